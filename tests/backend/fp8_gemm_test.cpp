// The backends' fp8 GEMM (backend_ops.h, fp8_gemm): the CPU's emulation against float64 sums of
// the same codes and against amp::fp8_gemm (the op layer's own emulation) bit for bit; on a GPU,
// cuBLASLt's fp8 GEMM (or the CUDA emulation where it does not qualify) against both. The GPU
// tests skip themselves without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_test_util.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/core/warning.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::backend {
namespace {

// fp8 codes of random values spread over the format's range (many binades, both signs, zeros).
Tensor random_codes(int64_t rows, int64_t cols, DType dt, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> exp(-8, 8);
  std::vector<double> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = i % 17 == 0 ? 0.0 : std::ldexp(mant(g), exp(g));
  return Tensor::from_vector(v, {rows, cols}).to(dt);
}

Tensor scalar_f32(float v, Device d = Device::cpu()) {
  return Tensor::from_vector(std::vector<float>{v}, {1, 1}).to(d);
}

std::vector<double> host_f64(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
}

// float64 sums of the codes' products times the scales' fp32 product, and the sums of |terms|.
void reference(const Tensor& a, float sa, const Tensor& b, float sb, std::vector<double>& want,
               std::vector<double>& mag) {
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  const std::vector<double> va = host_f64(a), vb = host_f64(b);
  const double f = double(sa * sb);
  want.assign(size_t(M * N), 0.0);
  mag.assign(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, g = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = va[size_t(m * K + k)] * vb[size_t(n * K + k)];
        s += p;
        g += std::fabs(p);
      }
      want[size_t(m * N + n)] = s * f;
      mag[size_t(m * N + n)] = g * std::fabs(f);
    }
  }
}

// max |got - want| / mag, failing where it exceeds `rel` (plus the output's own rounding when
// out is narrower than f32).
double check(const Tensor& out, const std::vector<double>& want, const std::vector<double>& mag,
             double rel, const std::string& what) {
  const std::vector<double> got = host_f64(out);
  const double out_eps = out.dtype() == DType::F32    ? 0.0
                         : out.dtype() == DType::BF16 ? std::ldexp(1.0, -8)
                                                      : std::ldexp(1.0, -11);
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    EXPECT_LE(err, rel * mag[i] + out_eps * std::fabs(want[i]) + 1e-30)
        << what << ": element " << i << " got " << got[i] << " want " << want[i];
    if (mag[i] > 0) worst = std::max(worst, err / mag[i]);
  }
  return worst;
}

// The operand formats fp8_gemm takes (E5M2 x E5M2 is not among cuBLASLt's fp8 GEMMs).
constexpr std::pair<DType, DType> kFormatPairs[] = {{DType::FP8_E4M3, DType::FP8_E4M3},
                                                    {DType::FP8_E4M3, DType::FP8_E5M2},
                                                    {DType::FP8_E5M2, DType::FP8_E4M3}};

struct Shape3 {
  int64_t M, N, K;
};

TEST(Fp8GemmOp, CpuEqualsFloat64OfTheCodesToFp32Rounding) {
  Backend& cpu = cpu_backend();
  for (const Shape3 s : {Shape3{37, 45, 300}, Shape3{1, 16, 16}, Shape3{8, 3, 1}}) {
    for (const auto& [da, db] : kFormatPairs) {
      const Tensor a = random_codes(s.M, s.K, da, 1), b = random_codes(s.N, s.K, db, 2);
      const float sa = 0.37f, sb = 1.0f / 512;
      std::vector<double> want, mag;
      reference(a, sa, b, sb, want, mag);
      Tensor out = Tensor::empty({s.M, s.N}, DType::F32);
      cpu.fp8_gemm(a, scalar_f32(sa), b, scalar_f32(sb), false, out);
      const std::string what = std::string(dtype_name(da)) + " x " + std::string(dtype_name(db)) +
                               " K " + std::to_string(s.K);
      // fp32 sums of K exact products, then one product with the scales: gamma_(K+1).
      check(out, want, mag, double(s.K + 1) * std::ldexp(1.0, -24), what);
      // A narrower output is the f32 result rounded once.
      Tensor bf = Tensor::empty({s.M, s.N}, DType::BF16);
      cpu.fp8_gemm(a, scalar_f32(sa), b, scalar_f32(sb), false, bf);
      EXPECT_EQ(host_f64(bf), host_f64(out.to(DType::BF16))) << what;
    }
  }
}

