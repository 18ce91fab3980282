// Internal: the arithmetic of FP4 block scaling that every backend's fp4_quantize and hadamard16
// share, host and device (docs/fp4.md has the recipes): NVFP4's two-level scales (an fp32 scale
// per tensor, an E4M3 scale per block of 16) as Transformer Engine's kernels compute them, MXFP4's
// E8M0 scale per block of 32 by the OCP rule or rounded up, and the rounding of one scaled value
// to fp4_e2m1. Pure functions of plain values, so nvcc compiles them for the device too and the
// CPU and the GPU give the same codes bit for bit.
#pragma once

#include <bit>
#include <cstdint>

#include "backend/backend.h"
#include "backend/fp8_math.h"
#include "backend/host_device.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"

namespace mantissa::backend {

inline constexpr float kFp4Max = 6.0f;          // fp4_e2m1's largest value
inline constexpr float kNvfp4E4m3Max = 448.0f;  // the block scale's largest value
inline constexpr float kFloatMax = 3.40282347e+38f;

// The block width along a row: 16 for NVFP4, 32 for the MX rules.
MT_HOST_DEVICE constexpr int64_t fp4_block_cols(Fp4ScaleRule rule) {
  return rule == Fp4ScaleRule::Nvfp4 ? 16 : 32;
}

// min(x, FLT_MAX) as torch.min computes it for x >= 0, except that NaN gives FLT_MAX too (a
// non-finite amax never makes a NaN scale here: see nvfp4_tensor_scales).
MT_HOST_DEVICE constexpr float fp4_cap(float x) {
  return x < kFloatMax ? x : kFloatMax;
}

// NVFP4's per-tensor scales from the tensor's amax, Transformer Engine's kernel path in fp32:
// encode = min(448 * 6 / amax, FLT_MAX), 1 where that is 0 (amax inf) or amax is NaN; decode =
// 1 / encode; the block multiplier encode * (1 / 6), the reciprocal rounded first (TE folds it
// into the global scale).
struct Nvfp4TensorScales {
  float encode = 1, decode = 1, multiplier = 1.0f / 6.0f;
};
MT_HOST_DEVICE constexpr Nvfp4TensorScales nvfp4_tensor_scales(float amax) {
  float encode = amax == amax ? fp4_cap((kNvfp4E4m3Max * kFp4Max) / amax) : 1.0f;
  encode = encode == 0.0f ? 1.0f : encode;
  return {encode, 1.0f / encode, encode * (1.0f / kFp4Max)};
}

// One block's scale: its code (E4M3 for NVFP4, E8M0 for MX), its value (what the block's fp4
// values are multiplied by to dequantize, before the tensor's decode scale) and the factor
// that the block's inputs are multiplied by before rounding to fp4.
struct Fp4BlockScale {
  uint32_t code = 0;
  float value = 1, encode = 1;
};

// NVFP4 (TE): value = e4m3(clamp(block_amax * multiplier, 0, 448)) rounded to nearest even
// (min(., FLT_MAX) first; a non-finite amax gives 448), encode = min(1 / (value * decode),
// FLT_MAX) in fp32 (an all-zero block: value 0, encode FLT_MAX).
MT_HOST_DEVICE constexpr Fp4BlockScale nvfp4_block_scale(float block_amax,
                                                         const Nvfp4TensorScales& t) {
  float s = fp4_cap(block_amax * t.multiplier);
  s = s > kNvfp4E4m3Max ? kNvfp4E4m3Max : s;
  constexpr FormatSpec e4m3 = format_spec(Format::FP8_E4M3);  // compile time: no table read
  const uint32_t code = detail::encode_bits<float>(
      std::bit_cast<uint32_t>(s), e4m3, RoundingMode::NearestEven, Overflow::Saturate, 0);
  const float value = detail::decode_bits(code, e4m3);
  return {code, value, fp4_cap(1.0f / (value * t.decode))};
}

// The exponent of the smallest power of two >= x, for a finite x > 0 (exactly, from the bits).
MT_HOST_DEVICE constexpr int fp4_ceil_log2(float x) {
  const int f = fp8_floor_log2(x);
  return x > fp8_pow2(f) ? f + 1 : f;
}

// MX (OCP v1.0): the block scale 2^e, e8m0 code e + 127, e clamped to [-127, 127].
//   MxFloor (the spec): e = floor(log2(amax)) - 2 (fp4_e2m1's largest exponent), so values in
//                       (6, 8) * 2^e saturate to 6 * 2^e.
//   MxCeil:             e = ceil(log2(amax / 6)), amax / 6 rounded in fp32: the smallest scale
//                       at which nothing saturates (TE's MXFP4 reference, torchao's RCEIL).
// amax 0 gives e = -127 (TE's clamp of log2(0)); a non-finite amax gives the E8M0 NaN (0xff),
// whose value and encode are NaN.
MT_HOST_DEVICE constexpr Fp4BlockScale mx_block_scale(float amax, Fp4ScaleRule rule) {
  if (!is_finite_value(double(amax))) {
    const float nan = std::bit_cast<float>(0x7fc00000u);
    return {0xffu, nan, nan};
  }
  int e = -127;
  if (amax > 0.0f) {
    e = rule == Fp4ScaleRule::MxFloor ? fp8_floor_log2(amax) - 2 : fp4_ceil_log2(amax / kFp4Max);
  }
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return {uint32_t(e + 127), fp8_pow2(e), fp8_pow2(-e)};
}

// A block's scale by the rule; for NVFP4 from the tensor's scales `t`.
MT_HOST_DEVICE constexpr Fp4BlockScale fp4_block_scale(float block_amax, Fp4ScaleRule rule,
                                                       const Nvfp4TensorScales& t) {
  return rule == Fp4ScaleRule::Nvfp4 ? nvfp4_block_scale(block_amax, t)
                                     : mx_block_scale(block_amax, rule);
}

// The fp4_e2m1 code of one scaled value x * encode: clamped to [-6, 6], then rounded to nearest
// even or stochastically (round.h's rule with the random bits `rnd`). Nearest even is the count
// of fp4 midpoints below |x|, a tie going to the even code: |x| > 0.25, >= 0.75, > 1.25, >= 1.75,
// > 2.5, >= 3.5, > 5 (TE's cast_to_fp4x2 buckets; the same codes as round.h's encoder, tested on
// every float between -8 and 8 that is a midpoint, beside one, or random). Branch-free, so the
// CPU's loop vectorizes. The sign of a zero is kept (TE's Python reference sends -0.0 to +0; the
// hardware's cvt and ml_dtypes keep it); NaN gives the zero of its sign (the caller's value
// says NaN).
MT_HOST_DEVICE constexpr uint32_t fp4_nearest_code(float c) {
  const uint32_t sign = (std::bit_cast<uint32_t>(c) >> 31) << 3;
  const float a = c < 0.0f ? -c : c;
  const uint32_t mag = uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) +
                       uint32_t(a >= 1.75f) + uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) +
                       uint32_t(a > 5.0f);
  return sign | mag;
}
MT_HOST_DEVICE constexpr uint32_t fp4_code(float scaled, bool stochastic, uint32_t rnd) {
  constexpr FormatSpec e2m1 = format_spec(Format::FP4_E2M1);
  const float c = scaled > kFp4Max ? kFp4Max : (scaled < -kFp4Max ? -kFp4Max : scaled);
  if (!stochastic) return fp4_nearest_code(c);
  return detail::encode_bits<float>(std::bit_cast<uint32_t>(c), e2m1, RoundingMode::Stochastic,
                                    Overflow::Saturate, rnd);
}

