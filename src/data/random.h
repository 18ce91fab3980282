// Internal: the counter-based draws behind the data module's randomness (samplers, synthetic
// data). Philox at explicit counters: no generator state, so any draw can be made on its own, on
// any thread, and results never depend on the thread count or the machine.
#pragma once

#include <cstdint>

#include "mantissa/numerics/philox.h"

namespace mantissa::data {

// 64 random bits for element i of stream `stream` under `seed`.
inline uint64_t draw64(uint64_t seed, uint64_t stream, uint64_t i) {
  return uint64_t(random_bits(seed, stream, 2 * i)) << 32 | random_bits(seed, stream, 2 * i + 1);
}

// Uniform in [0, n) (multiply-shift; the bias is n / 2^64).
inline uint64_t below(uint64_t bits, uint64_t n) {
  return uint64_t((unsigned __int128)bits * n >> 64);
}

// Uniform in [0, 1) with 53 random bits.
inline double unit(uint64_t bits) {
  return double(bits >> 11) * 0x1.0p-53;
}

}  // namespace mantissa::data
