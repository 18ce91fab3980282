#include <gtest/gtest.h>

#include <cmath>
#include <string_view>

#include "mantissa/core/error.h"
#include "mantissa/numerics/inspect.h"

namespace mantissa {
namespace {

ParsedNumber num(const char* s) {
  auto p = parse_number(s);
  EXPECT_TRUE(p.has_value()) << s;
  return p.value_or(ParsedNumber{});
}

TEST(ParseNumber, AcceptsEveryWrittenForm) {
  EXPECT_EQ(num("12.31").value, 12.31);
  EXPECT_EQ(num("-1.5e-3").value, -1.5e-3);
  EXPECT_EQ(num("0x1.8p-3").value, 0.1875);
  EXPECT_EQ(num(" 2 ").value, 2.0);
  EXPECT_TRUE(std::isinf(num("inf").value));
  EXPECT_TRUE(std::isinf(num("-inf").value) && num("-inf").value < 0);
  EXPECT_TRUE(std::isnan(num("nan").value));
  EXPECT_FALSE(num("inf").finite_input);
  const ParsedNumber huge = num("1e400");
  EXPECT_TRUE(std::isinf(huge.value));
  EXPECT_TRUE(huge.finite_input);
}

TEST(ParseNumber, RejectsNonNumbers) {
  for (const char* bad : {"", "   ", "abc", "1.5x", "12,5", "--1", "0x"}) {
    EXPECT_FALSE(parse_number(bad).has_value()) << "'" << bad << "'";
  }
  // Found by fuzz/number_fuzz.cpp: strtod stops at a NUL, which passed for the end of the text.
  using namespace std::string_view_literals;
  EXPECT_FALSE(parse_number("2\0"sv).has_value());
  EXPECT_FALSE(parse_number("1.5\0abc"sv).has_value());
}

TEST(Inspect, TheIssueExample) {
  const FormatReport r = inspect(Format::FP32, num("12.31"), RoundingMode::NearestEven);
  EXPECT_EQ(r.sign_bits + " " + r.exponent_bits + " " + r.mantissa_bits,
            "0 10000010 10001001111010111000011");
  EXPECT_EQ(r.hex, "0x4144f5c3");
  EXPECT_EQ(r.value, double(12.31f));
  EXPECT_EQ(r.abs_error, double(12.31f) - 12.31);
  EXPECT_EQ(r.value_class, ValueClass::Normal);
  EXPECT_FALSE(r.overflow || r.underflow);
}

TEST(Inspect, Tf32ShowsItsContainerAndRounds) {
  const FormatReport r = inspect(Format::TF32, num("12.31"), RoundingMode::NearestEven);
  EXPECT_EQ(r.mantissa_bits, "1000101000");  // 1000100111|1010... rounds up
  EXPECT_EQ(r.hex, "0x41450000");
  EXPECT_EQ(r.value, 12.3125);
  const FormatReport t = inspect(Format::TF32, num("12.31"), RoundingMode::TowardZero);
  EXPECT_EQ(t.mantissa_bits, "1000100111");
}

TEST(Inspect, OverflowUnderflowAndClasses) {
  const FormatReport o = inspect(Format::FP16, num("70000"), RoundingMode::NearestEven);
  EXPECT_EQ(o.value_class, ValueClass::Inf);
  EXPECT_TRUE(o.overflow);
  const FormatReport s =
      inspect(Format::FP16, num("70000"), RoundingMode::NearestEven, Overflow::Saturate);
  EXPECT_EQ(s.value, 65504.0);
  EXPECT_TRUE(s.overflow);
  EXPECT_EQ(inspect(Format::FP8_E4M3, num("1000"), RoundingMode::NearestEven).value_class,
            ValueClass::NaN);
  const FormatReport u = inspect(Format::FP16, num("1e-6"), RoundingMode::NearestEven);
  EXPECT_EQ(u.value_class, ValueClass::Subnormal);
  EXPECT_TRUE(u.underflow);
  const FormatReport z = inspect(Format::FP16, num("1e-9"), RoundingMode::NearestEven);
  EXPECT_EQ(z.value_class, ValueClass::Zero);
  EXPECT_TRUE(z.underflow);
  EXPECT_EQ(z.rel_error, 1.0);
  const FormatReport inf = inspect(Format::BF16, num("-inf"), RoundingMode::NearestEven);
  EXPECT_EQ(inf.value_class, ValueClass::Inf);
  EXPECT_FALSE(inf.overflow);  // inf in, inf out: nothing overflowed
  EXPECT_EQ(inf.hex, "0xff80");
  EXPECT_EQ(inspect(Format::FP8_E5M2, num("nan"), RoundingMode::NearestEven).value_class,
            ValueClass::NaN);
  EXPECT_EQ(inspect(Format::FP16, num("-0"), RoundingMode::NearestEven).hex, "0x8000");
  EXPECT_TRUE(inspect(Format::FP32, num("1e400"), RoundingMode::NearestEven).overflow);
}

TEST(Inspect, RefusesStochastic) {
  EXPECT_THROW(inspect(Format::FP16, num("1"), RoundingMode::Stochastic), Error);
}

}  // namespace
}  // namespace mantissa
