// Every bit pattern of the 16-, 8-, 6- and 4-bit formats decodes to the value the format's
// definition gives and re-encodes to the same bits.
#include <gtest/gtest.h>

#include <cmath>

#include "numerics/reference.h"

namespace mantissa {
namespace {

using testing::reference_decode;

class Exhaustive : public ::testing::TestWithParam<Format> {};

TEST_P(Exhaustive, DecodeMatchesDefinitionAndReencodes) {
  const Format f = GetParam();
  const FormatSpec s = format_spec(f);
  const uint32_t count = 1u << s.total_bits();
  int nans = 0, infs = 0, subnormals = 0;
  for (uint32_t b = 0; b < count; ++b) {
    const double want = reference_decode(f, b);
    const float got = decode(f, b);
    const bool negative = b & s.sign_bit();
    if (std::isnan(want)) {
      ++nans;
      ASSERT_TRUE(std::isnan(got)) << std::hex << "pattern 0x" << b;
      ASSERT_EQ(std::signbit(got), negative) << std::hex << "NaN sign of 0x" << b;
      const uint32_t again = encode(f, got);
      ASSERT_TRUE(std::isnan(reference_decode(f, again))) << std::hex << "0x" << b;
      ASSERT_EQ(bool(again & s.sign_bit()), negative);
      continue;
    }
    if (std::isinf(want)) ++infs;
    if (want != 0 && std::fabs(want) < format_info(f).min_normal) ++subnormals;
    ASSERT_EQ(double(got), want) << std::hex << "pattern 0x" << b;
    ASSERT_EQ(std::signbit(got), negative) << std::hex << "pattern 0x" << b;
    for (RoundingMode m : {RoundingMode::NearestEven, RoundingMode::TowardZero}) {
      ASSERT_EQ(encode(f, got, m), b) << std::hex << "pattern 0x" << b;
    }
    ASSERT_EQ(encode(f, double(got)), b) << std::hex << "from double, pattern 0x" << b;
  }
  // The census each definition implies.
  const uint32_t m = 1u << s.mantissa_bits;
  EXPECT_EQ(subnormals, s.is_scale() ? 0 : int(2 * (m - 1)));
  switch (s.nan) {
    case NanEncoding::Ieee:
      EXPECT_EQ(infs, 2);
      EXPECT_EQ(nans, int(2 * (m - 1)));
      break;
    case NanEncoding::AllOnes:
      EXPECT_EQ(infs, 0);
      EXPECT_EQ(nans, s.has_sign ? 2 : 1);
      break;
    case NanEncoding::None:
      EXPECT_EQ(infs, 0);
      EXPECT_EQ(nans, 0);
      break;
  }
}

// fp32 patterns into every one-byte format, in both deterministic modes and both overflows,
// against the value-table reference: every 1021st pattern (a prime stride, so every exponent and
// every residue of the low mantissa bits is met) — 4.2 million inputs per format.
// tools/reference/formats_exhaustive.py compares all 2^32 with ml_dtypes.
TEST_P(Exhaustive, StridedFloatsRoundAsTheReference) {
  const Format f = GetParam();
  if (format_info(f).storage_bytes != 1) GTEST_SKIP() << "the 16-bit formats: bulk_test";
  const testing::ReferenceRounder ref(f);
  const FormatSpec s = format_spec(f);
  for (uint64_t p = 0; p < (uint64_t(1) << 32); p += 1021) {
    const float x = std::bit_cast<float>(uint32_t(p));
    for (RoundingMode m : {RoundingMode::NearestEven, RoundingMode::TowardZero}) {
      const double want = ref.round(x, m);
      const uint32_t bits = encode(f, x, m);
      ASSERT_TRUE(testing::same_float(decode(f, bits), want))
          << std::hex << "x=0x" << p << " " << rounding_name(m) << " got 0x" << bits;
      // Saturation differs only where the reference overflows (or x is an infinity).
      const uint32_t sat = encode(f, x, m, Overflow::Saturate);
      const bool beyond =
          std::fabs(x) > format_info(f).max_finite && !std::isnan(x) && !(s.is_scale() && x < 0);
      if (beyond) {
        ASSERT_EQ(sat, s.max_finite_bits() | (std::signbit(x) ? s.sign_bit() : 0u))
            << std::hex << "x=0x" << p;
      } else {
        ASSERT_EQ(sat, bits) << std::hex << "x=0x" << p;
      }
    }
  }
}

TEST_P(Exhaustive, InfinityStaysInfinityUnderEveryMode) {
  const Format f = GetParam();
  const FormatSpec s = format_spec(f);
  for (RoundingMode m : {RoundingMode::NearestEven, RoundingMode::TowardZero}) {
    EXPECT_EQ(encode(f, INFINITY, m), s.inf_bits());
    EXPECT_EQ(encode(f, -INFINITY, m), s.inf_bits() | s.sign_bit());
    EXPECT_EQ(encode(f, INFINITY, m, Overflow::Saturate), s.max_finite_bits());
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Exhaustive,
                         ::testing::Values(Format::FP16, Format::BF16, Format::FP8_E4M3,
                                           Format::FP8_E5M2, Format::FP6_E2M3, Format::FP6_E3M2,
                                           Format::FP4_E2M1, Format::E8M0),
                         [](const auto& p) { return std::string(format_name(p.param)); });

TEST(ExhaustiveTf32, EveryPatternRoundTripsThroughTheContainer) {
  // tf32 has 2^19 patterns: all of them, through the fp32 container.
  for (uint32_t b = 0; b < (1u << 19); ++b) {
    const double want = reference_decode(Format::TF32, b);
    const float got = decode(Format::TF32, b);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
      continue;
    }
    ASSERT_EQ(double(got), want) << std::hex << b;
    ASSERT_EQ(std::bit_cast<uint32_t>(got), b << 13);
    ASSERT_EQ(encode(Format::TF32, got), b);
  }
}

}  // namespace
}  // namespace mantissa
