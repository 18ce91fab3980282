// CPU fp8 quantization (the contract is in backend_ops.h): per block, the amax of |x|, the scale
// (backend/fp8_math.h, shared with the CUDA backend), then x * scale rounded to fp8 by the row
// loops of cpu/fp8_rows.inc (one build per vector ISA; the AVX-512 one of the quantizing loops in
// intrinsics here), which read f32 and bf16 in place. Rows, or blocks of rows, are spread over
// the threads; a per-tensor amax is reduced over them.
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/avx512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/stored.h"
#include "backend/cpu/vector_isa.h"
#include "backend/fp8_math.h"
#include "mantissa/numerics/format.h"
#include "mantissa/numerics/round.h"

namespace mantissa::backend::cpu {
namespace {

#define MT_ISA_LOOPS "backend/cpu/fp8_rows.inc"
#include "backend/cpu/isa_builds.inc"

// max of two amaxes, NaN winning.
inline float amax_max(float a, float b) {
  return a != a || b != b ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

// Calls f with row r of x as f32 or bf16 storage: in place, or (f16) widened into buf.
template <typename T, typename Fn>
void with_row(const T* x, int64_t r, int64_t C, float* buf, Fn f) {
  if constexpr (kStoredInLoop<T>) {
    f(x + r * C);
  } else {
    load_contiguous<T, float>(x + r * C, buf, C);
    f(static_cast<const float*>(buf));
  }
}

#if defined(__x86_64__)
// The hot loops written with AVX-512 intrinsics, 16 values a step. GCC's build of the .inc loop
// is correct but poor here: it unrolls to 64 values, runs out of registers and spills, and keeps
// every select of the scalar definition. The arithmetic is round_fp8_saturating's (round.h) and
// quantize_one's, operation for operation, so the bits are the same (Fp8QuantizeKernel runs every
// build against the scalar definition). A step holding a product that is not finite (a
// non-finite input gives one; rare) goes through the scalar quantize_one, lane by lane.

template <typename S>
MT_AVX512 inline __m512 load16(const S* x, __mmask16 k) {
  if constexpr (std::is_same_v<S, float>) {
    return _mm512_maskz_loadu_ps(k, x);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(k, x);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// quantize16's constants for format F, made once a loop and kept in registers (GCC 12 would
// otherwise broadcast most of them again in every step: 17 % of a step in a standalone test).
struct Fp8Lanes {
  __m512i inf, min_e, cap_e, drop_e, first, max_code, sign8, max_mag, sign, odd, half;
};

template <Format F>
MT_AVX512 inline Fp8Lanes fp8_lanes() {
  constexpr FormatSpec t = format_spec(F);
  constexpr int m = t.mantissa_bits;
  constexpr int drop = 23 - m;
  constexpr uint32_t kRebias = uint32_t(127 - t.bias()) << m;
  constexpr uint32_t kMax = t.max_finite_bits();
  Fp8Lanes l{_mm512_set1_epi32(0x7f800000),
             _mm512_set1_epi32(int(uint32_t(t.emin() + 127) << 23)),
             _mm512_set1_epi32(int(uint32_t(t.emax() + 1 + 127) << 23)),
             _mm512_set1_epi32(int(uint32_t(drop) << 23)),
             _mm512_set1_epi32(int(uint32_t(128 - t.bias()) << m)),
             _mm512_set1_epi32(int(kMax)),
             _mm512_set1_epi32(0x80),
             _mm512_set1_epi32(int((kMax + kRebias) << drop)),
             _mm512_set1_epi32(int(0x80000000u)),
             _mm512_set1_epi32(1),
             _mm512_set1_epi32(0x7fff)};
  // An empty asm that may change them: the compiler cannot rematerialize them in the loop.
  asm(""
      : "+v"(l.inf), "+v"(l.min_e), "+v"(l.cap_e), "+v"(l.drop_e), "+v"(l.first), "+v"(l.max_code),
        "+v"(l.sign8), "+v"(l.max_mag), "+v"(l.sign), "+v"(l.odd), "+v"(l.half));
  return l;
}

// Lanes k of x[0..16) times s, into codes (and values: times si when kScaled) at the same
// offsets. Returns false, writing nothing, when a lane's product is not finite: a non-finite
// input gives one too (inf times a finite scale, NaN, or inf times 0), and finite products that
// overflowed are left to the scalar code with them.
template <typename S, Format F, bool kValues, bool kScaled, bool kCodes>
MT_AVX512 inline bool quantize16(const Fp8Lanes& l, const S* x, __m512 s, __m512 si, uint8_t* codes,
                                 bfloat16* values, __mmask16 k) {
  constexpr int drop = 23 - format_spec(F).mantissa_bits;
  const __m512i y = _mm512_castps_si512(_mm512_mul_ps(load16(x, k), s));
  const __m512i a = _mm512_andnot_si512(l.sign, y);  // |y|
  if (_mm512_mask_cmpge_epu32_mask(k, a, l.inf)) return false;
  // round_fp8_saturating: c = 2^(E + drop), E clamped to F's exponents; |y| + c rounds.
  __m512i e = _mm512_and_si512(a, l.inf);
  e = _mm512_min_epu32(_mm512_max_epu32(e, l.min_e), l.cap_e);
  const __m512i cb = _mm512_add_epi32(e, l.drop_e);
  const __m512 c = _mm512_castsi512_ps(cb);
  const __m512 sum = _mm512_add_ps(_mm512_castsi512_ps(a), c);
  if constexpr (kCodes) {
    __m512i code = _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(sum), cb),
                                    _mm512_srli_epi32(e, drop));
    code = _mm512_min_epu32(_mm512_sub_epi32(code, l.first), l.max_code);
    // code | (the sign of y, as the code's top bit): A | (B & C).
    code = _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(y, 24), l.sign8, 0xf8);
    // Narrowed in registers, then stored: Zen 4 runs vpmovdb and vpmovdw to memory slowly.
    const __m128i code8 = _mm512_cvtepi32_epi8(code);
    if (k == 0xffff) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), code8);
    } else {
      _mm_mask_storeu_epi8(codes, k, code8);
    }
  }
  if constexpr (kValues) {
    const __m512i mag = _mm512_min_epu32(_mm512_castps_si512(_mm512_sub_ps(sum, c)), l.max_mag);
    // The magnitude with y's sign: (y & sign) | mag.
    __m512i d = _mm512_ternarylogic_epi32(mag, y, l.sign, 0xf8);
    if constexpr (kScaled) {
      // stored_store's rounding to bf16 (the value is finite here: no NaN to quiet).
      d = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(d), si));
      const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(d, 16), l.odd);
      d = _mm512_add_epi32(_mm512_add_epi32(d, odd), l.half);
    }
    const __m256i value16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(d, 16));
    if (k == 0xffff) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(values), value16);
    } else {
      _mm256_mask_storeu_epi16(values, k, value16);
    }
  }
  return true;
}

inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

// row_quantize from column i of the row on (the blocks of bc columns, scale[b] and
// scale_inv[b]), in steps of 16 within each block, up to the first step holding a value
// quantize16 leaves to the scalar code: returns where it stopped (C when it did not). No call
// inside, so that the constants stay in registers.
template <typename S, Format F, bool kValues, bool kScaled, bool kCodes>
MT_AVX512 int64_t row_span(const S* x, int64_t i, int64_t C, int64_t bc, const float* scale,
                           uint8_t* codes, bfloat16* values, const float* scale_inv) {
  const Fp8Lanes l = fp8_lanes<F>();
  for (int64_t cb = i / bc; i < C; ++cb) {
    const int64_t end = std::min(C, (cb + 1) * bc);
    const __m512 s = _mm512_set1_ps(scale[cb]);
    const __m512 si = _mm512_set1_ps(kScaled ? scale_inv[cb] : 1.0f);
    for (; i < end; i += 16) {
      const __mmask16 k = first_lanes(end - i);
      if (!quantize16<S, F, kValues, kScaled, kCodes>(l, x + i, s, si, codes + i, values + i, k))
        return i;
    }
    i = end;  // a block whose width is no multiple of 16 ends inside the last vector
  }
  return C;
}

// row_quantize: a row of C values in column blocks of bc, scale[b] and scale_inv[b].
template <typename S, Format F, bool kValues, bool kScaled, bool kCodes>
MT_AVX512 void row_quantize_avx512(const S* x, int64_t C, int64_t bc, const float* scale,
                                   uint8_t* codes, bfloat16* values, const float* scale_inv) {
  for (int64_t i = 0; i < C; i += 16) {
    i = row_span<S, F, kValues, kScaled, kCodes>(x, i, C, bc, scale, codes, values, scale_inv);
    const int64_t cb = i / bc, end = std::min({C, i + 16, (cb + 1) * bc});
    const float si = kScaled && i < C ? scale_inv[cb] : 1.0f;
    for (int64_t j = i; j < end; ++j)
      avx512::quantize_one<F, kValues, kScaled, kCodes>(stored_load(x, j), scale[cb], si, codes,
                                                        values, j);
    i = end - 16;  // the loop's step then resumes at end
  }
}

