// Bulk conversions between fp32 arrays and the storage formats, and in-place rounding of fp32
// arrays onto a format's grid (the emulation primitive: fp16/tf32/fp8 "run" on a CPU that lacks
// them by rounding inputs to the format and computing in fp32).
//
// Round-to-nearest-even and truncation, and stochastic rounding to bf16 and fp16 (with the
// format's own overflow), are vectorized (AVX-512, AVX512-BF16, AVX2 + F16C), chosen at run time,
// and bit-identical to the scalar encode()/decode() of round.h, which remain the definition.
// Stochastic rounding draws element i's bits from random_bits(seed, offset, index + i); the vector
// path computes eight Philox blocks per register.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mantissa/numerics/format.h"
#include "mantissa/numerics/types.h"

namespace mantissa {

struct RoundingOptions {
  RoundingMode mode = RoundingMode::NearestEven;
  Overflow overflow = Overflow::Infinity;
  uint64_t seed = 0;    // Stochastic only
  uint64_t offset = 0;  // Stochastic only: advance it between uses of the same seed
  uint64_t index = 0;   // Stochastic only: the stream position of element 0 (a chunk's start)
};

void convert(const float* src, bfloat16* dst, size_t n, const RoundingOptions& options = {});
void convert(const float* src, half* dst, size_t n, const RoundingOptions& options = {});
void convert(const float* src, float8_e4m3* dst, size_t n, const RoundingOptions& options = {});
void convert(const float* src, float8_e5m2* dst, size_t n, const RoundingOptions& options = {});
void convert(const float* src, float6_e2m3* dst, size_t n, const RoundingOptions& options = {});
void convert(const float* src, float6_e3m2* dst, size_t n, const RoundingOptions& options = {});
void convert(const float* src, float4_e2m1* dst, size_t n, const RoundingOptions& options = {});
void convert(const float* src, float8_e8m0* dst, size_t n, const RoundingOptions& options = {});

// Exact widening.
void convert(const bfloat16* src, float* dst, size_t n);
void convert(const half* src, float* dst, size_t n);
void convert(const float8_e4m3* src, float* dst, size_t n);
void convert(const float8_e5m2* src, float* dst, size_t n);
void convert(const float6_e2m3* src, float* dst, size_t n);
void convert(const float6_e3m2* src, float* dst, size_t n);
void convert(const float4_e2m1* src, float* dst, size_t n);
void convert(const float8_e8m0* src, float* dst, size_t n);

// Moves every value of `data` onto format f's grid (values stay fp32). FP32 is a no-op.
void round_in_place(Format f, float* data, size_t n, const RoundingOptions& options = {});

}  // namespace mantissa
