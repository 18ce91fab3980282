#include "kernels.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "mantissa/core/cpu.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers pass _mm512_undefined_*() as don't-care operands, which its own
// -Wmaybe-uninitialized then flags at every inlined use: a known false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "x86_lanes.h"
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

// Stochastic rounding, overflow to inf: element i uses word (index + i) % 4 of Philox block
// (index + i) / 4, as convert() defines it.
template <Format F>
void stochastic_scalar(const float* src, uint16_t* dst, size_t n, uint64_t seed, uint64_t offset,
                       uint64_t index) {
  constexpr FormatSpec spec = format_spec(F);
  const std::array<uint32_t, 2> key = {uint32_t(seed), uint32_t(seed >> 32)};
  size_t i = 0;
  while (i < n) {
    const uint64_t pos = index + i;
    const uint64_t block = pos >> 2;
    const PhiloxBlock r = philox4x32_10(
        {uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32)}, key);
    for (size_t w = size_t(pos & 3); w < 4 && i < n; ++w, ++i) {
      dst[i] = uint16_t(encode_bits<float>(std::bit_cast<uint32_t>(src[i]), spec,
                                           RoundingMode::Stochastic, Overflow::Infinity, r[w]));
    }
  }
}

// Philox's per-round keys, shared by every block of a call.
struct PhiloxKeys {
  uint32_t k0[10], k1[10];
  explicit PhiloxKeys(uint64_t seed) {
    uint32_t a = uint32_t(seed), b = uint32_t(seed >> 32);
    for (int r = 0; r < 10; ++r, a += 0x9E3779B9u, b += 0xBB67AE85u) {
      k0[r] = a;
      k1[r] = b;
    }
  }
};

// Philox blocks are (index + i) / 4 modulo 2^62: the element position wraps at 2^64.
constexpr uint64_t kBlockMask = (uint64_t(1) << 62) - 1;

}  // namespace

// ---------------------------------------------------------------------------------------------
// x86 kernels. Each is compiled for its instruction set with a target attribute (not a file-wide
// -m flag), so no AVX-512 code can leak into functions the scalar path shares.

#ifdef MT_X86_KERNELS
namespace {

using x86::round_bits_avx2;

// x86_lanes.h's round_bits_avx2 in 16 lanes.
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
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, x86::load_bf16x8(src + i));
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
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, x86::load_f16x8(src + i));
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

// ---- Stochastic rounding.
//
// Philox4x32-10 runs on one block per 64-bit lane: the low half of a lane holds the 32-bit word
// and the high half is don't-care, since vpmuludq reads only the low halves and the products'
// high words are taken with a 64-bit shift. K independent groups interleave to hide the multiply
// latency. Lane l of a group computes block base + kLaneBlock[l], chosen so that the final
// unpacks leave the words of consecutive blocks in element order.
//
// The rounding itself is integer arithmetic on the fp32 bits, equal to encode_bits() (Stochastic,
// Overflow::Infinity) for every input:
//  bf16: fp32's exponent range, so every value drops its low 16 bits `rem` and rounds away from
//    zero iff r < rem << 16; the carry of a rounded-up mantissa goes into the exponent, and from
//    the largest finite value into inf (0x7f80). Zero and inf have rem = 0. NaN: quiet, payload
//    kept (bits >> 16 | 0x40).
//  fp16: with e_field the fp32 exponent field, sig the significand (implicit bit included for
//    e_field > 0), the dropped bit count is shift = max(13, 126 - max(e_field, 1)) (more than 13
//    in fp16's subnormal range), keep = sig >> shift, threshold = low 32 bits of
//    (sig << 32) >> shift, and the result max(e_field - 113, 0) << 10 + keep + (r < threshold),
//    clamped to inf (0x7c00) from above. NaN: 0x7e00 | payload.

