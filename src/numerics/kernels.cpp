#include "kernels.h"

#include <bit>
#include <cstring>

#include "mantissa/core/cpu.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/round.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers pass _mm512_undefined_*() as don't-care operands, which its own
// -Wmaybe-uninitialized then flags at every inlined use: a known false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define MT_X86_KERNELS 1
#define MT_TARGET_AVX2 __attribute__((target("avx2,f16c,fma")))
#define MT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,avx2")))
#define MT_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,avx2")))
#endif

namespace mantissa::detail {

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2+f16c";
    case Isa::Avx512:
      return "avx512";
    case Isa::Avx512Bf16:
      return "avx512_bf16";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::Scalar:
      return true;
#ifdef MT_X86_KERNELS
    case Isa::Avx2:
      return f.avx2 && f.f16c;
    case Isa::Avx512:
      return f.avx512_core() && f.f16c;
    case Isa::Avx512Bf16:
      return f.avx512_core() && f.f16c && f.avx512_bf16;
#else
    default:
      return false;
#endif
  }
  return false;
}

Isa best_isa() {
  static const Isa best = [] {
    for (Isa isa : {Isa::Avx512Bf16, Isa::Avx512, Isa::Avx2}) {
      if (isa_supported(isa)) return isa;
    }
    return Isa::Scalar;
  }();
  return best;
}

// ---------------------------------------------------------------------------------------------
// Scalar: the definition itself.

namespace {

template <Format F>
void encode_scalar(const float* src, uint16_t* dst, size_t n, RoundingMode mode) {
  constexpr FormatSpec spec = format_spec(F);
  for (size_t i = 0; i < n; ++i) {
    dst[i] = uint16_t(
        encode_bits<float>(std::bit_cast<uint32_t>(src[i]), spec, mode, Overflow::Infinity, 0));
  }
}

template <Format F>
void decode_scalar(const uint16_t* src, float* dst, size_t n) {
  constexpr FormatSpec spec = format_spec(F);
  for (size_t i = 0; i < n; ++i)
    dst[i] = decode_bits(src[i], spec);
}

void round_scalar(Format f, float* data, size_t n, RoundingMode mode) {
  for (size_t i = 0; i < n; ++i)
    data[i] = round_to(f, data[i], mode);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// x86 kernels. Each is compiled for its instruction set with a target attribute (not a file-wide
// -m flag), so no AVX-512 code can leak into functions the scalar path shares.

#ifdef MT_X86_KERNELS
namespace {

// bf16 and tf32 share fp32's exponent, so rounding is integer arithmetic on the fp32 bits:
// add half an ulp minus one plus the kept lsb (ties to even), then drop the low bits. NaN
// becomes quiet instead, so that a payload in the dropped bits cannot turn it into inf.
template <int kDrop>
MT_TARGET_AVX512 inline __m512i round_bits_avx512(__m512i b, RoundingMode mode) {
  const __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  __m512i r = b;
  if (mode == RoundingMode::NearestEven) {
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, kDrop), _mm512_set1_epi32(1));
    r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32((1 << (kDrop - 1)) - 1)));
  }
  return _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x00400000));
}

template <int kDrop>
MT_TARGET_AVX2 inline __m256i round_bits_avx2(__m256i b, RoundingMode mode) {
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

MT_TARGET_AVX512 void f32_to_bf16_avx512(const float* src, uint16_t* dst, size_t n,
                                         RoundingMode mode) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i b = _mm512_loadu_si512(src + i);
    const __m512i r = _mm512_srli_epi32(round_bits_avx512<16>(b, mode), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m512i b = _mm512_maskz_loadu_epi32(m, src + i);
    const __m512i r = _mm512_srli_epi32(round_bits_avx512<16>(b, mode), 16);
    _mm256_mask_storeu_epi16(dst + i, m, _mm512_cvtepi32_epi16(r));
  }
}

