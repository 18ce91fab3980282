// CPU FP4 block quantization and the 16-point Hadamard transform (the contracts are in
// backend_ops.h, the arithmetic in backend/fp4_math.h, shared with the CUDA backend). One pass
// for the tensor amax where NVFP4 needs it, then blocks of rows spread over the threads, each
// block's amax, its scale, and its elements: in AVX-512 where the CPU has it (the same operations
// as the scalar definition, which the other builds run; the conformance test compares them).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/avx512.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/vector_isa.h"
#include "backend/fp4_math.h"
#include "numerics/kernels.h"

namespace mantissa::backend::cpu {
namespace {

// max of two amaxes, NaN winning.
inline float nan_max(float a, float b) {
  return a != a || b != b ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

// x as f32, a row at a time (f16 and bf16 widened exactly).
template <typename T>
void load_row(const T* x, int64_t n, float* out) {
  load_contiguous<T, float>(x, out, n);  // the vectorized conversions
}

// max |x| over the tensor from the bits: for a float with its sign bit cleared, the unsigned
// order of the bits is the order of the magnitudes, and every NaN is above inf. So the loop is an
// integer max (vectorized), NaN winning (returned as the quiet NaN, as the CUDA kernel does).
template <typename T>
float tensor_amax(const T* x, int64_t n) {
  using Bits = std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>;
  constexpr Bits kMagnitude = Bits(std::numeric_limits<Bits>::max() >> 1);
  const Bits* b = reinterpret_cast<const Bits*>(x);
  Bits m = 0;
#pragma omp parallel for reduction(max : m) if (n >= kParallelGrain && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i)
    m = std::max<Bits>(m, b[i] & kMagnitude);
  T top;
  std::memcpy(&top, &m, sizeof(T));
  const float a = float(top);
  return a != a ? std::numeric_limits<float>::quiet_NaN() : a;
}

struct Fp4Out {
  uint8_t* codes;
  uint8_t* block_scales;
  bfloat16* values;  // or nullptr
};

// An element's code (unless values only) and its value as bf16 (exact: the float's top 16 bits).
inline void store(const Fp4Element& e, uint8_t* codes, bfloat16* values, int64_t i) {
  if (codes) codes[i] = uint8_t(e.code);
  if (values) values[i] = bfloat16::from_bits(uint16_t(std::bit_cast<uint32_t>(e.value) >> 16));
}

#if defined(__x86_64__)
// Round to nearest even of up to 16 values (mask k) of one block, as fp4_element computes them
// operation for operation: the product x * encode in fp32; the code from the signs and the seven
// midpoint comparisons (ordered: NaN compares false, giving its sign's zero; beyond 6 all seven
// hold: the clamp to 6 is implied); the value from a permute of the 16 code values times the
// block's value; NaN where x is not finite. Tested against the scalar definition in every build
// (BackendConformance.EveryVectorBuildOfTheCpu).
// A lane's block scale: its encode factor and its value (lanes may be blocks of their own).
struct Scale16 {
  __m512 encode, value;
};
MT_AVX512 inline Scale16 scale16(const Fp4BlockScale& s) {
  return {_mm512_set1_ps(s.encode), _mm512_set1_ps(s.value)};
}
MT_AVX512 inline void store16(__m512 v, __m512i code, __mmask16 k, const Scale16& s, uint8_t* codes,
                              bfloat16* values);
MT_AVX512 inline void nearest16(const float* x, __mmask16 k, const Scale16& s, uint8_t* codes,
                                bfloat16* values) {
  const __m512 v = _mm512_maskz_loadu_ps(k, x);
  const __m512 scaled = _mm512_mul_ps(v, s.encode);
  const __m512 a = _mm512_abs_ps(scaled);
  __m512i mag = _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi32(1);
  mag = _mm512_mask_add_epi32(mag, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_GT_OQ), mag,
                              one);
  mag = _mm512_mask_add_epi32(mag, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.75f), _CMP_GE_OQ), mag,
                              one);
  mag = _mm512_mask_add_epi32(mag, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.25f), _CMP_GT_OQ), mag,
                              one);
  mag = _mm512_mask_add_epi32(mag, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.75f), _CMP_GE_OQ), mag,
                              one);
  mag =
      _mm512_mask_add_epi32(mag, _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.5f), _CMP_GT_OQ), mag, one);
  mag =
      _mm512_mask_add_epi32(mag, _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.5f), _CMP_GE_OQ), mag, one);
  mag =
      _mm512_mask_add_epi32(mag, _mm512_cmp_ps_mask(a, _mm512_set1_ps(5.0f), _CMP_GT_OQ), mag, one);
  const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(_mm512_castps_si512(scaled), 31), 3);
  const __m512i code = _mm512_or_si512(sign, mag);
  store16(v, code, k, s, codes, values);
}

