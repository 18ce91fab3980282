// Exact conversions between IEEE binary floats (float, double) and the formats of format.h.
//
// One generic algorithm serves every format: it works on the source's bits, so it is exact for
// subnormals, signed zero, inf and NaN, and it is constexpr so the scalar types of types.h inline
// it with the format fixed at compile time. The vectorized bulk paths (convert.h) are tested
// bit-for-bit against it.
//
// NaN: a NaN converts to a quiet NaN of the same sign (the only NaN for fp8_e4m3), carrying the
// top payload bits that fit — what F16C and AVX512-BF16 hardware produce. The formats without NaN
// (fp6, fp4) take a NaN to a zero of the opposite sign, and e8m0 takes zero, negative numbers,
// inf and NaN to its NaN: both as ml_dtypes does, which the exhaustive tests compare against.
#pragma once

#include <bit>
#include <cstdint>

#include "mantissa/numerics/format.h"

namespace mantissa {
namespace detail {

template <typename Float>
struct FloatLayout;
template <>
struct FloatLayout<float> {
  using Bits = uint32_t;
  static constexpr int exponent_bits = 8, mantissa_bits = 23;
};
template <>
struct FloatLayout<double> {
  using Bits = uint64_t;
  static constexpr int exponent_bits = 11, mantissa_bits = 52;
};

// Whether to round a magnitude away from zero: `rem` of `1 << shift` is the discarded part, `odd`
// the kept part's last bit (ties to even).
template <typename Bits>
constexpr bool rounds_up(Bits rem, int shift, bool odd, RoundingMode mode, uint32_t random_bits) {
  constexpr int kWidth = 8 * sizeof(Bits);
  switch (mode) {
    case RoundingMode::NearestEven:
      if (shift > kWidth) return false;
      {
        const Bits half = Bits(1) << (shift - 1);
        return rem > half || (rem == half && odd);
      }
    case RoundingMode::TowardZero:
      return false;
    case RoundingMode::Stochastic: {
      // threshold = rem / 2^shift scaled to 32 bits.
      uint64_t threshold;
      if (shift <= 32) {
        threshold = uint64_t(rem) << (32 - shift);
      } else {
        const int down = shift - 32;
        threshold = down >= kWidth ? 0 : uint64_t(rem >> down);
      }
      return random_bits < threshold;
    }
  }
  return false;
}

// A power-of-two scale format (e8m0): x = 1.f * 2^e rounds to 2^e or 2^(e+1) (ties up: the kept
// significand, 1, is odd), then clamps into [2^emin, 2^emax]. There is no zero, so what rounds
// below 2^emin is 2^emin; zero, negative numbers, inf and NaN are the NaN.
template <typename Float>
constexpr uint32_t encode_scale_bits(typename FloatLayout<Float>::Bits x, FormatSpec t,
                                     RoundingMode mode, Overflow overflow, uint32_t random_bits) {
  using Bits = typename FloatLayout<Float>::Bits;
  constexpr int kSrcE = FloatLayout<Float>::exponent_bits;
  constexpr int kSrcM = FloatLayout<Float>::mantissa_bits;
  constexpr int kSrcBias = (1 << (kSrcE - 1)) - 1;
  constexpr Bits kSrcInf = ((Bits(1) << kSrcE) - 1) << kSrcM;
  const uint32_t nan = t.quiet_nan_bits();
  if (x == kSrcInf) return overflow == Overflow::Saturate ? t.max_finite_bits() : nan;
  if (x == 0 || x > kSrcInf) return nan;  // +0, NaN and every negative number
  const int e_field = int(x >> kSrcM);
  Bits sig = x & ((Bits(1) << kSrcM) - 1);
  int e = e_field - kSrcBias;
  if (e_field == 0) {  // a subnormal: normalize it
    e = 1 - kSrcBias;
    while (!(sig >> kSrcM)) {
      sig <<= 1;
      --e;
    }
    sig &= (Bits(1) << kSrcM) - 1;
  }
  if (rounds_up<Bits>(sig, kSrcM, true, mode, random_bits)) ++e;
  if (e < t.emin()) return 0;
  if (e > t.emax()) {
    return overflow == Overflow::Saturate || mode == RoundingMode::TowardZero ? t.max_finite_bits()
                                                                              : nan;
  }
  return uint32_t(e + t.bias());
}

// Rounds |x| (an IEEE float or double, given as bits) into format `t` and returns the format's
// bit pattern, right-aligned (tf32: 19 bits). `random_bits` is used only by Stochastic: the
// value rounds away from zero when random_bits < fraction * 2^32, so its expectation is x.
template <typename Float>
constexpr uint32_t encode_bits(typename FloatLayout<Float>::Bits x, FormatSpec t, RoundingMode mode,
                               Overflow overflow, uint32_t random_bits) {
  using Bits = typename FloatLayout<Float>::Bits;
  constexpr int kSrcE = FloatLayout<Float>::exponent_bits;
  constexpr int kSrcM = FloatLayout<Float>::mantissa_bits;
  constexpr int kWidth = 8 * sizeof(Bits);
  constexpr Bits kAbsMask = (Bits(1) << (kSrcE + kSrcM)) - 1;
  constexpr Bits kSrcInf = ((Bits(1) << kSrcE) - 1) << kSrcM;

  if (t.is_scale()) return encode_scale_bits<Float>(x, t, mode, overflow, random_bits);
  const uint32_t sign = (x >> (kSrcE + kSrcM)) ? t.sign_bit() : 0u;
  const Bits a = x & kAbsMask;
  const int m = t.mantissa_bits;

  if (a > kSrcInf) {                               // NaN
    if (!t.has_nan()) return sign ^ t.sign_bit();  // the zero of the other sign (ml_dtypes)
    if (!t.has_inf()) return sign | t.quiet_nan_bits();
    const uint32_t payload = uint32_t(a >> (kSrcM - m)) & t.mantissa_mask();
    return sign | t.quiet_nan_bits() | payload;
  }
  if (a == kSrcInf) {
    return sign | (overflow == Overflow::Saturate ? t.max_finite_bits() : t.inf_bits());
  }
  if (a == 0) return sign;

  // |x| = sig * 2^(e - kSrcM), with the implicit bit in sig for normal numbers.
  constexpr int kSrcBias = (1 << (kSrcE - 1)) - 1;
  const int e_field = int(a >> kSrcM);
  Bits sig = a & ((Bits(1) << kSrcM) - 1);
  int e = 1 - kSrcBias;
  if (e_field != 0) {
    e = e_field - kSrcBias;
    sig |= Bits(1) << kSrcM;
  }

  // Below the format's normal range the grid spacing stays that of emin (subnormals).
  const int emin = t.emin();
  const int scale_e = e < emin ? emin : e;
  const int shift = kSrcM - m + (scale_e - e);

  uint64_t keep;
  if (shift <= 0) {
    keep = uint64_t(sig) << -shift;  // the format is wider than the source: exact
  } else {
    keep = shift >= kWidth ? 0 : uint64_t(sig >> shift);
    const Bits rem = shift >= kWidth ? sig : sig & ((Bits(1) << shift) - 1);
    if (rounds_up<Bits>(rem, shift, keep & 1, mode, random_bits)) ++keep;
  }

  // For normal results keep carries the implicit bit, which lands in the exponent field; a
  // carry out of the mantissa bumps the exponent, as it should.
  const uint64_t result = (uint64_t(scale_e + t.bias() - 1) << m) + keep;
  if (result > t.max_finite_bits()) {
    // IEEE: rounding toward zero never produces inf from a finite number.
    if (overflow == Overflow::Saturate || mode == RoundingMode::TowardZero) {
      return sign | t.max_finite_bits();
    }
    return sign | t.inf_bits();
  }
  return sign | uint32_t(result);
}

// The exact float value of a format's bit pattern. NaN decodes to a NaN of the same sign; for
// formats with fp32's exponent range (tf32, bf16) decoding is the plain bit shift, for the others
// the quiet bit is set (as F16C's vcvtph2ps does).
constexpr float decode_bits(uint32_t b, FormatSpec t) {
  const int m = t.mantissa_bits;
  const uint32_t sign = (b & t.sign_bit()) ? 0x80000000u : 0u;
  if (t.is_scale()) {  // e8m0: 2^(b - 127); field 0 is 2^-127, below fp32's normal range
    if (b == t.quiet_nan_bits()) return std::bit_cast<float>(0x7fc00000u);
    return std::bit_cast<float>(b == 0 ? 0x00400000u : b << 23);
  }
  if (t.exponent_bits == 8)
    return std::bit_cast<float>(sign | ((b & t.magnitude_mask()) << (23 - m)));

  const uint32_t e_field = (b >> m) & t.exponent_mask();
  uint32_t mant = b & t.mantissa_mask();
  if (t.nan == NanEncoding::AllOnes && e_field == t.exponent_mask() && mant == t.mantissa_mask()) {
    return std::bit_cast<float>(sign | 0x7fc00000u);
  }
  if (t.has_inf() && e_field == t.exponent_mask()) {
    const uint32_t nan = mant ? 0x00400000u | (mant << (23 - m)) : 0u;
    return std::bit_cast<float>(sign | 0x7f800000u | nan);
  }
  int e = int(e_field) - t.bias();
  if (e_field == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Normalize the subnormal: every format here has a range well inside fp32's normal range.
    e = t.emin();
    while (!(mant & (1u << m))) {
      mant <<= 1;
      --e;
    }
    mant &= t.mantissa_mask();
  }
  return std::bit_cast<float>(sign | (uint32_t(e + 127) << 23) | (mant << (23 - m)));
}

// What encode_fp8_saturating computes for one float: the code, and the magnitude it rounded |x|
// to as float bits (for a non-NaN code, the bits of |decode_fp8(code)|; for NaN, meaningless).
struct Fp8Rounding {
  uint32_t code;
  uint32_t magnitude;
};

// fp8 training's quantization of one float (given as bits): round to nearest even into fp8
// format F with saturation (finite values beyond the largest, and infinities, become the
// largest), NaN to a quiet NaN. The same bits as encode_bits with Overflow::Saturate (tested over
// a sweep of all floats; this formulation was checked against the previous one on all 2^32
// inputs), branch-free so that a loop over it vectorizes. One float addition rounds: c = 2^(E +
// 23 - m), E the exponent of |x| (at least F's smallest normal exponent, at most one past its
// largest), has an ulp of 2^(E - m), F's grid step at |x|, in normal and subnormal results alike,
// so |x| + c rounds |x| onto F's grid (nearest even: c's significand is even), and (|x| + c) - c is
// the rounded magnitude, exactly. The steps of |x| + c above c count the code's position in its
// binade. The rounded magnitude comes with the code, so that a caller wanting the value too need
// not decode the code (the compiler drops it where it is not used). Always inlined, so a loop
// compiled for a wider instruction set keeps it in its own instructions.
template <Format F>
constexpr inline __attribute__((always_inline)) Fp8Rounding round_fp8_saturating(uint32_t x) {
  constexpr FormatSpec t = format_spec(F);
  constexpr int m = t.mantissa_bits;
  constexpr int drop = 23 - m;
  constexpr uint32_t kRebias = uint32_t(127 - t.bias()) << m;
  constexpr uint32_t kMinNormal = uint32_t(t.emin() + 127) << 23;  // 2^emin's exponent bits
  constexpr uint32_t kCap = uint32_t(t.emax() + 1 + 127) << 23;    // every |x| above saturates
  constexpr uint32_t kMax = t.max_finite_bits();
  constexpr uint32_t kMaxMagnitude = (kMax + kRebias) << drop;  // the largest value's float bits
  // The code of 2^emin's binade's first value, less 2^m (that value is 2^m steps above its c).
  constexpr uint32_t kFirst = uint32_t(128 - t.bias()) << m;
  const uint32_t sign = (x >> 31) << 7;
  const uint32_t a = x & 0x7fffffffu;
  uint32_t e = a & 0x7f800000u;
  e = e < kMinNormal ? kMinNormal : e;
  e = e > kCap ? kCap : e;
  const uint32_t cb = e + (uint32_t(drop) << 23);
  const float c = std::bit_cast<float>(cb);
  const float s = std::bit_cast<float>(a) + c;
  // Steps above c, plus the binade's first code: at least 0, as e >= kMinNormal. Beyond the
  // largest value (and for inf) it exceeds kMax; for NaN it is replaced.
  uint32_t code = std::bit_cast<uint32_t>(s) - cb + (e >> drop) - kFirst;
  code = code > kMax ? kMax : code;
  const uint32_t nan =
      t.has_inf() ? t.quiet_nan_bits() | ((a >> drop) & t.mantissa_mask()) : t.quiet_nan_bits();
  // Selected by a mask, not a condition: GCC moves float operations that feed one arm of a
  // select under a condition, and it does not if-convert float operations there (they may trap),
  // which would keep the loop scalar.
  const uint32_t is_nan = 0u - uint32_t(a > 0x7f800000u);
  code = (nan & is_nan) | (code & ~is_nan);
  const uint32_t magnitude = std::bit_cast<uint32_t>(s - c);
  return {sign | code, magnitude > kMaxMagnitude ? kMaxMagnitude : magnitude};
}

template <Format F>
constexpr inline __attribute__((always_inline)) uint32_t encode_fp8_saturating(uint32_t x) {
  return round_fp8_saturating<F>(x).code;
}

// The float value of an fp8 code of format F, as decode_bits gives it (tested on all 256
// codes), in integer operations only, so that a loop over it vectorizes (GCC will not if-convert
// float operations that it moves under a condition): normal codes rebias the exponent; a
// subnormal code's mantissa is normalized by its leading bit, found by comparisons; then inf and
// NaN.
template <Format F>
constexpr inline __attribute__((always_inline)) float decode_fp8(uint32_t code) {
  constexpr FormatSpec t = format_spec(F);
  constexpr int m = t.mantissa_bits;
  constexpr int drop = 23 - m;
  constexpr uint32_t kRebias = uint32_t(127 - t.bias()) << 23;
  const uint32_t sign = (code & 0x80u) << 24;
  const uint32_t mag = code & 0x7fu;
  const uint32_t e_field = mag >> m, mant = mag & t.mantissa_mask();
  // A subnormal is mant * 2^(emin - m) = 1.f * 2^(emin - m + lead), lead = floor(log2(mant)).
  uint32_t lead = 0;
  for (int k = 1; k < m; ++k)
    lead += uint32_t(mant >= (1u << k));
  uint32_t frac = 0;
  for (int k = 0; k < m; ++k)
    frac = lead == uint32_t(k) ? (mant << (23 - k)) & 0x7fffffu : frac;
  const uint32_t sub = mant == 0 ? 0u : ((uint32_t(t.emin() - m + 127) + lead) << 23) | frac;
  const uint32_t normal = (mag << drop) + kRebias;
  uint32_t bits = e_field == 0 ? sub : normal;
  if constexpr (t.has_inf()) {
    const uint32_t special = 0x7f800000u | (uint32_t(mant != 0) << 22) | (mant << drop);
    bits = e_field == t.exponent_mask() ? special : bits;
  } else {
    bits = mag == 0x7fu ? 0x7fc00000u : bits;
  }
  return std::bit_cast<float>(sign | bits);
}

}  // namespace detail

// Rounds x into format f; returns the format's bits, right-aligned (tf32: 19 bits).
constexpr uint32_t encode(Format f, float x, RoundingMode mode = RoundingMode::NearestEven,
                          Overflow overflow = Overflow::Infinity, uint32_t random_bits = 0) {
  return detail::encode_bits<float>(std::bit_cast<uint32_t>(x), format_spec(f), mode, overflow,
                                    random_bits);
}

// The same from a double, rounded once (no double rounding through float).
constexpr uint32_t encode(Format f, double x, RoundingMode mode = RoundingMode::NearestEven,
                          Overflow overflow = Overflow::Infinity, uint32_t random_bits = 0) {
  return detail::encode_bits<double>(std::bit_cast<uint64_t>(x), format_spec(f), mode, overflow,
                                     random_bits);
}

// The exact value of a format's bits.
constexpr float decode(Format f, uint32_t bits) {
  return detail::decode_bits(bits, format_spec(f));
}

// x moved onto the format's grid, as an fp32 value (the emulation primitive).
constexpr float round_to(Format f, float x, RoundingMode mode = RoundingMode::NearestEven,
                         Overflow overflow = Overflow::Infinity, uint32_t random_bits = 0) {
  return decode(f, encode(f, x, mode, overflow, random_bits));
}

}  // namespace mantissa
