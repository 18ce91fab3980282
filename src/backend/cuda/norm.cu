// CUDA layer norm and batch norm, forward and backward (the CPU backend's norm.cpp semantics).
//
// Inputs are made contiguous first, as the CPU does. Statistics are computed in fp32 (f64 for
// f64) and every sum is built in a fixed order (block reductions, per-chunk partials added in
// chunk order), never with atomics, so results do not vary from run to run. Per-channel and
// per-feature tensors (weight, bias, running stats, saved statistics, their gradients) may have
// any float dtype and layout: they are read through, and written from, contiguous copies in the
// compute type, the CPU's read_vector/write_vector rule (one rounding on the way out).
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/shapes.h"

namespace mantissa::backend::cuda {
namespace {

template <typename C>
constexpr DType stats_dtype_of() {
  return std::is_same_v<C, double> ? DType::F64 : DType::F32;
}

// t (any dtype and layout) as a contiguous `dtype` tensor: t itself when it already is one.
Tensor as_contiguous(Backend& be, const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t.detach();
  Tensor tmp = Tensor::empty(t.shape(), dtype, t.device());
  be.copy(t, tmp);
  return tmp;
}

// A per-channel input as a device pointer in the compute type; null when absent (the kernels
// then use the CPU's fill value). `holder` keeps a converted copy alive until the kernels are
// queued.
template <typename C>
const C* vector_in(Backend& be, const Tensor* t, int64_t n, Tensor& holder) {
  if (t == nullptr || !t->defined()) return nullptr;
  MT_ASSERT(t->numel() == n, "a per-channel tensor has ", t->numel(), " elements, expected ", n);
  holder = as_contiguous(be, *t, stats_dtype_of<C>());
  return device_ptr<const C>(holder);
}

// Where a per-channel result is computed: dst itself when it has the compute type and is
// contiguous, else a temporary that finish() copies into dst (one rounding).
template <typename C>
struct VectorOut {
  Tensor* dst = nullptr;
  Tensor buf;
  VectorOut(Tensor* d, int64_t n) : dst(d) {
    if (dst == nullptr || !dst->defined()) {
      dst = nullptr;
      return;
    }
    MT_ASSERT(dst->numel() == n, "writing ", n, " values into a ", dst->describe());
    buf = dst->dtype() == stats_dtype_of<C>() && dst->is_contiguous()
              ? *dst
              : Tensor::empty({n}, stats_dtype_of<C>(), dst->device());
  }
  C* ptr() const { return dst ? device_ptr<C>(buf) : nullptr; }
  void finish(Backend& be) {
    if (dst && !buf.is_same(*dst)) be.copy(buf.view(dst->shape()), *dst);
  }
};

// One block per row, grid-stride over the rows beyond the device's budget.
unsigned row_grid(int64_t rows) {
  return grid_for(rows, 1);
}

// ---- layer norm ------------------------------------------------------------------------------

template <typename S>
__global__ void layer_norm_kernel(const S* __restrict__ x, const compute_t<S>* __restrict__ w,
                                  const compute_t<S>* __restrict__ b, int64_t m, int64_t n,
                                  compute_t<S> eps, S* __restrict__ out,
                                  compute_t<S>* __restrict__ mean,
                                  compute_t<S>* __restrict__ rstd) {
  using C = compute_t<S>;
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const S* row = x + r * n;
    C s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      s += C(load(row + i));
    const C mu = block_sum(s) / C(n);
    C ss = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C d = C(load(row + i)) - mu;
      ss += d * d;
    }
    const C rs = C(1) / m_sqrt(block_sum(ss) / C(n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C wi = w ? w[i] : C(1), bi = b ? b[i] : C(0);
      store(out + r * n + i, (C(load(row + i)) - mu) * rs * wi + bi);
    }
    if (threadIdx.x == 0) {
      mean[r] = mu;
      rstd[r] = rs;
    }
  }
}

// grad_x of one row per block: rs (g w - mean(g w) - xhat mean(g w xhat)).
template <typename S>
__global__ void layer_norm_grad_x_kernel(const S* __restrict__ g, const S* __restrict__ x,
                                         const compute_t<S>* __restrict__ w,
                                         const compute_t<S>* __restrict__ mean,
                                         const compute_t<S>* __restrict__ rstd, int64_t m,
                                         int64_t n, S* __restrict__ gx) {
  using C = compute_t<S>;
  for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
    const S* gr = g + r * n;
    const S* xr = x + r * n;
    const C mu = mean[r], rs = rstd[r];
    C a = 0, d = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C dx = C(load(gr + i)) * (w ? w[i] : C(1));
      a += dx;
      d += dx * ((C(load(xr + i)) - mu) * rs);
    }
    const C ma = block_sum(a) / C(n);
    const C md = block_sum(d) / C(n);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C xhat = (C(load(xr + i)) - mu) * rs;
      store(gx + r * n + i, rs * (C(load(gr + i)) * (w ? w[i] : C(1)) - ma - xhat * md));
    }
  }
}