// Codes as bytes (unless values only); values (if wanted) the codes' values times the block's,
// NaN where x is not finite, as bf16 (exact: the top 16 bits).
MT_AVX512 inline void store16(__m512 v, __m512i code, __mmask16 k, const Scale16& s, uint8_t* codes,
                              bfloat16* values) {
  if (codes) _mm512_mask_cvtepi32_storeu_epi8(codes, k, code);
  if (!values) return;
  const __m512 table = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f,
                                      -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  __m512 value = _mm512_mul_ps(_mm512_permutexvar_ps(code, table), s.value);
  const __m512i exponent = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7f800000));
  const __mmask16 nonfinite = _mm512_cmpeq_epi32_mask(exponent, _mm512_set1_epi32(0x7f800000));
  value = _mm512_mask_mov_ps(value, nonfinite, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
  const __m512i top = _mm512_srli_epi32(_mm512_castps_si512(value), 16);
  _mm512_mask_cvtepi32_storeu_epi16(values, k, top);
}

// Stochastic rounding of up to 16 values, as fp4_element with Stochastic (round.h's rule on the
// bits of the clamped value |c| = sig * 2^(e - 23)): the dropped bit count shift = 22 + max(0,
// -e), keep = sig >> shift, threshold = the dropped bits scaled to 32 bits, the code 2 max(e, 0)
// + keep + (r < threshold), at most 7. The clamp keeps NaN (max/min return their second operand
// for NaN), and NaN gives the zero of the other sign, as encode_bits does.
MT_AVX512 inline void stochastic16(const float* x, const uint32_t* rnd, __mmask16 k,
                                   const Scale16& s, uint8_t* codes, bfloat16* values) {
  const __m512 v = _mm512_maskz_loadu_ps(k, x);
  const __m512 scaled = _mm512_mul_ps(v, s.encode);
  const __m512 c =
      _mm512_min_ps(_mm512_set1_ps(6.0f), _mm512_max_ps(_mm512_set1_ps(-6.0f), scaled));
  const __m512i b = _mm512_castps_si512(c);
  const __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i ef = _mm512_srli_epi32(abs, 23);
  const __m512i mant = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffff));
  const __m512i sig =
      _mm512_mask_or_epi32(mant, _mm512_test_epi32_mask(ef, ef), mant, _mm512_set1_epi32(1 << 23));
  const __m512i below = _mm512_max_epi32(  // max(0, -e) with e = max(ef, 1) - 127
      _mm512_sub_epi32(_mm512_set1_epi32(127), _mm512_max_epu32(ef, _mm512_set1_epi32(1))),
      _mm512_setzero_si512());
  const __m512i shift = _mm512_add_epi32(below, _mm512_set1_epi32(22));
  const __m512i keep = _mm512_srlv_epi32(sig, shift);
  // Shift counts above 31 (including "negative" ones) give 0.
  const __m512i threshold =
      _mm512_or_si512(_mm512_sllv_epi32(sig, _mm512_sub_epi32(_mm512_set1_epi32(32), shift)),
                      _mm512_srlv_epi32(sig, _mm512_sub_epi32(shift, _mm512_set1_epi32(32))));
  const __m512i base = _mm512_slli_epi32(
      _mm512_max_epi32(_mm512_sub_epi32(ef, _mm512_set1_epi32(127)), _mm512_setzero_si512()), 1);
  __m512i mag = _mm512_add_epi32(base, keep);
  const __m512i r = _mm512_maskz_loadu_epi32(k, rnd);
  mag =
      _mm512_mask_sub_epi32(mag, _mm512_cmplt_epu32_mask(r, threshold), mag, _mm512_set1_epi32(-1));
  mag = _mm512_min_epu32(mag, _mm512_set1_epi32(7));
  __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(b, 31), 3);
  sign = _mm512_mask_xor_epi32(sign, nan, sign, _mm512_set1_epi32(8));
  mag = _mm512_mask_mov_epi32(mag, nan, _mm512_setzero_si512());
  const __m512i code = _mm512_or_si512(sign, mag);
  store16(v, code, k, s, codes, values);
}

