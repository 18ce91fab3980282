// CUDA pooling kernels (NCHW): max, average and adaptive average pooling and their gradients,
// with the CPU backend's window rules (src/backend/cpu/pool.cpp). Inputs are made contiguous
// first; each (n, c) plane is indexed as plane * H * W + h * W + w.
//
// Forward passes run one thread per output element and scan the window in row-major order in the
// compute type, as the CPU does, so sums and maxima are bit-identical to it. The average-pool
// gradients run one thread per input element and gather the shares of the outputs whose windows
// cover it in row-major output order: again the CPU's summation order, deterministic. The max-pool
// gradient has no window parameters (only the saved indices), so it scatters with atomicAdd into
// an fp32 accumulator (f64 for f64): where windows overlap, equal-index contributions are summed
// in an unspecified order (the last bits may differ from run to run); half gradients are rounded
// once from that fp32 sum.
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/pool_windows.h"
#include "backend/shapes.h"

namespace mantissa::backend::cuda {
namespace {

struct Geometry {
  int64_t planes = 0, h = 0, w = 0, oh = 0, ow = 0;
};

Geometry geometry(const Tensor& in, const Tensor& out) {
  MT_ASSERT(in.dim() == 4 && out.dim() == 4, "pooling kernels take (N, C, H, W) tensors, got ",
            in.describe(), " and ", out.describe());
  MT_ASSERT(in.size(0) == out.size(0) && in.size(1) == out.size(1),
            "pooling planes differ: ", in.describe(), " vs ", out.describe());
  return {in.size(0) * in.size(1), in.size(2), in.size(3), out.size(2), out.size(3)};
}

// The pooling parameters a kernel needs, by value.
struct Window2d {
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};

Window2d window_params(const Pool2dParams& p) {
  return {p.kernel[0],  p.kernel[1],  p.stride[0],        p.stride[1],
          p.padding[0], p.padding[1], p.count_include_pad};
}

__device__ __forceinline__ int64_t avg_divisor(int64_t oh, int64_t ow, const Geometry& g,
                                               const Window2d& p) {
  return pool_avg_divisor(oh, ow, g.h, g.w, p.kh, p.kw, p.sh, p.sw, p.ph, p.pw,
                          p.count_include_pad);
}

// ---- max pooling ------------------------------------------------------------------------------

template <typename S>
__global__ void max_pool_kernel(const S* __restrict__ x, S* __restrict__ out,
                                int64_t* __restrict__ indices, Geometry g, Window2d p) {
  using C = compute_t<S>;
  const int64_t n = g.planes * g.oh * g.ow;
  MT_GRID_STRIDE_LOOP(e, n) {
    const int64_t ow = e % g.ow, oh = (e / g.ow) % g.oh, plane = e / (g.ow * g.oh);
    const S* in = x + plane * g.h * g.w;
    const PoolRange wh = pool_window(oh, p.sh, p.ph, p.kh, g.h);
    const PoolRange ww = pool_window(ow, p.sw, p.pw, p.kw, g.w);
    // The first maximum wins; the first NaN wins over everything (the CPU's rule).
    int64_t at = wh.begin * g.w + ww.begin;
    C best = -INFINITY;
    for (int64_t h = wh.begin; h < wh.end; ++h) {
      for (int64_t w = ww.begin; w < ww.end; ++w) {
        const C v = load(in + h * g.w + w);
        if (v > best || (v != v && best == best)) {
          best = v;
          at = h * g.w + w;
        }
      }
    }
    out[e] = in[at];
    indices[e] = at;
  }
}

// Scatter of grad_out into the accumulator A (zeroed) at the saved per-plane indices.
template <typename S, typename A>
__global__ void max_pool_backward_kernel(const S* __restrict__ grad_out,
                                         const int64_t* __restrict__ indices, A* __restrict__ acc,
                                         int64_t out_plane, int64_t in_plane, int64_t n) {
  MT_GRID_STRIDE_LOOP(e, n) {
    const int64_t plane = e / out_plane;
    atomicAdd(acc + plane * in_plane + indices[e], static_cast<A>(load(grad_out + e)));
  }
}

template <typename S>
__global__ void narrow_kernel(const float* __restrict__ src, S* __restrict__ dst, int64_t n) {
  MT_GRID_STRIDE_LOOP(i, n) {
    store(dst + i, src[i]);
  }
}

// ---- average pooling --------------------------------------------------------------------------

template <typename S>
__global__ void avg_pool_kernel(const S* __restrict__ x, S* __restrict__ out, Geometry g,
                                Window2d p) {
  using C = compute_t<S>;
  const int64_t n = g.planes * g.oh * g.ow;
  MT_GRID_STRIDE_LOOP(e, n) {
    const int64_t ow = e % g.ow, oh = (e / g.ow) % g.oh, plane = e / (g.ow * g.oh);
    const S* in = x + plane * g.h * g.w;
    const PoolRange wh = pool_window(oh, p.sh, p.ph, p.kh, g.h);
    const PoolRange ww = pool_window(ow, p.sw, p.pw, p.kw, g.w);
    C s = 0;
    for (int64_t h = wh.begin; h < wh.end; ++h) {
      for (int64_t w = ww.begin; w < ww.end; ++w)
        s += load(in + h * g.w + w);
    }
    store(out + e, s / C(avg_divisor(oh, ow, g, p)));
  }
}

template <typename S>
__global__ void avg_pool_backward_kernel(const S* __restrict__ grad_out, S* __restrict__ grad_x,
                                         Geometry g, Window2d p) {
  using C = compute_t<S>;
  const int64_t n = g.planes * g.h * g.w;
  MT_GRID_STRIDE_LOOP(e, n) {
    const int64_t w = e % g.w, h = (e / g.w) % g.h, plane = e / (g.w * g.h);
    const S* go = grad_out + plane * g.oh * g.ow;
    const PoolRange rh = pool_covering(h, p.sh, p.ph, p.kh, g.oh);
    const PoolRange rw = pool_covering(w, p.sw, p.pw, p.kw, g.ow);
    C acc = 0;
    for (int64_t oh = rh.begin; oh < rh.end; ++oh) {
      for (int64_t ow = rw.begin; ow < rw.end; ++ow)
        acc += load(go + oh * g.ow + ow) / C(avg_divisor(oh, ow, g, p));
    }
    store(grad_x + e, acc);
  }
}

// ---- adaptive average pooling -----------------------------------------------------------------

template <typename S>
__global__ void adaptive_avg_pool_kernel(const S* __restrict__ x, S* __restrict__ out, Geometry g) {
  using C = compute_t<S>;
  const int64_t n = g.planes * g.oh * g.ow;
  MT_GRID_STRIDE_LOOP(e, n) {
    const int64_t ow = e % g.ow, oh = (e / g.ow) % g.oh, plane = e / (g.ow * g.oh);
    const S* in = x + plane * g.h * g.w;
    const PoolRange wh = adaptive_pool_window(oh, g.h, g.oh);
    const PoolRange ww = adaptive_pool_window(ow, g.w, g.ow);
    C s = 0;
    for (int64_t h = wh.begin; h < wh.end; ++h) {
      for (int64_t w = ww.begin; w < ww.end; ++w)
        s += load(in + h * g.w + w);
    }
    store(out + e, s / C((wh.end - wh.begin) * (ww.end - ww.begin)));
  }
}

template <typename S>
__global__ void adaptive_avg_pool_backward_kernel(const S* __restrict__ grad_out,
                                                  S* __restrict__ grad_x, Geometry g) {
  using C = compute_t<S>;
  const int64_t n = g.planes * g.h * g.w;
  MT_GRID_STRIDE_LOOP(e, n) {
    const int64_t w = e % g.w, h = (e / g.w) % g.h, plane = e / (g.w * g.h);
    const S* go = grad_out + plane * g.oh * g.ow;
    const PoolRange rh = adaptive_pool_covering(h, g.h, g.oh);
    const PoolRange rw = adaptive_pool_covering(w, g.w, g.ow);
    C acc = 0;
    for (int64_t oh = rh.begin; oh < rh.end; ++oh) {
      const PoolRange wh = adaptive_pool_window(oh, g.h, g.oh);
      for (int64_t ow = rw.begin; ow < rw.end; ++ow) {
        const PoolRange ww = adaptive_pool_window(ow, g.w, g.ow);
        acc += load(go + oh * g.ow + ow) / C((wh.end - wh.begin) * (ww.end - ww.begin));
      }
    }
    store(grad_x + e, acc);
  }
}

}  // namespace

void CudaBackend::max_pool2d(const Tensor& x_in, Tensor& out, Tensor& indices,
                             const Pool2dParams& p) {
  DeviceGuard guard(device_);
  MT_ASSERT(out.is_contiguous() && indices.is_contiguous() && indices.dtype() == DType::I64 &&
                indices.shape() == out.shape() && out.dtype() == x_in.dtype(),
            "max_pool2d outputs");
  const Geometry g = geometry(x_in, out);
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor x = contiguous_input(x_in);
  dispatch_float(x.dtype(), "max_pool2d", [&](auto tag) {
    using S = typename decltype(tag)::type;
    max_pool_kernel<S><<<grid_for(n), kThreads, 0, stream_for(device_)>>>(
        device_ptr<S>(x), device_ptr<S>(out), device_ptr<int64_t>(indices), g, window_params(p));
    MT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::max_pool2d_backward(const Tensor& grad_out_in, const Tensor& indices_in,
                                      Tensor& grad_x) {
  DeviceGuard guard(device_);
  MT_ASSERT(grad_x.is_contiguous() && grad_x.dtype() == grad_out_in.dtype() &&
                indices_in.dtype() == DType::I64 && indices_in.shape() == grad_out_in.shape(),
            "max_pool2d_backward arguments");
  const Geometry g = geometry(grad_x, grad_out_in);
  if (grad_x.numel() == 0) return;
  cudaStream_t stream = stream_for(device_);
  const Tensor go = contiguous_input(grad_out_in);
  const Tensor ix = contiguous_input(indices_in);
  const int64_t n = go.numel();
  dispatch_float(go.dtype(), "max_pool2d_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    // f32 and f64 gradients are their own accumulators; narrower ones sum in an fp32 scratch.
    constexpr bool direct = std::is_same_v<S, float> || std::is_same_v<S, double>;
    using A = std::conditional_t<std::is_same_v<S, double>, double, float>;
    Tensor acc_t = direct ? grad_x : scratch(grad_x.numel() * int64_t(sizeof(float)), device_);
    A* acc = static_cast<A*>(acc_t.data_ptr());
    MT_CUDA_CHECK(cudaMemsetAsync(acc, 0, size_t(grad_x.numel()) * sizeof(A), stream));
    if (n > 0) {
      max_pool_backward_kernel<S, A><<<grid_for(n), kThreads, 0, stream>>>(
          device_ptr<S>(go), device_ptr<int64_t>(ix), acc, g.oh * g.ow, g.h * g.w, n);
      MT_CUDA_CHECK_LAUNCH();
    }
    if constexpr (!direct) {
      narrow_kernel<S><<<grid_for(grad_x.numel()), kThreads, 0, stream>>>(
          reinterpret_cast<const float*>(acc), device_ptr<S>(grad_x), grad_x.numel());
      MT_CUDA_CHECK_LAUNCH();
    }
  });
}

void CudaBackend::avg_pool2d(const Tensor& x_in, Tensor& out, const Pool2dParams& p) {
  DeviceGuard guard(device_);
  MT_ASSERT(out.is_contiguous() && out.dtype() == x_in.dtype(), "avg_pool2d output");
  const Geometry g = geometry(x_in, out);
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor x = contiguous_input(x_in);
  dispatch_float(x.dtype(), "avg_pool2d", [&](auto tag) {
    using S = typename decltype(tag)::type;
    avg_pool_kernel<S><<<grid_for(n), kThreads, 0, stream_for(device_)>>>(
        device_ptr<S>(x), device_ptr<S>(out), g, window_params(p));
    MT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::avg_pool2d_backward(const Tensor& grad_out_in, Tensor& grad_x,
                                      const Pool2dParams& p) {
  DeviceGuard guard(device_);
  MT_ASSERT(grad_x.is_contiguous() && grad_x.dtype() == grad_out_in.dtype(),
            "avg_pool2d_backward arguments");
  const Geometry g = geometry(grad_x, grad_out_in);
  const int64_t n = grad_x.numel();
  if (n == 0) return;
  const Tensor go = contiguous_input(grad_out_in);
  dispatch_float(go.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    avg_pool_backward_kernel<S><<<grid_for(n), kThreads, 0, stream_for(device_)>>>(
        device_ptr<S>(go), device_ptr<S>(grad_x), g, window_params(p));
    MT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::adaptive_avg_pool2d(const Tensor& x_in, Tensor& out) {
  DeviceGuard guard(device_);
  MT_ASSERT(out.is_contiguous() && out.dtype() == x_in.dtype(), "adaptive_avg_pool2d output");
  const Geometry g = geometry(x_in, out);
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor x = contiguous_input(x_in);
  dispatch_float(x.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    using S = typename decltype(tag)::type;
    adaptive_avg_pool_kernel<S><<<grid_for(n), kThreads, 0, stream_for(device_)>>>(
        device_ptr<S>(x), device_ptr<S>(out), g);
    MT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::adaptive_avg_pool2d_backward(const Tensor& grad_out_in, Tensor& grad_x) {
  DeviceGuard guard(device_);
  MT_ASSERT(grad_x.is_contiguous() && grad_x.dtype() == grad_out_in.dtype(),
            "adaptive_avg_pool2d_backward arguments");
  const Geometry g = geometry(grad_x, grad_out_in);
  const int64_t n = grad_x.numel();
  if (n == 0) return;
  if (g.oh == 0 || g.ow == 0) {  // no output: nothing flows back
    fill(grad_x, 0.0);
    return;
  }
  const Tensor go = contiguous_input(grad_out_in);
  dispatch_float(go.dtype(), "adaptive_avg_pool2d_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    adaptive_avg_pool_backward_kernel<S><<<grid_for(n), kThreads, 0, stream_for(device_)>>>(
        device_ptr<S>(go), device_ptr<S>(grad_x), g);
    MT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mantissa::backend::cuda
