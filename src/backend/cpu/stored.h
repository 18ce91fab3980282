// Internal: f32 or bf16 storage read and written inside a kernel's loop, so that the loop
// vectorizes with the conversions in it instead of a separate pass that converts each input into
// a float buffer and the result out of one. bf16 widens by a shift and rounds to nearest even by
// integer arithmetic, NaN quieted with its payload: the numerics layer's convert() bits.
// Always inlined, so that a loop compiled per instruction set (isa_builds.inc) gets them in its
// own instructions. stored_load/stored_store with S == C are plain reads and writes (f64 too).
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "mantissa/numerics/types.h"

namespace mantissa::backend::cpu {

// The storage types a kernel can read and write in its loop with float compute.
template <typename S>
inline constexpr bool kStoredInLoop = std::is_same_v<S, float> || std::is_same_v<S, bfloat16>;

template <typename S, typename C = float>
inline __attribute__((always_inline)) C stored_load(const S* p, int64_t j) {
  if constexpr (std::is_same_v<S, C>) {
    return p[j];
  } else {
    static_assert(std::is_same_v<S, bfloat16> && std::is_same_v<C, float>);
    return std::bit_cast<float>(uint32_t(p[j].bits) << 16);
  }
}

template <typename S, typename C = float>
inline __attribute__((always_inline)) void stored_store(S* p, int64_t j, C v) {
  if constexpr (std::is_same_v<S, C>) {
    p[j] = v;
  } else {
    static_assert(std::is_same_v<S, bfloat16> && std::is_same_v<C, float>);
    const uint32_t u = std::bit_cast<uint32_t>(v);
    const uint32_t rounded = (u + ((u >> 16) & 1u) + 0x7fffu) >> 16;
    const uint32_t quiet = (u | 0x00400000u) >> 16;
    p[j].bits = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

}  // namespace mantissa::backend::cpu