MT_AVX512 void nearest_span(const float* row, int64_t c0, int64_t c1, const Fp4BlockScale& s,
                            uint8_t* codes, bfloat16* values) {
  const Scale16 v = scale16(s);
  for (int64_t c = c0; c < c1; c += 16) {
    const int64_t n = std::min<int64_t>(16, c1 - c);
    nearest16(row + c, __mmask16((1u << n) - 1u), v, codes ? codes + c : nullptr,
              values ? values + c : nullptr);
  }
}

MT_AVX512 void stochastic_span(const float* row, const uint32_t* rnd, int64_t c0, int64_t c1,
                               const Fp4BlockScale& s, uint8_t* codes, bfloat16* values) {
  const Scale16 v = scale16(s);
  for (int64_t c = c0; c < c1; c += 16) {
    const int64_t n = std::min<int64_t>(16, c1 - c);
    stochastic16(row + c, rnd + c, __mmask16((1u << n) - 1u), v, codes ? codes + c : nullptr,
                 values ? values + c : nullptr);
  }
}

// max |x| over [c0, c1), NaN winning (the same as nan_max's fold: max is exact).
MT_AVX512 inline float amax_span(const float* row, int64_t c0, int64_t c1) {
  __m512 m = _mm512_setzero_ps();
  __mmask16 nan = 0;
  for (int64_t c = c0; c < c1; c += 16) {
    const int64_t n = std::min<int64_t>(16, c1 - c);
    const __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(__mmask16((1u << n) - 1u), row + c));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, v);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(m);
}
// NVFP4's block scales of up to 16 blocks at once from their amaxes: nvfp4_block_scale's
// operations lane by lane. s = min(amax * multiplier, FLT_MAX) (NaN too), at most 448, is
// rounded to E4M3 by hand: a normal s (>= 2^-6) to 3 mantissa bits, nearest even, by the integer
// add-and-mask on its bits; a subnormal one to a multiple of 2^-9 by roundscale (nearest even).
// Both give the rounded value as the float itself (448 is E4M3's largest, so nothing overflows)
// and the code from its bits. Then encode = min(1 / (value * decode), FLT_MAX).
struct BlockScales16 {
  __m512i code;
  __m512 value, encode;
};
MT_AVX512 inline BlockScales16 nvfp4_scales16(__m512 amax, const Nvfp4TensorScales& t) {
  const __m512 flt_max = _mm512_set1_ps(kFloatMax), e4m3_max = _mm512_set1_ps(kNvfp4E4m3Max);
  __m512 s = _mm512_mul_ps(amax, _mm512_set1_ps(t.multiplier));
  s = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(s, flt_max, _CMP_LT_OQ), flt_max, s);
  s = _mm512_min_ps(s, e4m3_max);
  const __m512i bits = _mm512_castps_si512(s);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 20), _mm512_set1_epi32(1));
  const __m512i normal_bits =
      _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff), lsb)),
                       _mm512_set1_epi32(~0xfffff));
  const __m512i normal_code = _mm512_or_si512(
      _mm512_slli_epi32(
          _mm512_sub_epi32(_mm512_srli_epi32(normal_bits, 23), _mm512_set1_epi32(120)), 3),
      _mm512_and_si512(_mm512_srli_epi32(normal_bits, 20), _mm512_set1_epi32(7)));
  const __m512 steps = _mm512_roundscale_ps(_mm512_mul_ps(s, _mm512_set1_ps(512.0f)),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __mmask16 sub = _mm512_cmp_ps_mask(s, _mm512_set1_ps(1.0f / 64), _CMP_LT_OQ);
  const __m512 value = _mm512_mask_blend_ps(sub, _mm512_castsi512_ps(normal_bits),
                                            _mm512_mul_ps(steps, _mm512_set1_ps(1.0f / 512)));
  const __m512i code = _mm512_mask_blend_epi32(sub, normal_code, _mm512_cvttps_epi32(steps));
  __m512 encode =
      _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(value, _mm512_set1_ps(t.decode)));
  encode = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(encode, flt_max, _CMP_LT_OQ), flt_max, encode);
  return {code, value, encode};
}

