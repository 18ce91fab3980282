// CPU FP4 block quantization and the 16-point Hadamard transform (the contracts are in
// backend_ops.h, the arithmetic in backend/fp4_math.h, shared with the CUDA backend). One pass
// for the tensor amax where NVFP4 needs it, then blocks of rows spread over the threads, each
// block's amax, its scale, and its elements. Scalar code over the shared definition: FP4 is
// emulated here for study, and the quantization is a small part of a step next to its GEMMs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/fp4_math.h"

namespace mantissa::backend::cpu {
namespace {

// max of two amaxes, NaN winning.
inline float nan_max(float a, float b) {
  return a != a || b != b ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

// x as f32, a row at a time (f16 and bf16 widened exactly).
template <typename T>
void load_row(const T* x, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = float(x[i]);
}

template <typename T>
float tensor_amax(const T* x, int64_t n) {
  float m = 0;
#pragma omp parallel for reduction(max : m) if (n >= kParallelGrain && !omp_in_parallel())
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(float(x[i]));
    m = a != a || m != m ? std::numeric_limits<float>::quiet_NaN() : std::max(m, a);
  }
  // OpenMP's max reduction may drop a NaN between threads: look again where it matters.
  if (std::isnan(m)) return m;
  for (int64_t i = 0; i < n && !std::isnan(m); ++i)
    if (std::isnan(float(x[i]))) m = std::numeric_limits<float>::quiet_NaN();
  return m;
}

struct Fp4Out {
  uint8_t* codes;
  uint8_t* block_scales;
  bfloat16* values;  // or nullptr
};

// Quantizes the block row `br_index` (rows [r0, r1)) of x.
template <typename T>
void quantize_block_row(const T* x, int64_t C, int64_t r0, int64_t r1, int64_t bc, int64_t nbc,
                        const Fp4QuantizeParams& p, const Nvfp4TensorScales& ts, int64_t br_index,
                        const Fp4Out& out, float* rows) {
  const int64_t n = r1 - r0;
  for (int64_t r = 0; r < n; ++r)
    load_row(x + (r0 + r) * C, C, rows + r * C);
  for (int64_t b = 0; b < nbc; ++b) {
    const int64_t c0 = b * bc, c1 = std::min(C, c0 + bc);
    float amax = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = c0; c < c1; ++c)
        amax = nan_max(amax, std::fabs(rows[r * C + c]));
    const Fp4BlockScale s = fp4_block_scale(amax, p.rule, ts);
    out.block_scales[br_index * nbc + b] = uint8_t(s.code);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t i = (r0 + r) * C + c;
        const uint32_t bits = p.stochastic ? random_bits(p.seed, p.offset, uint64_t(i)) : 0;
        const Fp4Element e = fp4_element(rows[r * C + c], s, p.stochastic, bits);
        out.codes[i] = uint8_t(e.code);
        if (out.values) out.values[i] = bfloat16(e.value);
      }
    }
  }
}

template <typename T>
void quantize(const T* x, int64_t R, int64_t C, const Fp4QuantizeParams& p, float given_amax,
              bool given, const Fp4Out& out, float* scale_inv, float* amax_out) {
  const float amax = given ? given_amax : tensor_amax(x, R * C);
  const Nvfp4TensorScales ts =
      p.rule == Fp4ScaleRule::Nvfp4 ? nvfp4_tensor_scales(amax) : Nvfp4TensorScales{};
  *amax_out = amax;
  *scale_inv = p.rule == Fp4ScaleRule::Nvfp4 ? ts.decode : 1.0f;
  const int64_t br = p.block_rows, bc = fp4_block_cols(p.rule);
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  parallel_rows<float>(nbr, R * C, br * C, [&](int64_t b, float* rows) {
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
  const Fp4Out out{static_cast<uint8_t*>(codes.data_ptr()),
                   static_cast<uint8_t*>(block_scales.data_ptr()),
                   values ? static_cast<bfloat16*>(values->data_ptr()) : nullptr};
  dispatch_float(x.dtype(), "fp4_quantize", [&]<typename T>() {
    if constexpr (std::is_same_v<T, double>) {
      MT_CHECK(false, "fp4_quantize takes f32, bf16 or f16 values, got f64");
    } else {
      quantize(static_cast<const T*>(x.data_ptr()), x.size(0), x.size(1), p, given_amax, given, out,
               static_cast<float*>(scale_inv.data_ptr()), static_cast<float*>(amax.data_ptr()));
    }
  });
}

void CpuBackend::hadamard16(const Tensor& x, uint32_t signs, Tensor& out) {
  check_hadamard16(x, out, Device::cpu());
  const int64_t R = x.size(0), C = x.size(1);
  float coef[16][16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)
      coef[i][j] = hadamard16_coefficient(signs, i, j);
  dispatch_float(x.dtype(), "hadamard16", [&]<typename T>() {
    dispatch_float(out.dtype(), "hadamard16", [&]<typename O>() {
      const T* src = static_cast<const T*>(x.data_ptr());
      O* dst = static_cast<O*>(out.data_ptr());
      parallel_rows<float>(R, R * C * 16, 0, [&](int64_t r, float*) {
        for (int64_t g = 0; g < C; g += 16) {
          float v[16];
          for (int i = 0; i < 16; ++i)
            v[i] = float(src[r * C + g + i]);
          for (int j = 0; j < 16; ++j) {
            float acc = v[0] * coef[0][j];
            for (int i = 1; i < 16; ++i)
              acc = acc + v[i] * coef[i][j];
            dst[r * C + g + j] = O(acc);
          }
        }
      });
    });
  });
}

}  // namespace mantissa::backend::cpu