// column_quantize: a row of C values with a scale per column, scale[c] and scale_inv[c].
template <typename S, Format F, bool kValues, bool kScaled, bool kCodes>
MT_AVX512 int64_t column_span(const S* x, int64_t i, int64_t C, const float* scale, uint8_t* codes,
                              bfloat16* values, const float* scale_inv) {
  const Fp8Lanes l = fp8_lanes<F>();
  for (; i < C; i += 16) {
    const __mmask16 k = first_lanes(C - i);
    const __m512 s = _mm512_maskz_loadu_ps(k, scale + i);
    const __m512 si = kScaled ? _mm512_maskz_loadu_ps(k, scale_inv + i) : _mm512_set1_ps(1.0f);
    if (!quantize16<S, F, kValues, kScaled, kCodes>(l, x + i, s, si, codes + i, values + i, k))
      return i;
  }
  return C;
}

template <typename S, Format F, bool kValues, bool kScaled, bool kCodes>
MT_AVX512 void column_quantize_avx512(const S* x, int64_t C, const float* scale, uint8_t* codes,
                                      bfloat16* values, const float* scale_inv) {
  for (int64_t i = 0; i < C; i += 16) {
    i = column_span<S, F, kValues, kScaled, kCodes>(x, i, C, scale, codes, values, scale_inv);
    for (int64_t j = i; j < std::min(C, i + 16); ++j)
      avx512::quantize_one<F, kValues, kScaled, kCodes>(
          stored_load(x, j), scale[j], kScaled ? scale_inv[j] : 1.0f, codes, values, j);
  }
}
#endif

template <typename S>
void amax_of_row(const S* x, int64_t C, int64_t bc, float* amax) {
  MT_ISA_CALL(row_amax<S>(x, C, bc, amax));
}

// row_quantize in the build the CPU runs (AVX-512: the intrinsics above).
template <typename S, Format F, bool kValues, bool kScaled, bool kCodes>
void row_quantize_isa(const S* x, int64_t C, int64_t bc, const float* scale, uint8_t* codes,
                      bfloat16* values, const float* scale_inv) {
#if defined(__x86_64__)
  if (vector_isa() == VectorIsa::Avx512) {
    return row_quantize_avx512<S, F, kValues, kScaled, kCodes>(x, C, bc, scale, codes, values,
                                                               scale_inv);
  }
#endif
  MT_ISA_CALL(
      row_quantize<S, F, kValues, kScaled, kCodes>(x, C, bc, scale, codes, values, scale_inv));
}

// Calls f.template operator()<kValues, kScaled, kCodes>() for the outputs asked for: the codes
// alone (no values), the values alone (no codes), or both; the values scaled with power-of-two
// scales.
template <typename Fn>
void with_outputs(const uint8_t* codes, const bfloat16* values, bool scaled, Fn f) {
  if (!values) return f.template operator()<false, false, true>();
  if (!codes) {
    return scaled ? f.template operator()<true, true, false>()
                  : f.template operator()<true, false, false>();
  }
  return scaled ? f.template operator()<true, true, true>()
                : f.template operator()<true, false, true>();
}

