// Training-step throughput of an MLP 784-1024-1024-10 (batch 256; --layers and --batch change
// them, e.g. the reference mlp: --layers 784,256,128,10 --batch 128): forward, cross-entropy,
// backward and a manual SGD update, in f32 or bf16 (parameters, activations and gradients in
// the dtype; GEMMs accumulate in fp32). Also: matmul 1024^3 through Mantissa next to the same
// GEMM as a bare oneDNN primitive, to show Mantissa's overhead.
//
// --peak also measures, in the same run, what the cores can do: fused multiply-adds on
// registers only (zmm where the CPU has AVX-512F, else ymm with FMA), and with avx512_bf16
// vdpbf16ps, on --threads threads at once; it prints the step's GEMM FLOP rate (counted from the
// layer shapes: forward, weight gradients, input gradients past the first layer) as a share of
// that peak (fp32's for f32, the bf16 dot product's for bf16).
//
//   bench_mlp --threads 2 --dtype bf16 [--steps 50] [--warmup 5] [--layers 784,1024,1024,10]
//             [--batch 256] [--peak] [--json]
//   bench_mlp --matmul 1024 --threads 2 --dtype f32 [--json]
//
// One JSON line per run with --json (tools/bench/mlp_compare.py runs this next to PyTorch).
#include <sys/resource.h>
#include <oneapi/dnnl/dnnl.hpp>
#if defined(__x86_64__)
// GCC 12's AVX-512 headers pass _mm512_undefined_*() as don't-care operands, which its own
// uninitialized-use warnings then flag where they are inlined: a known false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mantissa/autograd/engine.h"
#include "mantissa/core/clock.h"
#include "mantissa/core/cpu.h"
#include "mantissa/tensor/ops.h"

namespace {

using namespace mantissa;
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
  bool peak = false;
  int64_t batch = 256;
  std::vector<int64_t> layers = {784, 1024, 1024, 10};
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench_mlp [--threads N] [--dtype f32|bf16] [--steps N] [--warmup N] "
               "[--layers IN,H1,...,OUT] [--batch N] [--peak] [--matmul SIZE] [--json]\n");
  std::exit(2);
}

std::vector<int64_t> parse_layers(const std::string& text) {
  std::vector<int64_t> sizes;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) {
      std::fprintf(stderr,
                   "bench_mlp: --layers takes positive sizes, e.g. 784,256,128,10 (got "
                   "'%s')\n",
                   text.c_str());
      std::exit(2);
    }
    sizes.push_back(v);
    at = comma + 1;
  }
  if (sizes.size() < 2) {
    std::fprintf(stderr, "bench_mlp: --layers needs an input and an output size at least\n");
    std::exit(2);
  }
  return sizes;
}

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
    } else if (k == "--peak") {
      a.peak = true;
    } else if (k == "--batch") {
      a.batch = std::atoll(next().c_str());
    } else if (k == "--layers") {
      a.layers = parse_layers(next());
    } else {
      usage();
    }
  }
  if (a.threads < 1 || a.steps < 1 || a.warmup < 0 || a.batch < 1) {
    std::fprintf(stderr, "bench_mlp: --threads, --steps and --batch must be positive\n");
    std::exit(2);
  }
  return a;
}

// ---- what the cores can do: multiply-adds on registers only --------------------------------
//
// Twelve independent accumulators (more than an FMA's latency times its issue rate on the cores
// of the last years), no memory operand, so the loop runs at the FMA units' rate. The values
// stay finite (x = x * 0.999 + 0.0001 converges) and are summed, so nothing is optimized out.

constexpr int kChains = 12;

#if defined(__x86_64__)
__attribute__((target("avx512f"), noinline)) float fma_zmm(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c)
    acc[c] = _mm512_set1_ps(float(c));
  const __m512 m = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-4f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c)
      acc[c] = _mm512_fmadd_ps(acc[c], m, b);
  }
  __m512 t = acc[0];
  for (int c = 1; c < kChains; ++c)
    t = _mm512_add_ps(t, acc[c]);
  return _mm512_reduce_add_ps(t);
}

__attribute__((target("avx2,fma"), noinline)) float fma_ymm(int64_t iters) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c)
    acc[c] = _mm256_set1_ps(float(c));
  const __m256 m = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-4f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c)
      acc[c] = _mm256_fmadd_ps(acc[c], m, b);
  }
  __m256 t = acc[0];
  for (int c = 1; c < kChains; ++c)
    t = _mm256_add_ps(t, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, t);
  float sum = 0;
  for (float v : lanes)
    sum += v;
  return sum;
}

// vdpbf16ps: 32 bf16 products a zmm, each pair summed into one of 16 fp32 lanes (64 FLOP).
__attribute__((target("avx512f,avx512bf16"), noinline)) float dp_zmm(int64_t iters) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c)
    acc[c] = _mm512_set1_ps(float(c));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a83);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c)
      acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  }
  __m512 t = acc[0];
  for (int c = 1; c < kChains; ++c)
    t = _mm512_add_ps(t, acc[c]);
  return _mm512_reduce_add_ps(t);
}
#endif