// GCC 12 at -O2 with the sanitizers reports the _mm512_undefined_epi32() inside
// _mm512_srli_epi64's definition as used uninitialized (-Wuninitialized); the intrinsic's
// pass-through operand is unused under an all-ones mask, so the warning is false.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
template <int K>
MT_TARGET_AVX512 inline void philox_avx512(const __m512i (&blocks)[K], __m512i ofs_lo,
                                           __m512i ofs_hi, const PhiloxKeys& keys,
                                           __m512i (&out)[2 * K]) {
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
  __m512i c0[K], c1[K], c2[K], c3[K];
  for (int k = 0; k < K; ++k) {
    c0[k] = blocks[k];
    c1[k] = _mm512_srli_epi64(blocks[k], 32);
    c2[k] = ofs_lo;
    c3[k] = ofs_hi;
  }
  for (int r = 0; r < 10; ++r) {
    const __m512i key0 = _mm512_set1_epi32(int32_t(keys.k0[r]));
    const __m512i key1 = _mm512_set1_epi32(int32_t(keys.k1[r]));
    for (int k = 0; k < K; ++k) {
      const __m512i p0 = _mm512_mul_epu32(c0[k], m0), p1 = _mm512_mul_epu32(c2[k], m1);
      c0[k] = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p1, 32), c1[k], key0, 0x96);  // xor
      c2[k] = _mm512_ternarylogic_epi32(_mm512_srli_epi64(p0, 32), c3[k], key1, 0x96);
      c1[k] = p1;
      c3[k] = p0;
    }
  }
  for (int k = 0; k < K; ++k) {
    const __m512i w01 = _mm512_mask_blend_epi32(0xAAAA, c0[k], _mm512_slli_epi64(c1[k], 32));
    const __m512i w23 = _mm512_mask_blend_epi32(0xAAAA, c2[k], _mm512_slli_epi64(c3[k], 32));
    out[2 * k] = _mm512_unpacklo_epi64(w01, w23);      // blocks 0..3 of the group
    out[2 * k + 1] = _mm512_unpackhi_epi64(w01, w23);  // blocks 4..7
  }
}
#pragma GCC diagnostic pop

template <Format F>
MT_TARGET_AVX512 inline __m512i stochastic_round_avx512(__m512i b, __m512i r) {
  const __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  if constexpr (F == Format::BF16) {
    const __mmask16 up = _mm512_cmplt_epu32_mask(r, _mm512_slli_epi32(b, 16));
    const __m512i h = _mm512_srli_epi32(b, 16);
    const __m512i rounded = _mm512_mask_sub_epi32(h, up, h, _mm512_set1_epi32(-1));
    return _mm512_mask_or_epi32(rounded, nan, h, _mm512_set1_epi32(0x40));
  } else {
    static_assert(F == Format::FP16);
    const __m512i ef = _mm512_srli_epi32(abs, 23);
    const __m512i mant = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffff));
    const __m512i sig = _mm512_mask_or_epi32(mant, _mm512_test_epi32_mask(ef, ef), mant,
                                             _mm512_set1_epi32(1 << 23));
    const __m512i shift = _mm512_max_epi32(
        _mm512_sub_epi32(_mm512_set1_epi32(126), _mm512_max_epu32(ef, _mm512_set1_epi32(1))),
        _mm512_set1_epi32(13));
    const __m512i keep = _mm512_srlv_epi32(sig, shift);
    // Shift counts above 31 (including "negative" ones) give 0.
    const __m512i threshold =
        _mm512_or_si512(_mm512_sllv_epi32(sig, _mm512_sub_epi32(_mm512_set1_epi32(32), shift)),
                        _mm512_srlv_epi32(sig, _mm512_sub_epi32(shift, _mm512_set1_epi32(32))));
    const __m512i base = _mm512_slli_epi32(
        _mm512_max_epi32(_mm512_sub_epi32(ef, _mm512_set1_epi32(113)), _mm512_setzero_si512()), 10);
    __m512i res = _mm512_add_epi32(base, keep);
    res = _mm512_mask_sub_epi32(res, _mm512_cmplt_epu32_mask(r, threshold), res,
                                _mm512_set1_epi32(-1));
    res = _mm512_min_epu32(res, _mm512_set1_epi32(0x7c00));
    res = _mm512_mask_or_epi32(
        res, nan, _mm512_and_si512(_mm512_srli_epi32(abs, 13), _mm512_set1_epi32(0x3ff)),
        _mm512_set1_epi32(0x7e00));
    return _mm512_or_si512(res,
                           _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x8000)));
  }
}