// One row's codes and/or values (with_outputs) with the column blocks' scales.
template <Format F, typename S>
void quantize_row(const S* x, int64_t C, int64_t bc, const float* scale, uint8_t* codes,
                  bfloat16* values, const float* scale_inv, bool scaled) {
  with_outputs(codes, values, scaled, [&]<bool kValues, bool kScaled, bool kCodes>() {
    row_quantize_isa<S, F, kValues, kScaled, kCodes>(x, C, bc, scale, codes, values, scale_inv);
  });
}

// kRows rows' column amaxes into amax_bits (column_amax).
template <int kRows, typename S>
void amax_of_columns(const S* x, int64_t ld, int64_t C, uint32_t* amax_bits) {
  MT_ISA_CALL(column_amax<kRows, S>(x, ld, C, amax_bits));
}

// column_quantize in the build the CPU runs.
template <typename S, Format F, bool kValues, bool kScaled, bool kCodes>
void column_quantize_isa(const S* x, int64_t C, const float* scale, uint8_t* codes,
                         bfloat16* values, const float* scale_inv) {
#if defined(__x86_64__)
  if (vector_isa() == VectorIsa::Avx512) {
    return column_quantize_avx512<S, F, kValues, kScaled, kCodes>(x, C, scale, codes, values,
                                                                  scale_inv);
  }
#endif
  MT_ISA_CALL(
      column_quantize<S, F, kValues, kScaled, kCodes>(x, C, scale, codes, values, scale_inv));
}

// One row's codes and/or values (with_outputs) with a scale per column.
template <Format F, typename S>
void quantize_columns(const S* x, int64_t C, const float* scale, uint8_t* codes, bfloat16* values,
                      const float* scale_inv, bool scaled) {
  with_outputs(codes, values, scaled, [&]<bool kValues, bool kScaled, bool kCodes>() {
    column_quantize_isa<S, F, kValues, kScaled, kCodes>(x, C, scale, codes, values, scale_inv);
  });
}

// scale[b] = fp8_block_scale(amax[b], ...), scale_inv[b] = 1 / scale[b] for n blocks: Amax's in
// one vectorized loop; MXFP8's in one too (then its rare blocks, an amax of zero, subnormal or
// not finite, one at a time); Given's one at a time.
void block_scales(const float* amax, int64_t n, float fp8_max, const Fp8QuantizeParams& p,
                  float given, float* scale, float* scale_inv) {
  if (p.rule == Fp8ScaleRule::Amax) {
    MT_ISA_CALL(amax_scales(amax, n, fp8_max, scale, scale_inv));
  }
  const uint32_t fb = std::bit_cast<uint32_t>(fp8_max);
  const bool pow2 = p.rule == Fp8ScaleRule::AmaxPow2 && (fb >> 23) != 0;
  if (pow2) {
    bool all_common = false;
    [&] { MT_ISA_CALL(pow2_scales(amax, n, fb, scale, scale_inv, &all_common)); }();
    if (all_common) return;
  }
  for (int64_t b = 0; b < n; ++b) {
    const uint32_t ab = std::bit_cast<uint32_t>(amax[b]);
    if (pow2 && ab - 0x00800000u < 0x7f000000u) continue;  // computed by pow2_scales
    scale[b] = fp8_block_scale(amax[b], fp8_max, p.rule, given);
    scale_inv[b] = 1.0f / scale[b];
  }
}