TEST(Fp8GemmOp, CpuTakesRowsWithAStrideAndAnEmptySum) {
  Backend& cpu = cpu_backend();
  // Rows of a wider buffer (K innermost, row stride 40 > K = 32).
  const Tensor wide = random_codes(6, 40, DType::FP8_E4M3, 3);
  const Tensor a = wide.narrow(1, 4, 32), b = random_codes(5, 32, DType::FP8_E4M3, 4);
  Tensor got = Tensor::empty({6, 5}, DType::F32), want = Tensor::empty({6, 5}, DType::F32);
  cpu.fp8_gemm(a, scalar_f32(2.0f), b, scalar_f32(0.5f), false, got);
  cpu.fp8_gemm(a.contiguous(), scalar_f32(2.0f), b, scalar_f32(0.5f), false, want);
  EXPECT_EQ(host_f64(got), host_f64(want));
  const Tensor e = Tensor::empty({3, 0}, DType::FP8_E4M3),
               f = Tensor::empty({4, 0}, DType::FP8_E4M3);
  Tensor z = Tensor::full({3, 4}, 7.0, DType::F32);
  cpu.fp8_gemm(e, scalar_f32(1), f, scalar_f32(1), false, z);
  for (double v : host_f64(z))
    EXPECT_EQ(v, 0.0);
}

// block_scaled_gemm is its contract's arithmetic: each K slice's fp32 sums (the backend's own
// matmul of the slice), times sa * sb, the slices added in order and the bias added, every step
// an fp32 operation, then one rounding; in every output dtype, with ragged blocks and slices and
// a transposed operand (as the weight gradient's).
TEST(Fp8GemmOp, BlockScaledGemmIsItsFormulaInFp32) {
  Backend& cpu = cpu_backend();
  const int64_t M = 37, N = 21, K = 300, bk = 128, a_rows = 1, b_rows = 16;
  const int64_t S = (K + bk - 1) / bk;
  const Tensor a = random_codes(M, K, DType::FP8_E4M3, 7).to(DType::BF16);
  const Tensor bt = random_codes(K, N, DType::FP8_E4M3, 8).to(DType::BF16);  // b^T stored
  const Tensor b = bt.t();                                                   // (N, K), K outer
  const Tensor sa = Tensor::uniform({M, S}, 0.01, 2, 9);
  const Tensor sb = Tensor::uniform({(N + b_rows - 1) / b_rows, S}, 0.01, 2, 10);
  const Tensor bias = Tensor::uniform({N}, -1, 1, 11).to(DType::BF16);
  // The formula on the host, from the slices' fp32 sums.
  std::vector<float> want(size_t(M * N), 0.0f);
  const std::vector<float> fsa = sa.to_vector<float>(), fsb = sb.to_vector<float>();
  for (int64_t s = 0; s < S; ++s) {
    const int64_t k0 = s * bk, kl = std::min(bk, K - k0);
    Tensor part = Tensor::empty({1, M, N}, DType::F32);
    cpu.matmul(a.narrow(1, k0, kl).unsqueeze(0), b.narrow(1, k0, kl).t().unsqueeze(0), nullptr,
               part, MatmulOptions{});
    const std::vector<float> p = part.to_vector<float>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const float f = fsa[size_t(m / a_rows * S + s)] * fsb[size_t(n / b_rows * S + s)];
        float& w = want[size_t(m * N + n)];
        w = s == 0 ? p[size_t(m * N + n)] * f : w + p[size_t(m * N + n)] * f;
      }
  }
  const std::vector<float> fb = bias.to(DType::F32).to_vector<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      want[size_t(m * N + n)] += fb[size_t(n)];
  const Tensor want_t = Tensor::from_vector(want, {M, N});
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor out = Tensor::empty({M, N}, dt);
    cpu.block_scaled_gemm(a, sa, a_rows, b, sb, b_rows, bk, &bias, out);
    EXPECT_EQ(host_f64(out), host_f64(want_t.to(dt)));
  }
  // Per tensor, it is fp8_gemm's emulation.
  const Tensor ca = random_codes(M, K, DType::FP8_E4M3, 12),
               cb = random_codes(N, K, DType::FP8_E5M2, 13);
  Tensor via_fp8 = Tensor::empty({M, N}, DType::BF16),
         via_block = Tensor::empty({M, N}, DType::BF16);
  cpu.fp8_gemm(ca, scalar_f32(0.25f), cb, scalar_f32(3.0f), false, via_fp8);
  cpu.block_scaled_gemm(ca.to(DType::BF16), scalar_f32(0.25f), M, cb.to(DType::BF16),
                        scalar_f32(3.0f), N, K, nullptr, via_block);
  EXPECT_EQ(host_f64(via_block), host_f64(via_fp8));
}

