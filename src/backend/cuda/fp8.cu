// CUDA fp8 quantization (the contract is in backend_ops.h; the scale arithmetic is
// backend/fp8_math.h, the CPU's too): row amaxes per column block, one thread per block to reduce
// them and pick the scale, then one rounding per element through round.h's encoder with
// saturation; and block_scaled_gemm, the emulated GEMM of block-scaled operands (a cuBLAS GEMM per
// K slice, its sums scaled and added in fp32 as the CPU adds them). Straightforward rather than
// fast: cuBLASLt's block-scaled fp8 GEMMs are still to come.
#include <cmath>
#include <optional>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/fp8_math.h"

namespace mantissa::backend::cuda {
namespace {

__device__ __forceinline__ float amax_step(float acc, float v) {
  const float a = fabsf(v);
  return (a > acc || a != a) && acc == acc ? a : acc;
}

template <typename S>
__global__ void row_amax_kernel(const S* x, int64_t R, int64_t C, int64_t bc, int64_t nbc,
                                float* row_amax) {
  MT_GRID_STRIDE_LOOP(i, R * nbc) {
    const int64_t r = i / nbc, cb = i % nbc;
    const int64_t end = cb * bc + bc < C ? cb * bc + bc : C;
    float m = 0.0f;
    for (int64_t c = cb * bc; c < end; ++c)
      m = amax_step(m, float(load(x + r * C + c)));
    row_amax[i] = m;
  }
}

__global__ void block_scale_kernel(const float* row_amax, int64_t R, int64_t br, int64_t nbc,
                                   int64_t nblocks, float fp8_max, Fp8ScaleRule rule,
                                   const float* given, float* scale, float* scale_inv,
                                   float* amax) {
  MT_GRID_STRIDE_LOOP(b, nblocks) {
    const int64_t rb = b / nbc, cb = b % nbc;
    const int64_t end = rb * br + br < R ? rb * br + br : R;
    float m = 0.0f;
    for (int64_t r = rb * br; r < end; ++r)
      m = amax_step(m, row_amax[r * nbc + cb]);
    amax[b] = m;
    const float s = fp8_block_scale(m, fp8_max, rule, given != nullptr ? *given : 1.0f);
    scale[b] = s;
    scale_inv[b] = 1.0f / s;
  }
}

template <typename S, typename O>
__global__ void quantize_kernel(const S* x, int64_t R, int64_t C, int64_t br, int64_t bc,
                                int64_t nbc, const float* scale, const float* scale_inv,
                                bool scaled, O* out, __nv_bfloat16* values) {
  constexpr FormatSpec spec = format_spec(format_of<O>());
  MT_GRID_STRIDE_LOOP(i, R * C) {
    const int64_t r = i / C, c = i % C;
    const int64_t b = (r / br) * nbc + c / bc;
    const float v = float(load(x + i));
    const float q = v - v == 0.0f ? __fmul_rn(v, scale[b]) : __int_as_float(0x7fc00000);
    const uint32_t bits = detail::encode_bits<float>(
        __float_as_uint(q), spec, RoundingMode::NearestEven, Overflow::Saturate, 0u);
    out[i] = O::from_bits(typename O::bits_type(bits));
    if (values) {
      const float d = detail::decode_bits(bits, spec);
      values[i] = NativeFloat<__nv_bfloat16>::from_float(scaled ? __fmul_rn(d, scale_inv[b]) : d);
    }
  }
}

// fp8_observe in one thread (a few hundred blocks at most): the CPU's loop, NaN winning.
__global__ void fp8_observe_kernel(const float* amax, const float* scale_inv, int64_t n,
                                   float* stats, float* history) {
  float m = 0.0f, max_inv = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    m = amax_step(m, amax[i]);
    max_inv = amax_step(max_inv, scale_inv[i]);
  }
  stats[0] = m;
  stats[1] = 1.0f / max_inv;
  const bool finite = is_finite_value(double(m));
  if (!finite) stats[2] += 1.0f;
  if (history != nullptr && finite) history[0] = history[0] > m ? history[0] : m;
}

// fp8_update_scales for one history, in one thread.
__global__ void fp8_update_scale_kernel(float* history, int64_t n, float* scale, float fp8_max,
                                        bool use_max, int margin) {
  const float amax = delayed_amax(history, n, use_max);
  *scale = delayed_scale(amax, fp8_max, margin, *scale);
  const float first = history[0];
  for (int64_t i = 0; i + 1 < n; ++i)
    history[i] = history[i + 1];
  history[n - 1] = first;
  history[0] = 0.0f;
}

// One K slice s of block_scaled_gemm: acc (M, N) = (s == 0 ? 0 : acc) + part * (sa * sb), with
// the bias added after the last slice: the CPU's sum_row (cpu/fp8_gemm.cpp), operation for
// operation, each rounded to fp32.
__global__ void scale_accumulate_kernel(float* acc, const float* part, const float* sa,
                                        int64_t a_rows, const float* sb, int64_t b_rows, int64_t M,
                                        int64_t N, int64_t S, int64_t s, const float* bias) {
  MT_GRID_STRIDE_LOOP(i, M * N) {
    const int64_t m = i / N, n = i - m * N;
    const float f = mul_rn(sa[(m / a_rows) * S + s], sb[(n / b_rows) * S + s]);
    const float v = mul_rn(part[i], f);
    float r = s == 0 ? v : add_rn(acc[i], v);
    if (bias != nullptr) r = add_rn(r, bias[n]);
    acc[i] = r;
  }
}

// One K slice of fast_accumulate_gemm: part (M, N) = the fast accumulator's sums of a[m, k0 +
// k] * b[n, k0 + k] over k in [0, kl) (fp8_math.h's fast_accumulate_sum, as the CPU's).
__global__ void fast_part_kernel(const __nv_bfloat16* a, int64_t a0, int64_t a1,
                                 const __nv_bfloat16* b, int64_t b0, int64_t b1, int64_t M,
                                 int64_t N, int64_t k0, int64_t kl, int64_t promote, float* part) {
  MT_GRID_STRIDE_LOOP(i, M * N) {
    const int64_t m = i / N, n = i - m * N;
    const __nv_bfloat16* ar = a + m * a0 + k0 * a1;
    const __nv_bfloat16* br = b + n * b0 + k0 * b1;
    part[i] = fast_accumulate_sum(
        kl, promote, [&](int64_t k) { return __fmul_rn(load(ar + k * a1), load(br + k * b1)); });
  }
}

// A contiguous copy of t on this backend's device (t itself when it is one).
Tensor contiguous_here(Backend& be, const Tensor& t, DType dtype) {
  if (t.is_contiguous() && t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  be.copy(t, out);
  return out;
}

}  // namespace

void CudaBackend::fp8_observe(const Tensor& amax, const Tensor& scale_inv, Tensor& stats,
                              Tensor* history) {
  DeviceGuard guard(device_);
  check_fp8_observe(amax, scale_inv, stats, history, Device::cuda(device_));
  fp8_observe_kernel<<<1, 1, 0, stream_for(device_)>>>(
      device_ptr<float>(amax), device_ptr<float>(scale_inv), amax.numel(), device_ptr<float>(stats),
      history ? device_ptr<float>(*history) : nullptr);
  MT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::fp8_update_scales(std::span<Tensor> histories, std::span<Tensor> scales,
                                    std::span<const float> fp8_max, bool use_max, int margin) {
  DeviceGuard guard(device_);
  check_fp8_update_scales(histories, scales, fp8_max, Device::cuda(device_));
  for (size_t i = 0; i < histories.size(); ++i) {
    fp8_update_scale_kernel<<<1, 1, 0, stream_for(device_)>>>(
        device_ptr<float>(histories[i]), histories[i].numel(), device_ptr<float>(scales[i]),
        fp8_max[i], use_max, margin);
    MT_CUDA_CHECK_LAUNCH();
  }
}

namespace {

// block_scaled_gemm and fast_accumulate_gemm: each K slice's sums (a GEMM, or with `promote`
// the fast accumulator's kernel), scaled and added in fp32 as the CPU adds them.
void sliced_gemm(CudaBackend& be, int device, const Tensor& a, const Tensor& a_scales,
                 int64_t a_rows, const Tensor& b, const Tensor& b_scales, int64_t b_rows,
                 int64_t bk, const Tensor* bias, Tensor& out, std::optional<int64_t> promote) {
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1), S = a_scales.size(1);
  const Tensor sa = contiguous_here(be, a_scales, DType::F32);
  const Tensor sb = contiguous_here(be, b_scales, DType::F32);
  const Tensor bias_f = bias ? contiguous_here(be, *bias, DType::F32) : Tensor();
  Tensor acc = out.dtype() == DType::F32 ? out : Tensor::empty({M, N}, DType::F32, out.device());
  Tensor part = Tensor::empty({1, M, N}, DType::F32, out.device());
  for (int64_t s = 0; s < S; ++s) {
    const int64_t k0 = s * bk, kl = std::min(bk, K - k0);
    if (kl > 0 && promote) {
      launch(M * N, device, fast_part_kernel, device_ptr<__nv_bfloat16>(a), a.stride(0),
             a.stride(1), device_ptr<__nv_bfloat16>(b), b.stride(0), b.stride(1), M, N, k0, kl,
             *promote, device_ptr<float>(part));
    } else if (kl > 0) {
      be.matmul(a.narrow(1, k0, kl).unsqueeze(0), b.narrow(1, k0, kl).t().unsqueeze(0), nullptr,
                part, MatmulOptions{});
    } else {
      be.fill(part, 0.0);  // K == 0: no sums
    }
    launch(M * N, device, scale_accumulate_kernel, device_ptr<float>(acc), device_ptr<float>(part),
           device_ptr<float>(sa), a_rows, device_ptr<float>(sb), b_rows, M, N, S, s,
           s + 1 == S && bias ? device_ptr<float>(bias_f) : nullptr);
  }
  if (!acc.is_same(out)) be.copy(acc, out);  // the one rounding into the output dtype
}

}  // namespace

void CudaBackend::block_scaled_gemm(const Tensor& a, const Tensor& a_scales, int64_t a_rows,
                                    const Tensor& b, const Tensor& b_scales, int64_t b_rows,
                                    int64_t bk, const Tensor* bias, Tensor& out) {
  DeviceGuard guard(device_);
  check_block_scaled_gemm(a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out);
  if (out.numel() == 0) return;
  sliced_gemm(*this, device_, a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out,
              std::nullopt);
}

void CudaBackend::fast_accumulate_gemm(const Tensor& a, const Tensor& a_scales, int64_t a_rows,
                                       const Tensor& b, const Tensor& b_scales, int64_t b_rows,
                                       int64_t bk, int64_t promote, const Tensor* bias,
                                       Tensor& out) {
  DeviceGuard guard(device_);
  check_block_scaled_gemm(a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out);
  MT_ASSERT(promote >= 0, "fast_accumulate_gemm: promote must be >= 0, got ", promote);
  if (out.numel() == 0) return;
  sliced_gemm(*this, device_, a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out, promote);
}

void CudaBackend::fp8_quantize(const Tensor& x, const Fp8QuantizeParams& p, Tensor& codes,
                               Tensor& scale_inv, Tensor& amax, Tensor* values) {
  DeviceGuard guard(device_);
  MT_ASSERT(!p.values_only, "fp8_quantize: values_only is the CPU's");
  MT_ASSERT(x.dim() == 2 && x.is_contiguous() && codes.shape() == x.shape() &&
                codes.is_contiguous() && scale_inv.dtype() == DType::F32 &&
                amax.dtype() == DType::F32,
            "fp8_quantize wants contiguous x (R, C), codes (R, C), F32 scale_inv and amax");
  const int64_t R = x.size(0), C = x.size(1);
  const int64_t br = p.block_rows == 0 ? R : p.block_rows;
  const int64_t bc = p.block_cols == 0 ? C : p.block_cols;
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  MT_ASSERT(scale_inv.numel() == nbr * nbc && amax.numel() == nbr * nbc,
            "fp8_quantize: one scale per block");
  MT_ASSERT(
      p.rule != Fp8ScaleRule::Given || (p.given && p.given->dtype() == DType::F32 &&
                                        p.given->numel() == 1 && p.given->device() == x.device()),
      "fp8_quantize: a given scale is one f32 element on ", x.device().str());
  if (x.numel() == 0) return;
  const float fp8_max = float(format_info(*dtype_format(codes.dtype())).max_finite);
  Tensor row_amax = Tensor::empty({R, nbc}, DType::F32, x.device());
  Tensor scale = Tensor::empty({nbr, nbc}, DType::F32, x.device());
  dispatch_float(x.dtype(), "fp8_quantize", [&]<typename S>(Tag<S>) {
    if constexpr (std::is_same_v<S, double>) {
      MT_CHECK(false, "fp8_quantize takes f32, bf16 or f16 values, got f64");
    } else {
      launch(R * nbc, device_, row_amax_kernel<S>, device_ptr<S>(x), R, C, bc, nbc,
             device_ptr<float>(row_amax));
      launch(nbr * nbc, device_, block_scale_kernel, device_ptr<float>(row_amax), R, br, nbc,
             nbr * nbc, fp8_max, p.rule,
             p.rule == Fp8ScaleRule::Given ? device_ptr<float>(*p.given) : nullptr,
             device_ptr<float>(scale), device_ptr<float>(scale_inv), device_ptr<float>(amax));
      auto run = [&]<typename O>() {
        launch(R * C, device_, quantize_kernel<S, O>, device_ptr<S>(x), R, C, br, bc, nbc,
               device_ptr<float>(scale), device_ptr<float>(scale_inv),
               p.rule == Fp8ScaleRule::AmaxPow2, device_ptr<O>(codes),
               values ? device_ptr<__nv_bfloat16>(*values) : nullptr);
      };
      if (codes.dtype() == DType::FP8_E4M3) {
        run.template operator()<float8_e4m3>();
      } else {
        MT_ASSERT(codes.dtype() == DType::FP8_E5M2, "fp8_quantize writes fp8 codes");
        run.template operator()<float8_e5m2>();
      }
    }
  });
}

}  // namespace mantissa::backend::cuda
