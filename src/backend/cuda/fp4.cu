// CUDA FP4 block quantization and the 16-point Hadamard transform (the contracts are in
// backend_ops.h; the arithmetic is backend/fp4_math.h, the CPU's too, so the codes and scales
// are the CPU's bit for bit): the tensor amax by an atomic max over |x|'s bits (NaN winning: its
// bits are the largest), the tensor scales in one thread, then one thread per block for its
// amax, scale and elements. Straightforward rather than fast: the recipe's GEMMs dominate.
#include <cmath>

#include "backend/cuda/blas.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/fp4_math.h"

namespace mantissa::backend::cuda {
namespace {

// Where fp4_quantize's quantized matrix comes from (Fp4QuantizeParams): x (R, C) itself, or with
// columns Q = x^T (C, Rp) zero past R, its rows through the transform with rht.
struct Fp4Source {
  int64_t R, C, Rp;
  bool columns, rht;
  uint32_t signs;
};

// x's element (r, c) as f32, zero past R.
template <typename S>
__device__ float fp4_x(const S* x, const Fp4Source& s, int64_t r, int64_t c) {
  return r < s.R ? float(load(x + r * s.C + c)) : 0.0f;
}

// The element of the quantized matrix at x's position (r, c) (Q's (c, r) under columns): with
// rht its 16-group down the column transformed in index order, rounded to x's dtype.
template <typename S>
__device__ float fp4_source(const S* x, const Fp4Source& s, int64_t r, int64_t c) {
  if (!s.rht) return fp4_x(x, s, r, c);
  const int64_t g = r - r % 16;
  const int j = int(r % 16);
  float acc = __fmul_rn(fp4_x(x, s, g, c), hadamard16_coefficient(s.signs, 0, j));
  for (int i = 1; i < 16; ++i)
    acc = __fadd_rn(acc, __fmul_rn(fp4_x(x, s, g + i, c), hadamard16_coefficient(s.signs, i, j)));
  S narrow;
  store(&narrow, acc);
  return float(load(&narrow));
}

template <typename S>
__global__ void amax_bits_kernel(const S* x, Fp4Source s, unsigned int* amax_bits) {
  const int64_t rows = s.columns ? s.Rp : s.R;
  MT_GRID_STRIDE_LOOP(i, rows * s.C) {
    atomicMax(amax_bits, __float_as_uint(fp4_source(x, s, i / s.C, i % s.C)) & 0x7fffffffu);
  }
}

// amax: the given one copied, or the bits the atomic max left turned into a float (NaN
// canonical); scale_inv: NVFP4's tensor decode scale, 1 for MX.
__global__ void tensor_scales_kernel(const float* given, Fp4ScaleRule rule, float* amax,
                                     float* scale_inv) {
  float a = given != nullptr ? *given : *amax;
  if (given == nullptr && __float_as_uint(a) > 0x7f800000u) a = __int_as_float(0x7fc00000);
  *amax = a;
  *scale_inv = rule == Fp4ScaleRule::Nvfp4 ? nvfp4_tensor_scales(a).decode : 1.0f;
}

// One thread per block of the quantized matrix (R x C, or with columns Q's (C, Rp) in blocks of
// 1 x bc, each a run down a column of x): its amax, scale and elements, stored in x's layout.
template <typename S>
__global__ void quantize_kernel(const S* x, Fp4Source src, int64_t br, int64_t bc,
                                Fp4QuantizeParams p, const float* amax, uint8_t* codes,
                                uint8_t* block_scales, __nv_bfloat16* values) {
  const int64_t rows = src.columns ? src.C : src.R, cols = src.columns ? src.Rp : src.C;
  const int64_t nbc = (cols + bc - 1) / bc;
  MT_GRID_STRIDE_LOOP(b, ((rows + br - 1) / br) * nbc) {
    const int64_t r0 = (b / nbc) * br, c0 = (b % nbc) * bc;
    const int64_t r1 = r0 + br < rows ? r0 + br : rows, c1 = c0 + bc < cols ? c0 + bc : cols;
    // Q's (r, c) sits at x's (c, r) under columns.
    auto at = [&](int64_t r, int64_t c) { return src.columns ? c * src.C + r : r * src.C + c; };
    auto element = [&](int64_t r, int64_t c) {
      return src.columns ? fp4_source(x, src, c, r) : fp4_source(x, src, r, c);
    };
    float m = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const float a = fabsf(element(r, c));
        m = a != a || m != m ? __int_as_float(0x7fc00000) : (a > m ? a : m);
      }
    }
    const Nvfp4TensorScales ts =
        p.rule == Fp4ScaleRule::Nvfp4 ? nvfp4_tensor_scales(*amax) : Nvfp4TensorScales{};
    const Fp4BlockScale s = fp4_block_scale(m, p.rule, ts);
    // Q's block (r0 / br, c0 / bc) at x's layout's (c0 / bc, r0) under columns.
    block_scales[src.columns ? (c0 / bc) * src.C + r0 : b] = uint8_t(s.code);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const uint64_t i = uint64_t(r * cols + c);  // Q's row-major index
        const uint32_t bits = p.stochastic ? random_bits(p.seed, p.offset, i) : 0u;
        const Fp4Element e = fp4_element(element(r, c), s, p.stochastic, bits);
        codes[at(r, c)] = uint8_t(e.code);
        if (values != nullptr) store(values + at(r, c), e.value);
      }
    }
  }
}

