#include "mantissa/numerics/inspect.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "mantissa/core/error.h"
#include "mantissa/numerics/round.h"

namespace mantissa {

std::optional<ParsedNumber> parse_number(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return std::nullopt;
  const auto last = text.find_last_not_of(" \t");
  const std::string s(text.substr(first, last - first + 1));
  // strtod also takes "0x" hex floats, inf/infinity and nan; it reads the "C" locale's '.'
  // because the CLI never calls setlocale.
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  // All of it: a NUL inside `text` would stop strtod early and pass for the end.
  if (end == s.c_str() || end != s.c_str() + s.size()) return std::nullopt;
  ParsedNumber p;
  p.text = s;
  p.value = v;
  // ERANGE with an infinite result: a finite decimal too large for a double.
  p.finite_input = std::isfinite(v) || errno == ERANGE;
  return p;
}

std::string_view value_class_name(ValueClass c) {
  switch (c) {
    case ValueClass::Zero:
      return "zero";
    case ValueClass::Subnormal:
      return "subnormal";
    case ValueClass::Normal:
      return "normal";
    case ValueClass::Inf:
      return "inf";
    case ValueClass::NaN:
      return "nan";
  }
  return "?";
}

namespace {

std::string binary(uint32_t v, int width) {
  std::string s(static_cast<size_t>(width), '0');
  for (int i = 0; i < width; ++i) {
    if (v & (1u << (width - 1 - i))) s[static_cast<size_t>(i)] = '1';
  }
  return s;
}

ValueClass classify(uint32_t bits, FormatSpec t) {
  const uint32_t e = (bits >> t.mantissa_bits) & t.exponent_mask();
  const uint32_t m = bits & t.mantissa_mask();
  if (t.nan == NanEncoding::AllOnes && (bits & t.magnitude_mask()) == t.quiet_nan_bits())
    return ValueClass::NaN;
  if (t.is_scale()) return ValueClass::Normal;  // e8m0: every other pattern is 2^(e - bias)
  if (t.has_inf() && e == t.exponent_mask()) return m ? ValueClass::NaN : ValueClass::Inf;
  if (e == 0) return m ? ValueClass::Subnormal : ValueClass::Zero;
  return ValueClass::Normal;
}

}  // namespace

FormatReport inspect(Format f, const ParsedNumber& x, RoundingMode mode, Overflow overflow) {
  MT_CHECK(mode != RoundingMode::Stochastic,
           "inspect() shows one deterministic rounding; use nearest or truncate");
  const FormatInfo& info = format_info(f);
  const FormatSpec t = info.spec;
  FormatReport r;
  r.format = f;
  r.bits = encode(f, x.value, mode, overflow);
  r.container = f == Format::TF32 ? r.bits << (23 - t.mantissa_bits) : r.bits;
  r.sign_bits = t.has_sign ? binary(r.bits >> (t.exponent_bits + t.mantissa_bits), 1) : "";
  r.exponent_bits = binary((r.bits >> t.mantissa_bits) & t.exponent_mask(), t.exponent_bits);
  r.mantissa_bits = binary(r.bits & t.mantissa_mask(), t.mantissa_bits);
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%0*x", info.storage_bytes * 2, r.container);
  r.hex = hex;
  r.value = decode(f, r.bits);
  r.value_class = classify(r.bits, t);

  const double in = x.value;
  if (std::isnan(in) || std::isnan(r.value)) {
    r.abs_error = (std::isnan(in) && std::isnan(r.value)) ? 0.0 : NAN;
  } else if (r.value == in) {
    r.abs_error = 0.0;
  } else {
    r.abs_error = std::fabs(r.value - in);  // exact: both lie within a factor of two
  }
  r.rel_error = (in == 0.0 || std::isnan(r.abs_error)) ? (r.abs_error == 0.0 ? 0.0 : NAN)
                                                       : r.abs_error / std::fabs(in);
  if (std::isinf(in) && !x.finite_input) r.rel_error = r.abs_error == 0.0 ? 0.0 : NAN;

  // Only a magnitude beyond the largest value rounds to inf/NaN or saturates (e8m0's NaN for
  // zero and negative numbers is no overflow).
  const double mag = std::fabs(in);
  r.overflow = x.finite_input && !std::isnan(in) && mag > info.max_finite;
  r.underflow = std::isfinite(in) && in != 0.0 && mag < info.min_normal && r.value != in;
  return r;
}

}  // namespace mantissa
