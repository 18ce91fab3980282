// CUDA reductions over any sorted dims of any strided input (the CPU backend's reduce.cpp
// semantics). reduce_plan.h lays the input out as (kept, reduced) dim walks; a block reduces
// block_x output elements, block_y threads each, and combines the threads' partials in a fixed
// tree in shared memory: no atomics, so results do not vary from run to run. Sums accumulate in
// fp32 (f64 for f64, i64 for integers); Var takes two passes (mean, then squared deviations),
// as the CPU does; Max/Min/ArgMax/ArgMin keep the CPU's winner: the first NaN, else the first
// of equal extremes.
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/cuda/reduce_plan.h"

namespace mantissa::backend::cuda {
namespace {

// The accumulator type of a sum: the CPU backend's (f64 for f64, i64 for integers, else fp32).
template <typename S>
using acc_t = std::conditional_t<std::is_same_v<S, double>, double,
                                 std::conditional_t<std::is_integral_v<S>, int64_t, float>>;

enum class SumKind : int { Sum, Mean, Var };

template <typename T>
__device__ __forceinline__ bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return v != v;
  } else {
    return false;
  }
}

// Sums of a block's block_y threads per output column, combined as a fixed tree. `smem` holds
// blockDim.x * blockDim.y values; every thread of column x gets the total.
template <typename A>
__device__ A column_sum(A v, A* smem) {
  const int x = threadIdx.x, y = threadIdx.y, bx = blockDim.x;
  smem[y * bx + x] = v;
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s >>= 1) {
    if (y < s) smem[y * bx + x] += smem[(y + s) * bx + x];
    __syncthreads();
  }
  const A total = smem[x];
  __syncthreads();  // smem is reused by the caller's next column_sum
  return total;
}

template <typename S, typename O>
__global__ void sum_kernel(const S* __restrict__ x, O* __restrict__ out, ReducePlan p, SumKind kind,
                           int64_t correction) {
  using A = acc_t<S>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  // The loop bound is the same for every thread of the block (column_sum synchronizes).
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < p.n_out; base += stride) {
    const int64_t o = base + threadIdx.x;
    const bool active = o < p.n_out;
    const int64_t off = active ? p.kept.offset(o) : 0;
    A s = 0;
    if (active) {
      for (int64_t r = threadIdx.y; r < p.n_red; r += blockDim.y)
        s += A(load(x + off + p.red.offset(r)));
    }
    s = column_sum(s, smem);
    A result = s;
    if (kind == SumKind::Mean) {
      if (p.n_red == 0) {
        if constexpr (std::is_floating_point_v<A>) result = A(NAN);
      } else {
        result = s / A(p.n_red);
      }
    } else if (kind == SumKind::Var) {
      const A mean = p.n_red ? s / A(p.n_red) : A(0);
      A ss = 0;
      if (active) {
        for (int64_t r = threadIdx.y; r < p.n_red; r += blockDim.y) {
          const A d = A(load(x + off + p.red.offset(r))) - mean;
          ss += d * d;
        }
      }
      ss = column_sum(ss, smem);
      if (p.n_red - correction <= 0) {
        if constexpr (std::is_floating_point_v<A>) result = A(NAN);
      } else {
        result = ss / A(p.n_red - correction);
      }
    }
    if (active && threadIdx.y == 0) store(out + o, result);
  }
}

// A candidate winner: the value and its index along the reduction (-1: none yet).
template <typename C>
struct Extreme {
  C v;
  int64_t i;
};

// The CPU's rule as an associative, commutative combination: the NaN of lowest index, else the
// extreme value of lowest index. A fixed tree of these gives the CPU's sequential answer.
template <typename C>
__device__ __forceinline__ Extreme<C> better(Extreme<C> a, Extreme<C> b, bool want_max) {
  if (a.i < 0) return b;
  if (b.i < 0) return a;
  const bool an = is_nan(a.v), bn = is_nan(b.v);
  if (an || bn) {
    if (an && bn) return a.i < b.i ? a : b;
    return an ? a : b;
  }
  if (want_max ? a.v > b.v : a.v < b.v) return a;
  if (want_max ? b.v > a.v : b.v < a.v) return b;
  return a.i < b.i ? a : b;
}