template <typename S, typename O>
__global__ void hadamard16_kernel(const S* x, int64_t n, uint32_t signs, O* out) {
  // One thread per output element: its group's 16 inputs, summed in index order.
  MT_GRID_STRIDE_LOOP(k, n) {
    const int64_t g = k - k % 16;
    const int j = int(k % 16);
    float acc = __fmul_rn(float(load(x + g)), hadamard16_coefficient(signs, 0, j));
    for (int i = 1; i < 16; ++i)
      acc = __fadd_rn(acc, __fmul_rn(float(load(x + g + i)), hadamard16_coefficient(signs, i, j)));
    store(out + k, acc);
  }
}

// A native FP4 GEMM's operand from fp4_quantize's (fp4_math.h has the layout): the codes of
// (rows, 2 * half_k) with element strides (s_r, s_k), two to a byte along k.
__global__ void fp4_pack_kernel(const uint8_t* codes, int64_t rows, int64_t half_k, int64_t s_r,
                                int64_t s_k, uint8_t* out) {
  MT_GRID_STRIDE_LOOP(i, rows * half_k) {
    const uint8_t* p = codes + (i / half_k) * s_r + 2 * (i % half_k) * s_k;
    out[i] = fp4_pack_pair(p[0], p[s_k]);
  }
}

// The block scales (one per block_rows x block along k, element strides (s_r, s_c)) as a row per
// operand row, swizzled, the padding zero.
__global__ void fp4_swizzle_scales_kernel(const uint8_t* scales, int64_t rows, int64_t cols,
                                          int64_t block_rows, int64_t s_r, int64_t s_c,
                                          uint8_t* out) {
  const int64_t pc = fp4_swizzled_cols(cols);
  MT_GRID_STRIDE_LOOP(i, fp4_swizzled_rows(rows) * pc) {
    const int64_t r = i / pc, c = i % pc;
    out[fp4_swizzled_scale_offset(r, c, cols)] =
        r < rows && c < cols ? scales[(r / block_rows) * s_r + c * s_c] : uint8_t(0);
  }
}

// cuBLASLt's alpha and beta, read from the device: the tensor scales' product (NaN where an amax
// is not finite, so that the whole output says so) and 0.
__global__ void fp4_alpha_beta_kernel(const float* sa, const float* sb, const float* amax_a,
                                      const float* amax_b, float* alpha_beta) {
  const bool finite = isfinite(*amax_a) && isfinite(*amax_b);
  alpha_beta[0] = finite ? __fmul_rn(*sa, *sb) : __int_as_float(0x7fc00000);
  alpha_beta[1] = 0.0f;
}

}  // namespace

