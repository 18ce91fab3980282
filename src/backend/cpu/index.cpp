// CPU indexing kernels: index_select / index_add (embedding and its gradient) and
// gather / scatter_add. Inputs arrive contiguous; each is viewed as (outer, dim, inner).
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/shapes.h"

namespace mantissa::backend::cpu {
namespace {

void check_index(int64_t i, int64_t n, const Tensor& x, int dim) {
  MT_CHECK(i >= 0 && i < n, "index ", i, " is out of range for dim ", dim, " of size ", n, " of a ",
           x.describe());
}

}  // namespace

void CpuBackend::index_select(const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  MT_ASSERT(x.is_contiguous() && index.is_contiguous() && out.is_contiguous(),
            "index_select layout");
  const DimSplit sx = split_around(x, dim);
  const int64_t* idx = static_cast<const int64_t*>(index.data_ptr());
  const int64_t m = index.numel();
  for (int64_t j = 0; j < m; ++j)
    check_index(idx[j], sx.n, x, dim);
  const size_t row = size_t(sx.inner) * x.element_size();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
#pragma omp parallel for collapse(2) schedule(static) if (sx.outer * m * sx.inner >= kParallelGrain)
  for (int64_t o = 0; o < sx.outer; ++o) {
    for (int64_t j = 0; j < m; ++j) {
      std::memcpy(dst + size_t(o * m + j) * row, src + size_t(o * sx.n + idx[j]) * row, row);
    }
  }
}

void CpuBackend::index_add(Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out) {
  MT_ASSERT(grad_x.is_contiguous() && index.is_contiguous() && grad_out.is_contiguous(),
            "index_add layout");
  MT_ASSERT(grad_x.dtype() == grad_out.dtype(), "index_add dtypes");
  const DimSplit sx = split_around(grad_x, dim);
  const int64_t* idx = static_cast<const int64_t*>(index.data_ptr());
  const int64_t m = index.numel();
  for (int64_t j = 0; j < m; ++j)
    check_index(idx[j], sx.n, grad_x, dim);
  dispatch_dtype(grad_x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    T* gx = static_cast<T*>(grad_x.data_ptr());
    const T* go = static_cast<const T*>(grad_out.data_ptr());
    // Parallel over the inner dimension only: rows hit by repeated indices are summed in index
    // order by one thread each, so the result does not depend on the thread count.
#pragma omp parallel for schedule(static) if (sx.outer * m * sx.inner >= kParallelGrain)
    for (int64_t i = 0; i < sx.inner; ++i) {
      for (int64_t o = 0; o < sx.outer; ++o) {
        for (int64_t j = 0; j < m; ++j) {
          T& dst = gx[(o * sx.n + idx[j]) * sx.inner + i];
          const C v = load_one<T, C>(&dst) + load_one<T, C>(go + (o * m + j) * sx.inner + i);
          store_contiguous<C, T>(&v, &dst, 1);
        }
      }
    }
  });
}

void CpuBackend::gather(const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  MT_ASSERT(x.is_contiguous() && index.is_contiguous() && out.is_contiguous(), "gather layout");
  const DimSplit sx = split_around(x, dim), si = split_around(index, dim);
  const int64_t* idx = static_cast<const int64_t*>(index.data_ptr());
  const size_t es = x.element_size();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int64_t o = 0; o < si.outer; ++o) {
    for (int64_t j = 0; j < si.n; ++j) {
      for (int64_t i = 0; i < si.inner; ++i) {
        const int64_t k = (o * si.n + j) * si.inner + i;
        check_index(idx[k], sx.n, x, dim);
        std::memcpy(dst + size_t(k) * es, src + size_t((o * sx.n + idx[k]) * sx.inner + i) * es,
                    es);
      }
    }
  }
}

void CpuBackend::scatter_add(Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out) {
  MT_ASSERT(grad_x.is_contiguous() && index.is_contiguous() && grad_out.is_contiguous(),
            "scatter_add layout");
  MT_ASSERT(grad_x.dtype() == grad_out.dtype(), "scatter_add dtypes");
  const DimSplit sx = split_around(grad_x, dim), si = split_around(index, dim);
  const int64_t* idx = static_cast<const int64_t*>(index.data_ptr());
  dispatch_dtype(grad_x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    T* gx = static_cast<T*>(grad_x.data_ptr());
    const T* go = static_cast<const T*>(grad_out.data_ptr());
    for (int64_t o = 0; o < si.outer; ++o) {
      for (int64_t j = 0; j < si.n; ++j) {
        for (int64_t i = 0; i < si.inner; ++i) {
          const int64_t k = (o * si.n + j) * si.inner + i;
          check_index(idx[k], sx.n, grad_x, dim);
          T& d = gx[(o * sx.n + idx[k]) * sx.inner + i];
          const C v = load_one<T, C>(&d) + load_one<T, C>(go + k);
          store_contiguous<C, T>(&v, &d, 1);
        }
      }
    }
  });
}

}  // namespace mantissa::backend::cpu