// Partial weight/bias gradients: thread (column j, chunk c) sums rows [c * per, (c + 1) * per)
// of g * xhat and g into pw/pb[c * n + j]. Neighbouring threads read neighbouring columns.
template <typename S>
__global__ void layer_norm_partials_kernel(const S* __restrict__ g, const S* __restrict__ x,
                                           const compute_t<S>* __restrict__ mean,
                                           const compute_t<S>* __restrict__ rstd, int64_t m,
                                           int64_t n, int64_t per, compute_t<S>* __restrict__ pw,
                                           compute_t<S>* __restrict__ pb) {
  using C = compute_t<S>;
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const int64_t c = blockIdx.y, r1 = std::min(m, (c + 1) * per);
  C sw = 0, sb = 0;
  for (int64_t r = c * per; r < r1; ++r) {
    const C gv = load(g + r * n + j);
    sw += gv * ((C(load(x + r * n + j)) - mean[r]) * rstd[r]);
    sb += gv;
  }
  if (pw) pw[c * n + j] = sw;
  if (pb) pb[c * n + j] = sb;
}

// out[j] = sum over chunks, in chunk order, of partial[c * n + j].
template <typename C>
__global__ void sum_chunks_kernel(const C* __restrict__ partial, int64_t chunks, int64_t n,
                                  C* __restrict__ out) {
  MT_GRID_STRIDE_LOOP(j, n) {
    C s = 0;
    for (int64_t c = 0; c < chunks; ++c)
      s += partial[c * n + j];
    out[j] = s;
  }
}

// ---- batch norm ------------------------------------------------------------------------------

// Element i (0 .. N*S) of channel c.
__device__ __forceinline__ int64_t channel_offset(const ChannelShape& cs, int64_t c, int64_t i) {
  return ((i / cs.s) * cs.c + c) * cs.s + i % cs.s;
}

// One block per channel: batch mean and rstd (biased variance, two passes), and the running
// statistics (f64 copies) updated with the unbiased variance, as PyTorch does.
template <typename S>
__global__ void batch_norm_stats_kernel(const S* __restrict__ x, ChannelShape cs, compute_t<S> eps,
                                        double momentum, compute_t<S>* __restrict__ mean,
                                        compute_t<S>* __restrict__ rstd,
                                        double* __restrict__ running_mean,
                                        double* __restrict__ running_var) {
  using C = compute_t<S>;
  const int64_t count = cs.n * cs.s;
  for (int64_t c = blockIdx.x; c < cs.c; c += gridDim.x) {
    C s = 0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
      s += C(load(x + channel_offset(cs, c, i)));
    const C mu = block_sum(s) / C(count);
    C ss = 0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const C d = C(load(x + channel_offset(cs, c, i))) - mu;
      ss += d * d;
    }
    ss = block_sum(ss);
    if (threadIdx.x == 0) {
      mean[c] = mu;
      rstd[c] = C(1) / m_sqrt(ss / C(count) + eps);
      if (running_mean) {
        const double unbiased = double(ss) / double(count - 1);
        running_mean[c] = (1 - momentum) * running_mean[c] + momentum * double(mu);
        running_var[c] = (1 - momentum) * running_var[c] + momentum * unbiased;
      }
    }
  }
}

