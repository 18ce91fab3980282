// The fast accumulator of fp8 GEMMs (fp8_math.h, backend op fast_accumulate_gemm): each step
// against an independent reference (the exact sum in float64, truncated to 13 bits after the
// leading one), the kernel's vector build against its scalar one bit for bit, promotion against
// plain fp32 sums, and the swamping it models.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/vector_isa.h"
#include "backend/fp8_math.h"
#include "forced_isa.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::backend {
namespace {

// x (exact in float64) truncated toward zero to 14 significant bits (fp32's exponent range, far
// from its ends here).
double truncate13(double x) {
  if (x == 0) return 0;
  const int e = std::ilogb(x);
  return std::ldexp(std::trunc(std::ldexp(x, kFastAccumulatorBits - e)), e - kFastAccumulatorBits);
}

TEST(FastAccumulate, EachStepIsTheExactSumTruncated) {
  // Accumulators on the 13-bit grid and products of two E4M3 values, over 40 binades: the exact
  // sum fits float64, so the reference is independent of the TwoSum the kernel uses.
  std::mt19937_64 g(7);
  std::uniform_int_distribution<int> mant(-16383, 16383), pmant(-255, 255), ex(-20, 20);
  for (int i = 0; i < 200000; ++i) {
    const float acc = float(std::ldexp(double(mant(g)), ex(g)));
    const float p = float(std::ldexp(double(pmant(g)), ex(g)));
    ASSERT_EQ(double(fast_accumulate(acc, p)), truncate13(double(acc) + double(p)))
        << acc << " + " << p;
  }
  // Where fp32 rounds the sum onto the grid but the exact sum is just inside it.
  EXPECT_EQ(fast_accumulate(1.0f, -std::ldexp(1.0f, -40)), 1.0f - std::ldexp(1.0f, -13) / 2);
  EXPECT_EQ(fast_accumulate(-3.0f, std::ldexp(1.0f, -30)), -3.0f + std::ldexp(1.0f, -12));
  EXPECT_EQ(fast_accumulate(1.0f, std::ldexp(1.0f, -40)), 1.0f);
  // Subnormal steps, inf and NaN.
  EXPECT_EQ(fast_accumulate(0.0f, std::ldexp(1.0f, -149)), 0.0f);  // below the grid's 2^-139
  // Beyond fp32's range: the largest value, as rounding toward zero gives; inf stays inf.
  EXPECT_EQ(std::bit_cast<uint32_t>(fast_accumulate(3e38f, 3e38f)), 0x7f7ffc00u);
  EXPECT_EQ(std::bit_cast<uint32_t>(fast_accumulate(-3e38f, -3e38f)), 0xff7ffc00u);
  EXPECT_TRUE(std::isinf(fast_accumulate(1.0f, INFINITY)));
  EXPECT_TRUE(std::isnan(fast_accumulate(1.0f, NAN)));
}

// a (M, K) and b (N, K) of E4M3 values as bf16, spread over the format's range.
Tensor e4m3_values(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  std::uniform_int_distribution<int> ex(-6, 8);
  std::vector<double> v(size_t(rows * cols));
  for (double& x : v)
    x = std::ldexp(mant(g), ex(g));
  return Tensor::from_vector(v, {rows, cols}).to(DType::FP8_E4M3).to(DType::BF16);
}

Tensor ones(int64_t rows, int64_t cols) {
  return Tensor::full({rows, cols}, 1.0, DType::BF16);
}

Tensor gemm(const Tensor& a, const Tensor& b, std::optional<int64_t> promote, int64_t bk = 0) {
  Backend& be = backend_for(Device::cpu());
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  bk = bk > 0 ? bk : std::max<int64_t>(K, 1);
  const int64_t S = (K + bk - 1) / bk;
  const Tensor sa = Tensor::full({1, S}, 1.0, DType::F32),
               sb = Tensor::full({1, S}, 1.0, DType::F32);
  Tensor out = Tensor::empty({M, N}, DType::F32);
  if (promote) {
    be.fast_accumulate_gemm(a, sa, M, b, sb, N, bk, *promote, nullptr, out);
  } else {
    be.block_scaled_gemm(a, sa, M, b, sb, N, bk, nullptr, out);
  }
  return out;
}

// The narrow accumulator stops growing once a product is below its last place: 20000 ones sum to
// 2^14 (the accumulator's ulp there is 2, and 16384 + 1 truncates back), where fp32 sums, and
// the same accumulator promoted every 128 products, give 20000.
TEST(FastAccumulate, SwampingAndWhatPromotionBuys) {
  const Tensor a = ones(3, 20000), b = ones(70, 20000);
  for (const float v : gemm(a, b, std::nullopt).to_vector<float>())
    ASSERT_EQ(v, 20000.0f);
  for (const float v : gemm(a, b, 0).to_vector<float>())
    ASSERT_EQ(v, 16384.0f);
  for (const float v : gemm(a, b, 128).to_vector<float>())
    ASSERT_EQ(v, 20000.0f);
  // A K slice of scales promotes too: slices of 4096 give 4096 * 4 + 3616 exactly.
  for (const float v : gemm(a, b, 0, 4096).to_vector<float>())
    ASSERT_EQ(v, 20000.0f);
}

TEST(FastAccumulate, PromotingEveryProductIsTheSequentialFp32Sum) {
  const int64_t M = 5, N = 37, K = 300;
  const Tensor a = e4m3_values(M, K, 1), b = e4m3_values(N, K, 2);
  const std::vector<float> va = a.to(DType::F32).to_vector<float>(),
                           vb = b.to(DType::F32).to_vector<float>();
  const std::vector<float> got = gemm(a, b, 1).to_vector<float>();
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k)
        s = s + va[size_t(m * K + k)] * vb[size_t(n * K + k)];
      ASSERT_EQ(got[size_t(m * N + n)], s) << m << ", " << n;
    }
  }
}