// The value of an fp4_e2m1 code (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), in integer
// arithmetic (no table: device code reads none): exponent field e, mantissa bit m, the value
// is m / 2 for e = 0 and (2 + m) * 2^(e - 2) otherwise.
MT_HOST_DEVICE constexpr float fp4_value(uint32_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  const uint32_t halves = e == 0 ? m : (2u + m) << (e - 1);
  const float v = float(halves) * 0.5f;
  return (code & 8u) ? -v : v;
}

// One element of fp4_quantize: its code, and its dequantized value (fp4 value times the block
// scale's value, exact in bf16), NaN where the input is not finite or the scale is NaN.
struct Fp4Element {
  uint32_t code;
  float value;
};
MT_HOST_DEVICE constexpr Fp4Element fp4_element(float x, const Fp4BlockScale& s, bool stochastic,
                                                uint32_t rnd) {
  const uint32_t code = fp4_code(x * s.encode, stochastic, rnd);
  const bool finite = is_finite_value(double(x)) && s.value == s.value;
  return {code, finite ? fp4_value(code) * s.value : std::bit_cast<float>(0x7fc00000u)};
}

// The Random Hadamard Transform's coefficient at (i, j) of a 16-group: the Sylvester Hadamard
// matrix H (H[i][j] = (-1)^popcount(i & j)) with row i's sign flipped where bit i of `signs` is
// set, times 1/4 (= 1/sqrt(16)): out_j = sum_i x_i * coefficient(i, j), as TE's reference
// x @ (diag(s) H / 4). Exact (+-0.25).
MT_HOST_DEVICE constexpr float hadamard16_coefficient(uint32_t signs, int i, int j) {
  const uint32_t both = uint32_t(i & j);
  const int flips = int((both & 1u) + ((both >> 1) & 1u) + ((both >> 2) & 1u) + ((both >> 3) & 1u) +
                        ((signs >> i) & 1u));
  return (flips & 1) ? -0.25f : 0.25f;
}