template <typename C>
__global__ void batch_norm_eval_stats_kernel(const C* __restrict__ running_mean,
                                             const C* __restrict__ running_var, int64_t channels,
                                             C eps, C* __restrict__ mean, C* __restrict__ rstd) {
  MT_GRID_STRIDE_LOOP(c, channels) {
    mean[c] = running_mean[c];
    rstd[c] = C(1) / m_sqrt(running_var[c] + eps);
  }
}

template <typename S>
__global__ void batch_norm_apply_kernel(const S* __restrict__ x, ChannelShape cs,
                                        const compute_t<S>* __restrict__ mean,
                                        const compute_t<S>* __restrict__ rstd,
                                        const compute_t<S>* __restrict__ w,
                                        const compute_t<S>* __restrict__ b, S* __restrict__ out) {
  using C = compute_t<S>;
  MT_GRID_STRIDE_LOOP(i, cs.n * cs.c * cs.s) {
    const int64_t c = (i / cs.s) % cs.c;
    const C scale = rstd[c] * (w ? w[c] : C(1)), shift = b ? b[c] : C(0);
    store(out + i, (C(load(x + i)) - mean[c]) * scale + shift);
  }
}

// The per-channel terms of the backward, in coef (5, C): grad_weight = sum(g (x - mean)) rstd,
// grad_bias = sum(g), and gx = k (g - mg - (x - mean) q) with k = w rstd and, in training,
// mg = mean(g), q = mean(g (x - mean)) rstd^2 (eval: the statistics are constants, mg = q = 0).
template <typename S>
__global__ void batch_norm_backward_stats_kernel(const S* __restrict__ g, const S* __restrict__ x,
                                                 ChannelShape cs,
                                                 const compute_t<S>* __restrict__ mean,
                                                 const compute_t<S>* __restrict__ rstd,
                                                 const compute_t<S>* __restrict__ w, bool training,
                                                 compute_t<S>* __restrict__ coef) {
  using C = compute_t<S>;
  const int64_t count = cs.n * cs.s;
  for (int64_t c = blockIdx.x; c < cs.c; c += gridDim.x) {
    const C m = mean[c];
    C a = 0, d = 0;
    for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
      const int64_t off = channel_offset(cs, c, i);
      const C gv = load(g + off);
      a += gv;
      d += gv * (C(load(x + off)) - m);
    }
    a = block_sum(a);
    d = block_sum(d);
    if (threadIdx.x == 0) {
      const C rs = rstd[c];
      coef[c] = d * rs;
      coef[cs.c + c] = a;
      coef[2 * cs.c + c] = (w ? w[c] : C(1)) * rs;
      coef[3 * cs.c + c] = training ? a / C(count) : C(0);
      coef[4 * cs.c + c] = training ? d * rs * rs / C(count) : C(0);
    }
  }
}

template <typename S>
__global__ void batch_norm_grad_x_kernel(const S* __restrict__ g, const S* __restrict__ x,
                                         ChannelShape cs, const compute_t<S>* __restrict__ mean,
                                         const compute_t<S>* __restrict__ coef,
                                         S* __restrict__ gx) {
  using C = compute_t<S>;
  const compute_t<S>* k = coef + 2 * cs.c;
  const compute_t<S>* mg = coef + 3 * cs.c;
  const compute_t<S>* q = coef + 4 * cs.c;
  MT_GRID_STRIDE_LOOP(i, cs.n * cs.c * cs.s) {
    const int64_t c = (i / cs.s) % cs.c;
    store(gx + i, k[c] * (C(load(g + i)) - mg[c] - (C(load(x + i)) - mean[c]) * q[c]));
  }
}

}  // namespace