// Sixteen blocks' scales from their amaxes (lanes), by any rule: NVFP4's vector formula, the MX
// rules block by block.
MT_AVX512 inline BlockScales16 scales16(__m512 amax, Fp4ScaleRule rule,
                                        const Nvfp4TensorScales& t) {
  if (rule == Fp4ScaleRule::Nvfp4) return nvfp4_scales16(amax, t);
  alignas(64) float a[16], v[16], e[16];
  alignas(64) uint32_t code[16];
  _mm512_store_ps(a, amax);
  for (int l = 0; l < 16; ++l) {
    const Fp4BlockScale one = fp4_block_scale(a[l], rule, t);
    code[l] = one.code;
    v[l] = one.value;
    e[l] = one.encode;
  }
  return {_mm512_load_si512(code), _mm512_load_ps(v), _mm512_load_ps(e)};
}

MT_AVX512 void nvfp4_block_scales(const float* amax, int64_t n, const Nvfp4TensorScales& t,
                                  Fp4BlockScale* out, uint8_t* codes) {
  for (int64_t b = 0; b < n; b += 16) {
    const __mmask16 k = __mmask16((1u << std::min<int64_t>(16, n - b)) - 1u);
    const BlockScales16 s = nvfp4_scales16(_mm512_maskz_loadu_ps(k, amax + b), t);
    alignas(64) uint32_t c[16];
    alignas(64) float v[16], e[16];
    _mm512_store_si512(c, s.code);
    _mm512_store_ps(v, s.value);
    _mm512_store_ps(e, s.encode);
    for (int i = 0; i < 16 && b + i < n; ++i) {
      out[b + i] = {c[i], v[i], e[i]};
      codes[b + i] = uint8_t(c[i]);
    }
  }
}

// One row's 16-groups through the transform in place: the 16 outputs of a group in one
// register, each its own sum in index order (products and sums rounded separately, as the
// scalar loop computes them).
MT_AVX512 void hadamard_row(float* row, int64_t C, const float (&coef)[16][16]) {
  __m512 c[16];
  for (int i = 0; i < 16; ++i)
    c[i] = _mm512_loadu_ps(coef[i]);
  for (int64_t g = 0; g < C; g += 16) {
    __m512 acc = _mm512_mul_ps(_mm512_set1_ps(row[g]), c[0]);
    for (int i = 1; i < 16; ++i)
      acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(row[g + i]), c[i]));
    _mm512_storeu_ps(row + g, acc);
  }
}

// The transform down the columns of 16 rows (C wide) into out: out[j][c] = sum_i rows[i][c] *
// coef[i][j] in index order, products and sums rounded separately (the scalar loop's values).
MT_AVX512 void hadamard_down(const float* rows, int64_t C, const float (&coef)[16][16],
                             float* out) {
  for (int64_t c = 0; c < C; c += 16) {
    const __mmask16 k = __mmask16((1u << std::min<int64_t>(16, C - c)) - 1u);
    __m512 v[16];
    for (int i = 0; i < 16; ++i)
      v[i] = _mm512_maskz_loadu_ps(k, rows + i * C + c);
    for (int j = 0; j < 16; ++j) {
      __m512 acc = _mm512_mul_ps(v[0], _mm512_set1_ps(coef[0][j]));
      for (int i = 1; i < 16; ++i)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(v[i], _mm512_set1_ps(coef[i][j])));
      _mm512_mask_storeu_ps(out + j * C + c, k, acc);
    }
  }
}

// One row of 1 x bc blocks, sixteen blocks at a time: their amaxes (NaN winning), their scales
// (NVFP4's vector formula, the MX rules' block by block), then their elements.
MT_AVX512 void row_avx512(const float* row, int64_t C, int64_t bc, const Fp4QuantizeParams& p,
                          const Nvfp4TensorScales& ts, const uint32_t* bits, uint8_t* codes,
                          bfloat16* values, uint8_t* block_codes) {
  const int64_t nbc = (C + bc - 1) / bc;
  for (int64_t b0 = 0; b0 < nbc; b0 += 16) {
    const int64_t nb = std::min<int64_t>(16, nbc - b0);
    alignas(64) float amax[16] = {}, encode[16], value[16];
    alignas(64) uint32_t code[16];
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t c0 = (b0 + j) * bc;
      amax[j] = amax_span(row, c0, std::min(C, c0 + bc));
    }
    const BlockScales16 b = scales16(_mm512_load_ps(amax), p.rule, ts);
    _mm512_store_si512(code, b.code);
    _mm512_store_ps(value, b.value);
    _mm512_store_ps(encode, b.encode);
    _mm512_mask_cvtepi32_storeu_epi8(block_codes + b0, __mmask16((1u << nb) - 1u),
                                     _mm512_load_si512(code));
    for (int64_t j = 0; j < nb; ++j) {
      const Scale16 scale{_mm512_set1_ps(encode[j]), _mm512_set1_ps(value[j])};
      const int64_t c1 = std::min(C, (b0 + j + 1) * bc);
      for (int64_t c = (b0 + j) * bc; c < c1; c += 16) {
        const __mmask16 k = __mmask16((1u << std::min<int64_t>(16, c1 - c)) - 1u);
        uint8_t* code_row = codes ? codes + c : nullptr;
        bfloat16* value_row = values ? values + c : nullptr;
        if (bits) {
          stochastic16(row + c, bits + c, k, scale, code_row, value_row);
        } else {
          nearest16(row + c, k, scale, code_row, value_row);
        }
      }
    }
  }
}

