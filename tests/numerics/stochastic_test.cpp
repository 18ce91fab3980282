// Stochastic rounding: unbiased (the mean of many roundings is the input), reproducible (one
// seed, one result), and the Philox generator it draws from is the published one.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "mantissa/numerics/convert.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"

namespace mantissa {
namespace {

TEST(Philox, KnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (PhiloxBlock{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

struct Case {
  Format format;
  float x;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << format_name(c.format) << ' ' << c.x;
}

class StochasticMean : public ::testing::TestWithParam<Case> {};

TEST_P(StochasticMean, IsTheInputWithinTheStatisticalBound) {
  const auto [f, x] = GetParam();
  constexpr size_t kN = 1'000'000;
  std::vector<float> v(kN, x);
  round_in_place(f, v.data(), kN, {.mode = RoundingMode::Stochastic, .seed = 1234, .offset = 0});
  const double lo = decode(f, encode(f, x, RoundingMode::TowardZero));
  const double gap = std::fabs(
      double(decode(f, encode(f, x, RoundingMode::Stochastic, Overflow::Infinity, 0))) - lo);
  double sum = 0;
  for (float r : v) {
    ASSERT_TRUE(double(r) == lo || std::fabs(double(r) - lo) == gap) << r;  // one of the two
    sum += r;
  }
  const double mean = sum / kN;
  // Each draw is lo + gap * Bernoulli(p): sd <= gap / 2. Five sigma, plus the 2^-32 quantum
  // of the threshold.
  const double bound = 5 * (gap / 2) / std::sqrt(double(kN)) + gap * 0x1p-32;
  EXPECT_NEAR(mean, double(x), bound) << format_name(f) << " x=" << x;
}

INSTANTIATE_TEST_SUITE_P(
    Formats, StochasticMean,
    ::testing::Values(Case{Format::BF16, 1.00390625f + 0.001f}, Case{Format::BF16, -3.14159265f},
                      Case{Format::FP16, 0.1f}, Case{Format::FP16, 1e-6f /* subnormal */},
                      Case{Format::FP16, std::ldexp(1.0f, -30) /* far below min subnormal */},
                      Case{Format::TF32, 1.0f + 1e-4f}, Case{Format::FP8_E4M3, 0.3f},
                      Case{Format::FP8_E4M3, 300.0f}, Case{Format::FP8_E5M2, -1000.5f},
                      Case{Format::BF16, std::ldexp(1.1f, -130) /* bf16 subnormal */}),
    [](const auto& p) {
      return std::string(format_name(p.param.format)) + "_" + std::to_string(p.index);
    });

TEST(Stochastic, SameSeedSameBitsOtherSeedOtherBits) {
  std::vector<float> src(100003);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = std::sin(float(i)) * 3.0f;
  auto run = [&](uint64_t seed, uint64_t offset) {
    std::vector<bfloat16> out(src.size());
    convert(src.data(), out.data(), src.size(),
            {.mode = RoundingMode::Stochastic, .seed = seed, .offset = offset});
    std::vector<uint16_t> bits;
    for (auto b : out)
      bits.push_back(b.bits);
    return bits;
  };
  EXPECT_EQ(run(42, 0), run(42, 0));
  EXPECT_NE(run(42, 0), run(43, 0));
  EXPECT_NE(run(42, 0), run(42, 1));
}

TEST(Stochastic, BulkElementIDrawsRandomBitsI) {
  std::vector<float> src(1001);
  for (size_t i = 0; i < src.size(); ++i)
    src[i] = 0.001f * float(i) - 0.3f;
  const RoundingOptions o{.mode = RoundingMode::Stochastic, .seed = 99, .offset = 5};
  std::vector<half> h(src.size());
  std::vector<float8_e5m2> e(src.size());
  std::vector<float> r = src;
  convert(src.data(), h.data(), src.size(), o);
  convert(src.data(), e.data(), src.size(), o);
  round_in_place(Format::TF32, r.data(), r.size(), o);
  for (size_t i = 0; i < src.size(); ++i) {
    const uint32_t rnd = random_bits(99, 5, i);
    ASSERT_EQ(h[i].bits, encode(Format::FP16, src[i], RoundingMode::Stochastic, o.overflow, rnd));
    ASSERT_EQ(e[i].bits,
              encode(Format::FP8_E5M2, src[i], RoundingMode::Stochastic, o.overflow, rnd));
    ASSERT_EQ(r[i], round_to(Format::TF32, src[i], RoundingMode::Stochastic, o.overflow, rnd));
  }
}

}  // namespace
}  // namespace mantissa