void CudaBackend::batch_norm(const Tensor& x_in, const Tensor* weight, const Tensor* bias,
                             Tensor* running_mean, Tensor* running_var, bool training,
                             double momentum, double eps, Tensor& out, Tensor& save_mean,
                             Tensor& save_rstd) {
  const DeviceGuard guard(device_);
  MT_ASSERT(out.is_contiguous() && out.shape() == x_in.shape() && out.dtype() == x_in.dtype(),
            "batch_norm output");
  const Tensor x = contiguous_input(x_in);
  const bool has_running =
      running_mean && running_mean->defined() && running_var && running_var->defined();
  const ChannelShape cs = check_batch_norm(x, training, has_running);
  if (cs.c == 0) return;
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(x.dtype(), "batch_norm", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    VectorOut<C> mean(&save_mean, cs.c), rstd(&save_rstd, cs.c);
    Tensor rm64, rv64, w_hold, b_hold, rm_hold, rv_hold;
    if (training) {
      if (has_running) {
        // Updated in place when they already are contiguous F64, else through copies.
        rm64 = as_contiguous(*this, *running_mean, DType::F64);
        rv64 = as_contiguous(*this, *running_var, DType::F64);
      }
      batch_norm_stats_kernel<S><<<row_grid(cs.c), kThreads, 0, stream>>>(
          device_ptr<const S>(x), cs, C(eps), momentum, mean.ptr(), rstd.ptr(),
          has_running ? device_ptr<double>(rm64) : nullptr,
          has_running ? device_ptr<double>(rv64) : nullptr);
      MT_CUDA_CHECK_LAUNCH();
      if (has_running && !rm64.shares_storage(*running_mean)) copy(rm64, *running_mean);
      if (has_running && !rv64.shares_storage(*running_var)) copy(rv64, *running_var);
    } else {
      const C* rm = vector_in<C>(*this, running_mean, cs.c, rm_hold);
      const C* rv = vector_in<C>(*this, running_var, cs.c, rv_hold);
      batch_norm_eval_stats_kernel<C>
          <<<grid_for(cs.c), kThreads, 0, stream>>>(rm, rv, cs.c, C(eps), mean.ptr(), rstd.ptr());
      MT_CUDA_CHECK_LAUNCH();
    }
    const C* w = vector_in<C>(*this, weight, cs.c, w_hold);
    const C* b = vector_in<C>(*this, bias, cs.c, b_hold);
    if (x.numel() > 0) {
      batch_norm_apply_kernel<S><<<grid_for(x.numel()), kThreads, 0, stream>>>(
          device_ptr<const S>(x), cs, mean.ptr(), rstd.ptr(), w, b, device_ptr<S>(out));
      MT_CUDA_CHECK_LAUNCH();
    }
    // In eval mode these are the running statistics: backward needs nothing else.
    mean.finish(*this);
    rstd.finish(*this);
  });
}

void CudaBackend::batch_norm_backward(const Tensor& grad_out, const Tensor& x_in,
                                      const Tensor* weight, const Tensor& save_mean,
                                      const Tensor& save_rstd, bool training, Tensor* grad_x,
                                      Tensor* grad_weight, Tensor* grad_bias) {
  const DeviceGuard guard(device_);
  const Tensor x = contiguous_input(x_in);
  const Tensor g = contiguous_input(grad_out);
  const ChannelShape cs = channel_shape(x);
  const auto [want_x, want_w, want_b] =
      wanted_grads("batch_norm_backward", g, x, grad_x, grad_weight, grad_bias);
  if (cs.c == 0) return;
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    Tensor mean_hold, rstd_hold, w_hold;
    const C* mean = vector_in<C>(*this, &save_mean, cs.c, mean_hold);
    const C* rstd = vector_in<C>(*this, &save_rstd, cs.c, rstd_hold);
    const C* w = vector_in<C>(*this, weight, cs.c, w_hold);
    const Tensor coef = Tensor::empty({5, cs.c}, stats_dtype_of<C>(), x.device());
    batch_norm_backward_stats_kernel<S>
        <<<row_grid(cs.c), kThreads, 0, stream>>>(device_ptr<const S>(g), device_ptr<const S>(x),
                                                  cs, mean, rstd, w, training, device_ptr<C>(coef));
    MT_CUDA_CHECK_LAUNCH();
    if (want_w) copy(coef.select(0, 0).view(grad_weight->shape()), *grad_weight);
    if (want_b) copy(coef.select(0, 1).view(grad_bias->shape()), *grad_bias);
    if (want_x && x.numel() > 0) {
      batch_norm_grad_x_kernel<S><<<grid_for(x.numel()), kThreads, 0, stream>>>(
          device_ptr<const S>(g), device_ptr<const S>(x), cs, mean, device_ptr<const C>(coef),
          device_ptr<S>(*grad_x));
      MT_CUDA_CHECK_LAUNCH();
    }
  });
}

