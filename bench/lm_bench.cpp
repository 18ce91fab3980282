// Language-model benchmarks (issue 13): activation checkpointing's memory and time, and
// generation with the cache against a full forward per token.
//
//   bench_lm checkpoint [--model gpt2_tiny] [--vocab 4096] [--seq 256] [--batch 16] [--steps 12]
//                       [--warmup 2] [--threads 2] [--precision fp32,bf16]
//     One training step (forward, cross-entropy, backward, AdamW) without and with
//     checkpointing, the two models' steps interleaved (load changes hit both alike); the median
//     wall and process CPU time of a step (CPU time is steadier on a shared machine), its split
//     into forward + loss, backward and optimizer, and the peak memory: the model's resident state
//     (parameters and AdamW moments) plus the step's peak above it, the forward's part of that
//     and the logits' size, with the ratios on/off.
//
//   bench_lm generate [--model gpt2_tiny] [--vocab 4096] [--context 256] [--prompt 16]
//                     [--tokens 200] [--threads 2]
//     Greedy generation of --tokens tokens through the cache next to the same tokens computed
//     with a full forward over the whole sequence per token (what generation without a cache
//     does), and the tokens/s of each.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/clock.h"
#include "mantissa/nn/generate.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace {

using namespace mantissa;
// The CPU time of the whole process (every thread): less sensitive than wall time to other
// processes on a shared machine.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mib(int64_t bytes) {
  return double(bytes) / (1 << 20);
}

struct Args {
  std::string command;
  std::string model = "gpt2_tiny";
  int64_t vocab = 4096, seq = 256, batch = 16, context = 256, prompt = 16, tokens = 200;
  int steps = 12, warmup = 2, threads = 2;
  std::vector<std::string> precisions = {"fp32", "bf16"};
};

