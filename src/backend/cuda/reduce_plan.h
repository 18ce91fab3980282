// Internal, host side of the CUDA reductions (reduce.cu): how a reduction over any sorted dims of
// any strided input is laid out for the kernel. Plain C++ with no CUDA headers, so the planning
// is tested on machines without a GPU (tests/backend/cuda_reduce_norm_test.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

#include "mantissa/core/error.h"
#include "mantissa/core/shape.h"

namespace mantissa::backend::cuda {

// Output element o (row-major over the kept dims, i.e. the keepdim output's contiguous order)
// reduces the elements r = 0 .. n_red-1 (row-major over the reduced dims, so an arg index is the
// one the CPU backend reports) at input offset kept.offset(o) + red.offset(r).
// Size-1 dims are dropped and neighbouring dims that step through memory as one are merged, which
// leaves the row-major numbering of both sides unchanged.
struct DimWalk {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  // Element offset of the linear index i (row-major over sizes).
  constexpr int64_t offset(int64_t i) const {
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      off += (i % sizes[d]) * strides[d];
      i /= sizes[d];
    }
    return off;
  }
  constexpr int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d)
      n *= sizes[d];
    return n;
  }
  // Appends an outer-to-inner dim, merged into the previous one when they step as one.
  constexpr void push(int64_t size, int64_t stride) {
    if (size == 1) return;
    if (ndim > 0 && strides[ndim - 1] == stride * size) {
      sizes[ndim - 1] *= size;
      strides[ndim - 1] = stride;
      return;
    }
    sizes[ndim] = size;
    strides[ndim] = stride;
    ++ndim;
  }
};

// Threads per block of the reduction kernels (at most): block_x output elements side by side,
// each reduced by block_y threads (both powers of two, block_x * block_y <= kReduceThreads).
inline constexpr int kReduceThreads = 256;

struct ReducePlan {
  DimWalk kept, red;
  int64_t n_out = 1, n_red = 1;
  int block_x = 1, block_y = kReduceThreads;
};

constexpr int pow2_at_least(int64_t n, int cap) {
  int p = 1;
  while (p < cap && p < n)
    p <<= 1;
  return p;
}

// sizes/strides: the input's; dims: sorted, unique, in range (the op layer's normalize_dims).
inline ReducePlan plan_reduce(std::span<const int64_t> sizes, std::span<const int64_t> strides,
                              std::span<const int> dims) {
  MT_ASSERT(sizes.size() == strides.size() && sizes.size() <= size_t(kMaxDims),
            "plan_reduce: ", sizes.size(), " sizes, ", strides.size(), " strides");
  ReducePlan p;
  size_t next = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    const bool reduced = next < dims.size() && dims[next] == int(d);
    if (reduced) ++next;
    (reduced ? p.red : p.kept).push(sizes[d], strides[d]);
  }
  MT_ASSERT(next == dims.size(), "plan_reduce: dims not sorted, unique and below ", sizes.size());
  p.n_out = p.kept.numel();
  p.n_red = p.red.numel();
  // Neighbouring threads should read neighbouring memory: along the reduction when its innermost
  // dim is contiguous (or nothing else is), across outputs when theirs is (a bias gradient's
  // reduction over leading dims).
  const bool red_inner = p.red.ndim > 0 && p.red.strides[p.red.ndim - 1] == 1;
  const bool kept_inner = p.kept.ndim > 0 && p.kept.strides[p.kept.ndim - 1] == 1;
  // Neither side gets more threads than it has elements (a lone output of a short row).
  if (kept_inner && !red_inner) {
    p.block_x = pow2_at_least(p.n_out, 32);
    p.block_y = std::min(kReduceThreads / p.block_x, pow2_at_least(p.n_red, kReduceThreads));
  } else {
    p.block_y = pow2_at_least(p.n_red, kReduceThreads);
    p.block_x = std::min(kReduceThreads / p.block_y, pow2_at_least(p.n_out, kReduceThreads));
  }
  return p;
}

inline ReducePlan plan_reduce(const Shape& sizes, const Shape& strides, std::span<const int> dims) {
  return plan_reduce(std::span<const int64_t>(sizes.begin(), size_t(sizes.size())),
                     std::span<const int64_t>(strides.begin(), size_t(strides.size())), dims);
}

}  // namespace mantissa::backend::cuda
