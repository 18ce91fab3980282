// The number formats of mixed-precision training and their table of facts.
//
// Every format here is a sign / exponent / mantissa layout that lies inside fp32, so each of its
// values converts to float exactly. tf32 is a 19-bit layout that lives in an fp32 container (the
// low 13 mantissa bits are zero), as on NVIDIA tensor cores.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace mantissa {

enum class Format : uint8_t { FP32, TF32, FP16, BF16, FP8_E4M3, FP8_E5M2 };
inline constexpr int kNumFormats = 6;

enum class RoundingMode : uint8_t {
  NearestEven,  // IEEE round to nearest, ties to even
  TowardZero,   // truncation
  Stochastic,   // round up with probability equal to the discarded fraction
};

// What a finite value beyond the largest finite number becomes.
enum class Overflow : uint8_t {
  Infinity,  // what the format defines: ±inf, or NaN for formats without inf (fp8_e4m3)
  Saturate,  // ±max finite (inf inputs too; NaN stays NaN), like PTX .satfinite
};

// How NaN is encoded.
enum class NanEncoding : uint8_t {
  Ieee,     // exponent all ones, mantissa non-zero (and all-ones exponent with zero mantissa = inf)
  AllOnes,  // only S.1111.111 is NaN; no inf (the "fn" fp8 variant)
};

// The layout a conversion needs; everything else in FormatInfo derives from it.
struct FormatSpec {
  int exponent_bits;
  int mantissa_bits;
  NanEncoding nan;

  constexpr int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  constexpr int total_bits() const { return 1 + exponent_bits + mantissa_bits; }
  constexpr bool has_inf() const { return nan == NanEncoding::Ieee; }
  constexpr uint32_t exponent_mask() const { return (1u << exponent_bits) - 1; }
  constexpr uint32_t mantissa_mask() const { return (1u << mantissa_bits) - 1; }
  constexpr uint32_t sign_bit() const { return 1u << (exponent_bits + mantissa_bits); }
  // Smallest unbiased exponent of a normal number.
  constexpr int emin() const { return 1 - bias(); }
  // Largest unbiased exponent of a finite number.
  constexpr int emax() const {
    return (has_inf() ? int(exponent_mask()) - 1 : int(exponent_mask())) - bias();
  }
  constexpr uint32_t max_finite_bits() const {
    return has_inf() ? ((exponent_mask() - 1) << mantissa_bits) | mantissa_mask()
                     : (sign_bit() - 1) - 1;  // S.1111.110
  }
  // Positive infinity; for formats without inf, the positive NaN.
  constexpr uint32_t inf_bits() const {
    return has_inf() ? exponent_mask() << mantissa_bits : quiet_nan_bits();
  }
  // The canonical positive quiet NaN.
  constexpr uint32_t quiet_nan_bits() const {
    return has_inf() ? (exponent_mask() << mantissa_bits) | (1u << (mantissa_bits - 1))
                     : sign_bit() - 1;
  }
};

struct FormatInfo {
  Format format;
  std::string_view name;
  FormatSpec spec;
  int storage_bytes;  // bytes of the container a value is stored in (tf32: a 4-byte float)
  double max_finite;
  double min_normal;
  double min_subnormal;
  double epsilon;         // distance from 1 to the next larger value: 2^-mantissa_bits
  double decimal_digits;  // log10(2^(mantissa_bits + 1))
};

namespace detail {

constexpr double exp2i(int e) {
  double r = 1.0;
  for (; e > 0; --e)
    r *= 2.0;
  for (; e < 0; ++e)
    r *= 0.5;
  return r;
}

constexpr double log10_2 = 0.30102999566398119521;

constexpr FormatInfo make_format(Format f, std::string_view name, FormatSpec s, int bytes) {
  const int m = s.mantissa_bits;
  const double top_mantissa = (s.max_finite_bits() & s.mantissa_mask()) * exp2i(-m);
  return FormatInfo{f,
                    name,
                    s,
                    bytes,
                    (1.0 + top_mantissa) * exp2i(s.emax()),
                    exp2i(s.emin()),
                    exp2i(s.emin() - m),
                    exp2i(-m),
                    (m + 1) * log10_2};
}

}  // namespace detail

// Indexed by Format; the order is the enum's.
inline constexpr std::array<FormatInfo, kNumFormats> kFormatTable = {
    detail::make_format(Format::FP32, "fp32", {8, 23, NanEncoding::Ieee}, 4),
    detail::make_format(Format::TF32, "tf32", {8, 10, NanEncoding::Ieee}, 4),
    detail::make_format(Format::FP16, "fp16", {5, 10, NanEncoding::Ieee}, 2),
    detail::make_format(Format::BF16, "bf16", {8, 7, NanEncoding::Ieee}, 2),
    detail::make_format(Format::FP8_E4M3, "fp8_e4m3", {4, 3, NanEncoding::AllOnes}, 1),
    detail::make_format(Format::FP8_E5M2, "fp8_e5m2", {5, 2, NanEncoding::Ieee}, 1),
};

constexpr const FormatInfo& format_info(Format f) {
  return kFormatTable[static_cast<int>(f)];
}
constexpr FormatSpec format_spec(Format f) {
  return format_info(f).spec;
}
constexpr std::string_view format_name(Format f) {
  return format_info(f).name;
}

// Accepts the table names ("fp16", "fp8_e4m3", ...) and common aliases ("half", "bfloat16",
// "float32", "e4m3", "e5m2", ...).
std::optional<Format> parse_format(std::string_view name);

std::string_view rounding_name(RoundingMode mode);
std::optional<RoundingMode> parse_rounding(std::string_view name);

}  // namespace mantissa
