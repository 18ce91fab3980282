// An independent reference for the formats, written from their definitions with double and
// ldexp — sharing nothing with round.h's bit manipulation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "mantissa/numerics/format.h"
#include "mantissa/numerics/round.h"

namespace mantissa::testing {

// What a format does with the patterns beyond its numbers.
enum class Special {
  Ieee,   // all-ones exponent: inf (mantissa 0) and NaN
  Fn,     // fp8_e4m3 "fn": no inf, only S.1111.111 is NaN
  None,   // fp6/fp4: every pattern is a number; overflow and inf saturate, NaN becomes -sign 0
  Scale,  // e8m0: unsigned 2^(e - 127) for e in 0..254, 255 is NaN; no zero
};

struct Fields {
  int exponent_bits, mantissa_bits;
  Special special;
};

inline Fields fields_of(Format f) {
  switch (f) {
    case Format::FP32:
      return {8, 23, Special::Ieee};
    case Format::TF32:
      return {8, 10, Special::Ieee};
    case Format::FP16:
      return {5, 10, Special::Ieee};
    case Format::BF16:
      return {8, 7, Special::Ieee};
    case Format::FP8_E4M3:
      return {4, 3, Special::Fn};
    case Format::FP8_E5M2:
      return {5, 2, Special::Ieee};
    case Format::FP6_E2M3:
      return {2, 3, Special::None};
    case Format::FP6_E3M2:
      return {3, 2, Special::None};
    case Format::FP4_E2M1:
      return {2, 1, Special::None};
    case Format::E8M0:
      return {8, 0, Special::Scale};
  }
  return {};
}

// The value the format definition gives a bit pattern: (-1)^s * 2^(e-bias) * 1.m, or
// 2^(1-bias) * 0.m for e == 0; inf/NaN where the format puts them.
inline double reference_decode(Format f, uint32_t bits) {
  const Fields d = fields_of(f);
  const int bias = (1 << (d.exponent_bits - 1)) - 1;
  if (d.special == Special::Scale) return bits == 255 ? NAN : std::ldexp(1.0, int(bits) - bias);
  const uint32_t emask = (1u << d.exponent_bits) - 1, mmask = (1u << d.mantissa_bits) - 1;
  const bool neg = (bits >> (d.exponent_bits + d.mantissa_bits)) & 1;
  const uint32_t e = (bits >> d.mantissa_bits) & emask, m = bits & mmask;
  double v;
  if (d.special == Special::Fn && e == emask && m == mmask) {
    v = NAN;
  } else if (d.special == Special::Ieee && e == emask) {
    v = m ? NAN : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - bias - d.mantissa_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(double(m), -d.mantissa_bits), int(e) - bias);
  }
  return neg ? -v : v;
}

// Nearest-even and toward-zero rounding by searching the sorted list of the format's
// non-negative finite values (plus one value past the largest, where overflow starts).
class ReferenceRounder {
 public:
  explicit ReferenceRounder(Format f) : format_(f) {
    const Fields d = fields_of(f);
    const uint32_t positive_patterns = 1u << (d.exponent_bits + d.mantissa_bits);
    // Patterns ascend with value up to the first inf/NaN (or to the last, without either).
    for (uint32_t b = 0; b < positive_patterns; ++b) {
      const double v = reference_decode(f, b);
      if (!std::isfinite(v)) break;
      values_.push_back(v);
    }
    const double max = values_.back();
    const int emax = std::ilogb(max);
    beyond_ = max + std::ldexp(1.0, emax - d.mantissa_bits);
  }

  double max_finite() const { return values_.back(); }

  // The rounded magnitude's index (== its bit pattern); values_.size() means "overflow".
  size_t round_index(double mag, RoundingMode mode) const {
    if (mag >= beyond_)
      return mode == RoundingMode::TowardZero ? values_.size() - 1 : values_.size();
    if (mag < values_[0]) return 0;  // e8m0 only: no zero below 2^-127, so every mode clamps up
    const auto it = std::upper_bound(values_.begin(), values_.end(), mag);
    const size_t lo = size_t(it - values_.begin()) - 1;  // values_[lo] <= mag
    if (values_[lo] == mag || mode == RoundingMode::TowardZero) return lo;
    const double hi_v = lo + 1 < values_.size() ? values_[lo + 1] : beyond_;
    // 2*mag vs lo+hi is exact in double (the grid's values are short).
    const double twice = 2 * mag, mid2 = values_[lo] + hi_v;
    if (twice < mid2) return lo;
    if (twice > mid2) return lo + 1;
    // A tie: the even pattern; e8m0's ties go up (ml_dtypes: its one significand bit is odd).
    return (lo & 1) || special() == Special::Scale ? lo + 1 : lo;
  }

  // The rounded value of x (double), with the format's overflow: inf, NaN (fn and e8m0) or
  // the largest value (fp6/fp4).
  double round(double x, RoundingMode mode) const {
    const Special sp = special();
    if (sp == Special::Scale) {
      if (!(x > 0) || std::isinf(x)) return NAN;  // zero, negative, inf, NaN
      const size_t k = round_index(x, mode);
      return k == values_.size() ? NAN : values_[k];
    }
    if (std::isnan(x)) return sp == Special::None ? (std::signbit(x) ? 0.0 : -0.0) : NAN;
    const double mag = std::fabs(x);
    const double overflowed =
        sp == Special::Ieee ? INFINITY : (sp == Special::None ? max_finite() : NAN);
    double r;
    if (std::isinf(x)) {
      r = overflowed;
    } else {
      const size_t k = round_index(mag, mode);
      r = k == values_.size() ? overflowed : values_[k];
    }
    return std::signbit(x) ? -r : r;
  }

 private:
  Special special() const { return fields_of(format_).special; }

  Format format_;
  std::vector<double> values_;
  double beyond_;
};

// Bitwise float equality that treats any two NaNs as equal.
inline bool same_float(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

}  // namespace mantissa::testing
