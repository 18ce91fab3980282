// CUDA softmax, log_softmax, cross-entropy and their gradients (the CPU backend's norm.cpp
// semantics). Inputs are made contiguous first, as the CPU does. When the softmax dim is the
// innermost one, a block takes a row (max, sum of exp, output: three passes, fp32 or f64 math,
// block reductions in a fixed order); otherwise a thread takes a column of the (outer, n, inner)
// layout, neighbouring threads reading neighbouring memory. Out-of-range class targets cannot
// raise an error without the host waiting for the GPU: their loss and gradient rows are NaN.
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/shapes.h"

namespace mantissa::backend::cuda {
namespace {

// One block per row, grid-stride over the rows beyond the device's budget.
unsigned row_grid(int64_t rows) {
  return grid_for(rows, 1);
}

// The row's max, NaNs skipped as the CPU's `v > m ? v : m` does (a NaN still makes the sum, hence
// every output, NaN).
template <typename S, typename C>
__device__ C row_max(const S* row, int64_t n) {
  C m = C(-INFINITY);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const C v = load(row + i);
    m = v > m ? v : m;
  }
  return block_max(m);
}

template <typename S, typename C>
__device__ C row_sum_exp(const S* row, int64_t n, C mx) {
  C s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    s += m_exp(C(load(row + i)) - mx);
  return block_sum(s);
}

template <typename S>
__global__ void softmax_rows_kernel(const S* __restrict__ x, S* __restrict__ out, int64_t rows,
                                    int64_t n, bool log) {
  using C = compute_t<S>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* row = x + r * n;
    S* dst = out + r * n;
    const C mx = row_max<S, C>(row, n);
    const C s = row_sum_exp<S, C>(row, n, mx);
    if (log) {
      // (x - max) - log(sum): log(sum) is not rounded at the magnitude of max.
      const C log_s = m_log(s);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        store(dst + i, (C(load(row + i)) - mx) - log_s);
    } else {
      const C inv = C(1) / s;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        store(dst + i, m_exp(C(load(row + i)) - mx) * inv);
    }
  }
}

template <typename S>
__global__ void softmax_cols_kernel(const S* __restrict__ x, S* __restrict__ out, DimSplit sp,
                                    bool log) {
  using C = compute_t<S>;
  MT_GRID_STRIDE_LOOP(col, sp.outer * sp.inner) {
    const int64_t o = col / sp.inner, j = col % sp.inner;
    const S* src = x + o * sp.n * sp.inner + j;
    S* dst = out + o * sp.n * sp.inner + j;
    C mx = C(-INFINITY);
    for (int64_t k = 0; k < sp.n; ++k) {
      const C v = load(src + k * sp.inner);
      mx = v > mx ? v : mx;
    }
    C s = 0;
    for (int64_t k = 0; k < sp.n; ++k)
      s += m_exp(C(load(src + k * sp.inner)) - mx);
    const C a = log ? m_log(s) : C(1) / s;
    for (int64_t k = 0; k < sp.n; ++k) {
      const C v = load(src + k * sp.inner);
      store(dst + k * sp.inner, log ? (v - mx) - a : m_exp(v - mx) * a);
    }
  }
}

// softmax: gx = y (g - sum(g y));  log_softmax: gx = g - exp(y) sum(g).
template <typename S>
__global__ void softmax_backward_rows_kernel(const S* __restrict__ g, const S* __restrict__ y,
                                             S* __restrict__ gx, int64_t rows, int64_t n,
                                             bool log) {
  using C = compute_t<S>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* gr = g + r * n;
    const S* yr = y + r * n;
    S* dst = gx + r * n;
    C s = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
      s += log ? C(load(gr + i)) : C(load(gr + i)) * C(load(yr + i));
    s = block_sum(s);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C gv = load(gr + i), yv = load(yr + i);
      store(dst + i, log ? gv - m_exp(yv) * s : yv * (gv - s));
    }
  }
}