Args parse(int argc, char** argv) {
  Args a;
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_lm checkpoint|generate [options] (see the source)\n");
    std::exit(2);
  }
  a.command = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      a.model = v;
    else if (k == "--vocab")
      a.vocab = std::stoll(v);
    else if (k == "--seq")
      a.seq = std::stoll(v);
    else if (k == "--batch")
      a.batch = std::stoll(v);
    else if (k == "--context")
      a.context = std::stoll(v);
    else if (k == "--prompt")
      a.prompt = std::stoll(v);
    else if (k == "--tokens")
      a.tokens = std::stoll(v);
    else if (k == "--steps")
      a.steps = std::stoi(v);
    else if (k == "--warmup")
      a.warmup = std::stoi(v);
    else if (k == "--threads")
      a.threads = std::stoi(v);
    else if (k == "--precision") {
      a.precisions.clear();
      std::stringstream ss(v);
      for (std::string p; std::getline(ss, p, ',');)
        a.precisions.push_back(p);
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

// One model with its optimizer and the memory it holds between steps.
struct Trainee {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::AdamW> opt;
  int64_t resident = 0;  // parameters and AdamW moments
  std::vector<double> times, cpu_times;
  int64_t step_peak = 0;  // the step's peak above the bytes held when it began
  int64_t fwd_peak = 0;   // ... up to the loss
  int64_t logits_bytes = 0;
  std::vector<double> parts;                      // cpu seconds of forward, backward, step
  std::vector<std::vector<double>> part_samples;  // per measured step
};

struct Batch {
  Tensor inputs, targets;
};

void step(Trainee& t, const Batch& b, std::optional<DType> autocast) {
  t.opt->zero_grad();
  const int64_t before = memory_stats().current_bytes;
  reset_peak_memory();
  Tensor loss;
  const double c0 = cpu_seconds();
  {
    std::optional<amp::Autocast> ac;
    if (autocast) ac.emplace(DeviceType::CPU, *autocast);
    const Tensor logits = (*t.model)(b.inputs);
    t.logits_bytes = int64_t(logits.nbytes());
    loss = cross_entropy(logits.reshape({-1, logits.size(-1)}), b.targets.reshape({-1}));
  }
  const double c1 = cpu_seconds();
  t.fwd_peak = std::max(t.fwd_peak, memory_stats().peak_bytes - before);
  loss.backward();
  const double c2 = cpu_seconds();
  t.opt->step();
  t.parts = {c1 - c0, c2 - c1, cpu_seconds() - c2};
  t.step_peak = std::max(t.step_peak, memory_stats().peak_bytes - before);
}

int checkpoint_bench(const Args& a) {
  nn::ModelConfig c;
  c.vocab_size = a.vocab;
  c.max_seq_len = a.seq;
  c.seed = 1;
  nn::ModelConfig data = c;  // windows of seq + 1 tokens: inputs and next-token targets
  data.max_seq_len = a.seq + 1;
  const Tensor x = nn::example_input(a.model, data, a.batch, a.seq + 1, 7);
  const int64_t t = x.size(1) - 1;
  const Batch b{x.narrow(1, 0, t).contiguous(), x.narrow(1, 1, t).contiguous()};
  std::printf("%s vocab %lld, T %lld, batch %lld, %d threads, median of %d steps after %d\n",
              a.model.c_str(), static_cast<long long>(a.vocab), static_cast<long long>(t),
              static_cast<long long>(a.batch), a.threads, a.steps, a.warmup);
  std::printf("%-6s %-5s %9s %9s %10s %10s %10s %10s\n", "prec", "ckpt", "step ms", "cpu ms",
              "peak MiB", "step MiB", "fwd MiB", "logits MiB");
  for (const std::string& p : a.precisions) {
    const std::optional<DType> ac =
        p == "bf16" ? std::optional(DType::BF16) : std::optional<DType>();
    Trainee runs[2];
    for (int i = 0; i < 2; ++i) {
      const int64_t start = memory_stats().current_bytes;
      nn::ModelConfig mc = c;
      mc.activation_checkpointing =
          i == 0 ? nn::ActivationCheckpointing::Off : nn::ActivationCheckpointing::PerBlock;
      runs[i].model = nn::make_model(a.model, mc);
      runs[i].opt = std::make_unique<optim::AdamW>(runs[i].model->parameters());
      step(runs[i], b, ac);  // allocates the moments
      runs[i].opt->zero_grad();
      runs[i].resident = memory_stats().current_bytes - start;
      runs[i].step_peak = runs[i].fwd_peak = 0;
    }
    for (int s = 0; s < a.warmup + a.steps; ++s) {
      for (Trainee& r : runs) {  // interleaved: load changes hit both alike
        const auto t0 = Clock::now();
        const double c0 = cpu_seconds();
        step(r, b, ac);
        if (s >= a.warmup) {
          r.times.push_back(seconds_since(t0));
          r.cpu_times.push_back(cpu_seconds() - c0);
          r.part_samples.push_back(r.parts);
        }
      }
    }
    for (int i = 0; i < 2; ++i) {
      const Trainee& r = runs[i];
      std::printf("%-6s %-5s %9.1f %9.1f %10.1f %10.1f %10.1f %10.1f\n", p.c_str(),
                  i ? "on" : "off", 1e3 * median(r.times), 1e3 * median(r.cpu_times),
                  mib(r.resident + r.step_peak), mib(r.step_peak), mib(r.fwd_peak),
                  mib(r.logits_bytes));
    }
    for (int i = 0; i < 2; ++i) {
      std::vector<double> med;
      for (size_t k = 0; k < 3; ++k) {
        std::vector<double> v;
        for (const auto& sample : runs[i].part_samples)
          v.push_back(sample[k]);
        med.push_back(1e3 * median(v));
      }
      std::printf("%-6s %-5s cpu ms: forward+loss %.1f, backward %.1f, optimizer %.1f\n", p.c_str(),
                  i ? "on" : "off", med[0], med[1], med[2]);
    }
    std::printf(
        "%-6s ratio on/off: time %.3f (cpu %.3f), peak %.3f, step peak %.3f\n", p.c_str(),
        median(runs[1].times) / median(runs[0].times),
        median(runs[1].cpu_times) / median(runs[0].cpu_times),
        double(runs[1].resident + runs[1].step_peak) / double(runs[0].resident + runs[0].step_peak),
        double(runs[1].step_peak) / double(runs[0].step_peak));
  }
  return 0;
}

int generate_bench(const Args& a) {
  nn::ModelConfig c;
  c.vocab_size = a.vocab;
  c.max_seq_len = a.context;
  c.seed = 1;
  auto model = nn::make_model(a.model, c);
  model->eval();
  const Tensor prompt_t = nn::example_input(a.model, c, 1, a.prompt, 3);
  const std::vector<int64_t> prompt = prompt_t.to_vector<int64_t>();
  const nn::GenerateOptions o{.max_new_tokens = a.tokens, .temperature = 0};

  auto t0 = Clock::now();
  const nn::Generation g = nn::generate(*model, prompt, o);
  const double cached = seconds_since(t0);

  // Without a cache: a full forward over the whole sequence for every new token.
  t0 = Clock::now();
  std::vector<int64_t> seq = prompt;
  {
    NoGrad ng;
    for (int64_t i = 0; i < a.tokens; ++i) {
      const Tensor logits = (*model)(Tensor::from_vector(seq, {1, int64_t(seq.size())}));
      seq.push_back(int64_t(argmax(logits.select(1, logits.size(1) - 1), -1).item()));
    }
  }
  const double full = seconds_since(t0);
  const bool same = std::equal(g.tokens.begin(), g.tokens.end(), seq.begin() + a.prompt);
  std::printf("%s vocab %lld: prompt %lld, %lld new tokens, %d threads\n", a.model.c_str(),
              static_cast<long long>(nn::as_causal_lm(*model).vocab_size()),
              static_cast<long long>(a.prompt), static_cast<long long>(a.tokens), a.threads);
  std::printf("cached:       %8.3f s  %8.1f tokens/s\n", cached, double(a.tokens) / cached);
  std::printf("full forward: %8.3f s  %8.1f tokens/s\n", full, double(a.tokens) / full);
  std::printf("speedup %.1fx; same greedy tokens: %s\n", full / cached, same ? "yes" : "no");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  set_num_threads(a.threads);
  if (a.command == "checkpoint") return checkpoint_bench(a);
  if (a.command == "generate") return generate_bench(a);
  std::fprintf(stderr, "unknown command %s (checkpoint | generate)\n", a.command.c_str());
  return 2;
}