void CudaBackend::layer_norm(const Tensor& x_in, const Tensor* weight, const Tensor* bias,
                             double eps, Tensor& out, Tensor& mean_out, Tensor& rstd_out) {
  const DeviceGuard guard(device_);
  MT_ASSERT(out.is_contiguous() && out.shape() == x_in.shape() && out.dtype() == x_in.dtype(),
            "layer_norm output");
  const Tensor x = contiguous_input(x_in);
  const int64_t m = mean_out.numel();
  if (m == 0 || x.numel() == 0) return;
  const int64_t n = x.numel() / m;
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    Tensor w_hold, b_hold;
    const C* w = vector_in<C>(*this, weight, n, w_hold);
    const C* b = vector_in<C>(*this, bias, n, b_hold);
    VectorOut<C> mean(&mean_out, m), rstd(&rstd_out, m);
    layer_norm_kernel<S><<<row_grid(m), kThreads, 0, stream>>>(
        device_ptr<const S>(x), w, b, m, n, C(eps), device_ptr<S>(out), mean.ptr(), rstd.ptr());
    MT_CUDA_CHECK_LAUNCH();
    mean.finish(*this);
    rstd.finish(*this);
  });
}

void CudaBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x_in,
                                      const Tensor* weight, const Tensor& mean_in,
                                      const Tensor& rstd_in, Tensor* grad_x, Tensor* grad_weight,
                                      Tensor* grad_bias) {
  const DeviceGuard guard(device_);
  const Tensor x = contiguous_input(x_in);
  const Tensor g = contiguous_input(grad_out);
  const auto [want_x, want_w, want_b] =
      wanted_grads("layer_norm_backward", g, x, grad_x, grad_weight, grad_bias);
  const int64_t m = mean_in.numel();
  const int64_t n = m ? x.numel() / m : 0;
  if (m == 0) {
    // No rows: the weight and bias gradients are empty sums.
    if (want_w) fill(*grad_weight, 0.0);
    if (want_b) fill(*grad_bias, 0.0);
    return;
  }
  if (n == 0) return;
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    Tensor mean_hold, rstd_hold, w_hold;
    const C* mean = vector_in<C>(*this, &mean_in, m, mean_hold);
    const C* rstd = vector_in<C>(*this, &rstd_in, m, rstd_hold);
    const C* w = vector_in<C>(*this, weight, n, w_hold);
    if (want_x) {
      layer_norm_grad_x_kernel<S>
          <<<row_grid(m), kThreads, 0, stream>>>(device_ptr<const S>(g), device_ptr<const S>(x), w,
                                                 mean, rstd, m, n, device_ptr<S>(*grad_x));
      MT_CUDA_CHECK_LAUNCH();
    }
    if (!want_w && !want_b) return;
    // Rows in fixed chunks (a function of m only), each chunk's column sums added in chunk order
    // by a second pass: deterministic, and enough chunks to fill the GPU when n is small.
    const int64_t chunks = std::clamp<int64_t>((m + 31) / 32, 1, 256);
    const int64_t per = (m + chunks - 1) / chunks;
    const Tensor partial = Tensor::empty({2, chunks, n}, stats_dtype_of<C>(), x.device());
    C* pw = want_w ? device_ptr<C>(partial) : nullptr;
    C* pb = want_b ? device_ptr<C>(partial) + chunks * n : nullptr;
    const dim3 grid(unsigned((n + kThreads - 1) / kThreads), unsigned(chunks));
    layer_norm_partials_kernel<S><<<grid, kThreads, 0, stream>>>(
        device_ptr<const S>(g), device_ptr<const S>(x), mean, rstd, m, n, per, pw, pb);
    MT_CUDA_CHECK_LAUNCH();
    VectorOut<C> gw(grad_weight, n), gb(grad_bias, n);
    if (want_w) {
      sum_chunks_kernel<C><<<grid_for(n), kThreads, 0, stream>>>(pw, chunks, n, gw.ptr());
      MT_CUDA_CHECK_LAUNCH();
    }
    if (want_b) {
      sum_chunks_kernel<C><<<grid_for(n), kThreads, 0, stream>>>(pb, chunks, n, gb.ptr());
      MT_CUDA_CHECK_LAUNCH();
    }
    gw.finish(*this);
    gb.finish(*this);
  });
}

}  // namespace mantissa::backend::cuda
