// CPU reductions over any set of dims. The reduced dims are moved last, so every output element
// reduces one "row"; rows that are contiguous in memory are read in place, otherwise the input is
// first gathered (in its compute type) into row-major order. Sums accumulate in fp32 (f64 for
// f64) with SIMD partial sums per chunk; results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/stored.h"
#include "backend/cpu/vector_isa.h"

namespace mantissa::backend::cpu {
namespace {

#define MT_ISA_LOOPS "backend/cpu/reduce_rows.inc"
#include "backend/cpu/isa_builds.inc"

template <typename T>
void add_rows(const T* x, int64_t n, int64_t ld, int64_t nc, float* a) {
  MT_ISA_CALL(add_rows<T>(x, n, ld, nc, a));
}

template <typename A, typename C>
A sum_row(const C* x, int64_t n) {
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i)
    s += A(x[i]);
  return s;
}

// One row: x[0..n) in compute type C (already loaded). Returns the result in A and, for
// Max/Min/ArgMax/ArgMin, the index of the first winner (NaN wins, as in PyTorch).
template <typename A, typename C>
A reduce_row(ReduceOp op, const C* x, int64_t n, int64_t correction, int64_t* index) {
  switch (op) {
    case ReduceOp::Sum:
      return sum_row<A>(x, n);
    case ReduceOp::Mean:
      return n ? sum_row<A>(x, n) / A(n) : A(NAN);
    case ReduceOp::Var: {
      if (n - correction <= 0) return A(NAN);
      const A mean = sum_row<A>(x, n) / A(n);
      A ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < n; ++i)
        ss += (A(x[i]) - mean) * (A(x[i]) - mean);
      return ss / A(n - correction);
    }
    default:
      break;
  }
  const bool want_max = reduce_info(op).picks_max;
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    const C v = x[i], b = x[best];
    if (b != b) break;  // NaN already won
    if (v != v || (want_max ? v > b : v < b)) best = i;
  }
  if (index) *index = best;
  return A(x[best]);
}

// Moves `dims` to the end: the permutation and the (kept, reduced) sizes.
void split_dims(const Tensor& x, std::span<const int> dims, std::vector<int64_t>& perm,
                int64_t& rows, int64_t& row_len) {
  std::vector<bool> reduced(size_t(x.dim()), false);
  for (int d : dims)
    reduced[size_t(d)] = true;
  rows = 1;
  row_len = 1;
  for (int d = 0; d < x.dim(); ++d) {
    if (!reduced[size_t(d)]) {
      perm.push_back(d);
      rows *= x.size(d);
    }
  }
  for (int d = 0; d < x.dim(); ++d) {
    if (reduced[size_t(d)]) {
      perm.push_back(d);
      row_len *= x.size(d);
    }
  }
}

