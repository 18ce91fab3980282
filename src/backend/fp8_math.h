// Internal: the arithmetic of fp8 scaling that every backend's fp8_quantize shares, host and
// device (autocast/fp8.h has the recipes): a block's scale from its amax, and the one rounding of a
// scaled value. Pure functions of plain values, no library calls, so nvcc compiles them for the
// device too and the CPU and the GPU pick the same scales bit for bit.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "backend/step_math.h"

namespace mantissa::backend {

// 2^e as a float, for e in [-149, 127] (subnormal below -126).
MT_HOST_DEVICE constexpr float fp8_pow2(int e) {
  return e >= -126 ? std::bit_cast<float>(uint32_t(e + 127) << 23)
                   : std::bit_cast<float>(uint32_t(1) << (e + 149));
}

// The exponent of the largest power of two <= x, for a finite x > 0 (subnormals too).
MT_HOST_DEVICE constexpr int fp8_floor_log2(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x) & 0x7fffffffu;
  const int biased = int(bits >> 23);
  if (biased != 0) return biased - 127;
  int e = -127;  // subnormal: 2^-149 * mantissa
  for (uint32_t m = bits & 0x7fffffu; m != 0; m >>= 1)
    ++e;
  return e - 23;
}

// The scale a block gets (x * scale is what is rounded to fp8), from the block's amax.
//   Amax:     fp8_max / amax in fp32 (Transformer Engine's current scaling, DeepSeek-V3's tiles);
//             1 where amax is 0 or not finite, the largest float where the quotient overflows.
//   AmaxPow2: 2^-e with e = ceil(log2(amax / fp8_max)) clamped to E8M0's [-127, 127]: the
//             smallest power of two that puts amax at or below fp8_max, so a block never
//             saturates (NVIDIA's MXFP8 training recipe rounds the scale up for this reason;
//             the OCP spec's floor(log2(amax)) - emax can saturate the block's largest values).
//             1 where amax is 0; NaN (E8M0's NaN) where amax is not finite.
//   Given:    `given`.
MT_HOST_DEVICE constexpr float fp8_block_scale(float amax, float fp8_max, Fp8ScaleRule rule,
                                               float given) {
  if (rule == Fp8ScaleRule::Given) return given;
  const bool finite = is_finite_value(double(amax));
  if (rule == Fp8ScaleRule::Amax) {
    if (!finite || amax == 0.0f) return 1.0f;
    const float s = fp8_max / amax;
    return is_finite_value(double(s)) ? s : 3.40282347e+38f;
  }
  if (!finite) return std::bit_cast<float>(0x7fc00000u);
  if (amax == 0.0f) return 1.0f;
  const uint32_t ab = std::bit_cast<uint32_t>(amax), fb = std::bit_cast<uint32_t>(fp8_max);
  if (amax > 0.0f && (ab >> 23) != 0 && (fb >> 23) != 0) {
    // Both normal: amax = 1.a * 2^ea and fp8_max = 1.f * 2^ef, so amax <= fp8_max * 2^e holds
    // from e = ea - ef on when 1.a <= 1.f, else from the next e. (The loops below give the same
    // e; this is the common case without them, once per 32 values in MXFP8.)
    int e = int(ab >> 23) - int(fb >> 23) + int((ab & 0x7fffffu) > (fb & 0x7fffffu));
    e = e < -127 ? -127 : (e > 127 ? 127 : e);
    return fp8_pow2(-e);
  }
  int e = fp8_floor_log2(amax) - fp8_floor_log2(fp8_max);
  // The smallest e with amax <= fp8_max * 2^e, compared exactly in double (no rounding, no
  // overflow at e = 127).
  auto bound = [&](int k) {
    return double(fp8_max) * std::bit_cast<double>(uint64_t(k + 1023) << 52);
  };
  while (double(amax) > bound(e))
    ++e;
  while (double(amax) <= bound(e - 1))
    --e;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return fp8_pow2(-e);
}

// fp8_gemm's arguments as its contract (backend_ops.h) wants them; host side, shared by the
// backends. An internal caller's mistake, so an assertion.
inline void check_fp8_gemm(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                           const Tensor& b_scale_inv, const Tensor& out) {
  auto fp8 = [](const Tensor& t) {
    return t.dtype() == DType::FP8_E4M3 || t.dtype() == DType::FP8_E5M2;
  };
  auto scale = [&](const Tensor& s) {
    return s.dtype() == DType::F32 && s.numel() == 1 && s.device() == out.device();
  };
  MT_ASSERT(
      a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && fp8(a) && fp8(b) &&
          !(a.dtype() == DType::FP8_E5M2 && b.dtype() == DType::FP8_E5M2) &&
          a.size(1) == b.size(1) && (a.size(1) <= 1 || (a.stride(1) == 1 && b.stride(1) == 1)) &&
          out.size(0) == a.size(0) && out.size(1) == b.size(0) && out.is_contiguous() &&
          (out.dtype() == DType::F32 || out.dtype() == DType::BF16 || out.dtype() == DType::F16) &&
          a.device() == out.device() && b.device() == out.device() && scale(a_scale_inv) &&
          scale(b_scale_inv),
      "fp8_gemm wants fp8 a (M, K) and b (N, K) with unit stride along K (not both e5m2), "
      "one-element F32 scales and a contiguous f32/bf16/f16 out (M, N); got ",
      a.describe(), ", ", b.describe(), " -> ", out.describe());
}