// A group of bc rows quantized down its columns (p.columns): sixteen columns at a time, each
// lane its own block: the block amaxes (NaN winning), their scales (NVFP4's in vector form, the
// MX rules' per lane), then each row's elements with the lanes' scales.
MT_AVX512 void columns_avx512(const float* rows, int64_t C, int64_t bc, const Fp4QuantizeParams& p,
                              const Nvfp4TensorScales& ts, const uint32_t* bits, uint8_t* codes,
                              bfloat16* values, uint8_t* block_codes) {
  for (int64_t c = 0; c < C; c += 16) {
    const __mmask16 k = __mmask16((1u << std::min<int64_t>(16, C - c)) - 1u);
    __m512 m = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t i = 0; i < bc; ++i) {
      const __m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(k, rows + i * C + c));
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      m = _mm512_max_ps(m, v);
    }
    m = _mm512_mask_mov_ps(m, nan, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
    const BlockScales16 b = scales16(m, p.rule, ts);
    _mm512_mask_cvtepi32_storeu_epi8(block_codes + c, k, b.code);
    const Scale16 scale{b.encode, b.value};
    for (int64_t i = 0; i < bc; ++i) {
      uint8_t* code_row = codes ? codes + i * C + c : nullptr;
      if (bits) {
        stochastic16(rows + i * C + c, bits + i * C + c, k, scale, code_row, values + i * C + c);
      } else {
        nearest16(rows + i * C + c, k, scale, code_row, values + i * C + c);
      }
    }
  }
}
#endif

// max |v| over [c0, c1), NaN winning: in AVX-512 where the kernels run it, else the scalar fold.
inline float amax_of(const float* v, int64_t c0, int64_t c1) {
#if defined(__x86_64__)
  if (vector_isa() == VectorIsa::Avx512) return amax_span(v, c0, c1);
#endif
  float m = 0;
  for (int64_t c = c0; c < c1; ++c)
    m = nan_max(m, std::fabs(v[c]));
  return m;
}

