// Backend::copy_rounded on the CPU and the rounding cast built on it: every element must equal
// round.h's scalar encode() with the stream bits of its row-major position.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

// The raw storage bits of every element of t, row-major.
std::vector<uint32_t> bits_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const size_t es = c.element_size();
  std::vector<uint32_t> out(size_t(c.numel()));
  const char* p = static_cast<const char*>(c.data_ptr());
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t b = 0;
    std::memcpy(&b, p + i * es, es);  // little-endian: the low bytes
    out[i] = b;
  }
  return out;
}

// The expected bits: encode(format, v, ...) with element i drawing stream position index + i.
std::vector<uint32_t> expected_bits(const std::vector<double>& values, bool from_double, Format f,
                                    const RoundingOptions& r) {
  std::vector<uint32_t> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t rnd = r.mode == RoundingMode::Stochastic
                             ? random_bits(r.seed, r.offset, r.index + uint64_t(i))
                             : 0u;
    out[i] = from_double ? encode(f, values[i], r.mode, r.overflow, rnd)
                         : encode(f, float(values[i]), r.mode, r.overflow, rnd);
  }
  return out;
}

Tensor rounded(const Tensor& src, DType dtype, const RoundingOptions& r) {
  Tensor dst = Tensor::empty(src.shape(), dtype);
  backend::cpu_backend().copy_rounded(src, dst, r);
  return dst;
}

const RoundingOptions kStochastic{.mode = RoundingMode::Stochastic, .seed = 1234, .offset = 7};

struct Target {
  DType dtype;
  Format format;
};
const Target kTargets[] = {{DType::BF16, Format::BF16},
                           {DType::F16, Format::FP16},
                           {DType::FP8_E4M3, Format::FP8_E4M3},
                           {DType::FP8_E5M2, Format::FP8_E5M2}};

// More than one chunk and enough elements for the threaded path.
constexpr int64_t kN = 40000;

TEST(CopyRounded, NearestEvenIsCopy) {
  const Tensor x = Tensor::normal({kN}, 0.0, 100.0, 3);
  for (const Target& t : kTargets) {
    EXPECT_EQ(bits_of(rounded(x, t.dtype, {})), bits_of(x.to(t.dtype))) << dtype_name(t.dtype);
  }
}

TEST(CopyRounded, StochasticFromF32MatchesScalarEncode) {
  const Tensor x = Tensor::normal({kN}, 0.0, 3.0, 5);
  const std::vector<double> v = x.to_vector<double>();
  for (const Target& t : kTargets) {
    for (const uint64_t index : {uint64_t(0), uint64_t(3), uint64_t(1) << 40}) {
      RoundingOptions r = kStochastic;
      r.index = index;
      EXPECT_EQ(bits_of(rounded(x, t.dtype, r)), expected_bits(v, false, t.format, r))
          << dtype_name(t.dtype) << " index " << index;
    }
  }
}

TEST(CopyRounded, StochasticFromF64MatchesScalarEncodeFromDouble) {
  const Tensor x = Tensor::normal({kN}, 0.0, 3.0, 6, DType::F64);
  const std::vector<double> v = x.to_vector<double>();
  for (const Target& t : kTargets) {
    EXPECT_EQ(bits_of(rounded(x, t.dtype, kStochastic)),
              expected_bits(v, true, t.format, kStochastic))
        << dtype_name(t.dtype);
  }
  // f64 into f32 narrows too: rounded onto fp32's grid, once.
  EXPECT_EQ(bits_of(rounded(x, DType::F32, kStochastic)),
            expected_bits(v, true, Format::FP32, kStochastic));
}

TEST(CopyRounded, IntegerSourceRoundsFromDouble) {
  // 2049 lies between the f16 values 2048 and 2050.
  const Tensor x = Tensor::full({1000}, 2049.0, DType::I64);
  const std::vector<double> v = x.to_vector<double>();
  EXPECT_EQ(bits_of(rounded(x, DType::F16, kStochastic)),
            expected_bits(v, true, Format::FP16, kStochastic));
}

