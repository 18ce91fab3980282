// `mantissa bench`: the time and memory of one training step of a reference model, on
// synthetic data of the model's input shape (what tools/bench/train_compare.py runs next to
// PyTorch).
#include <fmt/core.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "commands.h"
#include "mantissa/amp/amp.h"
#include "mantissa/amp/precision.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/report.h"
#include "mantissa/train/trainer.h"

namespace mantissa::cli {
namespace {

struct BenchArgs {
  std::string model = "cnn";
  std::string precisions = "fp32";
  int64_t batch_size = 128;
  int64_t seq_len = train::TrainConfig{}.seq_len;  // train's default
  int steps = 30;
  int warmup = 5;
  int threads = 0;
  int64_t image_size = 28;
  int64_t in_channels = 1;
  std::string device = "cpu";
  std::string fp8_layers = "inner";
  bool json = false;
};

// The models bench runs, for its messages and help: those `mantissa train` trains as image
// classifiers or language models.
std::string bench_models() {
  const std::string images = train::task_name("cnn"), tokens = train::task_name("gpt2_tiny");
  std::string out;
  for (const auto& [model, task] : train::trainable_models()) {
    if (task == images || task == tokens) out += (out.empty() ? "" : ", ") + model;
  }
  return out;
}

// One precision to measure: "bf16" (O1), "bf16:O2", "fp16:O3", "bf16-pure", "tf32",
// "fp8:O2:mxfp8", ...
struct Variant {
  std::string label;
  amp::Recipe recipe;
};

Variant parse_variant(const std::string& item, amp::Fp8Layers fp8_layers) {
  std::vector<std::string> parts;
  for (size_t pos = 0; pos <= item.size();) {
    const size_t colon = std::min(item.find(':', pos), item.size());
    parts.push_back(item.substr(pos, colon - pos));
    pos = colon + 1;
  }
  const std::string what = "--precision entry '" + item + "': ";
  Variant v;
  try {
    v.recipe.precision = amp::resolve(parse_word<amp::Precision>(parts[0], "--precision"));
    if (parts.size() > 1) v.recipe.level = parse_word<amp::OptLevel>(parts[1], "opt level");
    if (parts.size() > 2) v.recipe.fp8.recipe = parse_word<amp::Fp8Recipe>(parts[2], "fp8 recipe");
    if (parts.size() > 3) {  // the accumulation, itself "fast:N" maybe
      std::string acc = parts[3];
      for (size_t i = 4; i < parts.size(); ++i)
        acc += ":" + parts[i];
      v.recipe.fp8.accumulate = amp::Fp8Accumulation::parse(acc);
    }
  } catch (const Error& e) {
    MT_CHECK(false, what, e.message());
  }
  const amp::Precision p = v.recipe.precision;
  MT_CHECK(parts.size() <= (p == amp::Precision::FP8 ? 5u : 2u), what,
           "use PRECISION[:LEVEL], or fp8[:LEVEL[:RECIPE[:ACCUMULATE]]]");
  MT_CHECK(!v.recipe.level || amp::accepts_level(p, *v.recipe.level), what, name_of(p),
           " does not run at ", name_of(*v.recipe.level));
  v.recipe.fp8_layers = fp8_layers;
  v.label = std::string(name_of(p));
  if (amp::precision_info(p).levels != amp::kLevelO0 && amp::precision_info(p).levels != 0)
    v.label += " " + std::string(name_of(amp::level_of(v.recipe)));
  if (p == amp::Precision::FP8) v.label += " " + std::string(name_of(v.recipe.fp8.recipe));
  if (p == amp::Precision::FP8 && v.recipe.fp8.accumulate.fast)
    v.label += " " + v.recipe.fp8.accumulate.str();
  return v;
}

std::vector<Variant> parse_variants(const std::string& list, amp::Fp8Layers fp8_layers) {
  std::vector<Variant> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string item = list.substr(pos, comma - pos);
    pos = comma + 1;
    if (!item.empty()) out.push_back(parse_variant(item, fp8_layers));
  }
  MT_CHECK(!out.empty(), "--precision needs at least one entry, e.g. fp32,bf16,bf16:O2");
  return out;
}

// A model, its optimizer and its precision set-up, with one training step.
class Runner {
 public:
  Runner(const BenchArgs& a, const Variant& v, Device device) : recipe_(v.recipe) {
    nn::ModelConfig mc;
    mc.image_size = a.image_size;
    mc.in_channels = a.in_channels;
    mc.max_seq_len = std::max<int64_t>(mc.max_seq_len, a.seq_len);
    model_ = nn::make_model(a.model, mc);
    model_->to(device);
    x_ = nn::example_input(a.model, mc, a.batch_size, a.seq_len, 1).to(device);
    tokens_ = nn::model_input(a.model) == nn::ModelInput::Tokens;
    // Targets: a class per image, or a next token per position.
    const int64_t classes = tokens_ ? (a.model == "gpt2" ? 50257 : mc.vocab_size) : mc.num_classes;
    const Shape target_shape = tokens_ ? x_.shape() : Shape{a.batch_size};
    y_ = Tensor::uniform(target_shape, 0, double(classes), 2, DType::F32).to(DType::I64).to(device);
    optim::SGDOptions so;
    so.lr = 0.01;
    so.momentum = 0.9;
    opt_ = std::make_unique<optim::SGD>(model_->parameters(), so);
    amp_ = std::make_unique<amp::Amp>(amp::initialize(*model_, *opt_, recipe_));
    model_->train();
  }