// The block counters of a run of Philox groups from block `first` on: each next<K>() computes
// K groups of 8 blocks (32 K words, in element order) and moves on.
struct PhiloxGroups {
  PhiloxKeys keys;
  __m512i ofs_lo, ofs_hi, mask, step, blk;
  MT_TARGET_AVX512 PhiloxGroups(uint64_t seed, uint64_t offset, uint64_t first)
      : keys(seed),
        ofs_lo(_mm512_set1_epi64(int64_t(offset & 0xffffffffu))),
        ofs_hi(_mm512_set1_epi64(int64_t(offset >> 32))),
        mask(_mm512_set1_epi64(int64_t(kBlockMask))),
        step(_mm512_set1_epi64(8)),
        blk(_mm512_and_si512(_mm512_add_epi64(_mm512_set1_epi64(int64_t(first)),
                                              _mm512_setr_epi64(0, 4, 1, 5, 2, 6, 3, 7)),
                             mask)) {}
  template <int K>
  MT_TARGET_AVX512 inline void next(__m512i (&r)[2 * K]) {
    __m512i blocks[K];
    for (int k = 0; k < K; ++k) {
      blocks[k] = blk;
      blk = _mm512_and_si512(_mm512_add_epi64(blk, step), mask);
    }
    philox_avx512<K>(blocks, ofs_lo, ofs_hi, keys, r);
  }
};

template <Format F, int K>
MT_TARGET_AVX512 void stochastic_avx512(const float* src, uint16_t* dst, size_t n, uint64_t seed,
                                        uint64_t offset, uint64_t index) {
  // Up to 3 elements until the stream position is a block start.
  const size_t head = std::min(n, size_t((4 - (index & 3)) & 3));
  stochastic_scalar<F>(src, dst, head, seed, offset, index);
  if (head == n) return;
  PhiloxGroups groups(seed, offset, (index + head) >> 2);
  size_t i = head;
  for (; i + 32 * K <= n; i += 32 * K) {
    __m512i r[2 * K];
    groups.next<K>(r);
    for (int j = 0; j < 2 * K; ++j) {
      const __m512i b = _mm512_loadu_si512(src + i + 16 * j);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16 * j),
                          _mm512_cvtepi32_epi16(stochastic_round_avx512<F>(b, r[j])));
    }
  }
  for (; i < n; i += 32) {
    __m512i r[2];
    groups.next<1>(r);
    const size_t m = std::min<size_t>(32, n - i);
    for (size_t j = 0; j < 2 && 16 * j < m; ++j) {
      const __mmask16 lanes = __mmask16((1u << std::min<size_t>(16, m - 16 * j)) - 1);
      const __m512i b = _mm512_maskz_loadu_epi32(lanes, src + i + 16 * j);
      _mm256_mask_storeu_epi16(dst + i + 16 * j, lanes,
                               _mm512_cvtepi32_epi16(stochastic_round_avx512<F>(b, r[j])));
    }
  }
}

// Philox's bits alone, element i of the stream at index + i, into dst: the blocks as
// stochastic_avx512 computes them.
template <int K>
MT_TARGET_AVX512 void random_bits_avx512(uint32_t* dst, size_t n, uint64_t seed, uint64_t offset,
                                         uint64_t index) {
  size_t i = 0;
  for (; i < n && ((index + i) & 3) != 0; ++i)
    dst[i] = random_bits(seed, offset, index + i);
  if (i == n) return;
  PhiloxGroups groups(seed, offset, (index + i) >> 2);
  for (; i + 32 * K <= n; i += 32 * K) {
    __m512i r[2 * K];
    groups.next<K>(r);
    for (int j = 0; j < 2 * K; ++j)
      _mm512_storeu_si512(dst + i + 16 * j, r[j]);
  }
  for (; i < n; ++i)
    dst[i] = random_bits(seed, offset, index + i);
}