// Transformer Engine's fixed sign vector for the wgrad RHT (get_wgrad_sign_vector, with
// with_random_sign_mask), as a mask: bit i set where the sign is -1.
inline constexpr uint32_t kTeWgradSigns = 0xd7e8u;

// A seeded sign mask: 16 bits of Philox's stream (seed, offset 0), element 0.
constexpr uint32_t hadamard16_signs(uint64_t seed) {
  return random_bits(seed, 0, 0) & 0xffffu;
}

// The operands of a native FP4 GEMM (fp4_gemm; cuBLASLt's block-scaled GEMMs on compute
// capability 10.0+). The codes go two to a byte, the first (lower k) in the low nibble. The block
// scales go as cuBLASLt reads them (cuBLAS's "1D block scaling factors layout"): a matrix with a
// row per row of the operand and a column per block along K, padded to tiles of 128 rows by 4
// columns (the padding zero), the tiles one after another (row of tiles by row of tiles), each
// tile's 512 bytes as 32 rows of 16: row r, column c at (r % 32) * 16 + (r / 32 % 4) * 4 + c % 4.
MT_HOST_DEVICE constexpr uint8_t fp4_pack_pair(uint32_t first, uint32_t second) {
  return uint8_t((first & 0xfu) | ((second & 0xfu) << 4));
}
MT_HOST_DEVICE constexpr int64_t fp4_swizzled_rows(int64_t rows) {
  return (rows + 127) / 128 * 128;
}
MT_HOST_DEVICE constexpr int64_t fp4_swizzled_cols(int64_t cols) {
  return (cols + 3) / 4 * 4;
}
MT_HOST_DEVICE constexpr int64_t fp4_swizzled_scale_offset(int64_t r, int64_t c, int64_t cols) {
  const int64_t tile = (r / 128) * (fp4_swizzled_cols(cols) / 4) + c / 4;
  return tile * 512 + (r % 32) * 16 + (r / 32 % 4) * 4 + c % 4;
}

// The rows of fp4_quantize's quantized matrix: x's, or with p.columns the codes' (Rp).
inline int64_t fp4_quantized_rows(const Tensor& x, const Fp4QuantizeParams& p, const Tensor& codes,
                                  const Tensor* values) {
  if (!p.columns) return x.size(0);
  return p.values_only ? (values ? values->size(0) : 0) : codes.size(0);
}

