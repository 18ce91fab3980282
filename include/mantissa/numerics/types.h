// Scalar storage types for the half, fp8, fp6 and fp4 formats and the e8m0 scale. Each is a
// trivially copyable wrapper of its bits, aligned to its size, converted explicitly from and to
// float (round to nearest even, overflow as the format defines: inf, NaN for fp8_e4m3 and e8m0, the
// largest value for fp6 and fp4 — as ml_dtypes and PyTorch do). Other rounding modes:
// encode()/round_to() in round.h and the bulk functions in convert.h.
#pragma once

#include <bit>
#include <cstdint>
#include <tuple>
#include <type_traits>

#include "mantissa/numerics/round.h"

namespace mantissa {

namespace detail {

template <Format F, typename Bits>
struct alignas(sizeof(Bits)) SmallFloat {
  using bits_type = Bits;
  static constexpr Format format = F;

  Bits bits;

  SmallFloat() = default;
  // The format's spec as a constant (not a run-time read of round.h's table, which is host
  // data: device code that indexed it at run time would read address 0 plus an offset).
  static constexpr FormatSpec spec() {
    constexpr FormatSpec s = format_spec(F);
    return s;
  }
  constexpr explicit SmallFloat(float x)
      : bits(static_cast<Bits>(detail::encode_bits<float>(std::bit_cast<uint32_t>(x), spec(),
                                                          RoundingMode::NearestEven,
                                                          Overflow::Infinity, 0u))) {}
  constexpr explicit operator float() const { return detail::decode_bits(bits, spec()); }

  static constexpr SmallFloat from_bits(Bits b) {
    SmallFloat r;
    r.bits = b;
    return r;
  }
  // Bitwise equality (NaN == NaN here, +0 != -0): what tests and checkpoints need.
  friend constexpr bool same_bits(SmallFloat a, SmallFloat b) { return a.bits == b.bits; }
};

}  // namespace detail

using half = detail::SmallFloat<Format::FP16, uint16_t>;
using bfloat16 = detail::SmallFloat<Format::BF16, uint16_t>;
using float8_e4m3 = detail::SmallFloat<Format::FP8_E4M3, uint8_t>;
using float8_e5m2 = detail::SmallFloat<Format::FP8_E5M2, uint8_t>;
// The OCP Microscaling element formats, one value in the low bits of a byte (as ml_dtypes'
// float6_e2m3fn, float6_e3m2fn and float4_e2m1fn), and the e8m0 block scale (float8_e8m0fnu).
using float6_e2m3 = detail::SmallFloat<Format::FP6_E2M3, uint8_t>;
using float6_e3m2 = detail::SmallFloat<Format::FP6_E3M2, uint8_t>;
using float4_e2m1 = detail::SmallFloat<Format::FP4_E2M1, uint8_t>;
using float8_e8m0 = detail::SmallFloat<Format::E8M0, uint8_t>;

// Every storage type, for code that picks one by its format at run time.
using SmallFloats = std::tuple<half, bfloat16, float8_e4m3, float8_e5m2, float6_e2m3, float6_e3m2,
                               float4_e2m1, float8_e8m0>;

// Whether T is one of these storage types (SmallFloat): converted through round.h, never by the
// compiler. The backends use it to pick their load/store paths, so a new format is one alias.
template <typename T>
inline constexpr bool is_small_float_v = false;
template <Format F, typename Bits>
inline constexpr bool is_small_float_v<detail::SmallFloat<F, Bits>> = true;

static_assert(std::is_trivially_copyable_v<half> && sizeof(half) == 2 && alignof(half) == 2);
static_assert(std::is_trivially_copyable_v<bfloat16> && sizeof(bfloat16) == 2);
static_assert(std::is_trivially_copyable_v<float8_e4m3> && sizeof(float8_e4m3) == 1);
static_assert(std::is_trivially_copyable_v<float8_e5m2> && sizeof(float8_e5m2) == 1);
static_assert(sizeof(float6_e2m3) == 1 && sizeof(float6_e3m2) == 1 && sizeof(float4_e2m1) == 1 &&
              sizeof(float8_e8m0) == 1);

}  // namespace mantissa