// The 16 x 16 transpose of 32-bit lanes: rows r[i] become columns.
MT_TARGET_AVX512 inline void transpose16_epi32(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int k = 0; k < 8; ++k) {
    t[2 * k] = _mm512_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; ++k) {
    u[4 * k] = _mm512_unpacklo_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 1] = _mm512_unpackhi_epi64(t[4 * k], t[4 * k + 2]);
    u[4 * k + 2] = _mm512_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
    u[4 * k + 3] = _mm512_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
  }
  // u[4k + j] holds, in its 128-bit lane q, column 4q + j of rows 4k..4k+3.
  for (int k = 0; k < 2; ++k) {
    for (int j = 0; j < 4; ++j) {
      t[8 * k + j] = _mm512_shuffle_i32x4(u[8 * k + j], u[8 * k + 4 + j], 0x88);
      t[8 * k + 4 + j] = _mm512_shuffle_i32x4(u[8 * k + j], u[8 * k + 4 + j], 0xdd);
    }
  }
  // t[8k + j] holds, for j < 4, columns j and 8 + j of rows 8k..8k+7 (128-bit lanes 0, 2 the
  // first's, 1, 3 the second's), and t[8k + 4 + j] columns 4 + j and 12 + j alike.
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd);
  }
}

// random_bits_runs16 with index and stride multiples of 4: sixteen runs at a time, two per
// Philox register (run A in out[2k], run B in out[2k + 1]: philox_avx512 writes 64-bit lanes
// 0, 2, 4, 6 as its first output's four blocks and 1, 3, 5, 7 as its second's), transposed.
MT_TARGET_AVX512 void random_bits_runs16_avx512(uint32_t* dst, size_t n, uint64_t seed,
                                                uint64_t offset, uint64_t index, uint64_t stride) {
  const PhiloxKeys keys(seed);
  const __m512i ofs_lo = _mm512_set1_epi64(int64_t(offset & 0xffffffffu));
  const __m512i ofs_hi = _mm512_set1_epi64(int64_t(offset >> 32));
  const __m512i mask = _mm512_set1_epi64(int64_t(kBlockMask));
  const __m512i steps = _mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3);
  for (size_t c0 = 0; c0 < n; c0 += 16) {
    __m512i blocks[8];
    for (int k = 0; k < 8; ++k) {
      const uint64_t a = (index + (c0 + 2 * size_t(k)) * stride) >> 2;
      const uint64_t b = (index + (c0 + 2 * size_t(k) + 1) * stride) >> 2;
      const __m512i base = _mm512_setr_epi64(int64_t(a), int64_t(b), int64_t(a), int64_t(b),
                                             int64_t(a), int64_t(b), int64_t(a), int64_t(b));
      blocks[k] = _mm512_and_si512(_mm512_add_epi64(base, steps), mask);
    }
    __m512i r[16];
    philox_avx512<8>(blocks, ofs_lo, ofs_hi, keys, r);
    transpose16_epi32(r);
    const size_t m = std::min<size_t>(16, n - c0);
    const __mmask16 lanes = __mmask16((1u << m) - 1u);
    for (int i = 0; i < 16; ++i)
      _mm512_mask_storeu_epi32(dst + size_t(i) * n + c0, lanes, r[i]);
  }
}

template <int K>
MT_TARGET_AVX2 inline void philox_avx2(const __m256i (&blocks)[K], __m256i ofs_lo, __m256i ofs_hi,
                                       const PhiloxKeys& keys, __m256i (&out)[2 * K]) {
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53), m1 = _mm256_set1_epi64x(0xCD9E8D57);
  __m256i c0[K], c1[K], c2[K], c3[K];
  for (int k = 0; k < K; ++k) {
    c0[k] = blocks[k];
    c1[k] = _mm256_srli_epi64(blocks[k], 32);
    c2[k] = ofs_lo;
    c3[k] = ofs_hi;
  }
  for (int r = 0; r < 10; ++r) {
    const __m256i key0 = _mm256_set1_epi32(int32_t(keys.k0[r]));
    const __m256i key1 = _mm256_set1_epi32(int32_t(keys.k1[r]));
    for (int k = 0; k < K; ++k) {
      const __m256i p0 = _mm256_mul_epu32(c0[k], m0), p1 = _mm256_mul_epu32(c2[k], m1);
      c0[k] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[k]), key0);
      c2[k] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[k]), key1);
      c1[k] = p1;
      c3[k] = p0;
    }
  }
  for (int k = 0; k < K; ++k) {
    const __m256i w01 = _mm256_blend_epi32(c0[k], _mm256_slli_epi64(c1[k], 32), 0xAA);
    const __m256i w23 = _mm256_blend_epi32(c2[k], _mm256_slli_epi64(c3[k], 32), 0xAA);
    out[2 * k] = _mm256_unpacklo_epi64(w01, w23);      // blocks 0, 1
    out[2 * k + 1] = _mm256_unpackhi_epi64(w01, w23);  // blocks 2, 3
  }
}