// fp4_quantize's arguments as its contract (backend_ops.h) wants them; host side, shared by the
// backends. An internal caller's mistake, so an assertion.
inline void check_fp4_quantize(const Tensor& x, const Fp4QuantizeParams& p, const Tensor& codes,
                               const Tensor& block_scales, const Tensor& scale_inv,
                               const Tensor& amax, const Tensor* values, Device device) {
  const bool input =
      x.dim() == 2 && x.is_contiguous() && x.device() == device &&
      (x.dtype() == DType::F32 || x.dtype() == DType::BF16 || x.dtype() == DType::F16);
  const int64_t R = input ? x.size(0) : 0, C = input ? x.size(1) : 0;
  const int64_t br = p.block_rows, bc = fp4_block_cols(p.rule);
  // The stored layout: x's, (Rp, C), with columns (blocks bc rows by 1 column).
  const int64_t Rp = input ? fp4_quantized_rows(x, p, codes, values) : 0;
  const Shape stored{Rp, C};
  const int64_t scale_rows = p.columns ? Rp / bc : (R + br - 1) / br;
  const int64_t scale_cols = p.columns ? C : (C + bc - 1) / bc;
  auto on = [&](const Tensor& t, DType dt) {
    return t.dtype() == dt && t.is_contiguous() && t.device() == device;
  };
  MT_ASSERT(input && (br == 1 || (br == 16 && p.rule == Fp4ScaleRule::Nvfp4 && !p.columns)) &&
                (!p.columns || (Rp >= R && Rp % bc == 0 && (!p.rht || Rp % 16 == 0))) &&
                (!p.rht || p.columns) && (!p.values_only || values) &&
                (p.values_only || (on(codes, DType::U8) && codes.shape() == stored)) &&
                on(block_scales, DType::U8) && block_scales.dim() == 2 &&
                block_scales.size(0) == scale_rows && block_scales.size(1) == scale_cols &&
                on(scale_inv, DType::F32) && scale_inv.numel() == 1 && on(amax, DType::F32) &&
                amax.numel() == 1 &&
                (!values || (on(*values, DType::BF16) && values->shape() == stored)) &&
                (!p.amax || (on(*p.amax, DType::F32) && p.amax->numel() == 1)),
            "fp4_quantize wants contiguous f32/bf16/f16 x (R, C), U8 codes (R, C) (with columns "
            "(Rp, C), Rp >= R a multiple of the block), U8 block scales (one per ",
            br, "x", bc, " block), one-element F32 scale_inv and amax, bf16 values; got ",
            x.describe(), ", ", codes.describe(), ", ", block_scales.describe(), ", ",
            scale_inv.describe(), ", ", amax.describe());
}

// fp4_gemm's arguments as its contract (backend_ops.h) wants them.
inline void check_fp4_gemm(const Tensor& a_codes, const Tensor& a_scales, int64_t a_block_rows,
                           const Tensor& a_scale_inv, const Tensor& a_amax, const Tensor& b_codes,
                           const Tensor& b_scales, int64_t b_block_rows, const Tensor& b_scale_inv,
                           const Tensor& b_amax, Fp4ScaleRule rule, const Tensor& out) {
  const Device d = out.device();
  const int64_t bc = fp4_block_cols(rule);
  auto scalar = [&](const Tensor& t) {
    return t.dtype() == DType::F32 && t.numel() == 1 && t.device() == d;
  };
  auto operand = [&](const Tensor& codes, const Tensor& scales, int64_t br, const Tensor& scale_inv,
                     const Tensor& amax) {
    return codes.dim() == 2 && codes.dtype() == DType::U8 && codes.device() == d &&
           (br == 1 || (br == 16 && rule == Fp4ScaleRule::Nvfp4)) && scales.dim() == 2 &&
           scales.dtype() == DType::U8 && scales.device() == d &&
           scales.size(0) == (codes.size(0) + br - 1) / br &&
           scales.size(1) == (codes.size(1) + bc - 1) / bc && scalar(scale_inv) && scalar(amax);
  };
  MT_ASSERT(operand(a_codes, a_scales, a_block_rows, a_scale_inv, a_amax) &&
                operand(b_codes, b_scales, b_block_rows, b_scale_inv, b_amax) &&
                a_codes.size(1) == b_codes.size(1) && out.dim() == 2 &&
                out.size(0) == a_codes.size(0) && out.size(1) == b_codes.size(0) &&
                out.is_contiguous() && (out.dtype() == DType::F32 || out.dtype() == DType::BF16),
            "fp4_gemm wants U8 codes a (M, K) and b (N, K) with their U8 block scales, "
            "one-element F32 scale_inv and amax, and a contiguous F32 or BF16 out (M, N) on one "
            "device; got ",
            a_codes.describe(), ", ", a_scales.describe(), ", ", b_codes.describe(), ", ",
            b_scales.describe(), " -> ", out.describe());
}

inline void check_hadamard16(const Tensor& x, const Tensor& out, Device device) {
  auto float32ish = [](DType d) { return d == DType::F32 || d == DType::BF16 || d == DType::F16; };
  MT_ASSERT(x.dim() == 2 && x.is_contiguous() && float32ish(x.dtype()) && x.size(1) % 16 == 0 &&
                x.device() == device && out.shape() == x.shape() && out.is_contiguous() &&
                float32ish(out.dtype()) && out.device() == device,
            "hadamard16 wants contiguous f32/bf16/f16 x (R, C), C a multiple of 16, and out of "
            "its shape; got ",
            x.describe(), " -> ", out.describe());
}

}  // namespace mantissa::backend
