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

// max(acc, |v|) that lets a NaN win, so a block holding one reports a non-finite amax.
inline float amax_step(float acc, float v) {
  const float a = std::fabs(v);
  return (a > acc || a != a) && acc == acc ? a : acc;
}

template <typename T>
void quantize(const T* x, int64_t R, int64_t C, const Fp8QuantizeParams& p, float fp8_max,
              Tensor& codes, float* scale_inv, float* amax) {
  const int64_t br = p.block_rows == 0 ? R : p.block_rows;
  const int64_t bc = p.block_cols == 0 ? C : p.block_cols;
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  const int64_t nblocks = nbr * nbc;
  // Amaxes: per row and column block, then reduced over each block's rows.
  std::vector<float> row_amax(size_t(R * nbc), 0.0f);
  parallel_rows<float>(R, R * C, C, [&](int64_t r, float* buf) {
    load_contiguous<T, float>(x + r * C, buf, C);
    for (int64_t cb = 0; cb < nbc; ++cb) {
      float m = 0.0f;
      for (int64_t c = cb * bc; c < std::min(C, (cb + 1) * bc); ++c)
        m = amax_step(m, buf[c]);
      row_amax[size_t(r * nbc + cb)] = m;
    }
  });
  std::vector<float> scale(static_cast<size_t>(nblocks));
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t rb = b / nbc, cb = b % nbc;
    float m = 0.0f;
    for (int64_t r = rb * br; r < std::min(R, (rb + 1) * br); ++r)
      m = amax_step(m, row_amax[size_t(r * nbc + cb)]);
    amax[b] = m;
    scale[size_t(b)] = fp8_block_scale(m, fp8_max, p.rule, p.scale);
    scale_inv[b] = 1.0f / scale[size_t(b)];
  }
  RoundingOptions sat;
  sat.overflow = Overflow::Saturate;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  dispatch_float(codes.dtype(), "fp8_quantize", [&]<typename O>() {
    if constexpr (std::is_same_v<O, float8_e4m3> || std::is_same_v<O, float8_e5m2>) {
      O* out = static_cast<O*>(codes.data_ptr());
      parallel_rows<float>(R, R * C, C, [&](int64_t r, float* buf) {
        load_contiguous<T, float>(x + r * C, buf, C);
        const float* s = scale.data() + (r / br) * nbc;
        for (int64_t c = 0; c < C; ++c) {
          const float v = buf[c];
          // Finite values saturate; inf and NaN become NaN, so that the step sees them.
          buf[c] = v - v == 0.0f ? v * s[c / bc] : nan;
        }
        convert(buf, out + r * C, size_t(C), sat);
      });
    } else {
      MT_ASSERT(false, "fp8_quantize writes fp8 codes, got ", dtype_name(codes.dtype()));
    }
  });
}

}  // namespace

void CpuBackend::fp8_quantize(const Tensor& x, const Fp8QuantizeParams& p, Tensor& codes,
                              Tensor& scale_inv, Tensor& amax) {
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
      quantize<T>(static_cast<const T*>(x.data_ptr()), R, C, p, fp8_max, codes,
                  static_cast<float*>(scale_inv.data_ptr()), static_cast<float*>(amax.data_ptr()));
    }
  });
}

}  // namespace mantissa::backend::cpu