// r < t, unsigned, as an all-ones lane mask.
MT_TARGET_AVX2 inline __m256i less_epu32_avx2(__m256i r, __m256i t) {
  const __m256i flip = _mm256_set1_epi32(int32_t(0x80000000u));
  return _mm256_cmpgt_epi32(_mm256_xor_si256(t, flip), _mm256_xor_si256(r, flip));
}

template <Format F>
MT_TARGET_AVX2 inline __m256i stochastic_round_avx2(__m256i b, __m256i r) {
  const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));  // abs >= 0
  if constexpr (F == Format::BF16) {
    const __m256i h = _mm256_srli_epi32(b, 16);
    const __m256i rounded = _mm256_sub_epi32(h, less_epu32_avx2(r, _mm256_slli_epi32(b, 16)));
    return _mm256_blendv_epi8(rounded, _mm256_or_si256(h, _mm256_set1_epi32(0x40)), nan);
  } else {
    static_assert(F == Format::FP16);
    const __m256i ef = _mm256_srli_epi32(abs, 23);
    const __m256i implicit = _mm256_andnot_si256(_mm256_cmpeq_epi32(ef, _mm256_setzero_si256()),
                                                 _mm256_set1_epi32(1 << 23));
    const __m256i sig = _mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffff)), implicit);
    const __m256i shift = _mm256_max_epi32(
        _mm256_sub_epi32(_mm256_set1_epi32(126), _mm256_max_epu32(ef, _mm256_set1_epi32(1))),
        _mm256_set1_epi32(13));
    const __m256i keep = _mm256_srlv_epi32(sig, shift);
    const __m256i threshold =
        _mm256_or_si256(_mm256_sllv_epi32(sig, _mm256_sub_epi32(_mm256_set1_epi32(32), shift)),
                        _mm256_srlv_epi32(sig, _mm256_sub_epi32(shift, _mm256_set1_epi32(32))));
    const __m256i base = _mm256_slli_epi32(
        _mm256_max_epi32(_mm256_sub_epi32(ef, _mm256_set1_epi32(113)), _mm256_setzero_si256()), 10);
    __m256i res = _mm256_sub_epi32(_mm256_add_epi32(base, keep), less_epu32_avx2(r, threshold));
    res = _mm256_min_epu32(res, _mm256_set1_epi32(0x7c00));
    const __m256i quiet =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(abs, 13), _mm256_set1_epi32(0x3ff)),
                        _mm256_set1_epi32(0x7e00));
    res = _mm256_blendv_epi8(res, quiet, nan);
    return _mm256_or_si256(res,
                           _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x8000)));
  }
}

// 16 fp32 -> 16 rounded 16-bit patterns, in order.
template <Format F>
MT_TARGET_AVX2 inline __m256i stochastic16_avx2(const float* src, __m256i r_lo, __m256i r_hi) {
  const __m256i a =
      stochastic_round_avx2<F>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)), r_lo);
  const __m256i b =
      stochastic_round_avx2<F>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 8)), r_hi);
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
}