template <typename T, Format F>
void quantize(const T* x, int64_t R, int64_t C, const Fp8QuantizeParams& p, float given,
              float fp8_max, uint8_t* out, float* scale_inv, float* amax, bfloat16* values) {
  const bool scaled = p.rule == Fp8ScaleRule::AmaxPow2;
  const int64_t br = p.block_rows == 0 ? R : p.block_rows;
  const int64_t bc = p.block_cols == 0 ? C : p.block_cols;
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  const int64_t nblocks = nbr * nbc;
  auto row_values = [&](int64_t r) { return values ? values + r * C : nullptr; };
  auto row_codes = [&](int64_t r) { return out ? out + r * C : nullptr; };
  if (p.rule == Fp8ScaleRule::Given) {
    // The scale is known: each row is measured (for the history) and quantized while it is in
    // the cache.
    std::vector<float> row_amax(static_cast<size_t>(R));
    const float given_inv = 1.0f / given;
    parallel_rows<float>(R, R * C, kStoredInLoop<T> ? 0 : C, [&](int64_t r, float* buf) {
      with_row(x, r, C, buf, [&]<typename S>(const S* row) {
        amax_of_row(row, C, C, &row_amax[size_t(r)]);
        quantize_row<F>(row, C, C, &given, row_codes(r), row_values(r), &given_inv, false);
      });
    });
    float m = 0.0f;
    for (float a : row_amax)
      m = amax_max(m, a);
    amax[0] = m;
    scale_inv[0] = given_inv;
    return;
  }
  if constexpr (kStoredInLoop<T>) {
    if (br == 1 && C > 0 && C % bc == 0) {
      // Blocks within a row that tile the rows exactly (MXFP8's 1 x 32 in a model's widths): a
      // group of rows is one long row of whole blocks, measured, scaled and quantized while it is
      // in the cache. Groups of about 4096 values: the loops, the calls and the scales' loop then
      // run once a group, not once a row of a few blocks.
      const int64_t group = std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1));
      const int64_t groups = (R + group - 1) / group;
      const int64_t most = group * C;
      const int64_t spread = bc > 32 ? 0 : 2 * most;  // the repeated scales
      parallel_rows<float>(groups, R * C, group * nbc + spread, [&](int64_t g, float* buf) {
        const int64_t r0 = g * group, rows = std::min(R, r0 + group) - r0;
        const int64_t n = rows * C, blocks = rows * nbc;
        float* scale = buf;
        float* each_scale = buf + group * nbc;
        float* each_inv = each_scale + most;
        float* ga = amax + r0 * nbc;
        float* gs = scale_inv + r0 * nbc;
        amax_of_row(x + r0 * C, n, bc, ga);
        block_scales(ga, blocks, fp8_max, p, given, scale, gs);
        if (bc > 32 || vector_isa() == VectorIsa::Avx512) {
          quantize_row<F>(x + r0 * C, n, bc, scale, row_codes(r0), row_values(r0), gs, scaled);
          return;
        }
        // Without AVX-512 (whose loop broadcasts each block's scale), narrow blocks' scales
        // repeated over their values: then one flat loop quantizes the group (a loop per block
        // of 32 costs more in its setup than in its values: with GCC's AVX-512 build, MXFP8's
        // rows of 128 took 1.10 ns a value that way and 0.87 ns with the repeated scales).
        for (int64_t b = 0; b < blocks; ++b) {
          std::fill_n(each_scale + b * bc, bc, scale[b]);
          std::fill_n(each_inv + b * bc, bc, gs[b]);
        }
        quantize_columns<F>(x + r0 * C, n, each_scale, row_codes(r0), row_values(r0), each_inv,
                            scaled);
      });
      return;
    }
  }
  if (br == 1) {
    // Blocks within a row (MXFP8's 1 x 32, the 1 x 128 tiles): each row is measured, scaled and
    // quantized while it is in the cache.
    const int64_t scratch = (kStoredInLoop<T> ? 0 : C) + nbc;
    parallel_rows<float>(R, R * C, scratch, [&](int64_t r, float* buf) {
      float* scale = buf + (kStoredInLoop<T> ? 0 : C);
      float* ra = amax + r * nbc;
      float* rs = scale_inv + r * nbc;
      with_row(x, r, C, buf, [&]<typename S>(const S* row) {
        amax_of_row(row, C, bc, ra);
        block_scales(ra, nbc, fp8_max, p, given, scale, rs);
        quantize_row<F>(row, C, bc, scale, row_codes(r), row_values(r), rs, scaled);
      });
    });
    return;
  }
  if (bc == 1 && br > 1) {
    // Blocks a column wide (a transposed operand's row blocks: fp8_quantize_transposed): each
    // block of rows gathers its columns' amaxes a row at a time, then quantizes its rows with a
    // scale per column. Row blocks are spread over the threads.
    const int64_t scratch = (kStoredInLoop<T> ? 0 : C) + C;
    parallel_rows<float>(nbr, R * C, scratch, [&](int64_t rb, float* buf) {
      float* scale = buf + (kStoredInLoop<T> ? 0 : C);
      std::vector<uint32_t> bits(static_cast<size_t>(C), 0u);
      const int64_t r0 = rb * br, r1 = std::min(R, r0 + br);
      int64_t measured = r0;  // rows measured so far
      if constexpr (kStoredInLoop<T>) {
        for (; measured + 4 <= r1; measured += 4)
          amax_of_columns<4>(x + measured * C, C, C, bits.data());
      }
      for (; measured < r1; ++measured)
        with_row(x, measured, C, buf,
                 [&]<typename S>(const S* row) { amax_of_columns<1>(row, C, C, bits.data()); });
      float* ba = amax + rb * C;
      float* bs = scale_inv + rb * C;
      for (int64_t c = 0; c < C; ++c) {
        const uint32_t m = bits[size_t(c)];
        ba[c] = m > 0x7f800000u ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(m);
      }
      block_scales(ba, C, fp8_max, p, given, scale, bs);
      for (int64_t r = r0; r < r1; ++r) {
        with_row(x, r, C, buf, [&]<typename S>(const S* row) {
          quantize_columns<F>(row, C, scale, row_codes(r), row_values(r), bs, scaled);
        });
      }
    });
    return;
  }
  // Blocks of several rows and columns: amaxes per row and column block, then reduced over each
  // block's rows; the scales; then the rows quantized.
  std::vector<float> row_amax(static_cast<size_t>(R * nbc));
  parallel_rows<float>(R, R * C, kStoredInLoop<T> ? 0 : C, [&](int64_t r, float* buf) {
    with_row(x, r, C, buf, [&]<typename S>(const S* row) {
      amax_of_row(row, C, bc, &row_amax[size_t(r * nbc)]);
    });
  });
  std::vector<float> scale(static_cast<size_t>(nblocks));
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t rb = b / nbc, cb = b % nbc;
    float m = 0.0f;
    for (int64_t r = rb * br; r < std::min(R, (rb + 1) * br); ++r)
      m = amax_max(m, row_amax[size_t(r * nbc + cb)]);
    amax[b] = m;
  }
  block_scales(amax, nblocks, fp8_max, p, given, scale.data(), scale_inv);
  parallel_rows<float>(R, R * C, kStoredInLoop<T> ? 0 : C, [&](int64_t r, float* buf) {
    with_row(x, r, C, buf, [&]<typename S>(const S* row) {
      quantize_row<F>(row, C, bc, scale.data() + (r / br) * nbc, row_codes(r), row_values(r),
                      scale_inv + (r / br) * nbc, scaled);
    });
  });
}

}  // namespace

