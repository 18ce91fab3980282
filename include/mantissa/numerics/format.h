// The number formats of mixed-precision training and their table of facts.
//
// Every format here is a sign / exponent / mantissa layout that lies inside fp32, so each of its
// values converts to float exactly. tf32 is a 19-bit layout that lives in an fp32 container (the
// low 13 mantissa bits are zero), as on NVIDIA tensor cores. The OCP Microscaling formats are
// here too: fp6_e2m3, fp6_e3m2 and fp4_e2m1 (the elements of MX and NVFP4 blocks; no inf, no
// NaN) and e8m0, the unsigned power-of-two block scale (no sign, no zero, no mantissa).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace mantissa {

enum class Format : uint8_t {
  FP32,
  TF32,
  FP16,
  BF16,
  FP8_E4M3,
  FP8_E5M2,
  FP6_E2M3,
  FP6_E3M2,
  FP4_E2M1,
  E8M0,
};
inline constexpr int kNumFormats = 10;

enum class RoundingMode : uint8_t {
  NearestEven,  // IEEE round to nearest, ties to even
  TowardZero,   // truncation
  Stochastic,   // round up with probability equal to the discarded fraction
};

// What a finite value beyond the largest finite number becomes.
enum class Overflow : uint8_t {
  Infinity,  // what the format defines: ±inf, or NaN for formats without inf (fp8_e4m3, e8m0),
             // or ±max finite for formats with neither (fp6, fp4)
  Saturate,  // ±max finite (inf inputs too; NaN stays NaN), like PTX .satfinite
};

// How NaN is encoded.
enum class NanEncoding : uint8_t {
  Ieee,     // exponent all ones, mantissa non-zero (and all-ones exponent with zero mantissa = inf)
  AllOnes,  // only S.1111.111 is NaN; no inf (the "fn" fp8 variant; e8m0's 0xff)
  None,     // every pattern is finite (fp6, fp4): inf saturates, NaN becomes a zero (as ml_dtypes)
};

// The layout a conversion needs; everything else in FormatInfo derives from it.
//
// A format without a sign bit is a power-of-two scale (e8m0, mantissa_bits 0): every exponent
// field but the NaN is a normal number 2^(field - bias), field 0 included (no zero, no subnormal).
struct FormatSpec {
  int exponent_bits;
  int mantissa_bits;
  NanEncoding nan;
  bool has_sign = true;

  constexpr int bias() const { return (1 << (exponent_bits - 1)) - 1; }
  constexpr int total_bits() const { return int(has_sign) + exponent_bits + mantissa_bits; }
  constexpr bool has_inf() const { return nan == NanEncoding::Ieee; }
  constexpr bool has_nan() const { return nan != NanEncoding::None; }
  constexpr bool is_scale() const { return !has_sign; }
  constexpr uint32_t exponent_mask() const { return (1u << exponent_bits) - 1; }
  constexpr uint32_t mantissa_mask() const { return (1u << mantissa_bits) - 1; }
  // Every bit below the sign: the magnitude's patterns.
  constexpr uint32_t magnitude_mask() const { return (1u << (exponent_bits + mantissa_bits)) - 1; }
  // 0 for the unsigned scale format.
  constexpr uint32_t sign_bit() const {
    return has_sign ? 1u << (exponent_bits + mantissa_bits) : 0u;
  }
  // Smallest unbiased exponent of a normal number.
  constexpr int emin() const { return is_scale() ? -bias() : 1 - bias(); }
  constexpr uint32_t max_finite_bits() const {
    switch (nan) {
      case NanEncoding::Ieee:
        return ((exponent_mask() - 1) << mantissa_bits) | mantissa_mask();
      case NanEncoding::AllOnes:
        return magnitude_mask() - 1;  // S.1111.110
      case NanEncoding::None:
        break;
    }
    return magnitude_mask();
  }
  // Largest unbiased exponent of a finite number.
  constexpr int emax() const { return int(max_finite_bits() >> mantissa_bits) - bias(); }
  // What a finite value beyond the largest becomes under Overflow::Infinity: positive infinity;
  // for formats without inf, the positive NaN; for formats with neither, the largest value.
  constexpr uint32_t inf_bits() const {
    return has_inf() ? exponent_mask() << mantissa_bits
                     : (has_nan() ? quiet_nan_bits() : max_finite_bits());
  }
  // The canonical positive quiet NaN (formats with a NaN only).
  constexpr uint32_t quiet_nan_bits() const {
    return has_inf() ? (exponent_mask() << mantissa_bits) | (1u << (mantissa_bits - 1))
                     : magnitude_mask();
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

// Indexed by Format; the order is the enum's. The fp6 and fp4 formats are stored one value per
// byte (in the low bits), as ml_dtypes stores them.
inline constexpr std::array<FormatInfo, kNumFormats> kFormatTable = {
    detail::make_format(Format::FP32, "fp32", {8, 23, NanEncoding::Ieee}, 4),
    detail::make_format(Format::TF32, "tf32", {8, 10, NanEncoding::Ieee}, 4),
    detail::make_format(Format::FP16, "fp16", {5, 10, NanEncoding::Ieee}, 2),
    detail::make_format(Format::BF16, "bf16", {8, 7, NanEncoding::Ieee}, 2),
    detail::make_format(Format::FP8_E4M3, "fp8_e4m3", {4, 3, NanEncoding::AllOnes}, 1),
    detail::make_format(Format::FP8_E5M2, "fp8_e5m2", {5, 2, NanEncoding::Ieee}, 1),
    detail::make_format(Format::FP6_E2M3, "fp6_e2m3", {2, 3, NanEncoding::None}, 1),
    detail::make_format(Format::FP6_E3M2, "fp6_e3m2", {3, 2, NanEncoding::None}, 1),
    detail::make_format(Format::FP4_E2M1, "fp4_e2m1", {2, 1, NanEncoding::None}, 1),
    detail::make_format(Format::E8M0, "e8m0", {8, 0, NanEncoding::AllOnes, false}, 1),
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
static_assert(
    [] {
      for (int i = 0; i < kNumFormats; ++i)
        if (kFormatTable[i].format != Format(i)) return false;
      return true;
    }(),
    "kFormatTable is indexed by Format: its rows must follow the enum's order");

// Calls fn(std::integral_constant<Format, F>{}) with F == f: a run-time format to a compile-time
// one, for every row of the table (a new format needs no new case).
template <int I = 0, typename Fn>
constexpr decltype(auto) with_format(Format f, Fn&& fn) {
  if constexpr (I + 1 < kNumFormats) {
    if (int(f) != I) return with_format<I + 1>(f, static_cast<Fn&&>(fn));
  }
  return fn(std::integral_constant<Format, Format(I)>{});
}

// Accepts the table names ("fp16", "fp8_e4m3", ...) and common aliases ("half", "bfloat16",
// "float32", "e4m3", "e5m2", ...).
std::optional<Format> parse_format(std::string_view name);
// The table's names, "fp32, tf32, ..., e8m0": what a message about an unknown format lists.
std::string format_names();

std::string_view rounding_name(RoundingMode mode);
std::optional<RoundingMode> parse_rounding(std::string_view name);

}  // namespace mantissa