// values may be null (ArgMax/ArgMin); indices may be null (Max/Min without indices).
template <typename S>
__global__ void extreme_kernel(const S* __restrict__ x, S* __restrict__ values,
                               int64_t* __restrict__ indices, ReducePlan p, bool want_max) {
  using C = compute_t<S>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Extreme<C>* smem = reinterpret_cast<Extreme<C>*>(smem_raw);
  const int bx = blockDim.x, tx = threadIdx.x, ty = threadIdx.y;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t base = int64_t(blockIdx.x) * blockDim.x; base < p.n_out; base += stride) {
    const int64_t o = base + tx;
    const bool active = o < p.n_out;
    Extreme<C> e{C(0), -1};
    if (active) {
      const int64_t off = p.kept.offset(o);
      for (int64_t r = ty; r < p.n_red; r += blockDim.y)
        e = better(e, Extreme<C>{load(x + off + p.red.offset(r)), r}, want_max);
    }
    smem[ty * bx + tx] = e;
    __syncthreads();
    for (int s = blockDim.y / 2; s > 0; s >>= 1) {
      if (ty < s)
        smem[ty * bx + tx] = better(smem[ty * bx + tx], smem[(ty + s) * bx + tx], want_max);
      __syncthreads();
    }
    if (active && ty == 0) {
      const Extreme<C> w = smem[tx];
      if (values) store(values + o, w.v);
      if (indices) indices[o] = w.i;
    }
    __syncthreads();  // smem is rewritten by the next round
  }
}

unsigned blocks_for(const ReducePlan& p) {
  const int64_t blocks = (p.n_out + p.block_x - 1) / p.block_x;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t(1) << 30));
}

}  // namespace

void CudaBackend::reduce(ReduceOp op, const Tensor& x, std::span<const int> dims, Tensor& out,
                         Tensor* indices, int64_t correction) {
  const DeviceGuard guard(device_);
  const ReducePlan p = plan_reduce(x.shape(), x.strides(), dims);
  const bool is_arg = reduce_info(op).kind == ReduceKind::Index;
  const bool is_extreme = reduce_info(op).kind != ReduceKind::Accumulate;
  MT_CHECK(p.n_red > 0 || op == ReduceOp::Sum || op == ReduceOp::Mean, "cannot take the ",
           op == ReduceOp::Var ? "variance" : "max/min", " of an empty dimension of a ",
           x.describe());
  MT_CHECK(x.dtype() != DType::Bool,
           "reductions of bool tensors are not supported; cast to an integer dtype");
  MT_ASSERT(out.is_contiguous() && out.numel() == p.n_out, "reduce output ", out.describe(),
            " for ", p.n_out, " results");
  if (p.n_out == 0) return;
  const cudaStream_t stream = stream_for(device_);
  const dim3 block(unsigned(p.block_x), unsigned(p.block_y));
  const unsigned grid = blocks_for(p);

  if (is_extreme) {
    int64_t* idx = nullptr;
    if (is_arg) {
      MT_ASSERT(out.dtype() == DType::I64, "arg reductions write I64, got ", out.describe());
      idx = device_ptr<int64_t>(out);
    } else if (indices && indices->defined()) {
      MT_ASSERT(
          indices->dtype() == DType::I64 && indices->is_contiguous() && indices->numel() == p.n_out,
          "reduce indices ", indices->describe());
      idx = device_ptr<int64_t>(*indices);
    }
    if (!is_arg) {
      MT_ASSERT(out.dtype() == x.dtype(), "max/min output ", out.describe(), " for ", x.describe());
    }
    dispatch_all(x.dtype(), "reduce", [&](auto tag) {
      using S = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<S, bool>) {
        using C = compute_t<S>;
        const size_t smem = size_t(p.block_x) * p.block_y * sizeof(Extreme<C>);
        extreme_kernel<S><<<grid, block, smem, stream>>>(device_ptr<const S>(x),
                                                         is_arg ? nullptr : device_ptr<S>(out), idx,
                                                         p, reduce_info(op).picks_max);
        MT_CUDA_CHECK_LAUNCH();
      }
    });
    return;
  }

  const SumKind kind = op == ReduceOp::Sum    ? SumKind::Sum
                       : op == ReduceOp::Mean ? SumKind::Mean
                                              : SumKind::Var;
  MT_ASSERT(op == ReduceOp::Sum || op == ReduceOp::Mean || op == ReduceOp::Var, "reduce op");
  dispatch_all(x.dtype(), "reduce", [&](auto tag) {
    using S = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<S, bool>) {
      using A = acc_t<S>;
      const size_t smem = size_t(p.block_x) * p.block_y * sizeof(A);
      auto launch = [&](auto* o) {
        sum_kernel<<<grid, block, smem, stream>>>(device_ptr<const S>(x), o, p, kind, correction);
        MT_CUDA_CHECK_LAUNCH();
      };
      if constexpr (std::is_integral_v<S>) {
        // Integer sums are exact in i64 (the op layer's sum dtype); other results keep S.
        if (out.dtype() == DType::I64) {
          launch(device_ptr<int64_t>(out));
        } else {
          MT_ASSERT(out.dtype() == x.dtype(), "reduce output ", out.describe(), " for ",
                    x.describe());
          launch(device_ptr<S>(out));
        }
      } else {
        MT_ASSERT(out.dtype() == x.dtype(), "reduce output ", out.describe(), " for ",
                  x.describe());
        launch(device_ptr<S>(out));
      }
    }
  });
}

}  // namespace mantissa::backend::cuda