template <typename S>
__global__ void softmax_backward_cols_kernel(const S* __restrict__ g, const S* __restrict__ y,
                                             S* __restrict__ gx, DimSplit sp, bool log) {
  using C = compute_t<S>;
  MT_GRID_STRIDE_LOOP(col, sp.outer * sp.inner) {
    const int64_t base = (col / sp.inner) * sp.n * sp.inner + col % sp.inner;
    C s = 0;
    for (int64_t k = 0; k < sp.n; ++k) {
      const int64_t i = base + k * sp.inner;
      s += log ? C(load(g + i)) : C(load(g + i)) * C(load(y + i));
    }
    for (int64_t k = 0; k < sp.n; ++k) {
      const int64_t i = base + k * sp.inner;
      const C gv = load(g + i), yv = load(y + i);
      store(gx + i, log ? gv - m_exp(yv) * s : yv * (gv - s));
    }
  }
}

// One block per sample: log_probs (C) = log_softmax(logits row); loss = the label-smoothed NLL,
// PyTorch's (1 - ls) * nll + ls * mean over classes of -log p; 0 where ignored.
template <typename S>
__global__ void cross_entropy_kernel(const S* __restrict__ logits,
                                     const int64_t* __restrict__ target, int64_t rows,
                                     int64_t classes, int64_t ignore_index, compute_t<S> ls,
                                     compute_t<S>* __restrict__ log_probs,
                                     compute_t<S>* __restrict__ loss) {
  using C = compute_t<S>;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* row = logits + r * classes;
    C* lp = log_probs + r * classes;
    const C mx = row_max<S, C>(row, classes);
    const C log_s = m_log(row_sum_exp<S, C>(row, classes, mx));
    C total = 0;
    for (int64_t i = threadIdx.x; i < classes; i += blockDim.x) {
      const C v = (C(load(row + i)) - mx) - log_s;
      lp[i] = v;
      total += v;
    }
    total = block_sum(total);
    if (threadIdx.x == 0) {
      const int64_t t = target[r];
      C l;
      if (t == ignore_index) {
        l = C(0);
      } else if (t < 0 || t >= classes) {
        l = C(NAN);
      } else {
        l = -((C(load(row + t)) - mx) - log_s);  // the value written to lp[t]
        if (ls != C(0)) l = (C(1) - ls) * l - ls * total / C(classes);
      }
      loss[r] = l;
    }
  }
}

// grad_logits = g_n * (exp(log p) - smoothed one-hot); 0 on ignored rows.
template <typename C, typename T>
__global__ void cross_entropy_backward_kernel(const C* __restrict__ grad_loss,
                                              const C* __restrict__ log_probs,
                                              const int64_t* __restrict__ target, int64_t rows,
                                              int64_t classes, int64_t ignore_index, C off, C on,
                                              T* __restrict__ grad_logits) {
  MT_GRID_STRIDE_LOOP(e, rows * classes) {
    const int64_t r = e / classes, i = e % classes;
    const int64_t t = target[r];
    C v;
    if (t == ignore_index) {
      v = C(0);
    } else if (t < 0 || t >= classes) {
      v = C(NAN);
    } else {
      v = grad_loss[r] * (m_exp(log_probs[e]) - (i == t ? on : off));
    }
    store(grad_logits + e, v);
  }
}

}  // namespace