void CpuBackend::fp8_quantize(const Tensor& x, const Fp8QuantizeParams& p, Tensor& codes,
                              Tensor& scale_inv, Tensor& amax, Tensor* values) {
  MT_ASSERT(!values || (values->dtype() == DType::BF16 && values->is_contiguous() &&
                        values->shape() == x.shape()),
            "fp8_quantize writes values as contiguous bf16 of x's shape");
  MT_ASSERT(!p.values_only || values, "fp8_quantize: values_only wants the values");
  MT_ASSERT(x.dim() == 2 && x.is_contiguous() &&
                (p.values_only || (codes.shape() == x.shape() && codes.is_contiguous())) &&
                scale_inv.dtype() == DType::F32 && amax.dtype() == DType::F32 &&
                scale_inv.is_contiguous() && amax.is_contiguous(),
            "fp8_quantize wants contiguous x (R, C), codes (R, C), F32 scale_inv and amax; got ",
            x.describe(), ", ", codes.describe(), ", ", scale_inv.describe(), ", ",
            amax.describe());
  const int64_t R = x.size(0), C = x.size(1);
  const int64_t br = p.block_rows == 0 ? R : p.block_rows;
  const int64_t bc = p.block_cols == 0 ? C : p.block_cols;
  MT_ASSERT(p.rule != Fp8ScaleRule::Given || (br >= R && bc >= C),
            "fp8_quantize: a given scale is per tensor");
  MT_ASSERT(br > 0 && bc > 0 && scale_inv.numel() == ((R + br - 1) / br) * ((C + bc - 1) / bc) &&
                amax.numel() == scale_inv.numel(),
            "fp8_quantize: ", scale_inv.describe(), " does not hold one scale per block");
  const float fp8_max = float(format_info(*dtype_format(codes.dtype())).max_finite);
  float given = 1;
  if (p.rule == Fp8ScaleRule::Given) {
    MT_ASSERT(p.given && p.given->dtype() == DType::F32 && p.given->numel() == 1 &&
                  p.given->device().is_cpu(),
              "fp8_quantize: a given scale is one f32 element on the cpu");
    given = *static_cast<const float*>(p.given->data_ptr());
  }
  dispatch_float(x.dtype(), "fp8_quantize", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      MT_CHECK(false, "fp8_quantize takes f32, bf16 or f16 values, got f64");
    } else {
      auto run = [&]<Format F>() {
        quantize<T, F>(static_cast<const T*>(x.data_ptr()), R, C, p, given, fp8_max,
                       p.values_only ? nullptr : static_cast<uint8_t*>(codes.data_ptr()),
                       static_cast<float*>(scale_inv.data_ptr()),
                       static_cast<float*>(amax.data_ptr()),
                       values ? static_cast<bfloat16*>(values->data_ptr()) : nullptr);
      };
      if (codes.dtype() == DType::FP8_E4M3) {
        run.template operator()<Format::FP8_E4M3>();
      } else {
        MT_ASSERT(codes.dtype() == DType::FP8_E5M2, "fp8_quantize writes fp8 codes, got ",
                  dtype_name(codes.dtype()));
        run.template operator()<Format::FP8_E5M2>();
      }
    }
  });
}