// vcvtneps2bf16 rounds to nearest even and quiets NaN exactly as the definition does, but it
// treats subnormal inputs as zero. A block holding a subnormal takes the integer path instead.
MT_TARGET_AVX512BF16 void f32_to_bf16_avx512bf16(const float* src, uint16_t* dst, size_t n) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(src + i);
    const __m512 hi = _mm512_loadu_ps(src + i + 16);
    const __m512i blo = _mm512_castps_si512(lo), bhi = _mm512_castps_si512(hi);
    // Subnormal: exponent field zero and the value non-zero.
    const __mmask16 sub_lo =
        _mm512_testn_epi32_mask(blo, exp_mask) & _mm512_test_epi32_mask(blo, abs_mask);
    const __mmask16 sub_hi =
        _mm512_testn_epi32_mask(bhi, exp_mask) & _mm512_test_epi32_mask(bhi, abs_mask);
    if ((sub_lo | sub_hi) == 0) [[likely]] {
      const __m512bh packed = _mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(dst + i, reinterpret_cast<const __m512i&>(packed));
    } else {
      f32_to_bf16_avx512(src + i, dst + i, 32, RoundingMode::NearestEven);
    }
  }
  if (i < n) f32_to_bf16_avx512(src + i, dst + i, n - i, RoundingMode::NearestEven);
}

MT_TARGET_AVX2 void f32_to_bf16_avx2(const float* src, uint16_t* dst, size_t n, RoundingMode mode) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a =
        round_bits_avx2<16>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)), mode);
    const __m256i b = round_bits_avx2<16>(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)), mode);
    // packus works per 128-bit lane; the permute restores element order.
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(a, 16), _mm256_srli_epi32(b, 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permute4x64_epi64(packed, 0xd8));
  }
  encode_scalar<Format::BF16>(src + i, dst + i, n - i, mode);
}

MT_TARGET_AVX512 void bf16_to_f32_avx512(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
    _mm512_mask_storeu_epi32(dst + i, m, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

MT_TARGET_AVX2 void bf16_to_f32_avx2(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  decode_scalar<Format::BF16>(src + i, dst + i, n - i);
}

template <int kRound>
MT_TARGET_AVX512 void f32_to_f16_avx512(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), kRound);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), kRound);
    _mm256_mask_storeu_epi16(dst + i, m, h);
  }
}

template <int kRound>
MT_TARGET_AVX2 void f32_to_f16_avx2(const float* src, uint16_t* dst, size_t n, RoundingMode mode) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), kRound);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  encode_scalar<Format::FP16>(src + i, dst + i, n - i, mode);
}

MT_TARGET_AVX512 void f16_to_f32_avx512(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}

MT_TARGET_AVX2 void f16_to_f32_avx2(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  decode_scalar<Format::FP16>(src + i, dst + i, n - i);
}

template <int kDrop>
MT_TARGET_AVX512 void round_grid_avx512(float* data, size_t n, RoundingMode mode) {
  const __m512i keep = _mm512_set1_epi32(int32_t(~((1u << kDrop) - 1)));
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i b = _mm512_loadu_si512(data + i);
    _mm512_storeu_si512(data + i, _mm512_and_si512(round_bits_avx512<kDrop>(b, mode), keep));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m512i b = _mm512_maskz_loadu_epi32(m, data + i);
    _mm512_mask_storeu_epi32(data + i, m,
                             _mm512_and_si512(round_bits_avx512<kDrop>(b, mode), keep));
  }
}

template <int kDrop>
MT_TARGET_AVX2 void round_grid_avx2(float* data, size_t n, RoundingMode mode, Format f) {
  const __m256i keep = _mm256_set1_epi32(int32_t(~((1u << kDrop) - 1)));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    auto* p = reinterpret_cast<__m256i*>(data + i);
    _mm256_storeu_si256(
        p, _mm256_and_si256(round_bits_avx2<kDrop>(_mm256_loadu_si256(p), mode), keep));
  }
  round_scalar(f, data + i, n - i, mode);
}

template <int kRound>
MT_TARGET_AVX512 void round_f16_avx512(float* data, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(data + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(data + i), kRound)));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, data + i);
    _mm512_mask_storeu_ps(data + i, m, _mm512_cvtph_ps(_mm512_cvtps_ph(x, kRound)));
  }
}

template <int kRound>
MT_TARGET_AVX2 void round_f16_avx2(float* data, size_t n, RoundingMode mode) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(data + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(data + i), kRound)));
  }
  round_scalar(Format::FP16, data + i, n - i, mode);
}

constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr int kRtz = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;

}  // namespace
#endif  // MT_X86_KERNELS

// ---------------------------------------------------------------------------------------------
// Dispatch.

namespace {

void check_call(Isa isa, RoundingMode mode) {
  MT_ASSERT(isa_supported(isa), "instruction set ", isa_name(isa), " is not available here");
  MT_ASSERT(mode != RoundingMode::Stochastic, "the vector kernels do not round stochastically");
}

}  // namespace

void f32_to_bf16(const float* src, uint16_t* dst, size_t n, RoundingMode mode, Isa isa) {
  check_call(isa, mode);
#ifdef MT_X86_KERNELS
  if (isa == Isa::Avx512Bf16 && mode == RoundingMode::NearestEven) {
    return f32_to_bf16_avx512bf16(src, dst, n);
  }
  if (isa == Isa::Avx512 || isa == Isa::Avx512Bf16) return f32_to_bf16_avx512(src, dst, n, mode);
  if (isa == Isa::Avx2) return f32_to_bf16_avx2(src, dst, n, mode);
#endif
  encode_scalar<Format::BF16>(src, dst, n, mode);
}

void f32_to_f16(const float* src, uint16_t* dst, size_t n, RoundingMode mode, Isa isa) {
  check_call(isa, mode);
#ifdef MT_X86_KERNELS
  const bool rne = mode == RoundingMode::NearestEven;
  if (isa == Isa::Avx512 || isa == Isa::Avx512Bf16) {
    return rne ? f32_to_f16_avx512<kRne>(src, dst, n) : f32_to_f16_avx512<kRtz>(src, dst, n);
  }
  if (isa == Isa::Avx2) {
    return rne ? f32_to_f16_avx2<kRne>(src, dst, n, mode)
               : f32_to_f16_avx2<kRtz>(src, dst, n, mode);
  }
#endif
  encode_scalar<Format::FP16>(src, dst, n, mode);
}

void bf16_to_f32(const uint16_t* src, float* dst, size_t n, Isa isa) {
  check_call(isa, RoundingMode::NearestEven);
#ifdef MT_X86_KERNELS
  if (isa == Isa::Avx512 || isa == Isa::Avx512Bf16) return bf16_to_f32_avx512(src, dst, n);
  if (isa == Isa::Avx2) return bf16_to_f32_avx2(src, dst, n);
#endif
  decode_scalar<Format::BF16>(src, dst, n);
}

void f16_to_f32(const uint16_t* src, float* dst, size_t n, Isa isa) {
  check_call(isa, RoundingMode::NearestEven);
#ifdef MT_X86_KERNELS
  if (isa == Isa::Avx512 || isa == Isa::Avx512Bf16) return f16_to_f32_avx512(src, dst, n);
  if (isa == Isa::Avx2) return f16_to_f32_avx2(src, dst, n);
#endif
  decode_scalar<Format::FP16>(src, dst, n);
}

void round_in_place_fast(Format f, float* data, size_t n, RoundingMode mode, Isa isa) {
  check_call(isa, mode);
  MT_ASSERT(f == Format::TF32 || f == Format::BF16 || f == Format::FP16, "format ", format_name(f),
            " has no vector rounding kernel");
#ifdef MT_X86_KERNELS
  const bool avx512 = isa == Isa::Avx512 || isa == Isa::Avx512Bf16;
  if (avx512 || isa == Isa::Avx2) {
    const bool rne = mode == RoundingMode::NearestEven;
    switch (f) {
      case Format::TF32:
        return avx512 ? round_grid_avx512<13>(data, n, mode)
                      : round_grid_avx2<13>(data, n, mode, f);
      case Format::BF16:
        return avx512 ? round_grid_avx512<16>(data, n, mode)
                      : round_grid_avx2<16>(data, n, mode, f);
      default:
        if (avx512) return rne ? round_f16_avx512<kRne>(data, n) : round_f16_avx512<kRtz>(data, n);
        return rne ? round_f16_avx2<kRne>(data, n, mode) : round_f16_avx2<kRtz>(data, n, mode);
    }
  }
#endif
  round_scalar(f, data, n, mode);
}

}  // namespace mantissa::detail