  // Forward, cross-entropy, backward (scaled), optimizer step through the scaler.
  void step() {
    set_matmul_precision(amp::precision_info(recipe_.precision).gemm);
    opt_->zero_grad();
    Tensor logits = amp_->forward(*model_, x_);
    if (tokens_) logits = logits.reshape({-1, logits.size(-1)});
    const Tensor loss = cross_entropy(logits, tokens_ ? y_.reshape({-1}) : y_);
    amp::GradScaler& sc = amp_->scaler();
    sc.scale(loss).backward();
    sc.step(*opt_);
    sc.update();
    if (amp_->fp8()) amp_->fp8()->update();
  }

  const nn::Module& model() const { return *model_; }
  bool tokens() const { return tokens_; }

 private:
  amp::Recipe recipe_;
  std::shared_ptr<nn::Module> model_;
  Tensor x_, y_;
  bool tokens_ = false;
  std::unique_ptr<optim::SGD> opt_;
  std::unique_ptr<amp::Amp> amp_;
};

struct Row {
  std::string label;
  double ms = 0;
  int64_t peak = 0;
  amp::CastCacheStats casts;  // autocast's weight-cast cache over one step
};

int run_bench(const BenchArgs& a) {
  MT_CHECK(a.steps > 0, "--steps must be positive, got ", a.steps);
  MT_CHECK(a.warmup >= 0, "--warmup must be >= 0, got ", a.warmup);
  MT_CHECK(a.batch_size > 0, "--batch-size must be positive, got ", a.batch_size);
  MT_CHECK(a.seq_len > 0, "--seq-len must be positive, got ", a.seq_len);
  MT_CHECK(a.threads >= 0, "--threads must be >= 0 (0: every core), got ", a.threads);
  set_num_threads(a.threads > 0 ? a.threads
                                : int(std::max(1u, std::thread::hardware_concurrency())));
  const Device device = train::require_device(a.device);
  // GPU work is queued, not done, when step() returns: a step's time is measured from an idle
  // device to an idle device.
  auto wait_idle = [&] {
    if (device.is_cuda()) cuda::synchronize(device.index);
  };
  // The models a bench step runs: image classifiers and language models (the GAN and the
  // recommenders train with two networks or two inputs: `mantissa train` measures them).
  const std::string task = train::task_name(a.model);  // (an unknown model is refused here)
  MT_CHECK(task == train::task_name("cnn") || task == train::task_name("gpt2_tiny"), "model '",
           a.model, "' is a ", task,
           "; bench measures image classifiers and "
           "language models (",
           bench_models(), "); time a ", task, " with `mantissa train --model ", a.model,
           " --steps N`");
  const std::vector<Variant> variants =
      parse_variants(a.precisions, parse_word<amp::Fp8Layers>(a.fp8_layers, "--fp8-layers"));
  std::vector<Row> rows(variants.size());

  // Memory, one variant at a time (nothing else alive): the peak of a step after warm-up,
  // counting everything the step needs (weights, masters, optimizer state, gradients, input).
  int64_t parameters = 0;
  bool tokens = false;
  for (size_t k = 0; k < variants.size(); ++k) {
    empty_cache(device);
    reset_peak_memory(device);
    Runner r(a, variants[k], device);
    parameters = r.model().num_parameters();
    tokens = r.tokens();
    for (int i = 0; i < std::max(a.warmup, 2); ++i)
      r.step();
    wait_idle();
    reset_peak_memory(device);
    amp::reset_cast_cache_stats();
    r.step();
    wait_idle();
    rows[k].label = variants[k].label;
    rows[k].peak = memory_stats(device).peak_bytes;
    rows[k].casts = amp::cast_cache_stats();
  }

  // Time, all variants alive and interleaved step by step, so that the machine's noise falls on
  // all of them alike; the median step of each.
  std::vector<std::unique_ptr<Runner>> runners;
  for (const Variant& v : variants)
    runners.push_back(std::make_unique<Runner>(a, v, device));
  for (int i = 0; i < a.warmup; ++i) {
    for (auto& r : runners)
      r->step();
  }
  std::vector<std::vector<double>> times(variants.size());
  for (int i = 0; i < a.steps; ++i) {
    for (size_t k = 0; k < runners.size(); ++k) {
      wait_idle();
      const auto t0 = std::chrono::steady_clock::now();
      runners[k]->step();
      wait_idle();
      times[k].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    std::sort(times[k].begin(), times[k].end());
    rows[k].ms = times[k][times[k].size() / 2] * 1e3;
  }

  const int64_t samples = tokens ? a.batch_size * a.seq_len : a.batch_size;
  const Row& base = rows[0];
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  if (a.json) {
    for (const Row& row : rows) {
      nlohmann::ordered_json j;
      j["impl"] = "mantissa";
      j["model"] = a.model;
      j["precision"] = row.label;
      j["batch_size"] = a.batch_size;
      j["device"] = device.str();
      j["threads"] = get_num_threads();
      j["ms_per_step"] = row.ms;
      j[tokens ? "tokens_per_s" : "samples_per_s"] = double(samples) / (row.ms / 1e3);
      j["peak_memory_bytes"] = row.peak;
      j["speedup_vs_first"] = base.ms / row.ms;
      j["memory_vs_first"] = double(row.peak) / double(base.peak);
      j["peak_rss_bytes"] = int64_t(ru.ru_maxrss) * 1024;
      j["parameters"] = parameters;
      j["weight_casts_per_step"] = row.casts.casts;
      j["cast_cache_hits_per_step"] = row.casts.hits;
      fmt::print("{}\n", json_line(j));
    }
    return 0;
  }
  fmt::print(
      "{} ({} parameters) on {}, batch {}, {} thread(s); median of {} steps interleaved across "
      "precisions; peak memory of one step measured alone\n",
      a.model, parameters, device.str(), a.batch_size, get_num_threads(), a.steps);
  size_t width = std::string_view("precision").size();  // the widest label's
  for (const Row& row : rows)
    width = std::max(width, row.label.size());
  fmt::print("{:<{}} {:>9} {:>12} {:>9} {:>12} {:>9}\n", "precision", width, "ms/step",
             tokens ? "tokens/s" : "samples/s", "speedup", "peak memory", "memory");
  for (const Row& row : rows) {
    fmt::print("{:<{}} {:>9.2f} {:>12.0f} {:>8.2f}x {:>12} {:>8.2f}x\n", row.label, width, row.ms,
               double(samples) / (row.ms / 1e3), base.ms / row.ms, train::format_bytes(row.peak),
               double(row.peak) / double(base.peak));
  }
  if (rows.size() > 1) fmt::print("(speedup and memory relative to {})\n", base.label);
  for (const Row& row : rows) {
    if (row.casts.casts + row.casts.hits > 0) {
      fmt::print("{}: autocast's weight-cast cache in one step: {} casts, {} hits\n", row.label,
                 row.casts.casts, row.casts.hits);
    }
  }
  return 0;
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time one training step (forward, loss, backward, SGD) of a model on synthetic data, in "
      "one or several precisions side by side");
  cmd->add_option("--model", a->model, "Model: " + bench_models())->capture_default_str();
  cmd->add_option("--fp8-layers", a->fp8_layers,
                  "fp8 variants: which Linear layers run in fp8: " +
                      word_list(words_of<amp::Fp8Layers>(), /*with_help=*/true))
      ->capture_default_str();
  cmd->add_option(
         "--precision", a->precisions,
         "Comma-separated precisions to compare, each PRECISION[:LEVEL] as for train "
         "(fp8[:LEVEL[:RECIPE[:ACCUMULATE]]] for fp8), e.g. fp32,bf16,bf16:O2,fp16:O2,bf16-pure,"
         "fp8:O2:delayed (ratios are to the first)")
      ->capture_default_str();
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
  cmd->add_option("--device", a->device,
                  "cpu, cuda or cuda:N (on a GPU: each step timed from idle to idle, peak "
                  "memory of the device)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON line");
  return [a] { return run_bench(*a); };
}

}  // namespace mantissa::cli