// The op layer's CPU emulation (codes through bf16 values, per tensor) and the backend op agree
// bit for bit: two code paths, one contract.
TEST(Fp8GemmOp, CpuAgreesWithTheOpLayersEmulationBitForBit) {
  const Tensor x = Tensor::uniform({24, 96}, -3, 3, 5), w = Tensor::uniform({40, 96}, -1, 1, 6);
  const amp::Fp8Scaling s{0, 0, amp::Fp8ScaleRule::Amax, 1};
  const amp::Fp8Tensor qx = amp::fp8_quantize(x, DType::FP8_E4M3, s),
                       qw = amp::fp8_quantize(w, DType::FP8_E5M2, s);
  const Tensor layer = amp::fp8_gemm(qx, qw, Tensor(), DType::F32);
  Tensor op = Tensor::empty({24, 40}, DType::F32);
  cpu_backend().fp8_gemm(qx.codes, qx.scale_inv, qw.codes, qw.scale_inv, false, op);
  EXPECT_EQ(host_f64(op), host_f64(layer));
}

// fast_accumulate asks for the device's fast accumulation: the CPU has none of its own, so it is
// the model's, bit for bit (fast_accumulate_gemm of the codes' values, never promoted) -- and at
// K = 4096 the model's truncations show against the fp32 sums.
TEST(Fp8GemmOp, CpuFastAccumulationIsTheModel) {
  Backend& cpu = cpu_backend();
  const int64_t M = 9, N = 7, K = 4096;
  const Tensor a = random_codes(M, K, DType::FP8_E4M3, 31),
               b = random_codes(N, K, DType::FP8_E5M2, 32);
  Tensor fast = Tensor::empty({M, N}, DType::F32), fp32 = Tensor::empty({M, N}, DType::F32),
         model = Tensor::empty({M, N}, DType::F32);
  cpu.fp8_gemm(a, scalar_f32(0.5f), b, scalar_f32(3.0f), true, fast);
  cpu.fp8_gemm(a, scalar_f32(0.5f), b, scalar_f32(3.0f), false, fp32);
  cpu.fast_accumulate_gemm(a.to(DType::BF16), scalar_f32(0.5f), M, b.to(DType::BF16),
                           scalar_f32(3.0f), N, K, 0, nullptr, model);
  EXPECT_EQ(fast.to_vector<float>(), model.to_vector<float>());
  EXPECT_NE(fast.to_vector<float>(), fp32.to_vector<float>());
}

