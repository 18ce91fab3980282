// CPU fp8 quantization (the contract is in backend_ops.h): per block, the amax of |x|, the scale
// (backend/fp8_math.h, shared with the CUDA backend), then x * scale rounded to fp8 through the
// vectorized saturating converters of numerics/convert.h. Rows are spread over the threads; a
// per-tensor amax is reduced over them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/fp8_math.h"
#include "mantissa/numerics/format.h"

namespace mantissa::backend::cpu {
namespace {

// max |p[i]|, NaN if any p[i] is NaN (a block holding one reports a non-finite amax). Branch-free,
// so it vectorizes.
inline float block_amax(const float* p, int64_t n) {
  float m = 0.0f;
  int nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(p[i]);
    m = a > m ? a : m;
    nan |= a != a;
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// max of two amaxes, NaN winning.
inline float amax_max(float a, float b) {
  return a != a || b != b ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

// One row: codes = saturate(round(x * scale of its column block)); inf and NaN to NaN. With
// `values`, also the codes' values in bf16, times scale_inv when `scaled`.
template <typename O>
void quantize_row(float* buf, int64_t C, int64_t bc, const float* scale, O* out, bfloat16* values,
                  const float* scale_inv, bool scaled) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t c0 = 0, cb = 0; c0 < C; c0 += bc, ++cb) {
    const float s = scale[cb];
    const int64_t end = std::min(C, c0 + bc);
    for (int64_t c = c0; c < end; ++c) {
      const float v = buf[c];
      buf[c] = v - v == 0.0f ? v * s : nan;  // finite values saturate below
    }
  }
  RoundingOptions sat;
  sat.overflow = Overflow::Saturate;
  convert(buf, out, size_t(C), sat);
  if (!values) return;
  convert(out, buf, size_t(C));  // exact: the table of fp8 values
  if (scaled) {
    for (int64_t c0 = 0, cb = 0; c0 < C; c0 += bc, ++cb) {
      const float si = scale_inv[cb];
      for (int64_t c = c0; c < std::min(C, c0 + bc); ++c)
        buf[c] *= si;
    }
  }
  convert(buf, values, size_t(C));
}

template <typename T, typename O>
void quantize(const T* x, int64_t R, int64_t C, const Fp8QuantizeParams& p, float fp8_max, O* out,
              float* scale_inv, float* amax, bfloat16* values) {
  const bool scaled = p.rule == Fp8ScaleRule::AmaxPow2;
  const int64_t br = p.block_rows == 0 ? R : p.block_rows;
  const int64_t bc = p.block_cols == 0 ? C : p.block_cols;
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  const int64_t nblocks = nbr * nbc;
  if (p.rule == Fp8ScaleRule::Given) {
    // The scale is known: one pass quantizes and measures the amax (for the history).
    std::vector<float> row_amax(static_cast<size_t>(R));
    const float given_inv = 1.0f / p.scale;
    parallel_rows<float>(R, R * C, C, [&](int64_t r, float* buf) {
      load_contiguous<T, float>(x + r * C, buf, C);
      row_amax[size_t(r)] = block_amax(buf, C);
      quantize_row(buf, C, C, &p.scale, out + r * C, values ? values + r * C : nullptr, &given_inv,
                   false);
    });
    float m = 0.0f;
    for (float a : row_amax)
      m = amax_max(m, a);
    amax[0] = m;
    scale_inv[0] = given_inv;
    return;
  }
  // Amaxes per row and column block, then reduced over each block's rows; the scales; then the
  // rows quantized.
  std::vector<float> row_amax(static_cast<size_t>(R * nbc));
  parallel_rows<float>(R, R * C, C, [&](int64_t r, float* buf) {
    load_contiguous<T, float>(x + r * C, buf, C);
    for (int64_t cb = 0; cb < nbc; ++cb)
      row_amax[size_t(r * nbc + cb)] = block_amax(buf + cb * bc, std::min(bc, C - cb * bc));
  });
  std::vector<float> scale(static_cast<size_t>(nblocks));
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t rb = b / nbc, cb = b % nbc;
    float m = 0.0f;
    for (int64_t r = rb * br; r < std::min(R, (rb + 1) * br); ++r)
      m = amax_max(m, row_amax[size_t(r * nbc + cb)]);
    amax[b] = m;
    scale[size_t(b)] = fp8_block_scale(m, fp8_max, p.rule, p.scale);
    scale_inv[b] = 1.0f / scale[size_t(b)];
  }
  parallel_rows<float>(R, R * C, C, [&](int64_t r, float* buf) {
    load_contiguous<T, float>(x + r * C, buf, C);
    quantize_row(buf, C, bc, scale.data() + (r / br) * nbc, out + r * C,
                 values ? values + r * C : nullptr, scale_inv + (r / br) * nbc, scaled);
  });
}

}  // namespace