// Quantizes the block row `br_index` (rows [r0, r1)) of x: the blocks' scales, then each row,
// its random bits first under stochastic rounding (the vector Philox), block by block.
template <typename T>
void quantize_block_row(const T* x, int64_t C, int64_t r0, int64_t r1, int64_t bc, int64_t nbc,
                        const Fp4QuantizeParams& p, const Nvfp4TensorScales& ts, int64_t br_index,
                        const Fp4Out& out, float* rows) {
  const int64_t n = r1 - r0;
  const bool avx512 = vector_isa() == VectorIsa::Avx512;
  for (int64_t r = 0; r < n; ++r)
    load_row(x + (r0 + r) * C, C, rows + r * C);
  thread_local std::vector<Fp4BlockScale> scales;
  thread_local std::vector<float> amaxes;
  thread_local std::vector<uint32_t> bits;
#if defined(__x86_64__)
  if (avx512 && n == 1) {  // 1 x bc blocks: the row on its own
    const int64_t base = r0 * C;
    if (p.stochastic) {
      bits.resize(size_t(C));
      detail::random_bits_fill(bits.data(), size_t(C), p.seed, p.offset, uint64_t(base),
                               detail::Isa::Avx512);
    }
    return row_avx512(rows, C, bc, p, ts, p.stochastic ? bits.data() : nullptr,
                      out.codes ? out.codes + base : nullptr,
                      out.values ? out.values + base : nullptr, out.block_scales + br_index * nbc);
  }
#endif
  scales.resize(size_t(nbc));
  amaxes.resize(size_t(nbc));
  for (int64_t b = 0; b < nbc; ++b) {
    const int64_t c0 = b * bc, c1 = std::min(C, c0 + bc);
    float amax = 0;
    for (int64_t r = 0; r < n; ++r)
      amax = nan_max(amax, amax_of(rows + r * C, c0, c1));
    amaxes[size_t(b)] = amax;
  }
  uint8_t* block_codes = out.block_scales + br_index * nbc;
  bool scaled = false;
#if defined(__x86_64__)
  if (avx512 && p.rule == Fp4ScaleRule::Nvfp4) {
    nvfp4_block_scales(amaxes.data(), nbc, ts, scales.data(), block_codes);
    scaled = true;
  }
#endif
  for (int64_t b = 0; !scaled && b < nbc; ++b) {
    scales[size_t(b)] = fp4_block_scale(amaxes[size_t(b)], p.rule, ts);
    block_codes[b] = uint8_t(scales[size_t(b)].code);
  }
  if (p.stochastic) bits.resize(size_t(C));
  for (int64_t r = 0; r < n; ++r) {
    const float* row = rows + r * C;
    const int64_t base = (r0 + r) * C;
    uint8_t* codes = out.codes ? out.codes + base : nullptr;
    bfloat16* values = out.values ? out.values + base : nullptr;
    if (p.stochastic) {
      detail::random_bits_fill(bits.data(), size_t(C), p.seed, p.offset, uint64_t(base),
                               avx512 ? detail::Isa::Avx512 : detail::Isa::Scalar);
    }
    for (int64_t b = 0; b < nbc; ++b) {
      const int64_t c0 = b * bc, c1 = std::min(C, c0 + bc);
      const Fp4BlockScale& s = scales[size_t(b)];
#if defined(__x86_64__)
      if (avx512) {
        if (p.stochastic) {
          stochastic_span(row, bits.data(), c0, c1, s, codes, values);
        } else {
          nearest_span(row, c0, c1, s, codes, values);
        }
        continue;
      }
#endif
      for (int64_t c = c0; c < c1; ++c) {
        const uint32_t rnd = p.stochastic ? bits[size_t(c)] : 0u;
        store(fp4_element(row[c], s, p.stochastic, rnd), codes, values, c);
      }
    }
  }
}

// The transform's coefficients, coef[i][j] (fp4_math.h).
struct HadamardCoefficients {
  alignas(64) float coef[16][16];
  explicit HadamardCoefficients(uint32_t signs) {
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j)
        coef[i][j] = hadamard16_coefficient(signs, i, j);
  }
};

// Rows r0..r0+n of the matrix p.columns quantizes down: x's rows as f32 (zeros past R) and, with
// p.rht, each 16 rows through the transform down the columns, rounded to T as hadamard16 stores
// them. rows: n x C; tmp: 16 x C floats; narrow: n x C of T, the transform's rounded values.
template <typename T>
void column_source(const T* x, int64_t R, int64_t C, int64_t r0, int64_t n,
                   const Fp4QuantizeParams& p, const HadamardCoefficients& h, float* rows,
                   float* tmp, T* narrow) {
  for (int64_t i = 0; i < n; ++i) {
    if (r0 + i < R) {
      load_row(x + (r0 + i) * C, C, rows + i * C);
    } else {
      std::fill(rows + i * C, rows + (i + 1) * C, 0.0f);
    }
  }
  if (!p.rht) return;
  for (int64_t s = 0; s < n; s += 16) {
    float* group = rows + s * C;
#if defined(__x86_64__)
    if (vector_isa() == VectorIsa::Avx512) {
      hadamard_down(group, C, h.coef, tmp);
    } else
#endif
    {
      for (int j = 0; j < 16; ++j) {
        float* out = tmp + j * C;
        for (int64_t c = 0; c < C; ++c)
          out[c] = group[c] * h.coef[0][j];
        for (int i = 1; i < 16; ++i)
          for (int64_t c = 0; c < C; ++c)
            out[c] = out[c] + group[i * C + c] * h.coef[i][j];
      }
    }
    store_contiguous<float, T>(tmp, narrow + s * C, 16 * C);
    load_contiguous<T, float>(narrow + s * C, group, 16 * C);
  }
}

