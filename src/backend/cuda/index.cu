// CUDA indexing kernels: index_select / index_add (embedding and its gradient) and gather /
// scatter_add, with the semantics of src/backend/cpu/index.cpp. Inputs arrive contiguous (the op
// layer makes them so); each tensor is viewed as (outer, dim, inner).
//
// Reads copy elements as raw bits (any dtype). The adds accumulate with atomicAdd: f32 and f64
// directly in the tensor, narrower float dtypes in an fp32 copy that is rounded once at the end
// (so a row hit many times loses no precision, unlike a running half sum). Atomics make the order
// of equal-index contributions unspecified: f32/f64 results can differ in the last bits from run
// to run and from the CPU's index-order sum.
//
// Out-of-range indices: the CPU backend rejects them with an error, but checking here would mean
// reading the indices back to the host on every call. The kernels never touch memory outside the
// tensors instead: a read at a bad index yields zero bits, an add at a bad index is dropped.
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/shapes.h"

namespace mantissa::backend::cuda {
namespace {

// out(o, j, i) = x(o, idx[j], i); m = index length (index_select), or
// out(o, j, i) = x(o, idx[(o, j, i)], i); m = index.size(dim) (gather, per_element).
template <typename B, bool per_element>
__global__ void select_kernel(const B* __restrict__ x, const int64_t* __restrict__ idx,
                              B* __restrict__ out, int64_t outer, int64_t n, int64_t m,
                              int64_t inner) {
  const int64_t total = outer * m * inner;
  MT_GRID_STRIDE_LOOP(k, total) {
    const int64_t i = k % inner, j = (k / inner) % m, o = k / (inner * m);
    const int64_t r = per_element ? idx[k] : idx[j];
    out[k] = (r >= 0 && r < n) ? x[(o * n + r) * inner + i] : B(0);
  }
}

// acc(o, idx[.], i) += src(o, j, i), as select_kernel's index rules.
template <typename S, typename A, bool per_element>
__global__ void add_kernel(A* __restrict__ acc, const int64_t* __restrict__ idx,
                           const S* __restrict__ src, int64_t outer, int64_t n, int64_t m,
                           int64_t inner) {
  const int64_t total = outer * m * inner;
  MT_GRID_STRIDE_LOOP(k, total) {
    const int64_t i = k % inner, j = (k / inner) % m, o = k / (inner * m);
    const int64_t r = per_element ? idx[k] : idx[j];
    if (r >= 0 && r < n) atomicAdd(acc + (o * n + r) * inner + i, static_cast<A>(load(src + k)));
  }
}

template <typename S>
__global__ void widen_kernel(const S* __restrict__ src, float* __restrict__ dst, int64_t n) {
  MT_GRID_STRIDE_LOOP(i, n) {
    dst[i] = static_cast<float>(load(src + i));
  }
}

template <typename S>
__global__ void narrow_kernel(const float* __restrict__ src, S* __restrict__ dst, int64_t n) {
  MT_GRID_STRIDE_LOOP(i, n) {
    store(dst + i, src[i]);
  }
}

template <bool per_element>
void select(int device, const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  MT_ASSERT(x.is_contiguous() && index.is_contiguous() && out.is_contiguous() &&
                index.dtype() == DType::I64 && out.dtype() == x.dtype(),
            "index_select / gather layout");
  const DimSplit sx = split_around(x, dim);
  const DimSplit so = split_around(out, dim);
  const int64_t total = out.numel();
  if (total == 0) return;
  dispatch_size(x.element_size(), [&](auto tag) {
    using B = typename decltype(tag)::type;
    select_kernel<B, per_element><<<grid_for(total), kThreads, 0, stream_for(device)>>>(
        device_ptr<const B>(x), device_ptr<const int64_t>(index), device_ptr<B>(out), so.outer,
        sx.n, so.n, so.inner);
    MT_CUDA_CHECK_LAUNCH();
  });
}

template <bool per_element>
void accumulate(int device, Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out,
                const char* op) {
  MT_ASSERT(grad_x.is_contiguous() && index.is_contiguous() && grad_out.is_contiguous() &&
                index.dtype() == DType::I64,
            op, " layout");
  MT_ASSERT(grad_x.dtype() == grad_out.dtype(), op, " dtypes");
  const DimSplit sx = split_around(grad_x, dim);
  const DimSplit sg = split_around(grad_out, dim);
  const int64_t total = grad_out.numel();
  if (total == 0 || grad_x.numel() == 0) return;
  cudaStream_t stream = stream_for(device);
  dispatch_float(grad_x.dtype(), op, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const int64_t* idx = device_ptr<const int64_t>(index);
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
      add_kernel<S, S, per_element><<<grid_for(total), kThreads, 0, stream>>>(
          device_ptr<S>(grad_x), idx, device_ptr<const S>(grad_out), sg.outer, sx.n, sg.n,
          sg.inner);
      MT_CUDA_CHECK_LAUNCH();
    } else {
      const int64_t nx = grad_x.numel();
      const Tensor acc_t = scratch(nx * int64_t(sizeof(float)), device);
      float* acc = static_cast<float*>(acc_t.data_ptr());
      widen_kernel<S><<<grid_for(nx), kThreads, 0, stream>>>(device_ptr<const S>(grad_x), acc, nx);
      MT_CUDA_CHECK_LAUNCH();
      add_kernel<S, float, per_element><<<grid_for(total), kThreads, 0, stream>>>(
          acc, idx, device_ptr<const S>(grad_out), sg.outer, sx.n, sg.n, sg.inner);
      MT_CUDA_CHECK_LAUNCH();
      narrow_kernel<S><<<grid_for(nx), kThreads, 0, stream>>>(acc, device_ptr<S>(grad_x), nx);
      MT_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

void CudaBackend::index_select(const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  DeviceGuard guard(device_);
  MT_ASSERT(out.dim() == 0 || index.numel() == out.size(dim), "index_select: out ", out.describe(),
            " vs index ", index.describe());
  select<false>(device_, x, dim, index, out);
}

void CudaBackend::index_add(Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out) {
  DeviceGuard guard(device_);
  MT_ASSERT(grad_out.dim() == 0 || index.numel() == grad_out.size(dim), "index_add: grad_out ",
            grad_out.describe(), " vs index ", index.describe());
  accumulate<false>(device_, grad_x, dim, index, grad_out, "index_add");
}

void CudaBackend::gather(const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  DeviceGuard guard(device_);
  MT_ASSERT(index.shape() == out.shape(), "gather: out ", out.describe(), " vs index ",
            index.describe());
  select<true>(device_, x, dim, index, out);
}

void CudaBackend::scatter_add(Tensor& grad_x, int dim, const Tensor& index,
                              const Tensor& grad_out) {
  DeviceGuard guard(device_);
  MT_ASSERT(index.shape() == grad_out.shape(), "scatter_add: grad_out ", grad_out.describe(),
            " vs index ", index.describe());
  accumulate<true>(device_, grad_x, dim, index, grad_out, "scatter_add");
}

}  // namespace mantissa::backend::cuda
