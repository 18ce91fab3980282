#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <type_traits>

#include "mantissa/numerics/format.h"
#include "mantissa/numerics/types.h"

namespace mantissa {
namespace {

TEST(FormatTable, FactsMatchPublishedValues) {
  const auto& fp32 = format_info(Format::FP32);
  EXPECT_EQ(fp32.max_finite, double(FLT_MAX));
  EXPECT_EQ(fp32.min_normal, double(FLT_MIN));
  EXPECT_EQ(fp32.min_subnormal, double(FLT_TRUE_MIN));
  EXPECT_EQ(fp32.epsilon, double(FLT_EPSILON));

  const auto& fp16 = format_info(Format::FP16);
  EXPECT_EQ(fp16.max_finite, 65504.0);
  EXPECT_EQ(fp16.min_normal, std::ldexp(1.0, -14));
  EXPECT_EQ(fp16.min_subnormal, std::ldexp(1.0, -24));
  EXPECT_EQ(fp16.epsilon, std::ldexp(1.0, -10));
  EXPECT_EQ(fp16.spec.bias(), 15);

  const auto& bf16 = format_info(Format::BF16);
  EXPECT_EQ(bf16.max_finite, 3.3895313892515355e38);
  EXPECT_EQ(bf16.min_normal, double(FLT_MIN));
  EXPECT_EQ(bf16.min_subnormal, std::ldexp(1.0, -133));
  EXPECT_EQ(bf16.epsilon, 0.0078125);

  const auto& tf32 = format_info(Format::TF32);
  EXPECT_EQ(tf32.max_finite, std::ldexp(2.0 - std::ldexp(1.0, -10), 127));
  EXPECT_EQ(tf32.epsilon, std::ldexp(1.0, -10));
  EXPECT_EQ(tf32.storage_bytes, 4);

  const auto& e4m3 = format_info(Format::FP8_E4M3);
  EXPECT_EQ(e4m3.max_finite, 448.0);
  EXPECT_EQ(e4m3.min_normal, std::ldexp(1.0, -6));
  EXPECT_EQ(e4m3.min_subnormal, std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3.spec.bias(), 7);
  EXPECT_FALSE(e4m3.spec.has_inf());
  EXPECT_EQ(e4m3.spec.quiet_nan_bits(), 0x7fu);
  EXPECT_EQ(e4m3.spec.max_finite_bits(), 0x7eu);

  const auto& e5m2 = format_info(Format::FP8_E5M2);
  EXPECT_EQ(e5m2.max_finite, 57344.0);
  EXPECT_EQ(e5m2.min_normal, std::ldexp(1.0, -14));
  EXPECT_EQ(e5m2.min_subnormal, std::ldexp(1.0, -16));
  EXPECT_EQ(e5m2.spec.inf_bits(), 0x7cu);
  EXPECT_EQ(e5m2.spec.quiet_nan_bits(), 0x7eu);

  EXPECT_NEAR(fp32.decimal_digits, 7.22, 0.01);
  EXPECT_NEAR(fp16.decimal_digits, 3.31, 0.01);
  EXPECT_NEAR(bf16.decimal_digits, 2.41, 0.01);
}

TEST(FormatTable, EncodingsOfSpecials) {
  EXPECT_EQ(format_spec(Format::FP16).inf_bits(), 0x7c00u);
  EXPECT_EQ(format_spec(Format::FP16).quiet_nan_bits(), 0x7e00u);
  EXPECT_EQ(format_spec(Format::FP16).max_finite_bits(), 0x7bffu);
  EXPECT_EQ(format_spec(Format::BF16).inf_bits(), 0x7f80u);
  EXPECT_EQ(format_spec(Format::BF16).quiet_nan_bits(), 0x7fc0u);
  EXPECT_EQ(format_spec(Format::FP32).quiet_nan_bits(), 0x7fc00000u);
}

TEST(FormatTable, NamesParseBack) {
  for (const auto& info : kFormatTable) {
    ASSERT_EQ(parse_format(info.name), info.format) << info.name;
    EXPECT_EQ(format_name(info.format), info.name);
  }
  EXPECT_EQ(parse_format("half"), Format::FP16);
  EXPECT_EQ(parse_format("BFloat16"), Format::BF16);
  EXPECT_EQ(parse_format("float8_e4m3fn"), Format::FP8_E4M3);
  EXPECT_FALSE(parse_format("fp12").has_value());
  EXPECT_EQ(parse_rounding("nearest"), RoundingMode::NearestEven);
  EXPECT_EQ(parse_rounding("truncate"), RoundingMode::TowardZero);
  EXPECT_FALSE(parse_rounding("up").has_value());
}

TEST(ScalarTypes, AreTrivialAndSized) {
  static_assert(std::is_trivially_copyable_v<half> && alignof(half) == 2);
  static_assert(std::is_trivially_copyable_v<bfloat16> && alignof(bfloat16) == 2);
  static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);
  EXPECT_EQ(half(1.0f).bits, 0x3c00);
  EXPECT_EQ(bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float8_e4m3(1.0f).bits, 0x38);
  EXPECT_EQ(float8_e5m2(1.0f).bits, 0x3c);
  EXPECT_EQ(float(half(0.1f)), 0.0999755859375f);
  EXPECT_EQ(float(bfloat16(3.14159f)), 3.140625f);
  EXPECT_EQ(float(float8_e4m3(1000.0f)) != float(float8_e4m3(1000.0f)), true);  // NaN: no inf
  EXPECT_EQ(float(float8_e5m2(1e6f)), INFINITY);
  constexpr half h = half::from_bits(0x3555);
  static_assert(float(h) == 0.333251953125f, "decode is constexpr and exact");
}

}  // namespace
}  // namespace mantissa
