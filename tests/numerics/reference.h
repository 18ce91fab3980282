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

struct Fields {
  int exponent_bits, mantissa_bits;
  bool fn;  // fp8_e4m3 "fn": no inf, only S.1111.111 is NaN
};

inline Fields fields_of(Format f) {
  switch (f) {
    case Format::FP32:
      return {8, 23, false};
    case Format::TF32:
      return {8, 10, false};
    case Format::FP16:
      return {5, 10, false};
    case Format::BF16:
      return {8, 7, false};
    case Format::FP8_E4M3:
      return {4, 3, true};
    case Format::FP8_E5M2:
      return {5, 2, false};
  }
  return {};
}

// The value the format definition gives a bit pattern: (-1)^s * 2^(e-bias) * 1.m, or
// 2^(1-bias) * 0.m for e == 0; inf/NaN where the format puts them.
inline double reference_decode(Format f, uint32_t bits) {
  const Fields d = fields_of(f);
  const int bias = (1 << (d.exponent_bits - 1)) - 1;
  const uint32_t emask = (1u << d.exponent_bits) - 1, mmask = (1u << d.mantissa_bits) - 1;
  const bool neg = (bits >> (d.exponent_bits + d.mantissa_bits)) & 1;
  const uint32_t e = (bits >> d.mantissa_bits) & emask, m = bits & mmask;
  double v;
  if (d.fn && e == emask && m == mmask) {
    v = NAN;
  } else if (!d.fn && e == emask) {
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
    for (uint32_t b = 0; b < positive_patterns; ++b) {
      const double v = reference_decode(f, b);
      if (!std::isfinite(v)) break;  // patterns ascend with value up to the first inf/NaN
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
    const auto it = std::upper_bound(values_.begin(), values_.end(), mag);
    const size_t lo = size_t(it - values_.begin()) - 1;  // values_[lo] <= mag
    if (values_[lo] == mag || mode == RoundingMode::TowardZero) return lo;
    const double hi_v = lo + 1 < values_.size() ? values_[lo + 1] : beyond_;
    // 2*mag vs lo+hi is exact in double (the grid's values are short).
    const double twice = 2 * mag, mid2 = values_[lo] + hi_v;
    if (twice < mid2) return lo;
    if (twice > mid2) return lo + 1;
    return (lo & 1) ? lo + 1 : lo;  // tie: the even pattern
  }

  // The rounded value of x (double), with overflow to inf (NaN for the fn format).
  double round(double x, RoundingMode mode) const {
    if (std::isnan(x)) return NAN;
    const double mag = std::fabs(x);
    double r;
    if (std::isinf(x)) {
      r = fields_of(format_).fn ? NAN : INFINITY;
    } else {
      const size_t k = round_index(mag, mode);
      r = k == values_.size() ? (fields_of(format_).fn ? NAN : INFINITY) : values_[k];
    }
    return std::signbit(x) ? -r : r;
  }

 private:
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