struct Peak {
  const char* what;
  bool bf16;      // the bf16 dot product's, else fp32 FMA's
  double gflops;  // all threads together
};

// kernel on `threads` threads at once; FLOP per iteration and thread given; best of 5 rounds.
Peak measure_peak(const char* what, bool bf16, float (*kernel)(int64_t), double flop_per_iter,
                  int threads) {
  const int64_t iters = 20'000'000;
  double best = 0;
  float sink = 0;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += kernel(iters);
    best = std::max(best, flop_per_iter * double(iters) * threads / seconds_since(t0) / 1e9);
  }
  if (sink != sink) std::fprintf(stderr, "(nan)\n");  // keeps the sums alive
  return {what, bf16, best};
}

// The fp32 FMA peak and, where the CPU has it, the bf16 dot-product peak.
std::vector<Peak> measure_peaks(int threads) {
  std::vector<Peak> peaks;
#if defined(__x86_64__)
  const CpuFeatures& f = cpu_features();
  if (f.avx512f) {
    peaks.push_back(measure_peak("fp32 FMA (zmm)", false, fma_zmm, kChains * 16 * 2.0, threads));
  } else if (f.avx2 && f.fma) {
    peaks.push_back(measure_peak("fp32 FMA (ymm)", false, fma_ymm, kChains * 8 * 2.0, threads));
  }
  if (f.avx512_bf16)
    peaks.push_back(
        measure_peak("bf16 dot product (vdpbf16ps)", true, dp_zmm, kChains * 32 * 2.0, threads));
#else
  (void)threads;
#endif
  return peaks;
}

int run_mlp(const Args& a) {
  const int64_t batch = a.batch, classes = a.layers.back();
  const double lr = 0.01;
  // Kaiming-uniform-like init, then cast: the parameters live in the benchmark's dtype.
  auto param = [&](Shape s, int64_t fan_in, uint64_t seed) {
    const double bound = 1.0 / std::sqrt(double(fan_in));
    return Tensor::uniform(s, -bound, bound, seed, a.dtype).set_requires_grad(true);
  };
  std::vector<Tensor> params;
  double gemm_flop = 0;  // a step's: forward, weight gradients, input gradients past layer 0
  for (size_t l = 0; l + 1 < a.layers.size(); ++l) {
    const int64_t in = a.layers[l], out = a.layers[l + 1];
    params.push_back(param({out, in}, in, 2 * l + 1));
    params.push_back(param({out}, in, 2 * l + 2));
    gemm_flop += 2.0 * double(batch) * double(in) * double(out) * (l == 0 ? 2 : 3);
  }
  const Tensor x = Tensor::normal({batch, a.layers.front()}, 0, 1, 7, a.dtype);
  const Tensor y = Tensor::uniform({batch}, 0, double(classes), 8, DType::F32).to(DType::I64);
  std::string shape;
  for (int64_t v : a.layers) {
    if (!shape.empty()) shape += '-';
    shape += std::to_string(v);
  }

  auto step = [&] {
    for (auto& p : params)
      p.set_grad(Tensor());  // set_to_none
    Tensor h = x;
    for (size_t l = 0; l + 2 < params.size(); l += 2)
      h = relu(linear(h, params[l], params[l + 1]));
    const Tensor logits = linear(h, params[params.size() - 2], params.back());
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
  const double gflops = gemm_flop / (ms * 1e-3) / 1e9;
  if (a.peak && !a.json) {
    std::printf(
        "mlp %s b%lld %s, %d thread(s): %.3f ms/step, %.1f GFLOP/s in its GEMMs' %.1f "
        "MFLOP a step\n",
        shape.c_str(), (long long)batch, std::string(dtype_name(a.dtype)).c_str(), a.threads, ms,
        gflops, gemm_flop / 1e6);
    const std::vector<Peak> peaks = measure_peaks(a.threads);
    for (const Peak& p : peaks)
      std::printf("  peak of %d core(s), %s: %.1f GFLOP/s\n", a.threads, p.what, p.gflops);
    // The peak of the step's dtype: bf16's dot product where the CPU has one, else fp32's FMA.
    const Peak* ref = nullptr;
    for (const Peak& p : peaks)
      if (!ref || p.bf16 == (a.dtype == DType::BF16)) ref = &p;
    if (ref)
      std::printf("  the step at %.1f %% of the %s peak\n", 100 * gflops / ref->gflops, ref->what);
    return 0;
  }
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
    std::printf("mlp %s b%lld %s, %d thread(s): %.3f ms/step, peak %.1f MiB\n", shape.c_str(),
                (long long)batch, std::string(dtype_name(a.dtype)).c_str(), a.threads, ms,
                double(peak) / (1 << 20));
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