// fp8_gemm's emulation, on any backend: the codes as bf16 (exact), then the one per-tensor slice
// of block_scaled_gemm, or with fast_accumulate fast_accumulate_gemm's model (never promoted).
inline void emulated_fp8_gemm(Backend& be, const Tensor& a, const Tensor& a_scale_inv,
                              const Tensor& b, const Tensor& b_scale_inv, bool fast_accumulate,
                              Tensor& out) {
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  Tensor ab = Tensor::empty({M, K}, DType::BF16, out.device());
  Tensor bb = Tensor::empty({N, K}, DType::BF16, out.device());
  be.copy(a, ab);
  be.copy(b, bb);
  const Tensor sa = a_scale_inv.view({1, 1}), sb = b_scale_inv.view({1, 1});
  const int64_t ra = std::max<int64_t>(M, 1), rb = std::max<int64_t>(N, 1),
                bk = std::max<int64_t>(K, 1);
  if (fast_accumulate) {
    be.fast_accumulate_gemm(ab, sa, ra, bb, sb, rb, bk, 0, nullptr, out);
  } else {
    be.block_scaled_gemm(ab, sa, ra, bb, sb, rb, bk, nullptr, out);
  }
}

// block_scaled_gemm's arguments as its contract (backend_ops.h) wants them; host side, shared by
// the backends.
inline void check_block_scaled_gemm(const Tensor& a, const Tensor& a_scales, int64_t a_rows,
                                    const Tensor& b, const Tensor& b_scales, int64_t b_rows,
                                    int64_t bk, const Tensor* bias, const Tensor& out) {
  const Device d = out.device();
  const bool operands = a.dim() == 2 && b.dim() == 2 && a.dtype() == DType::BF16 &&
                        b.dtype() == DType::BF16 && a.size(1) == b.size(1) && a.device() == d &&
                        b.device() == d;
  const int64_t M = operands ? a.size(0) : 0, N = operands ? b.size(0) : 0;
  const int64_t K = operands ? a.size(1) : 0;
  const int64_t S = bk > 0 ? std::max<int64_t>((K + bk - 1) / bk, 1) : 0;
  auto scales = [&](const Tensor& s, int64_t rows, int64_t block) {
    return block > 0 && s.dtype() == DType::F32 && s.dim() == 2 && s.device() == d &&
           s.size(0) == std::max<int64_t>((rows + block - 1) / block, 1) && s.size(1) == S;
  };
  MT_ASSERT(
      operands && bk > 0 && scales(a_scales, M, a_rows) && scales(b_scales, N, b_rows) &&
          out.dim() == 2 && out.size(0) == M && out.size(1) == N && out.is_contiguous() &&
          (out.dtype() == DType::F32 || out.dtype() == DType::BF16 || out.dtype() == DType::F16) &&
          (!bias || (bias->dim() == 1 && bias->size(0) == N && bias->device() == d &&
                     bias->is_floating_point())),
      "block_scaled_gemm wants bf16 a (M, K) and b (N, K), F32 scales (row blocks, K "
      "slices) for each and a contiguous f32/bf16/f16 out (M, N); got ",
      a.describe(), " (scales ", a_scales.describe(), " per ", a_rows, " rows), ", b.describe(),
      " (scales ", b_scales.describe(), " per ", b_rows, " rows), slices of ", bk, " -> ",
      out.describe());
}

// Delayed scaling (fp8_update_scales): the amax a history gives, the max over it or its most
// recent entry (slot 0), and the scale it makes, Transformer Engine's (fp8_max / amax) / 2^margin
// in fp32, kept as `old` where the amax is 0 or not finite or the scale would not be finite.
MT_HOST_DEVICE constexpr float delayed_amax(const float* history, int64_t n, bool use_max) {
  if (!use_max) return history[0];
  float m = history[0];
  for (int64_t i = 1; i < n; ++i)
    m = history[i] > m ? history[i] : m;
  return m;
}
MT_HOST_DEVICE constexpr float delayed_scale(float amax, float fp8_max, int margin, float old) {
  if (!(amax > 0.0f) || !is_finite_value(double(amax))) return old;
  const float s = (fp8_max / amax) / fp8_pow2(margin);
  return is_finite_value(double(s)) ? s : old;
}