bool CudaBackend::fp4_gemm(const Tensor& a_codes, const Tensor& a_scales, int64_t a_block_rows,
                           const Tensor& a_scale_inv, const Tensor& a_amax, const Tensor& b_codes,
                           const Tensor& b_scales, int64_t b_block_rows, const Tensor& b_scale_inv,
                           const Tensor& b_amax, Fp4ScaleRule rule, Tensor& out) {
  DeviceGuard guard(device_);
  check_fp4_gemm(a_codes, a_scales, a_block_rows, a_scale_inv, a_amax, b_codes, b_scales,
                 b_block_rows, b_scale_inv, b_amax, rule, out);
  const int64_t M = a_codes.size(0), N = b_codes.size(0), K = a_codes.size(1);
  if (!fp4_gemm_qualifies(M, N, K, device_)) return false;
  const Device d = out.device();
  auto packed = [&](const Tensor& codes) {
    Tensor p = Tensor::empty({codes.size(0), K / 2}, DType::U8, d);
    launch(p.numel(), device_, fp4_pack_kernel, device_ptr<const uint8_t>(codes), codes.size(0),
           K / 2, codes.stride(0), codes.stride(1), device_ptr<uint8_t>(p));
    return p;
  };
  auto swizzled = [&](const Tensor& scales, int64_t rows, int64_t block_rows) {
    const int64_t cols = scales.size(1);
    Tensor s = Tensor::empty({fp4_swizzled_rows(rows) * fp4_swizzled_cols(cols)}, DType::U8, d);
    launch(s.numel(), device_, fp4_swizzle_scales_kernel, device_ptr<const uint8_t>(scales), rows,
           cols, block_rows, scales.stride(0), scales.stride(1), device_ptr<uint8_t>(s));
    return s;
  };
  Tensor alpha_beta = Tensor::empty({2}, DType::F32, d);
  launch(1, device_, fp4_alpha_beta_kernel, device_ptr<const float>(a_scale_inv),
         device_ptr<const float>(b_scale_inv), device_ptr<const float>(a_amax),
         device_ptr<const float>(b_amax), device_ptr<float>(alpha_beta));
  return native_fp4_gemm(packed(a_codes), swizzled(a_scales, M, a_block_rows), packed(b_codes),
                         swizzled(b_scales, N, b_block_rows), alpha_beta, rule, out, device_);
}

void CudaBackend::fp4_quantize(const Tensor& x, const Fp4QuantizeParams& p, Tensor& codes,
                               Tensor& block_scales, Tensor& scale_inv, Tensor& amax,
                               Tensor* values) {
  check_fp4_quantize(x, p, codes, block_scales, scale_inv, amax, values, x.device());
  MT_ASSERT(!p.values_only, "fp4_quantize: values_only is the CPU's");
  const int64_t R = x.size(0), C = x.size(1);
  const Fp4Source src{R, C, fp4_quantized_rows(x, p, codes, values), p.columns, p.rht, p.rht_signs};
  const int64_t br = p.block_rows, bc = fp4_block_cols(p.rule);
  const int64_t blocks = p.columns ? C * (src.Rp / bc) : ((R + br - 1) / br) * ((C + bc - 1) / bc);
  const bool given = p.rule == Fp4ScaleRule::Nvfp4 && p.amax != nullptr;
  Fp4QuantizeParams kp = p;
  kp.amax = nullptr;  // the kernel reads the amax output
  dispatch_float(x.dtype(), "fp4_quantize", [&]<typename S>(Tag<S>) {
    if constexpr (std::is_same_v<S, double>) {
      MT_CHECK(false, "fp4_quantize takes f32, bf16 or f16 values, got f64");
    } else {
      if (!given) {
        fill(amax, 0.0);
        const int64_t n = (p.columns ? src.Rp : R) * C;
        if (n > 0)
          launch(n, device_, amax_bits_kernel<S>, device_ptr<S>(x), src,
                 reinterpret_cast<unsigned int*>(device_ptr<float>(amax)));
      }
      launch(1, device_, tensor_scales_kernel, given ? device_ptr<float>(*p.amax) : nullptr, p.rule,
             device_ptr<float>(amax), device_ptr<float>(scale_inv));
      if (blocks == 0) return;
      launch(blocks, device_, quantize_kernel<S>, device_ptr<S>(x), src, br, bc, kp,
             static_cast<const float*>(device_ptr<float>(amax)), device_ptr<uint8_t>(codes),
             device_ptr<uint8_t>(block_scales),
             values ? device_ptr<__nv_bfloat16>(*values) : nullptr);
    }
  });
}

void CudaBackend::hadamard16(const Tensor& x, uint32_t signs, Tensor& out) {
  check_hadamard16(x, out, x.device());
  if (x.numel() == 0) return;
  dispatch_float(x.dtype(), "hadamard16", [&]<typename S>(Tag<S>) {
    dispatch_float(out.dtype(), "hadamard16", [&]<typename O>(Tag<O>) {
      launch(x.numel(), device_, hadamard16_kernel<S, O>, device_ptr<S>(x), x.numel(), signs,
             device_ptr<O>(out));
    });
  });
}

}  // namespace mantissa::backend::cuda