void CudaBackend::softmax(const Tensor& x_in, int dim, bool log, Tensor& out) {
  const DeviceGuard guard(device_);
  MT_ASSERT(out.is_contiguous() && out.shape() == x_in.shape() && out.dtype() == x_in.dtype(),
            "softmax output");
  const Tensor x = contiguous_input(x_in);
  if (x.numel() == 0) return;
  const DimSplit sp = split_around(x, dim);
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(x.dtype(), log ? "log_softmax" : "softmax", [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (sp.inner == 1) {
      softmax_rows_kernel<S><<<row_grid(sp.outer), kThreads, 0, stream>>>(
          device_ptr<const S>(x), device_ptr<S>(out), sp.outer, sp.n, log);
    } else {
      softmax_cols_kernel<S><<<grid_for(sp.outer * sp.inner), kThreads, 0, stream>>>(
          device_ptr<const S>(x), device_ptr<S>(out), sp, log);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::softmax_backward(const Tensor& grad_y, const Tensor& y_in, int dim, bool log,
                                   Tensor& grad_x) {
  const DeviceGuard guard(device_);
  MT_ASSERT(grad_x.is_contiguous() && grad_x.shape() == y_in.shape() &&
                grad_x.dtype() == y_in.dtype() && grad_y.dtype() == y_in.dtype() &&
                grad_y.shape() == y_in.shape(),
            "softmax_backward arguments");
  const Tensor y = contiguous_input(y_in);
  const Tensor g = contiguous_input(grad_y);
  if (y.numel() == 0) return;
  const DimSplit sp = split_around(y, dim);
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(y.dtype(), log ? "log_softmax backward" : "softmax backward", [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (sp.inner == 1) {
      softmax_backward_rows_kernel<S><<<row_grid(sp.outer), kThreads, 0, stream>>>(
          device_ptr<const S>(g), device_ptr<const S>(y), device_ptr<S>(grad_x), sp.outer, sp.n,
          log);
    } else {
      softmax_backward_cols_kernel<S><<<grid_for(sp.outer * sp.inner), kThreads, 0, stream>>>(
          device_ptr<const S>(g), device_ptr<const S>(y), device_ptr<S>(grad_x), sp, log);
    }
    MT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::cross_entropy(const Tensor& logits_in, const Tensor& target_in,
                                int64_t ignore_index, double label_smoothing, Tensor& loss,
                                Tensor& log_probs) {
  const DeviceGuard guard(device_);
  const Tensor logits = contiguous_input(logits_in);
  const Tensor target = contiguous_input(target_in);
  MT_ASSERT(logits.dim() == 2 && target.dim() == 1 && target.dtype() == DType::I64 &&
                target.size(0) == logits.size(0),
            "cross_entropy kernel shapes: ", logits.describe(), ", ", target.describe());
  const int64_t rows = logits.size(0), classes = logits.size(1);
  if (rows == 0) return;
  const cudaStream_t stream = stream_for(device_);
  dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using S = typename decltype(tag)::type;
    using C = compute_t<S>;
    const DType stats = std::is_same_v<C, double> ? DType::F64 : DType::F32;
    MT_ASSERT(loss.dtype() == stats && log_probs.dtype() == stats && loss.is_contiguous() &&
                  log_probs.is_contiguous() && loss.numel() == rows &&
                  log_probs.numel() == rows * classes,
              "cross_entropy outputs: loss ", loss.describe(), ", log_probs ",
              log_probs.describe());
    cross_entropy_kernel<S><<<row_grid(rows), kThreads, 0, stream>>>(
        device_ptr<const S>(logits), device_ptr<const int64_t>(target), rows, classes, ignore_index,
        C(label_smoothing), device_ptr<C>(log_probs), device_ptr<C>(loss));
    MT_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::cross_entropy_backward(const Tensor& grad_loss_in, const Tensor& log_probs_in,
                                         const Tensor& target_in, int64_t ignore_index,
                                         double label_smoothing, Tensor& grad_logits) {
  const DeviceGuard guard(device_);
  const Tensor gl = contiguous_input(grad_loss_in);
  const Tensor log_probs = contiguous_input(log_probs_in);
  const Tensor target = contiguous_input(target_in);
  MT_ASSERT(log_probs.dim() == 2 && grad_logits.is_contiguous() &&
                grad_logits.shape() == log_probs.shape() && gl.numel() == log_probs.size(0) &&
                gl.dtype() == log_probs.dtype() && target.numel() == log_probs.size(0) &&
                target.dtype() == DType::I64,
            "cross_entropy_backward arguments");
  MT_ASSERT(log_probs.dtype() == DType::F32 || log_probs.dtype() == DType::F64,
            "cross_entropy_backward: log-probs are F32 or F64, got ", log_probs.describe());
  const int64_t rows = log_probs.size(0), classes = log_probs.size(1);
  if (rows * classes == 0) return;
  const cudaStream_t stream = stream_for(device_);
  auto run = [&](auto ctag) {
    using C = typename decltype(ctag)::type;
    const C ls = C(label_smoothing);
    const C off = ls / C(classes), on = C(1) - ls + off;
    dispatch_float(grad_logits.dtype(), "cross_entropy_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cross_entropy_backward_kernel<C, T><<<grid_for(rows * classes), kThreads, 0, stream>>>(
          device_ptr<const C>(gl), device_ptr<const C>(log_probs),
          device_ptr<const int64_t>(target), rows, classes, ignore_index, off, on,
          device_ptr<T>(grad_logits));
      MT_CUDA_CHECK_LAUNCH();
    });
  };
  if (log_probs.dtype() == DType::F64) {
    run(Tag<double>{});
  } else {
    run(Tag<float>{});
  }
}

}  // namespace mantissa::backend::cuda
