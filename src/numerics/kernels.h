// Internal: the vectorized conversion kernels, callable per instruction set so that tests can
// prove each one bit-identical to the scalar definition and benchmarks can compare them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "mantissa/numerics/format.h"

namespace mantissa::detail {

enum class Isa : uint8_t {
  Scalar,
  Avx2,        // AVX2 + F16C
  Avx512,      // AVX-512 F/BW/VL
  Avx512Bf16,  // Avx512 + vcvtneps2bf16
};
inline constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16};

std::string_view isa_name(Isa isa);
// Whether this machine can run `isa` (after the MANTISSA_ISA cap).
bool isa_supported(Isa isa);
// The best supported one.
Isa best_isa();

// `mode` is NearestEven or TowardZero; overflow goes to inf (the formats' own definition).
void f32_to_bf16(const float* src, uint16_t* dst, size_t n, RoundingMode mode, Isa isa);
void f32_to_f16(const float* src, uint16_t* dst, size_t n, RoundingMode mode, Isa isa);
void bf16_to_f32(const uint16_t* src, float* dst, size_t n, Isa isa);
void f16_to_f32(const uint16_t* src, float* dst, size_t n, Isa isa);
// f is TF32, BF16 or FP16.
void round_in_place_fast(Format f, float* data, size_t n, RoundingMode mode, Isa isa);

// Stochastic rounding with overflow to inf: element i draws random_bits(seed, offset, index + i)
// (philox.h), exactly as encode_bits() with those bits. The vector kernels run Philox4x32-10 on
// 8 (AVX-512) or 4 (AVX2) blocks per register; an unaligned index takes up to 3 scalar elements.
void f32_to_bf16_stochastic(const float* src, uint16_t* dst, size_t n, uint64_t seed,
                            uint64_t offset, uint64_t index, Isa isa);
void f32_to_f16_stochastic(const float* src, uint16_t* dst, size_t n, uint64_t seed,
                           uint64_t offset, uint64_t index, Isa isa);

// dst[i] = random_bits(seed, offset, index + i) (philox.h), by the same vector Philox.
void random_bits_fill(uint32_t* dst, size_t n, uint64_t seed, uint64_t offset, uint64_t index,
                      Isa isa);
// Sixteen consecutive elements of each of n runs `stride` apart, run c from index + c * stride,
// as rows: dst[i * n + c] = random_bits(seed, offset, index + c * stride + i) for i < 16, c < n
// (FP4's stochastic rounding down a matrix's columns). The vector Philox where index and stride
// are multiples of 4 (each run then four whole blocks).
void random_bits_runs16(uint32_t* dst, size_t n, uint64_t seed, uint64_t offset, uint64_t index,
                        uint64_t stride, Isa isa);

}  // namespace mantissa::detail