// ---- on a GPU ---------------------------------------------------------------------------------

TEST(CudaFp8Gemm, MatchesFloat64AndTheCpuInEveryFormatPairAndOutput) {
  MT_REQUIRE_CUDA();
  Backend& gpu = backend_for(Device::cuda());
  // Qualifying shapes run cuBLASLt's fp8 GEMM on a GPU with fp8 tensor cores; K = 40 does not
  // (K must be a multiple of 16) and runs the CUDA emulation.
  for (const Shape3 s : {Shape3{64, 48, 256}, Shape3{33, 80, 128}, Shape3{1, 16, 16},
                         Shape3{512, 768, 3072}, Shape3{20, 24, 40}}) {
    for (const auto& [da, db] : kFormatPairs) {
      const Tensor a = random_codes(s.M, s.K, da, 11), b = random_codes(s.N, s.K, db, 12);
      const float sa = 0.37f, sb = 1.0f / 512;
      std::vector<double> want, mag;
      reference(a, sa, b, sb, want, mag);
      for (const DType od : {DType::F32, DType::BF16, DType::F16}) {
        Tensor out = Tensor::full({s.M, s.N}, double(NAN), od, Device::cuda());
        gpu.fp8_gemm(a.to(Device::cuda()), scalar_f32(sa, Device::cuda()), b.to(Device::cuda()),
                     scalar_f32(sb, Device::cuda()), false, out);
        const std::string what = std::string(dtype_name(da)) + " x " + std::string(dtype_name(db)) +
                                 " -> " + std::string(dtype_name(od)) + " (" + std::to_string(s.M) +
                                 ", " + std::to_string(s.N) + ", " + std::to_string(s.K) + ")";
        // fp32 sums in an order of cuBLASLt's choosing. Hopper's fp8 tensor cores add within a
        // k-group at reduced precision before the fp32 promotion: on an H200 (CUDA 13.0) the
        // largest error was 6.1e-4 (2^-10.7) of sum |terms| at K = 128, against 2.5e-7 for the
        // emulation's fp32 sums (K = 40). The bound is 2^-9 of it: a wrong scale, operand or
        // transposition is off by O(1).
        const double worst = check(out, want, mag, std::ldexp(1.0, -9), what);
        if (od == DType::F32)
          std::printf("%s: max error / sum|terms| = %.3g\n", what.c_str(), worst);
      }
    }
  }
}

// What cuBLASLt's FAST_ACCUM (--fp8-accumulate native) costs against float64, K by K, next to
// its fp32 sums and the CPU's model of the narrow accumulator (--fp8-accumulate fast): the figures
// docs/fp8.md asks the first GPU run for. The model truncates after every product, so it should
// err at least as much as the hardware; the bound here only catches a wrong operand or scale
// (O(1)), the printed figures are the measurement.
TEST(CudaFp8Gemm, FastAccumulationAgainstFloat64AndTheModelByK) {
  MT_REQUIRE_CUDA();
  Backend& gpu = backend_for(Device::cuda());
  Backend& cpu = cpu_backend();
  for (const int64_t K : {int64_t(128), int64_t(1024), int64_t(4096), int64_t(16384)}) {
    const int64_t M = 64, N = 64;
    const Tensor a = random_codes(M, K, DType::FP8_E4M3, 40 + uint64_t(K)),
                 b = random_codes(N, K, DType::FP8_E4M3, 50 + uint64_t(K));
    std::vector<double> want, mag;
    reference(a, 1.0f, b, 1.0f, want, mag);
    const std::string what = "e4m3 x e4m3 K " + std::to_string(K);
    double worst[3] = {0, 0, 0};  // fp32 sums, FAST_ACCUM, the model
    for (int i = 0; i < 3; ++i) {
      Tensor out =
          Tensor::full({M, N}, double(NAN), DType::F32, i < 2 ? Device::cuda() : Device::cpu());
      if (i < 2) {
        gpu.fp8_gemm(a.to(Device::cuda()), scalar_f32(1, Device::cuda()), b.to(Device::cuda()),
                     scalar_f32(1, Device::cuda()), i == 1, out);
      } else {
        cpu.fp8_gemm(a, scalar_f32(1), b, scalar_f32(1), true, out);
      }
      worst[i] = check(out, want, mag, std::ldexp(1.0, i == 0 ? -9 : -3), what);
    }
    std::printf("%s: max error / sum|terms|: fp32 sums 2^%.1f, FAST_ACCUM 2^%.1f, model 2^%.1f\n",
                what.c_str(), std::log2(worst[0]), std::log2(worst[1]), std::log2(worst[2]));
  }
}

