// `mantissa bench`: the time and memory of one training step of a reference model, on
// synthetic data of the model's input shape (what tools/bench/train_compare.py runs next to
// PyTorch).
#include <fmt/core.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "commands.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/report.h"

namespace mantissa::cli {
namespace {

struct BenchArgs {
  std::string model = "cnn";
  int64_t batch_size = 128;
  int64_t seq_len = 64;
  int steps = 30;
  int warmup = 5;
  int threads = 0;
  int64_t image_size = 28;
  int64_t in_channels = 1;
  bool json = false;
};

int run_bench(const BenchArgs& a) {
  MT_CHECK(a.steps > 0 && a.warmup >= 0 && a.batch_size > 0,
           "bench: --steps and --batch-size must be positive");
  set_num_threads(a.threads > 0 ? a.threads
                                : int(std::max(1u, std::thread::hardware_concurrency())));
  nn::ModelConfig mc;
  mc.image_size = a.image_size;
  mc.in_channels = a.in_channels;
  mc.max_seq_len = std::max<int64_t>(mc.max_seq_len, a.seq_len);
  auto model = nn::make_model(a.model, mc);
  const Tensor x = nn::example_input(a.model, mc, a.batch_size, a.seq_len, 1);
  const bool tokens = nn::model_input(a.model) == nn::ModelInput::Tokens;
  // Targets: a class per image, or a next token per position.
  const int64_t classes = tokens ? (a.model == "gpt2" ? 50257 : mc.vocab_size) : mc.num_classes;
  const Shape target_shape = tokens ? x.shape() : Shape{a.batch_size};
  const Tensor y = Tensor::uniform(target_shape, 0, double(classes), 2, DType::F32).to(DType::I64);
  optim::SGDOptions so;
  so.lr = 0.01;
  so.momentum = 0.9;
  optim::SGD opt(model->parameters(), so);
  model->train();

  auto step = [&] {
    opt.zero_grad();
    Tensor logits = (*model)(x);
    if (tokens) logits = logits.reshape({-1, logits.size(-1)});
    const Tensor loss = cross_entropy(logits, tokens ? y.reshape({-1}) : y);
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < a.warmup; ++i)
    step();
  reset_peak_memory();
  std::vector<double> times;
  for (int i = 0; i < a.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double ms = times[times.size() / 2] * 1e3;
  const int64_t samples = tokens ? a.batch_size * a.seq_len : a.batch_size;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  if (a.json) {
    nlohmann::ordered_json j;
    j["impl"] = "mantissa";
    j["model"] = a.model;
    j["batch_size"] = a.batch_size;
    j["threads"] = get_num_threads();
    j["ms_per_step"] = ms;
    j[tokens ? "tokens_per_s" : "samples_per_s"] = double(samples) / (ms / 1e3);
    j["peak_memory_bytes"] = memory_stats().peak_bytes;
    j["peak_rss_bytes"] = int64_t(ru.ru_maxrss) * 1024;
    j["parameters"] = model->num_parameters();
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print(
        "{} ({} parameters), batch {}, {} thread(s): {:.2f} ms/step, {:.0f} {}/s, "
        "peak memory {}\n",
        a.model, model->num_parameters(), a.batch_size, get_num_threads(), ms,
        double(samples) / (ms / 1e3), tokens ? "tokens" : "samples",
        train::format_bytes(memory_stats().peak_bytes));
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time one training step (forward, loss, backward, SGD) of a model on synthetic data");
  cmd->add_option("--model", a->model, "Model name (as for train)")->capture_default_str();
  cmd->add_option("--batch-size", a->batch_size, "Batch size")->capture_default_str();
  cmd->add_option("--seq-len", a->seq_len, "Sequence length (token models)")->capture_default_str();
  cmd->add_option("--image-size", a->image_size, "Image side (image models)")
      ->capture_default_str();
  cmd->add_option("--in-channels", a->in_channels, "Image channels")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Timed steps (the median is reported)")
      ->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Compute threads (0: every core)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON line");
  return [a] { return run_bench(*a); };
}

}  // namespace mantissa::cli