// The fast accumulator of fp8 GEMMs (fast_accumulate_gemm; amp::Fp8Accumulation): a float with
// kFastAccumulatorBits bits after the leading one and fp32's exponent (e8m13, about what Hopper's
// fp8 tensor cores keep), every addition exact and then truncated toward zero.
inline constexpr int kFastAccumulatorBits = 13;
inline constexpr uint32_t kFastAccumulatorDrop = (uint32_t(1) << (23 - kFastAccumulatorBits)) - 1;

// a + b in fp32 rounded toward zero. On the host from the sum rounded to nearest, s, and its
// error e (TwoSum: a + b = s + e exactly, |e| <= half an ulp of s): where e points toward zero
// the exact sum is just inside s and the answer is the float before s (one step down in the
// magnitude's bits, which crosses into the binade below correctly). A finite sum beyond fp32's
// range gives the largest float, as rounding toward zero does; inf and NaN pass. The device's
// __fadd_rz and AVX-512's embedded rounding (cpu/fp8_gemm.cpp) compute the same.
MT_HOST_DEVICE float add_toward_zero(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rz(a, b);
#else
  const float s = a + b;
  const uint32_t sb = std::bit_cast<uint32_t>(s);
  auto finite = [](float v) { return (std::bit_cast<uint32_t>(v) & 0x7f800000u) != 0x7f800000u; };
  if (!finite(s))
    return finite(a) && finite(b) ? std::bit_cast<float>((sb & 0x80000000u) | 0x7f7fffffu) : s;
  const float bb = s - a;
  const float e = (a - (s - bb)) + (b - bb);
  const bool inward = e != 0.0f && ((std::bit_cast<uint32_t>(e) ^ sb) >> 31) != 0;
  return inward ? std::bit_cast<float>(sb - 1) : s;
#endif
}

// acc + p onto the accumulator's grid, truncated toward zero, for acc on that grid: the fp32 sum
// rounded toward zero, its last 23 - 13 bits cleared (the grid is a subset of fp32's, so the two
// truncations are one). Exact for p exact in fp32 (a product of two fp8 values always is).
MT_HOST_DEVICE float fast_accumulate(float acc, float p) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(add_toward_zero(acc, p)) &
                              ~kFastAccumulatorDrop);
}

// fast_accumulate_gemm's slice sum: product(k) for k in [0, n) (each exact in fp32) through
// the fast accumulator, promoted (added to an fp32 sum, rounded to nearest) every `promote`
// products (0: once, at the end).
template <typename Product>
MT_HOST_DEVICE float fast_accumulate_sum(int64_t n, int64_t promote, Product product) {
  float total = 0.0f, acc = 0.0f;
  for (int64_t k = 0; k < n; ++k) {
    acc = fast_accumulate(acc, product(k));
    if (promote > 0 && (k + 1) % promote == 0) {
      total = total + acc;
      acc = 0.0f;
    }
  }
  return total + acc;
}

// fp8_observe's and fp8_update_scales's arguments as their contracts (backend_ops.h) want them.
inline void check_fp8_observe(const Tensor& amax, const Tensor& scale_inv, const Tensor& stats,
                              const Tensor* history, Device device) {
  auto f32_on = [&](const Tensor& t) {
    return t.dtype() == DType::F32 && t.is_contiguous() && t.device() == device;
  };
  MT_ASSERT(f32_on(amax) && f32_on(scale_inv) && f32_on(stats) && stats.numel() == 3 &&
                amax.numel() > 0 && scale_inv.numel() == amax.numel() &&
                (!history || (f32_on(*history) && history->numel() > 0)),
            "fp8_observe wants contiguous F32 amax and scale_inv blocks, stats (3) and a history "
            "on ",
            device.str(), "; got ", amax.describe(), ", ", scale_inv.describe(), ", ",
            stats.describe());
}

inline void check_fp8_update_scales(std::span<const Tensor> histories,
                                    std::span<const Tensor> scales, std::span<const float> fp8_max,
                                    Device device) {
  MT_ASSERT(histories.size() == scales.size() && fp8_max.size() == scales.size(),
            "fp8_update_scales: one scale and one fp8_max per history");
  for (size_t i = 0; i < histories.size(); ++i) {
    const Tensor &h = histories[i], &s = scales[i];
    MT_ASSERT(h.dtype() == DType::F32 && h.is_contiguous() && h.numel() > 0 &&
                  h.device() == device && s.dtype() == DType::F32 && s.numel() == 1 &&
                  s.device() == device,
              "fp8_update_scales: history ", h.describe(), " and scale ", s.describe(), " on ",
              device.str());
  }
}

}  // namespace mantissa::backend