TEST(CudaFp8Linear, ForwardAndBackwardFollowTheCpuInEveryRecipe) {
  MT_REQUIRE_CUDA();
  const Tensor x0 = Tensor::uniform({4, 32, 128}, -2, 2, 21),
               w0 = Tensor::uniform({96, 128}, -0.2, 0.2, 22),
               b0 = Tensor::uniform({96}, -1, 1, 23),
               gy = Tensor::uniform({4, 32, 96}, -1e-3, 1e-3, 24);
  auto rel = [](const Tensor& got, const Tensor& want) {
    const std::vector<double> g = host_f64(got), w = host_f64(want);
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      num += (g[i] - w[i]) * (g[i] - w[i]);
      den += w[i] * w[i];
    }
    return std::sqrt(num / den);
  };
  // Every recipe, and rowwise with the fast accumulator (the same kernel's model on both).
  std::vector<amp::Fp8Options> options;
  for (const amp::Fp8Recipe r : all_words<amp::Fp8Recipe>())
    options.push_back({.recipe = r});
  options.push_back({.recipe = amp::Fp8Recipe::Rowwise, .accumulate = {true, 128}});
  for (const amp::Fp8Options& o : options) {
    const amp::Fp8Recipe r = o.recipe;
    struct Run {
      Tensor y, gx, gw, gb;
    };
    auto run = [&](Device d) {
      amp::Fp8Context ctx(o);
      auto st = ctx.add_layer("l");
      Tensor x = x0.to(d).detach().set_requires_grad(true),
             w = w0.to(d).detach().set_requires_grad(true),
             b = b0.to(d).detach().set_requires_grad(true);
      Tensor y = amp::fp8_linear(x, w, b, *st, o);
      y.backward(gy.to(d));
      return Run{y, x.grad(), w.grad(), b.grad()};
    };
    const Run c = run(Device::cpu()), g = run(Device::cuda());
    // The same codes on both devices (scales from the same amaxes); only the sums differ: their
    // order (emulated recipes: 1e-5), and for the per-tensor recipes (cuBLASLt's fp8 GEMM) the
    // tensor cores' reduced precision within a k-group, up to 2^-10.7 of sum |terms| per
    // element (above), which cancelling terms (sum |terms| ~ sqrt(K) |sum| here) magnify in
    // relative terms: 2^-6. A wrong scale, operand or transposition is off by O(1).
    const std::string what = std::string(name_of(r)) + " " + o.accumulate.str();
    const bool native = o.per_tensor() && !o.accumulate.fast;
    const double tol = native ? std::ldexp(1.0, -6) : 1e-5;
    EXPECT_LT(rel(g.y, c.y), tol) << what;
    EXPECT_LT(rel(g.gx, c.gx), tol) << what;
    EXPECT_LT(rel(g.gw, c.gw), tol) << what;
    EXPECT_LT(rel(g.gb, c.gb), 1e-5) << what;
    std::printf("%s: relative difference cuda vs cpu: y %.3g, dx %.3g, dw %.3g\n", what.c_str(),
                rel(g.y, c.y), rel(g.gx, c.gx), rel(g.gw, c.gw));
  }
}

}  // namespace
}  // namespace mantissa::backend