// out[j] = sum_r x[r, j] (or the mean) for x (n_rows, cols) contiguous. Threads split the
// columns, each summing its columns over all rows in row order: the result does not depend on
// the thread count (nor on the block width, which follows it). A bias gradient has a few hundred
// columns: blocks of at most 512, and as many as there are threads, so that one does not run it
// alone (it did: 1.5 % of a 2-thread GPT-2 tiny step with the other thread waiting).
template <typename T, typename C, typename A>
void reduce_leading(const T* x, int64_t n_rows, int64_t cols, bool mean, Tensor& out) {
  constexpr int64_t kCols = 512, kLanes = 16;
  std::unique_ptr<A[]> acc(new A[size_t(cols)]);
  const bool parallel =
      n_rows * cols >= kParallelGrain && omp_get_max_threads() > 1 && !omp_in_parallel();
  const int64_t per_thread = (cols + omp_get_max_threads() - 1) / omp_get_max_threads();
  const int64_t width =
      parallel ? std::clamp((per_thread + kLanes - 1) / kLanes * kLanes, kLanes, kCols) : kCols;
  const int64_t blocks = (cols + width - 1) / width;
#pragma omp parallel for schedule(static) if (parallel && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * width, nc = std::min(width, cols - c0);
    // Summed in the thread's own lines: a shared accumulator's line that straddles two blocks
    // went back and forth between the cores once per row (measured 1.7x slower on 2 threads).
    alignas(64) A a[kCols];
    std::fill(a, a + nc, A(0));
    if constexpr (std::is_same_v<A, float> && kStoredInLoop<T>) {
      add_rows<T>(x + c0, n_rows, cols, nc, a);
    } else {
      alignas(64) C row[kCols];
      for (int64_t r = 0; r < n_rows; ++r) {
        const T* src = x + r * cols + c0;
        const C* v = reinterpret_cast<const C*>(src);
        if constexpr (!std::is_same_v<T, C>) {
          load_contiguous<T, C>(src, row, nc);
          v = row;
        }
#pragma omp simd
        for (int64_t j = 0; j < nc; ++j)
          a[j] += A(v[j]);
      }
    }
    if (mean) {
      for (int64_t j = 0; j < nc; ++j)
        a[j] /= A(n_rows);
    }
    std::copy(a, a + nc, acc.get() + c0);
  }
  dispatch_dtype(out.dtype(), [&]<typename O>() {
    if constexpr (std::is_same_v<A, int64_t> && is_small_float_v<O>) {
      MT_ASSERT(false, "integer reduction into a half dtype");
    } else {
      store_contiguous<A, O>(acc.get(), static_cast<O*>(out.data_ptr()), cols);
    }
  });
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, std::span<const int> dims, Tensor& out,
                        Tensor* indices, int64_t correction) {
  std::vector<int64_t> perm;
  int64_t rows = 0, row_len = 0;
  split_dims(x, dims, perm, rows, row_len);
  const ReduceKind kind = reduce_info(op).kind;
  const bool is_arg = kind == ReduceKind::Index;
  const bool wants_index = is_arg || (kind == ReduceKind::Select && indices && indices->defined());
  MT_CHECK(row_len > 0 || op == ReduceOp::Sum || op == ReduceOp::Mean, "cannot take the ",
           op == ReduceOp::Var ? "variance" : "max/min", " of an empty dimension of a ",
           x.describe());
  int64_t* idx_out = nullptr;
  if (is_arg) {
    idx_out = static_cast<int64_t*>(out.data_ptr());
  } else if (wants_index) {
    idx_out = static_cast<int64_t*>(indices->data_ptr());
  }

  dispatch_dtype(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    using A = std::conditional_t<std::is_same_v<C, double>, double,
                                 std::conditional_t<std::is_floating_point_v<C>, float, int64_t>>;
    if constexpr (std::is_same_v<T, bool>) {
      MT_CHECK(false, "reductions of bool tensors are not supported; cast to an integer dtype");
    } else {
      // Sum/mean over leading dims of a contiguous tensor (a bias gradient: (N, M) -> (M)):
      // add whole rows into an accumulator, vectorized along the kept dims, no transpose.
      const bool leading =
          x.is_contiguous() && !dims.empty() && dims.back() == int(dims.size()) - 1;
      if (leading && (op == ReduceOp::Sum || op == ReduceOp::Mean) && rows > 1) {
        reduce_leading<T, C, A>(static_cast<const T*>(x.data_ptr()), row_len, rows,
                                op == ReduceOp::Mean, out);
        return;
      }
      // The reduced view, gathered into row-major (rows, row_len) unless it already is.
      const Tensor pv = x.detach().permute(perm);
      const bool in_place = std::is_same_v<T, C> && pv.is_contiguous();
      std::unique_ptr<C[]> gathered;  // uninitialized: every element is written
      const C* data = nullptr;
      if (in_place) {
        data = static_cast<const C*>(pv.data_ptr());
      } else {
        gathered.reset(new C[size_t(rows * row_len)]);
        const Operand opnd = operand_for(pv, pv.shape());
        parallel_chunks(rows * row_len, [&](int64_t start, int64_t n) {
          gather_chunk<T, C>(opnd, pv.shape(), start, n, gathered.get() + start);
        });
        data = gathered.get();
      }
      auto run_row = [&](int64_t r, A* result) {
        int64_t index = 0;
        *result = reduce_row<A, C>(op, data + r * row_len, row_len, correction, &index);
        if (idx_out) idx_out[r] = index;
      };
      if (is_arg) {
        A dummy;
#pragma omp parallel for schedule(static) if (rows * row_len >= kParallelGrain && rows > 1)
        for (int64_t r = 0; r < rows; ++r)
          run_row(r, &dummy);
        return;
      }
      std::vector<A> results(static_cast<size_t>(rows));
      if (rows == 1 && row_len >= kParallelGrain && (op == ReduceOp::Sum || op == ReduceOp::Mean)) {
        // One long row: per-chunk partial sums, combined in chunk order (deterministic).
        const int64_t chunks = (row_len + kChunk - 1) / kChunk;
        std::vector<A> partial(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < chunks; ++c) {
          partial[size_t(c)] =
              sum_row<A>(data + c * kChunk, std::min(kChunk, row_len - c * kChunk));
        }
        A s = 0;
        for (A p : partial)
          s += p;
        results[0] = op == ReduceOp::Mean ? s / A(row_len) : s;
      } else {
#pragma omp parallel for schedule(static) if (rows * row_len >= kParallelGrain && rows > 1)
        for (int64_t r = 0; r < rows; ++r)
          run_row(r, &results[size_t(r)]);
      }
      dispatch_dtype(out.dtype(), [&]<typename O>() {
        if constexpr (std::is_same_v<A, int64_t> && is_small_float_v<O>) {
          MT_ASSERT(false, "integer reduction into a half dtype");
        } else {
          store_contiguous<A, O>(results.data(), static_cast<O*>(out.data_ptr()), rows);
        }
      });
    }
  });
}

}  // namespace mantissa::backend::cpu