// p.columns: the group of bc rows from r0, quantized down its columns: the blocks' amaxes and
// scales (one block per column), then the elements, stochastic ones drawing Q's index c * Rp + r.
// Writes rows r0..r0+bc of codes and values and row r0 / bc of the block scales.
template <typename T>
void quantize_column_group(const T* x, int64_t R, int64_t C, int64_t Rp, int64_t r0,
                           const Fp4QuantizeParams& p, const Nvfp4TensorScales& ts,
                           const HadamardCoefficients& h, const Fp4Out& out, float* scratch) {
  const int64_t bc = fp4_block_cols(p.rule);
  float* rows = scratch;
  thread_local std::vector<float> tmp;
  thread_local std::vector<T> narrow;
  thread_local std::vector<uint32_t> bits;
  if (p.rht) {
    tmp.resize(size_t(16 * C));
    narrow.resize(size_t(bc * C));
  }
  column_source(x, R, C, r0, bc, p, h, rows, tmp.data(), narrow.data());
  const bool avx512 = vector_isa() == VectorIsa::Avx512;
  const detail::Isa isa = avx512 ? detail::Isa::Avx512 : detail::Isa::Scalar;
  if (p.stochastic) {
    bits.resize(size_t(bc * C));
    for (int64_t s = 0; s < bc; s += 16)
      detail::random_bits_runs16(bits.data() + s * C, size_t(C), p.seed, p.offset, uint64_t(r0 + s),
                                 uint64_t(Rp), isa);
  }
  uint8_t* codes = out.codes ? out.codes + r0 * C : nullptr;
  bfloat16* values = out.values + r0 * C;
  uint8_t* block_codes = out.block_scales + (r0 / bc) * C;
  const uint32_t* rnd = p.stochastic ? bits.data() : nullptr;
#if defined(__x86_64__)
  if (avx512) return columns_avx512(rows, C, bc, p, ts, rnd, codes, values, block_codes);
#endif
  for (int64_t c = 0; c < C; ++c) {
    float amax = 0;
    for (int64_t i = 0; i < bc; ++i)
      amax = nan_max(amax, std::fabs(rows[i * C + c]));
    const Fp4BlockScale s = fp4_block_scale(amax, p.rule, ts);
    block_codes[c] = uint8_t(s.code);
    for (int64_t i = 0; i < bc; ++i) {
      const Fp4Element e = fp4_element(rows[i * C + c], s, p.stochastic, rnd ? rnd[i * C + c] : 0);
      store(e, codes, values, i * C + c);
    }
  }
}

// p.columns with p.rht: the transform once, into `transformed` ((Rp, C), x's dtype, as
// hadamard16 would store it), returning its amax; the quantization then reads it as it is.
template <typename T>
float transform_columns(const T* x, int64_t R, int64_t C, int64_t Rp, const Fp4QuantizeParams& p,
                        const HadamardCoefficients& h, T* transformed) {
  const int64_t groups = Rp / 16;
  std::vector<float> amaxes(static_cast<size_t>(groups));
  parallel_rows<float>(groups, Rp * C * 16, 16 * C, [&](int64_t g, float* rows) {
    thread_local std::vector<float> tmp;
    tmp.resize(size_t(16 * C));
    // The rounded values go straight into their place in `transformed`.
    column_source(x, R, C, g * 16, 16, p, h, rows, tmp.data(), transformed + g * 16 * C);
    amaxes[size_t(g)] = amax_of(rows, 0, 16 * C);
  });
  float m = 0;
  for (float a : amaxes)
    m = nan_max(m, a);
  return m;
}

template <typename T>
void quantize(const T* x, int64_t R, int64_t C, int64_t Rp, const Fp4QuantizeParams& p,
              float given_amax, bool given, const Fp4Out& out, float* scale_inv, float* amax_out) {
  const HadamardCoefficients h(p.rht_signs);
  if (p.columns && p.rht && !given) {
    // The amax is the transformed tensor's: transform once, then quantize what it stored.
    // From the tensor allocator's cache: a fresh buffer of this size would be fresh pages.
    const Tensor buffer = Tensor::empty({Rp, C}, dtype_of_v<T>, Device::cpu());
    T* transformed = static_cast<T*>(buffer.data_ptr());
    const float a = transform_columns(x, R, C, Rp, p, h, transformed);
    Fp4QuantizeParams direct = p;
    direct.rht = false;
    return quantize(transformed, Rp, C, Rp, direct, a, true, out, scale_inv, amax_out);
  }
  const float amax = given ? given_amax : tensor_amax(x, R * C);
  const Nvfp4TensorScales ts =
      p.rule == Fp4ScaleRule::Nvfp4 ? nvfp4_tensor_scales(amax) : Nvfp4TensorScales{};
  *amax_out = amax;
  *scale_inv = p.rule == Fp4ScaleRule::Nvfp4 ? ts.decode : 1.0f;
  const int64_t br = p.block_rows, bc = fp4_block_cols(p.rule);
  if (p.columns) {
    parallel_rows<float>(Rp / bc, Rp * C, bc * C, [&](int64_t g, float* rows) {
      quantize_column_group(x, R, C, Rp, g * bc, p, ts, h, out, rows);
    });
    return;
  }
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  // Block rows in tasks of 16 (a task per row of 1 x bc blocks would be too fine a grain).
  constexpr int64_t kPerTask = 16;
  parallel_rows<float>((nbr + kPerTask - 1) / kPerTask, R * C, br * C, [&](int64_t t, float* rows) {
    for (int64_t b = t * kPerTask; b < std::min(nbr, (t + 1) * kPerTask); ++b)
      quantize_block_row(x, C, b * br, std::min(R, (b + 1) * br), bc, nbc, p, ts, b, out, rows);
  });
}

}  // namespace

