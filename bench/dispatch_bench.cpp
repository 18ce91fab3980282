// Per-op overhead on tiny tensors, where the arithmetic is nothing and the time is dispatch,
// allocation and the autograd record: a chain of 64 ops on a (4, 4) f32 tensor, timed
//   forward  — no tensor needs a gradient (no graph is recorded);
//   record   — the input needs a gradient, so every op records its node;
//   backward — record, then backward through the chain.
// Reports microseconds per op (the median of --reps runs of the chain) for each op kind.
//
//   bench_dispatch [--reps 200] [--op NAME] [--json]
//
// tools/bench/dispatch_compare.py runs this next to the same chains in PyTorch eager.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "mantissa/autograd/engine.h"
#include "mantissa/tensor/ops.h"

namespace {

using namespace mantissa;
using Clock = std::chrono::steady_clock;
constexpr int kChain = 64;

struct OpKind {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> step;  // (x, w) -> next x
};

std::vector<OpKind> op_kinds() {
  return {
      {"add", [](const Tensor& x, const Tensor& w) { return add(x, w); }},
      {"mul", [](const Tensor& x, const Tensor& w) { return mul(x, w); }},
      {"relu", [](const Tensor& x, const Tensor&) { return relu(x); }},
      {"tanh", [](const Tensor& x, const Tensor&) { return tanh(x); }},
      {"matmul", [](const Tensor& x, const Tensor& w) { return matmul(x, w); }},
      {"linear", [](const Tensor& x, const Tensor& w) { return linear(x, w); }},
      {"sum_keepdim", [](const Tensor& x, const Tensor&) { return sum(x, {1}, true); }},
      {"reshape",
       [](const Tensor& x, const Tensor&) {
         return x.reshape({16}).reshape({4, 4});
       }},
  };
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Microseconds per op for one mode.
double time_chain(const OpKind& op, const std::string& mode, int reps) {
  const Tensor w = Tensor::uniform({4, 4}, -0.5, 0.5, 1);
  std::vector<double> us;
  for (int r = 0; r < reps + reps / 10; ++r) {
    Tensor x = Tensor::uniform({4, 4}, -0.5, 0.5, 2);
    if (mode != "forward") x.set_requires_grad(true);
    const auto t0 = Clock::now();
    Tensor y = x;
    for (int i = 0; i < kChain; ++i)
      y = op.step(y, w);
    if (mode == "backward") sum(y).backward();
    const double t = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (r >= reps / 10) us.push_back(t / kChain);  // the first tenth warms up
  }
  return median(us);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 200;
  bool json = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--json") {
      json = true;
    } else if (k == "--reps" && i + 1 < argc) {
      reps = std::max(10, std::atoi(argv[++i]));
    } else if (k == "--op" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "bench_dispatch: unknown argument %s (use --reps N, --op NAME, --json)\n",
                   k.c_str());
      return 2;
    }
  }
  if (!json)
    std::printf("%-12s %10s %10s %10s   (us per op, chain of %d)\n", "op", "forward", "record",
                "backward", kChain);
  for (const OpKind& op : op_kinds()) {
    if (!only.empty() && only != op.name) continue;
    const double f = time_chain(op, "forward", reps), r = time_chain(op, "record", reps),
                 b = time_chain(op, "backward", reps);
    if (json) {
      std::printf(
          "{\"op\": \"%s\", \"forward_us\": %.3f, \"record_us\": %.3f, "
          "\"backward_us\": %.3f}\n",
          op.name, f, r, b);
    } else {
      std::printf("%-12s %10.2f %10.2f %10.2f\n", op.name, f, r, b);
    }
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  if (json) std::printf("{\"peak_rss_bytes\": %ld}\n", ru.ru_maxrss * 1024L);
  return 0;
}
