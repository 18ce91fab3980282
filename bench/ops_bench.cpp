// The reference models' pointwise and row ops at their shapes (batch 128): forward and backward
// time of each, one thread, the median of --reps runs. tools/bench/ops_compare.py runs it next to
// the same ops in PyTorch and prints the ratios.
//   build/bench/bench_ops [--reps 15] [--op NAME] [--dtype f32|bf16|f16] [--json]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "mantissa/tensor/ops.h"

namespace {

using namespace mantissa;

struct Op {
  const char* name;
  const char* shape;
  std::function<Tensor(const Tensor&)> fn;
  Tensor input;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 15;
  bool json = false;
  std::string only;
  DType dtype = DType::F32;
  std::string dtype_arg = "f32";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--json") {
      json = true;
    } else if (k == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (k == "--op" && i + 1 < argc) {
      only = argv[++i];
    } else if (k == "--dtype" && i + 1 < argc) {
      const std::string d = dtype_arg = argv[++i];
      if (d != "f32" && d != "bf16" && d != "f16") {
        std::fprintf(stderr, "bench_ops: --dtype takes f32, bf16 or f16, got %s\n", d.c_str());
        return 2;
      }
      dtype = d == "bf16" ? DType::BF16 : d == "f16" ? DType::F16 : DType::F32;
    } else {
      std::fprintf(stderr,
                   "bench_ops: unknown argument %s (use --reps N, --op NAME, --dtype D, --json)\n",
                   k.c_str());
      return 2;
    }
  }
  set_num_threads(1);
  // Inputs and incoming gradients in --dtype; the layer norm and batch norm parameters stay
  // f32, as the models keep them.
  auto u = [&](const Shape& s) { return Tensor::uniform(s, -2, 2, 1).to(dtype); };
  const Tensor w64 = Tensor::uniform({64}, 0.5, 1.5, 3), b64 = Tensor::uniform({64}, -1, 1, 4);
  const Tensor w16 = Tensor::uniform({16}, 0.5, 1.5, 3), b16 = Tensor::uniform({16}, -1, 1, 4);
  const Tensor rm = Tensor::zeros({16}), rv = Tensor::ones({16});
  std::vector<int64_t> t(8192);
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = int64_t(i * 7919 % 256);
  const Tensor target = Tensor::from_vector(t, {8192}, DType::I64);
  Pool2dOptions pool;
  pool.kernel_size = {2, 2};
  // The shapes: ViT's MLP activations (128 x 50 tokens, hidden 256), GPT-2 tiny's layer norm
  // rows (128 x 64 tokens, d 64), attention-score rows (128 x 4 heads x 64 x 64, the composed
  // path), the LM loss over a 256-token vocabulary, the CNNs' first feature maps, and a bias
  // gradient (the sum over GPT-2 tiny's 8192 token rows of its MLP's hidden 512).
  const std::vector<Op> ops = {
      {"gelu", "6400x256", [](const Tensor& x) { return gelu(x); }, u({6400, 256})},
      {"gelu_tanh", "6400x256", [](const Tensor& x) { return gelu(x, GeluApproximation::Tanh); },
       u({6400, 256})},
      {"layer_norm", "8192x64", [&](const Tensor& x) { return layer_norm(x, {64}, w64, b64); },
       u({8192, 64})},
      {"softmax", "512x64x64", [](const Tensor& x) { return softmax(x, -1); }, u({512, 64, 64})},
      {"cross_entropy", "8192x256", [&](const Tensor& x) { return cross_entropy(x, target); },
       u({8192, 256})},
      {"batch_norm", "128x16x28x28",
       [&](const Tensor& x) { return batch_norm(x, w16, b16, rm, rv, true); },
       u({128, 16, 28, 28})},
      {"relu", "128x16x28x28", [](const Tensor& x) { return relu(x); }, u({128, 16, 28, 28})},
      {"max_pool2d", "128x16x28x28", [&](const Tensor& x) { return max_pool2d(x, pool); },
       u({128, 16, 28, 28})},
      {"sum_rows", "8192x512", [](const Tensor& x) { return sum(x, {0}); }, u({8192, 512})},
  };
  if (!json)
    std::printf("one thread, %s, median of %d runs, ms\n%-14s %-14s %9s %9s\n", dtype_arg.c_str(),
                reps, "op", "shape", "forward", "backward");
  for (const Op& op : ops) {
    if (!only.empty() && only != op.name) continue;
    const Tensor g = Tensor::uniform(op.fn(op.input).shape(), -1, 1, 7).to(dtype);
    std::vector<double> fwd, bwd;
    for (int r = 0; r < reps + 2; ++r) {
      Tensor x = op.input.detach().set_requires_grad();
      auto t0 = std::chrono::steady_clock::now();
      const Tensor y = op.fn(x);
      const double f = ms_since(t0);
      t0 = std::chrono::steady_clock::now();
      y.backward(g);
      const double b = ms_since(t0);
      if (r >= 2) {  // two warm-up runs
        fwd.push_back(f);
        bwd.push_back(b);
      }
    }
    if (json) {
      std::printf(
          "{\"op\": \"%s\", \"shape\": \"%s\", \"dtype\": \"%s\", \"forward_ms\": %.4f, "
          "\"backward_ms\": %.4f}\n",
          op.name, op.shape, dtype_arg.c_str(), median(fwd), median(bwd));
    } else {
      std::printf("%-14s %-14s %9.3f %9.3f\n", op.name, op.shape, median(fwd), median(bwd));
    }
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  if (json) std::printf("{\"peak_rss_bytes\": %ld}\n", ru.ru_maxrss * 1024L);
  return 0;
}