void CpuBackend::fp4_quantize(const Tensor& x, const Fp4QuantizeParams& p, Tensor& codes,
                              Tensor& block_scales, Tensor& scale_inv, Tensor& amax,
                              Tensor* values) {
  check_fp4_quantize(x, p, codes, block_scales, scale_inv, amax, values, Device::cpu());
  const bool given = p.rule == Fp4ScaleRule::Nvfp4 && p.amax;
  const float given_amax = given ? *static_cast<const float*>(p.amax->data_ptr()) : 0.0f;
  const Fp4Out out{p.values_only ? nullptr : static_cast<uint8_t*>(codes.data_ptr()),
                   static_cast<uint8_t*>(block_scales.data_ptr()),
                   values ? static_cast<bfloat16*>(values->data_ptr()) : nullptr};
  MT_ASSERT(!p.columns || values, "fp4_quantize: columns wants the values");
  const int64_t Rp = fp4_quantized_rows(x, p, codes, values);
  dispatch_float(x.dtype(), "fp4_quantize", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      MT_CHECK(false, "fp4_quantize takes f32, bf16 or f16 values, got f64");
    } else {
      quantize(static_cast<const T*>(x.data_ptr()), x.size(0), x.size(1), Rp, p, given_amax, given,
               out, static_cast<float*>(scale_inv.data_ptr()),
               static_cast<float*>(amax.data_ptr()));
    }
  });
}

void CpuBackend::hadamard16(const Tensor& x, uint32_t signs, Tensor& out) {
  check_hadamard16(x, out, Device::cpu());
  const int64_t R = x.size(0), C = x.size(1);
  const bool avx512 = vector_isa() == VectorIsa::Avx512;
  const HadamardCoefficients h(signs);
  const auto& coef = h.coef;
  dispatch_float(x.dtype(), "hadamard16", [&]<typename T>() {
    dispatch_float(out.dtype(), "hadamard16", [&]<typename O>() {
      const T* src = static_cast<const T*>(x.data_ptr());
      O* dst = static_cast<O*>(out.data_ptr());
      // A row in f32 (widened exactly), transformed in place, then stored with one rounding.
      parallel_rows<float>(R, R * C * 16, C, [&](int64_t r, float* row) {
        load_row(src + r * C, C, row);
#if defined(__x86_64__)
        if (avx512) {
          hadamard_row(row, C, coef);
          store_contiguous<float, O>(row, dst + r * C, C);
          return;
        }
#endif
        for (int64_t g = 0; g < C; g += 16) {
          // The 16 outputs side by side, each its own sum in index order (vectorized across
          // the outputs: no sum reordered, no product fused).
          float acc[16];
          for (int j = 0; j < 16; ++j)
            acc[j] = row[g] * coef[0][j];
          for (int i = 1; i < 16; ++i) {
            const float v = row[g + i];
            for (int j = 0; j < 16; ++j)
              acc[j] = acc[j] + v * coef[i][j];
          }
          std::memcpy(row + g, acc, sizeof(acc));
        }
        store_contiguous<float, O>(row, dst + r * C, C);
      });
    });
  });
}

// No FP4 tensor cores here: the op layer emulates (block_scaled_gemm of the codes' values).
bool CpuBackend::fp4_gemm(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&,
                          Fp4ScaleRule, Tensor&) {
  return false;
}

}  // namespace mantissa::backend::cpu