TEST(CopyRounded, StridedSourceAndDestinationFollowRowMajorOrder) {
  const Tensor base = Tensor::normal({70, 64}, 0.0, 2.0, 8);
  const Tensor xt = base.t();  // (64, 70), not contiguous
  ASSERT_FALSE(xt.is_contiguous());
  const std::vector<double> v = xt.contiguous().to_vector<double>();
  for (const Target& t : kTargets) {
    const std::vector<uint32_t> want = expected_bits(v, false, t.format, kStochastic);
    EXPECT_EQ(bits_of(rounded(xt, t.dtype, kStochastic)), want) << dtype_name(t.dtype);
    // A strided destination receives the same values at the same logical positions.
    Tensor dst = Tensor::empty({70, 64}, t.dtype).t();
    ASSERT_FALSE(dst.is_contiguous());
    backend::cpu_backend().copy_rounded(xt, dst, kStochastic);
    EXPECT_EQ(bits_of(dst), want) << dtype_name(t.dtype);
    // A half source (bf16 into fp8) goes through the same gather.
    const Tensor h = xt.to(DType::BF16);
    if (t.dtype != DType::BF16) {
      EXPECT_EQ(bits_of(rounded(h, t.dtype, kStochastic)),
                expected_bits(h.to_vector<double>(), false, t.format, kStochastic))
          << dtype_name(t.dtype);
    }
  }
}

TEST(CopyRounded, IndexShiftsTheStream) {
  const Tensor x = Tensor::normal({kN}, 0.0, 1.0, 9);
  const std::vector<uint32_t> full = bits_of(rounded(x, DType::BF16, kStochastic));
  RoundingOptions r = kStochastic;
  r.index = 5;
  const std::vector<uint32_t> tail = bits_of(rounded(x.narrow(0, 5, kN - 5), DType::BF16, r));
  ASSERT_EQ(tail.size(), full.size() - 5);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), full.begin() + 5));
  // A different offset draws different bits.
  RoundingOptions other = kStochastic;
  other.offset += 1;
  EXPECT_NE(bits_of(rounded(x, DType::BF16, other)), full);
}

TEST(CopyRounded, StochasticRoundingIsUnbiased) {
  // 1 + 2^-9 lies a quarter of the way from 1 to the next bf16 value 1 + 2^-7.
  const double value = 1.0 + std::ldexp(1.0, -9);
  const int64_t n = 1 << 18;
  const Tensor x = Tensor::full({n}, value);
  const Tensor nearest = rounded(x, DType::BF16, {});
  EXPECT_EQ(mean(nearest.to(DType::F64)).item(), 1.0);
  const double m = mean(rounded(x, DType::BF16, kStochastic).to(DType::F64)).item();
  // Each draw has standard deviation 2^-7 * sqrt(0.25 * 0.75); five standard errors.
  const double se = std::ldexp(1.0, -7) * std::sqrt(0.25 * 0.75) / std::sqrt(double(n));
  EXPECT_NEAR(m, value, 5 * se);
}

TEST(CopyRounded, TruncationAndSaturation) {
  const Tensor x =
      Tensor::from_vector(std::vector<float>{1000.f, -1000.f, 1.2f, -1.2f, INFINITY}, {5});
  const RoundingOptions r{.mode = RoundingMode::TowardZero, .overflow = Overflow::Saturate};
  const std::vector<double> got = rounded(x, DType::FP8_E4M3, r).to_vector<double>();
  EXPECT_EQ(got, (std::vector<double>{448, -448, 1.125, -1.125, 448}));
  // Into integers: truncation, as copy().
  EXPECT_EQ(rounded(x.narrow(0, 0, 4), DType::I32, kStochastic).to_vector<int32_t>(),
            (std::vector<int32_t>{1000, -1000, 1, -1}));
  // Widening stays exact whatever the options say.
  const Tensor h = Tensor::from_vector(std::vector<float>{INFINITY, 1.5f}, {2}).to(DType::F16);
  EXPECT_EQ(rounded(h, DType::F32, r).to_vector<float>(), (std::vector<float>{INFINITY, 1.5f}));
}

TEST(CopyRounded, CastOpRoundsAndDifferentiates) {
  Tensor x = Tensor::normal({4, 300}, 0.0, 2.0, 10);
  x.set_requires_grad();
  const Tensor y = cast(x, DType::BF16, kStochastic);
  EXPECT_EQ(y.dtype(), DType::BF16);
  EXPECT_EQ(bits_of(y), expected_bits(x.to_vector<double>(), false, Format::BF16, kStochastic));
  // The gradient comes back in x's dtype.
  y.backward(Tensor::full({4, 300}, 0.5, DType::BF16));
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::F32);
  for (const float g : x.grad().to_vector<float>())
    ASSERT_EQ(g, 0.5f);
  // Options that round as cast() does give cast()'s result.
  EXPECT_EQ(bits_of(cast(x.detach(), DType::F16, RoundingOptions{})),
            bits_of(cast(x.detach(), DType::F16)));
}

}  // namespace
}  // namespace mantissa