// The GEMM against the model summed here element by element, in every vector build, with
// transposed operands, ragged widths (tails of the 64-wide vector blocks) and slices.
TEST(FastAccumulate, TheKernelIsTheModelInEveryVectorBuild) {
  const int64_t M = 7, N = 83, K = 517;
  const Tensor a = e4m3_values(M, K, 3), bt = e4m3_values(K, N, 4);
  const Tensor b = bt.t();  // (N, K) with K outer
  const std::vector<float> va = a.to(DType::F32).to_vector<float>(),
                           vb = bt.to(DType::F32).to_vector<float>();
  for (const int64_t promote : {int64_t(0), int64_t(1), int64_t(32), int64_t(128)}) {
    for (const int64_t bk : {int64_t(0), int64_t(128)}) {
      std::vector<float> want(size_t(M * N));
      const int64_t width = bk > 0 ? bk : K;
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          float total = 0;
          for (int64_t k0 = 0; k0 < K; k0 += width) {
            const int64_t kl = std::min(width, K - k0);
            const float part = fast_accumulate_sum(kl, promote, [&](int64_t k) {
              return va[size_t(m * K + k0 + k)] * vb[size_t((k0 + k) * N + n)];
            });
            total = k0 == 0 ? part : total + part;
          }
          want[size_t(m * N + n)] = total;
        }
      }
      for (const cpu::VectorIsa isa :
           {cpu::VectorIsa::Baseline, cpu::VectorIsa::Avx2, cpu::VectorIsa::Avx512}) {
        if (!cpu::vector_isa_supported(isa)) continue;
        cpu::ForcedIsa forced(isa);
        EXPECT_EQ(gemm(a, b, promote, bk).to_vector<float>(), want)
            << "promote " << promote << ", slices of " << bk << ", " << cpu::vector_isa_name(isa);
      }
    }
  }
}

// What the accumulator costs as K grows: the largest error of each output against float64 sums of
// the same products, relative to sum |terms| (the measure "What exactly is computed" in
// docs/fp8.md uses for the H200's fp8 GEMM), for E4M3 values of both signs over 15 binades.
// Without promotion the error grows with K (the accumulator's last place grows with the sum);
// promoted every 128 products it stays at the 128-product level.
TEST(FastAccumulate, ErrorGrowsWithKAndPromotionBoundsIt) {
  const int64_t M = 16, N = 16;
  std::vector<double> fast_err, promoted_err, fp32_err;
  for (const int64_t K :
       {int64_t(128), int64_t(256), int64_t(1024), int64_t(4096), int64_t(16384)}) {
    const Tensor a = e4m3_values(M, K, 10 + uint64_t(K)), b = e4m3_values(N, K, 20 + uint64_t(K));
    const std::vector<double> va = a.to(DType::F64).to_vector<double>(),
                              vb = b.to(DType::F64).to_vector<double>();
    const std::vector<float> fast = gemm(a, b, 0).to_vector<float>(),
                             promoted = gemm(a, b, 128).to_vector<float>(),
                             fp32 = gemm(a, b, std::nullopt).to_vector<float>();
    double ef = 0, ep = 0, e32 = 0;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact += va[size_t(m * K + k)] * vb[size_t(n * K + k)];
          mag += std::fabs(va[size_t(m * K + k)] * vb[size_t(n * K + k)]);
        }
        const size_t i = size_t(m * N + n);
        ef = std::max(ef, std::fabs(fast[i] - exact) / mag);
        ep = std::max(ep, std::fabs(promoted[i] - exact) / mag);
        e32 = std::max(e32, std::fabs(fp32[i] - exact) / mag);
      }
    }
    std::printf(
        "K %6lld: largest error / sum|terms|: fast %.2e (2^%.1f), fast:128 %.2e (2^%.1f), "
        "fp32 %.2e\n",
        static_cast<long long>(K), ef, std::log2(ef), ep, std::log2(ep), e32);
    fast_err.push_back(ef);
    promoted_err.push_back(ep);
    fp32_err.push_back(e32);
  }
  EXPECT_GT(fast_err.back(), 8 * fast_err.front());
  EXPECT_LT(promoted_err.back(), 2 * promoted_err.front());
  for (size_t i = 0; i < fast_err.size(); ++i) {
    EXPECT_LE(promoted_err[i], fast_err[i] * 1.0001);
    EXPECT_LT(fp32_err[i], promoted_err[i]);
  }
}

}  // namespace
}  // namespace mantissa::backend
