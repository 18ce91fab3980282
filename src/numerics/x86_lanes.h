// Internal: fp32 <-> bf16 and fp16 conversions of 8 lanes in registers, for x86 kernels compiled
// for AVX2 + F16C + FMA (kernels.cpp's AVX2 conversions, and kernels elsewhere that convert a
// row of a few dozen elements inside their loops, where a call to convert() per row cost more
// than the conversion). The same bits as the formats' scalar definitions (round.h), which the
// conversion tests check for every kernel built on these: nearest-even ties, overflow to inf,
// subnormals kept, NaN quiet with its sign and payload's high bits.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "mantissa/numerics/format.h"

// Inlined into callers built for the same features (a target attribute or a #pragma GCC target
// with at least avx2, f16c and fma).
#define MT_X86_LANES __attribute__((target("avx2,f16c,fma"), always_inline)) inline

namespace mantissa::detail::x86 {

// bf16 and tf32 share fp32's exponent, so rounding is integer arithmetic on the fp32 bits:
// add half an ulp minus one plus the kept lsb (ties to even), then drop the low bits. NaN
// becomes quiet instead, so that a payload in the dropped bits cannot turn it into inf. The
// low kDrop bits of the result are to be dropped by the caller.
template <int kDrop>
MT_X86_LANES __m256i round_bits_avx2(__m256i b, RoundingMode mode) {
  const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  // Signed compare is safe: abs is non-negative.
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  __m256i r = b;
  if (mode == RoundingMode::NearestEven) {
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, kDrop), _mm256_set1_epi32(1));
    r = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32((1 << (kDrop - 1)) - 1)));
  }
  const __m256i quiet = _mm256_or_si256(b, _mm256_set1_epi32(0x00400000));
  return _mm256_blendv_epi8(r, quiet, nan);
}

// 8 bf16 at p, widened exactly.
MT_X86_LANES __m256 load_bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// x rounded to bf16 (nearest even), stored as 8 values at p.
MT_X86_LANES void store_bf16x8(__m256 x, uint16_t* p) {
  const __m256i r =
      _mm256_srli_epi32(round_bits_avx2<16>(_mm256_castps_si256(x), RoundingMode::NearestEven), 16);
  // Each lane is below 2^16, so the unsigned saturation of packus keeps it as it is.
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// 8 fp16 at p, widened exactly (F16C).
MT_X86_LANES __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// x rounded to fp16 (nearest even, overflow to inf: F16C's conversion is the definition's),
// stored as 8 values at p.
MT_X86_LANES void store_f16x8(__m256 x, uint16_t* p) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

}  // namespace mantissa::detail::x86

#endif
