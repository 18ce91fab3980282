// float -> format at the places rounding goes wrong: ties, the overflow threshold, the subnormal
// boundaries, zeros, inf and NaN — for every format and rounding mode.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "numerics/reference.h"

namespace mantissa {
namespace {

using testing::ReferenceRounder;
using testing::same_float;

constexpr RoundingMode kRne = RoundingMode::NearestEven;
constexpr RoundingMode kRtz = RoundingMode::TowardZero;
constexpr RoundingMode kSr = RoundingMode::Stochastic;

uint32_t enc(Format f, float x, RoundingMode m = kRne, Overflow o = Overflow::Infinity) {
  return encode(f, x, m, o);
}

TEST(RoundingFp16, Ties) {
  const float one_half_ulp = 1.0f + std::ldexp(1.0f, -11);                  // between 1 and 1+2^-10
  EXPECT_EQ(enc(Format::FP16, one_half_ulp), 0x3c00u);                      // to even (down)
  EXPECT_EQ(enc(Format::FP16, 1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02u);  // to even (up)
  EXPECT_EQ(enc(Format::FP16, -one_half_ulp), 0xbc00u);
  EXPECT_EQ(enc(Format::FP16, std::nextafter(one_half_ulp, 2.0f)), 0x3c01u);
  EXPECT_EQ(enc(Format::FP16, std::nextafter(one_half_ulp, 2.0f), kRtz), 0x3c00u);
  EXPECT_EQ(enc(Format::FP16, 1.0f + 3 * std::ldexp(1.0f, -11), kRtz), 0x3c01u);
  // Not ties away from zero: 2.5 ulp rounds to 2, not 3.
  EXPECT_EQ(enc(Format::FP16, 1.0f + 5 * std::ldexp(1.0f, -11)), 0x3c02u);
}

TEST(RoundingFp16, OverflowThreshold) {
  EXPECT_EQ(enc(Format::FP16, 65504.0f), 0x7bffu);
  EXPECT_EQ(enc(Format::FP16, std::nextafter(65520.0f, 0.0f)), 0x7bffu);  // just below the tie
  EXPECT_EQ(enc(Format::FP16, 65520.0f), 0x7c00u);  // the tie goes to even: inf
  EXPECT_EQ(enc(Format::FP16, -65520.0f), 0xfc00u);
  EXPECT_EQ(enc(Format::FP16, 65520.0f, kRtz), 0x7bffu);  // IEEE: RTZ never makes inf
  EXPECT_EQ(enc(Format::FP16, 1e30f, kRtz), 0x7bffu);
  EXPECT_EQ(enc(Format::FP16, 1e30f, kRne, Overflow::Saturate), 0x7bffu);
  EXPECT_EQ(enc(Format::FP16, -1e30f, kRne, Overflow::Saturate), 0xfbffu);
  EXPECT_EQ(enc(Format::FP16, FLT_MAX), 0x7c00u);
}

TEST(RoundingFp16, SubnormalBoundaries) {
  const float min_sub = std::ldexp(1.0f, -24);
  EXPECT_EQ(enc(Format::FP16, min_sub), 0x0001u);
  EXPECT_EQ(enc(Format::FP16, min_sub / 2), 0x0000u);   // tie between 0 and 1: even
  EXPECT_EQ(enc(Format::FP16, -min_sub / 2), 0x8000u);  // keeps the sign
  EXPECT_EQ(enc(Format::FP16, std::nextafter(min_sub / 2, 1.0f)), 0x0001u);
  EXPECT_EQ(enc(Format::FP16, 3 * min_sub / 2), 0x0002u);    // tie between 1 and 2: even
  EXPECT_EQ(enc(Format::FP16, 1023.5f * min_sub), 0x0400u);  // largest subnormal + half: normal
  EXPECT_EQ(enc(Format::FP16, 1023.5f * min_sub, kRtz), 0x03ffu);
  EXPECT_EQ(enc(Format::FP16, std::ldexp(1.0f, -14)), 0x0400u);  // min normal
  EXPECT_EQ(enc(Format::FP16, FLT_TRUE_MIN), 0x0000u);           // fp32 subnormal
  EXPECT_EQ(enc(Format::FP16, -FLT_TRUE_MIN), 0x8000u);
}

TEST(RoundingSpecials, ZerosInfNanEveryFormat) {
  for (const auto& info : kFormatTable) {
    const Format f = info.format;
    const FormatSpec s = info.spec;
    SCOPED_TRACE(std::string(info.name));
    const float snan = std::bit_cast<float>(0x7f800001u);
    for (RoundingMode m : {kRne, kRtz, kSr}) {
      EXPECT_EQ(encode(f, NAN, m, Overflow::Saturate), encode(f, NAN, m));
      EXPECT_EQ(encode(f, INFINITY, m), s.inf_bits());
      if (s.is_scale()) {  // e8m0: no zero and no sign: both zeros, -inf and NaN are its NaN
        for (float x : {0.0f, -0.0f, -INFINITY, NAN, -NAN, snan})
          EXPECT_EQ(encode(f, x, m), s.quiet_nan_bits()) << x;
        EXPECT_EQ(encode(f, INFINITY, m, Overflow::Saturate), s.max_finite_bits());
        continue;
      }
      EXPECT_EQ(encode(f, 0.0f, m), 0u);
      EXPECT_EQ(encode(f, -0.0f, m), s.sign_bit());
      EXPECT_EQ(encode(f, -INFINITY, m, Overflow::Saturate), s.max_finite_bits() | s.sign_bit());
      const uint32_t pos_nan = encode(f, NAN, m), neg_nan = encode(f, -NAN, m);
      if (!s.has_nan()) {  // fp6/fp4: a NaN becomes the zero of the other sign (ml_dtypes)
        EXPECT_EQ(pos_nan, s.sign_bit());
        EXPECT_EQ(neg_nan, 0u);
        EXPECT_EQ(encode(f, snan, m), s.sign_bit());
        continue;
      }
      EXPECT_TRUE(std::isnan(decode(f, pos_nan)));
      EXPECT_TRUE(std::isnan(decode(f, neg_nan)));
      EXPECT_FALSE(std::signbit(decode(f, pos_nan)));
      EXPECT_TRUE(std::signbit(decode(f, neg_nan)));
      // A signalling NaN whose payload lies only in dropped bits must stay NaN, not become inf.
      EXPECT_TRUE(std::isnan(decode(f, encode(f, snan, m))));
    }
  }
}

TEST(RoundingBf16, Cases) {
  EXPECT_EQ(enc(Format::BF16, 1.0f + std::ldexp(1.0f, -8)), 0x3f80u);  // tie down to even
  EXPECT_EQ(enc(Format::BF16, 1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82u);
  EXPECT_EQ(enc(Format::BF16, FLT_MAX), 0x7f80u);
  EXPECT_EQ(enc(Format::BF16, FLT_MAX, kRtz), 0x7f7fu);
  EXPECT_EQ(enc(Format::BF16, FLT_MAX, kRne, Overflow::Saturate), 0x7f7fu);
  EXPECT_EQ(enc(Format::BF16, std::ldexp(1.0f, -133)), 0x0001u);  // bf16 min subnormal
  EXPECT_EQ(enc(Format::BF16, std::ldexp(1.0f, -134)), 0x0000u);  // half of it: tie to 0
  EXPECT_EQ(enc(Format::BF16, std::ldexp(3.0f, -135)), 0x0001u);  // 0.75: up
  EXPECT_EQ(enc(Format::BF16, 3.14159265f), 0x4049u);
}

TEST(RoundingFp8, E4m3) {
  const Format f = Format::FP8_E4M3;
  EXPECT_EQ(enc(f, 448.0f), 0x7eu);
  EXPECT_EQ(enc(f, 464.0f), 0x7eu);  // tie between 448 (even) and 480 (the NaN pattern)
  EXPECT_EQ(enc(f, std::nextafter(464.0f, 1e9f)), 0x7fu);  // beyond: NaN, as ml_dtypes does
  EXPECT_EQ(enc(f, -1000.0f), 0xffu);
  EXPECT_EQ(enc(f, 1000.0f, kRtz), 0x7eu);
  EXPECT_EQ(enc(f, 1000.0f, kRne, Overflow::Saturate), 0x7eu);
  EXPECT_EQ(enc(f, -INFINITY), 0xffu);
  EXPECT_EQ(enc(f, std::ldexp(1.0f, -9)), 0x01u);
  EXPECT_EQ(enc(f, std::ldexp(1.0f, -10)), 0x00u);
  EXPECT_EQ(enc(f, std::ldexp(3.0f, -11)), 0x01u);
  EXPECT_EQ(enc(f, 0.3f), 0x2au);  // 0.3 -> 0.3125 = 1.010 * 2^-2
}

TEST(RoundingFp8, E5m2) {
  const Format f = Format::FP8_E5M2;
  EXPECT_EQ(enc(f, 57344.0f), 0x7bu);
  EXPECT_EQ(enc(f, 61440.0f), 0x7cu);  // tie between 57344 (odd) and 65536: up to inf
  EXPECT_EQ(enc(f, std::nextafter(61440.0f, 0.0f)), 0x7bu);
  EXPECT_EQ(enc(f, 1e6f, kRtz), 0x7bu);
  EXPECT_EQ(enc(f, std::ldexp(1.0f, -16)), 0x01u);
  EXPECT_EQ(enc(f, std::ldexp(1.0f, -17)), 0x00u);
}

// The OCP Microscaling formats at their edges, as ml_dtypes 0.7 gives them (measured).
TEST(RoundingMx, Fp4E2m1) {
  const Format f = Format::FP4_E2M1;
  EXPECT_EQ(enc(f, 6.0f), 0x7u);
  EXPECT_EQ(enc(f, 100.0f), 0x7u);  // no inf: overflow saturates
  EXPECT_EQ(enc(f, INFINITY), 0x7u);
  EXPECT_EQ(enc(f, -INFINITY), 0xfu);
  EXPECT_EQ(enc(f, NAN), 0x8u);  // no NaN: a zero of the other sign
  EXPECT_EQ(enc(f, -NAN), 0x0u);
  EXPECT_EQ(enc(f, 0.25f), 0x0u);  // tie between 0 (even) and 0.5
  EXPECT_EQ(enc(f, 0.75f), 0x2u);  // tie between 0.5 and 1 (even)
  EXPECT_EQ(enc(f, 5.0f), 0x6u);   // tie between 4 (even) and 6
  EXPECT_EQ(enc(f, 5.0f, kRtz), 0x6u);
  EXPECT_EQ(enc(f, 5.5f, kRtz), 0x6u);
  EXPECT_EQ(enc(f, -2.9f), 0xdu);  // -3
  EXPECT_EQ(decode(f, 0x1u), 0.5f);
  EXPECT_EQ(format_info(f).max_finite, 6.0);
  EXPECT_EQ(format_info(f).min_subnormal, 0.5);
}

TEST(RoundingMx, Fp6) {
  EXPECT_EQ(format_info(Format::FP6_E2M3).max_finite, 7.5);
  EXPECT_EQ(format_info(Format::FP6_E2M3).min_subnormal, 0.125);
  EXPECT_EQ(format_info(Format::FP6_E3M2).max_finite, 28.0);
  EXPECT_EQ(format_info(Format::FP6_E3M2).min_subnormal, 0.0625);
  EXPECT_EQ(enc(Format::FP6_E2M3, 100.0f), 0x1fu);
  EXPECT_EQ(enc(Format::FP6_E2M3, 0.25f), 0x02u);
  EXPECT_EQ(enc(Format::FP6_E2M3, 5.0f), 0x1au);
  EXPECT_EQ(enc(Format::FP6_E2M3, NAN), 0x20u);
  EXPECT_EQ(enc(Format::FP6_E3M2, 100.0f), 0x1fu);
  EXPECT_EQ(enc(Format::FP6_E3M2, 0.25f), 0x04u);
  EXPECT_EQ(enc(Format::FP6_E3M2, 5.0f), 0x15u);
  EXPECT_EQ(enc(Format::FP6_E3M2, -INFINITY), 0x3fu);
}

TEST(RoundingMx, E8m0) {
  const Format f = Format::E8M0;
  EXPECT_EQ(enc(f, 1.0f), 127u);
  EXPECT_EQ(enc(f, 1.5f), 128u);  // ties go up: the kept significand (1) is odd
  EXPECT_EQ(enc(f, 3.0f), 129u);
  EXPECT_EQ(enc(f, 1.49f), 127u);
  EXPECT_EQ(enc(f, 3.0f, kRtz), 128u);
  EXPECT_EQ(enc(f, 1e-9f), 97u);                  // 2^-30
  EXPECT_EQ(enc(f, std::ldexp(1.0f, -128)), 0u);  // no zero: clamps up to 2^-127
  EXPECT_EQ(enc(f, 1e-45f), 0u);
  EXPECT_EQ(enc(f, std::ldexp(1.0f, 127)), 254u);
  EXPECT_EQ(enc(f, 3e38f), 255u);  // beyond 2^127 (ties up past it): NaN
  EXPECT_EQ(enc(f, 3e38f, kRne, Overflow::Saturate), 254u);
  EXPECT_EQ(enc(f, 3e38f, kRtz), 254u);
  for (float x : {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN})
    EXPECT_EQ(enc(f, x), 255u) << x;
  EXPECT_EQ(decode(f, 0u), std::ldexp(1.0f, -127));
  EXPECT_EQ(decode(f, 254u), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(decode(f, 255u)));
  EXPECT_EQ(format_info(f).min_normal, std::ldexp(1.0, -127));
  EXPECT_EQ(format_spec(f).total_bits(), 8);
}

// Everything above, and more, against the independent reference: powers of two, their
// neighbours, ties and near-ties around every binade of each format.
TEST(RoundingReference, EdgeValuesEveryFormat) {
  for (Format f : {Format::TF32, Format::FP16, Format::BF16, Format::FP8_E4M3, Format::FP8_E5M2,
                   Format::FP6_E2M3, Format::FP6_E3M2, Format::FP4_E2M1, Format::E8M0}) {
    const ReferenceRounder ref(f);
    const FormatInfo& info = format_info(f);
    SCOPED_TRACE(std::string(info.name));
    std::vector<float> xs;
    for (int e = std::ilogb(info.min_subnormal) - 3; e <= std::ilogb(info.max_finite) + 2; ++e) {
      for (float m : {1.0f, 1.5f, 1.25f, 1.75f}) {
        const float base = std::ldexp(m, e);
        const float half_ulp = std::ldexp(1.0f, e - info.spec.mantissa_bits - 1);
        for (float x : {base, base + half_ulp, base - half_ulp / 2, base + 3 * half_ulp}) {
          xs.push_back(x);
          xs.push_back(std::nextafter(x, 0.0f));
          xs.push_back(std::nextafter(x, INFINITY));
        }
      }
    }
    xs.push_back(float(info.max_finite));
    for (float x : xs) {
      for (float sx : {x, -x}) {
        for (RoundingMode m : {kRne, kRtz}) {
          const double want = ref.round(sx, m);
          const double got = decode(f, encode(f, sx, m));
          ASSERT_TRUE(same_float(got, want))
              << sx << " (" << std::hexfloat << sx << ") mode " << rounding_name(m) << ": got "
              << got << " want " << want;
        }
      }
    }
  }
}

TEST(RoundingDouble, RoundsOnceNotTwice) {
  // Just above a fp16 tie, but close enough that float rounding lands exactly on the tie.
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  EXPECT_EQ(encode(Format::FP16, float(x)), 0x3c00u);  // through float: double rounding
  EXPECT_EQ(encode(Format::FP16, x), 0x3c01u);         // directly: correct
  EXPECT_EQ(encode(Format::FP32, 12.31), 0x4144f5c3u);
  EXPECT_EQ(encode(Format::FP32, 1e300), 0x7f800000u);
  EXPECT_EQ(encode(Format::FP32, 1e300, kRtz), 0x7f7fffffu);
  EXPECT_EQ(encode(Format::FP32, 1e-300), 0u);
  EXPECT_EQ(encode(Format::FP32, std::ldexp(1.0, -149)), 1u);
  EXPECT_EQ(encode(Format::FP8_E4M3, -1e-300), 0x80u);
}

TEST(RoundingDouble, MatchesTheCompilersFloatConversion) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const double x = std::bit_cast<double>(rng());
    if (std::isnan(x)) continue;
    const float want = static_cast<float>(x);  // IEEE round to nearest even
    ASSERT_EQ(encode(Format::FP32, x), std::bit_cast<uint32_t>(want)) << std::hexfloat << x;
  }
}

TEST(RoundingStochastic, ExtremeRandomBitsAreTheDirectedModes) {
  // random_bits == 0 always rounds an inexact value away from zero; 0xffffffff never does.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-300.0f, 300.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = dist(rng);
    for (Format f :
         {Format::TF32, Format::FP16, Format::BF16, Format::FP8_E4M3, Format::FP8_E5M2}) {
      const uint32_t down = encode(f, x, kRtz);
      ASSERT_EQ(encode(f, x, kSr, Overflow::Infinity, 0xffffffffu), down);
      const bool exact = decode(f, down) == x;
      const uint32_t up = encode(f, x, kSr, Overflow::Infinity, 0);
      ASSERT_EQ(up, exact ? down : down + 1) << x << " " << format_name(f);
    }
  }
}

}  // namespace
}  // namespace mantissa
