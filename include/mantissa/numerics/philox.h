// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. The i-th random number is a pure function of (seed, counter), so
// stochastic rounding is reproducible, splittable across threads and identical on any device.
#pragma once

#include <array>
#include <cstdint>

namespace mantissa {

using PhiloxBlock = std::array<uint32_t, 4>;

constexpr PhiloxBlock philox4x32_10(PhiloxBlock ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kM0) * ctr[0];
    const uint64_t p1 = uint64_t(kM1) * ctr[2];
    ctr = {uint32_t(p1 >> 32) ^ ctr[1] ^ key[0], uint32_t(p1), uint32_t(p0 >> 32) ^ ctr[3] ^ key[1],
           uint32_t(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

// The 32 random bits for element `index` of a stream identified by (seed, offset). One Philox
// block yields four consecutive elements. Callers that round the same tensor twice (e.g. every
// optimizer step) advance `offset` so that each use draws fresh bits.
constexpr uint32_t random_bits(uint64_t seed, uint64_t offset, uint64_t index) {
  const uint64_t block = index >> 2;
  const PhiloxBlock r = philox4x32_10(
      {uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32)},
      {uint32_t(seed), uint32_t(seed >> 32)});
  return r[index & 3];
}

// A well-mixed 64-bit seed for sub-stream `index` of `seed` (splitmix64 of a combination):
// nearby (seed, index) pairs give unrelated seeds. How a model's layers and a default generator's
// draws get seeds of their own from one seed.
constexpr uint64_t mix_seed(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + (index + 1) * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace mantissa