template <Format F, int K>
MT_TARGET_AVX2 void stochastic_avx2(const float* src, uint16_t* dst, size_t n, uint64_t seed,
                                    uint64_t offset, uint64_t index) {
  const size_t head = std::min(n, size_t((4 - (index & 3)) & 3));
  stochastic_scalar<F>(src, dst, head, seed, offset, index);
  if (head == n) return;
  const PhiloxKeys keys(seed);
  const __m256i ofs_lo = _mm256_set1_epi64x(int64_t(offset & 0xffffffffu));
  const __m256i ofs_hi = _mm256_set1_epi64x(int64_t(offset >> 32));
  const __m256i mask = _mm256_set1_epi64x(int64_t(kBlockMask));
  const __m256i step = _mm256_set1_epi64x(4);
  __m256i blk = _mm256_and_si256(_mm256_add_epi64(_mm256_set1_epi64x(int64_t((index + head) >> 2)),
                                                  _mm256_setr_epi64x(0, 2, 1, 3)),
                                 mask);
  size_t i = head;
  for (; i + 16 * K <= n; i += 16 * K) {
    __m256i blocks[K], r[2 * K];
    for (int k = 0; k < K; ++k) {
      blocks[k] = blk;
      blk = _mm256_and_si256(_mm256_add_epi64(blk, step), mask);
    }
    philox_avx2<K>(blocks, ofs_lo, ofs_hi, keys, r);
    for (int k = 0; k < K; ++k) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i + 16 * k),
                          stochastic16_avx2<F>(src + i + 16 * k, r[2 * k], r[2 * k + 1]));
    }
  }
  for (; i < n; i += 16) {
    __m256i blocks[1] = {blk}, r[2];
    blk = _mm256_and_si256(_mm256_add_epi64(blk, step), mask);
    philox_avx2<1>(blocks, ofs_lo, ofs_hi, keys, r);
    const size_t m = std::min<size_t>(16, n - i);
    float in[16] = {};
    alignas(32) uint16_t out[16];
    std::memcpy(in, src + i, m * sizeof(float));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), stochastic16_avx2<F>(in, r[0], r[1]));
    std::memcpy(dst + i, out, m * sizeof(uint16_t));
  }
}

// Philox groups interleaved per loop iteration: the best in bench_numerics on Zen 4 (AVX-512:
// 4 beats 2 and 1, 8 would spill; AVX2 has 16 registers: 4 spills).
constexpr int kSrGroupsAvx512 = 4;
constexpr int kSrGroupsAvx2 = 2;

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

namespace {

template <Format F>
void stochastic_dispatch(const float* src, uint16_t* dst, size_t n, uint64_t seed, uint64_t offset,
                         uint64_t index, Isa isa) {
  MT_ASSERT(isa_supported(isa), "instruction set ", isa_name(isa), " is not available here");
#ifdef MT_X86_KERNELS
  if (isa == Isa::Avx512 || isa == Isa::Avx512Bf16) {
    return stochastic_avx512<F, kSrGroupsAvx512>(src, dst, n, seed, offset, index);
  }
  if (isa == Isa::Avx2) return stochastic_avx2<F, kSrGroupsAvx2>(src, dst, n, seed, offset, index);
#endif
  stochastic_scalar<F>(src, dst, n, seed, offset, index);
}

}  // namespace

void random_bits_fill(uint32_t* dst, size_t n, uint64_t seed, uint64_t offset, uint64_t index,
                      Isa isa) {
  MT_ASSERT(isa_supported(isa), "instruction set ", isa_name(isa), " is not available here");
#ifdef MT_X86_KERNELS
  if (isa == Isa::Avx512 || isa == Isa::Avx512Bf16)
    return random_bits_avx512<kSrGroupsAvx512>(dst, n, seed, offset, index);
#endif
  for (size_t i = 0; i < n; ++i)
    dst[i] = random_bits(seed, offset, index + i);
}

void random_bits_runs16(uint32_t* dst, size_t n, uint64_t seed, uint64_t offset, uint64_t index,
                        uint64_t stride, Isa isa) {
  MT_ASSERT(isa_supported(isa), "instruction set ", isa_name(isa), " is not available here");
#ifdef MT_X86_KERNELS
  if ((isa == Isa::Avx512 || isa == Isa::Avx512Bf16) && index % 4 == 0 && stride % 4 == 0)
    return random_bits_runs16_avx512(dst, n, seed, offset, index, stride);
#endif
  for (size_t c = 0; c < n; ++c)
    for (size_t i = 0; i < 16; ++i)
      dst[i * n + c] = random_bits(seed, offset, index + c * stride + i);
}

void f32_to_bf16_stochastic(const float* src, uint16_t* dst, size_t n, uint64_t seed,
                            uint64_t offset, uint64_t index, Isa isa) {
  stochastic_dispatch<Format::BF16>(src, dst, n, seed, offset, index, isa);
}

void f32_to_f16_stochastic(const float* src, uint16_t* dst, size_t n, uint64_t seed,
                           uint64_t offset, uint64_t index, Isa isa) {
  stochastic_dispatch<Format::FP16>(src, dst, n, seed, offset, index, isa);
}

}  // namespace mantissa::detail
