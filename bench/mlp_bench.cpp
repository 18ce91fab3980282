// Training-step throughput of an MLP 784-1024-1024-10 (batch 256): forward, cross-entropy,
// backward and a manual SGD update, in f32 or bf16 (parameters, activations and gradients in
// the dtype; GEMMs accumulate in fp32). Also: matmul 1024^3 through Mantissa next to the same
// GEMM as a bare oneDNN primitive, to show Mantissa's overhead.
//
//   bench_mlp --threads 2 --dtype bf16 [--steps 50] [--warmup 5] [--json]
//   bench_mlp --matmul 1024 --threads 2 --dtype f32 [--json]
//
// One JSON line per run with --json (tools/bench/mlp_compare.py runs this next to PyTorch).
#include <sys/resource.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mantissa/autograd/engine.h"
#include "mantissa/tensor/ops.h"

namespace {

using namespace mantissa;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Args {
  int threads = 1;
  DType dtype = DType::F32;
  int steps = 50;
  int warmup = 5;
  int matmul = 0;
  bool json = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_mlp: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--threads") {
      a.threads = std::atoi(next().c_str());
    } else if (k == "--dtype") {
      const auto d = parse_dtype(next());
      if (!d || (*d != DType::F32 && *d != DType::BF16)) {
        std::fprintf(stderr, "bench_mlp: --dtype takes f32 or bf16\n");
        std::exit(2);
      }
      a.dtype = *d;
    } else if (k == "--steps") {
      a.steps = std::atoi(next().c_str());
    } else if (k == "--warmup") {
      a.warmup = std::atoi(next().c_str());
    } else if (k == "--matmul") {
      a.matmul = std::atoi(next().c_str());
    } else if (k == "--json") {
      a.json = true;
    } else {
      std::fprintf(stderr,
                   "usage: bench_mlp [--threads N] [--dtype f32|bf16] [--steps N] [--warmup N] "
                   "[--matmul SIZE] [--json]\n");
      std::exit(2);
    }
  }
  return a;
}

int run_mlp(const Args& a) {
  const int64_t batch = 256, in = 784, hidden = 1024, classes = 10;
  const double lr = 0.01;
  // Kaiming-uniform-like init, then cast: the parameters live in the benchmark's dtype.
  auto param = [&](Shape s, int64_t fan_in, uint64_t seed) {
    const double bound = 1.0 / std::sqrt(double(fan_in));
    return Tensor::uniform(s, -bound, bound, seed, a.dtype).set_requires_grad(true);
  };
  std::vector<Tensor> params = {param({hidden, in}, in, 1),          param({hidden}, in, 2),
                                param({hidden, hidden}, hidden, 3),  param({hidden}, hidden, 4),
                                param({classes, hidden}, hidden, 5), param({classes}, hidden, 6)};
  const Tensor x = Tensor::normal({batch, in}, 0, 1, 7, a.dtype);
  const Tensor y = Tensor::uniform({batch}, 0, double(classes), 8, DType::F32).to(DType::I64);

  auto step = [&] {
    for (auto& p : params)
      p.set_grad(Tensor());  // set_to_none
    Tensor h = relu(linear(x, params[0], params[1]));
    h = relu(linear(h, params[2], params[3]));
    const Tensor logits = linear(h, params[4], params[5]);
    const Tensor loss = cross_entropy(logits, y);
    loss.backward();
    NoGrad ng;
    for (auto& p : params)
      p.add_(p.grad(), -lr);
    return loss;
  };
  for (int i = 0; i < a.warmup; ++i)
    step();
  reset_peak_memory();
  const int64_t base = memory_stats().current_bytes;
  std::vector<double> times;
  for (int i = 0; i < a.steps; ++i) {
    const auto t0 = Clock::now();
    step();
    times.push_back(seconds_since(t0));
  }
  const double ms = median(times) * 1e3;
  const int64_t peak = memory_stats().peak_bytes;
  if (a.json) {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    std::printf(
        "{\"impl\":\"mantissa\",\"bench\":\"mlp\",\"dtype\":\"%s\",\"threads\":%d,"
        "\"ms_per_step\":%.4f,\"peak_bytes\":%lld,\"activation_peak_bytes\":%lld,"
        "\"peak_rss_bytes\":%lld}\n",
        std::string(dtype_name(a.dtype)).c_str(), a.threads, ms, (long long)peak,
        (long long)(peak - base), (long long)ru.ru_maxrss * 1024);
  } else {
    std::printf("mlp 784-1024-1024-10 b256 %s, %d thread(s): %.3f ms/step, peak %.1f MiB\n",
                std::string(dtype_name(a.dtype)).c_str(), a.threads, ms, double(peak) / (1 << 20));
  }
  return 0;
}

// The same GEMM as one bare oneDNN primitive: what Mantissa's matmul costs on top of it.
double onednn_gemm_seconds(int64_t n, DType dtype, int reps) {
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  const auto dt = dtype == DType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::desc a_md({n, n}, dt, memory::format_tag::ab);
  const memory::desc c_md({n, n}, dt, memory::format_tag::ab);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, a_md, c_md), eng);
  const dnnl::matmul prim(pd);
  memory a(a_md, eng), b(a_md, eng), c(c_md, eng);
  std::memset(a.get_data_handle(), 0, a_md.get_size());
  std::memset(b.get_data_handle(), 0, a_md.get_size());
  std::vector<double> t;
  for (int i = 0; i < reps + 3; ++i) {
    const auto t0 = Clock::now();
    prim.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
    if (i >= 3) t.push_back(seconds_since(t0));
  }
  return median(t);
}

int run_matmul(const Args& a) {
  const int64_t n = a.matmul;
  const Tensor x = Tensor::normal({n, n}, 0, 1, 1, a.dtype),
               w = Tensor::normal({n, n}, 0, 1, 2, a.dtype);
  std::vector<double> ours;
  for (int i = 0; i < a.steps + 3; ++i) {
    const auto t0 = Clock::now();
    const Tensor c = matmul(x, w);
    if (i >= 3) ours.push_back(seconds_since(t0));
  }
  const double ours_s = median(ours);
  const double raw_s = onednn_gemm_seconds(n, a.dtype, a.steps);
  const double flop = 2.0 * double(n) * double(n) * double(n);
  if (a.json) {
    std::printf(
        "{\"impl\":\"mantissa\",\"bench\":\"matmul\",\"n\":%lld,\"dtype\":\"%s\","
        "\"threads\":%d,\"gflops\":%.2f,\"onednn_gflops\":%.2f}\n",
        (long long)n, std::string(dtype_name(a.dtype)).c_str(), a.threads, flop / ours_s / 1e9,
        flop / raw_s / 1e9);
  } else {
    std::printf(
        "matmul %lld^3 %s, %d thread(s): mantissa %.1f GFLOP/s, bare oneDNN %.1f GFLOP/s "
        "(%.3fx)\n",
        (long long)n, std::string(dtype_name(a.dtype)).c_str(), a.threads, flop / ours_s / 1e9,
        flop / raw_s / 1e9, raw_s / ours_s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  set_num_threads(a.threads);
  return a.matmul > 0 ? run_matmul(a) : run_mlp(a);
}