void CpuBackend::fp8_observe(const Tensor& amax, const Tensor& scale_inv, Tensor& stats,
                             Tensor* history) {
  check_fp8_observe(amax, scale_inv, stats, history, Device::cpu());
  const float* a = static_cast<const float*>(amax.data_ptr());
  const float* si = static_cast<const float*>(scale_inv.data_ptr());
  float m = 0, max_inv = 0;
  for (int64_t i = 0; i < amax.numel(); ++i)
    m = amax_max(m, a[i]);
  for (int64_t i = 0; i < scale_inv.numel(); ++i)
    max_inv = amax_max(max_inv, si[i]);
  float* st = static_cast<float*>(stats.data_ptr());
  st[0] = m;
  st[1] = 1.0f / max_inv;
  const bool finite = std::isfinite(m);
  if (!finite) st[2] += 1.0f;
  if (history && finite) {
    float* h = static_cast<float*>(history->data_ptr());
    h[0] = std::max(h[0], m);
  }
}

void CpuBackend::fp8_update_scales(std::span<Tensor> histories, std::span<Tensor> scales,
                                   std::span<const float> fp8_max, bool use_max, int margin) {
  check_fp8_update_scales(histories, scales, fp8_max, Device::cpu());
  for (size_t i = 0; i < histories.size(); ++i) {
    float* h = static_cast<float*>(histories[i].data_ptr());
    const int64_t n = histories[i].numel();
    const float amax = delayed_amax(h, n, use_max);
    float* s = static_cast<float*>(scales[i].data_ptr());
    *s = delayed_scale(amax, fp8_max[i], margin, *s);
    std::rotate(h, h + 1, h + n);
    h[0] = 0.0f;
  }
}

}  // namespace mantissa::backend::cpu