void CpuBackend::fp8_quantize(const Tensor& x, const Fp8QuantizeParams& p, Tensor& codes,
                              Tensor& scale_inv, Tensor& amax, Tensor* values) {
  MT_ASSERT(!values || (values->dtype() == DType::BF16 && values->is_contiguous() &&
                        values->shape() == x.shape()),
            "fp8_quantize writes values as contiguous bf16 of x's shape");
  MT_ASSERT(x.dim() == 2 && x.is_contiguous() && codes.shape() == x.shape() &&
                codes.is_contiguous() && scale_inv.dtype() == DType::F32 &&
                amax.dtype() == DType::F32 && scale_inv.is_contiguous() && amax.is_contiguous(),
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
  dispatch_float(x.dtype(), "fp8_quantize", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      MT_CHECK(false, "fp8_quantize takes f32, bf16 or f16 values, got f64");
    } else {
      auto run = [&]<typename O>() {
        quantize<T, O>(static_cast<const T*>(x.data_ptr()), R, C, p, fp8_max,
                       static_cast<O*>(codes.data_ptr()), static_cast<float*>(scale_inv.data_ptr()),
                       static_cast<float*>(amax.data_ptr()),
                       values ? static_cast<bfloat16*>(values->data_ptr()) : nullptr);
      };
      if (codes.dtype() == DType::FP8_E4M3) {
        run.template operator()<float8_e4m3>();
      } else {
        MT_ASSERT(codes.dtype() == DType::FP8_E5M2, "fp8_quantize writes fp8 codes, got ",
                  dtype_name(codes.dtype()));
        run.template operator()<float8_e5m2>();
      }
    }
  });
}

void CpuBackend::fp8_gemm(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                          const Tensor& b_scale_inv, Tensor& out) {
  check_fp8_gemm(a, a_scale_inv, b, b_scale_inv, out);
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  if (out.numel() == 0) return;
  // The codes as bf16 (exact), one GEMM with fp32 sums, then the scales' product (in fp32)
  // applied to each sum and the one rounding into out's dtype.
  Tensor acc = out.dtype() == DType::F32 ? out : Tensor::empty({M, N}, DType::F32);
  if (K == 0) {
    fill(acc, 0.0);
  } else {
    Tensor ab = Tensor::empty({M, K}, DType::BF16), bb = Tensor::empty({N, K}, DType::BF16);
    copy(a, ab);
    copy(b, bb);
    Tensor acc3 = acc.view({1, M, N});
    matmul(ab.unsqueeze(0), bb.t().unsqueeze(0), nullptr, acc3, MatmulOptions{});
  }
  const float factor = *static_cast<const float*>(a_scale_inv.data_ptr()) *
                       *static_cast<const float*>(b_scale_inv.data_ptr());
  float* p = static_cast<float*>(acc.data_ptr());
  for (int64_t i = 0; i < M * N; ++i)
    p[i] *= factor;
  if (!acc.is_same(out)) copy(acc, out);
}

}  // namespace mantissa::backend::cpu
