// Internal: the CPU elementwise engine. Storage and compute types are separate: each chunk of
// inputs is loaded into compute-type buffers (vectorized conversion for contiguous half data,
// strided gathers for views and broadcasts), the op runs on plain arrays the compiler
// vectorizes, and the result is rounded (RNE) into the output's storage type. Chunks are spread
// over OpenMP threads for large tensors.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/dispatch.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/convert.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend::cpu {

inline constexpr int64_t kChunk = 2048;           // elements per chunk (fits L1 per buffer)
inline constexpr int64_t kParallelGrain = 32768;  // below this, one thread

// The compute type of a storage type, from the dtype list's compute column: float for f32 and
// every half/fp8 type, double for f64, the type itself for integers and bool.
template <typename T>
using compute_t = typename DTypeTraits<dtype_of_v<T>>::compute_type;

// is_small_float_v<T> (numerics/types.h): the storage types converted through round.h's
// encoders and the vectorized converters, never by a C++ cast.

template <typename T, typename C>
inline C load_one(const T* p) {
  if constexpr (is_small_float_v<T>) {
    return static_cast<C>(float(*p));
  } else {
    return static_cast<C>(*p);
  }
}

// Contiguous storage -> compute.
template <typename T, typename C>
inline void load_contiguous(const T* src, C* dst, int64_t n) {
  if constexpr (std::is_same_v<T, C>) {
    std::memcpy(dst, src, size_t(n) * sizeof(T));
  } else if constexpr (is_small_float_v<T> && std::is_same_v<C, float>) {
    convert(src, dst, size_t(n));
  } else {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = load_one<T, C>(src + i);
  }
}

// Compute -> contiguous storage, rounding to nearest even.
template <typename C, typename T>
inline void store_contiguous(const C* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, C>) {
    std::memcpy(dst, src, size_t(n) * sizeof(T));
  } else if constexpr (is_small_float_v<T> && std::is_same_v<C, float>) {
    convert(src, dst, size_t(n));
  } else if constexpr (is_small_float_v<T>) {
    // From double or an integer: one rounding, straight from double.
    for (int64_t i = 0; i < n; ++i) {
      dst[i] = T::from_bits(typename T::bits_type(encode(T::format, static_cast<double>(src[i]))));
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = src[i] != C(0);
  } else {
    for (int64_t i = 0; i < n; ++i)
      dst[i] = static_cast<T>(src[i]);
  }
}

// An input seen in the output's shape: strides (in elements) with 0 on broadcast dims.
struct Operand {
  const char* base = nullptr;
  Shape strides;
  bool contiguous = false;  // element i of the output is element i here
};

inline Operand operand_for(const Tensor& t, const Shape& out_shape) {
  Operand op;
  op.base = static_cast<const char*>(t.data_ptr());
  const int n = out_shape.size(), lead = n - t.dim();
  op.strides = Shape::filled(n, 0);
  for (int i = 0; i < t.dim(); ++i) {
    op.strides[lead + i] = t.size(i) == 1 && out_shape[lead + i] != 1 ? 0 : t.stride(i);
  }
  op.contiguous = t.shape() == out_shape && t.is_contiguous();
  return op;
}

// Loads elements [start, start + n) of the output's row-major order from a strided operand.
template <typename T, typename C>
void gather_chunk(const Operand& op, const Shape& shape, int64_t start, int64_t n, C* dst) {
  const T* base = reinterpret_cast<const T*>(op.base);
  if (op.contiguous) {
    load_contiguous<T, C>(base + start, dst, n);
    return;
  }
  const int nd = shape.size();
  if (nd == 0) {
    dst[0] = load_one<T, C>(base);
    return;
  }
  std::array<int64_t, kMaxDims> idx{};
  int64_t rem = start, off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    idx[size_t(d)] = rem % shape[d];
    rem /= shape[d];
    off += idx[size_t(d)] * op.strides[d];
  }
  const int64_t inner = shape[nd - 1], inner_stride = op.strides[nd - 1];
  int64_t i = 0;
  while (i < n) {
    const int64_t run = std::min(inner - idx[size_t(nd - 1)], n - i);
    if (inner_stride == 0) {
      const C v = load_one<T, C>(base + off);
      std::fill(dst + i, dst + i + run, v);
    } else if (inner_stride == 1) {
      load_contiguous<T, C>(base + off, dst + i, run);
    } else {
      for (int64_t k = 0; k < run; ++k)
        dst[i + k] = load_one<T, C>(base + off + k * inner_stride);
    }
    i += run;
    off += run * inner_stride;
    idx[size_t(nd - 1)] += run;
    for (int d = nd - 1; d > 0 && idx[size_t(d)] == shape[d]; --d) {
      off -= shape[d] * op.strides[d];
      idx[size_t(d)] = 0;
      ++idx[size_t(d - 1)];
      off += op.strides[d - 1];
    }
  }
}

// Runs f over chunks [start, start+n) of [0, total), in parallel when large.
template <typename F>
void parallel_chunks(int64_t total, F f) {
  const int64_t chunks = (total + kChunk - 1) / kChunk;
  if (total < kParallelGrain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (int64_t c = 0; c < chunks; ++c)
      f(c * kChunk, std::min(kChunk, total - c * kChunk));
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    f(c * kChunk, std::min(kChunk, total - c * kChunk));
}

// body(i, scratch) for i in [0, n), spread over OpenMP threads when `work` (elements touched) is
// large; each thread owns one scratch buffer of `scratch` values. Iterations must write
// disjoint outputs.
template <typename S, typename F>
void parallel_rows(int64_t n, int64_t work, int64_t scratch, F body) {
  const bool parallel =
      work >= kParallelGrain && n > 1 && omp_get_max_threads() > 1 && !omp_in_parallel();
#pragma omp parallel if (parallel)
  {
    std::vector<S> buf(static_cast<size_t>(scratch));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      body(i, buf.data());
  }
}

// out = f(inputs...) elementwise with broadcasting. T: storage type of the inputs, C: compute
// type, O: storage type of out (contiguous). f(C* out, const C* in0, ..., int64_t n).
template <typename T, typename C, typename O, size_t N, typename F>
void elementwise(Tensor& out, const std::array<const Tensor*, N>& inputs, F f) {
  MT_ASSERT(out.is_contiguous(), "elementwise output must be contiguous");
  const Shape shape = out.shape();
  const int64_t total = out.numel();
  std::array<Operand, N> ops;
  for (size_t k = 0; k < N; ++k)
    ops[k] = operand_for(*inputs[k], shape);
  O* out_data = static_cast<O*>(out.data_ptr());
  parallel_chunks(total, [&](int64_t start, int64_t n) {
    alignas(64) C in_buf[N][kChunk];
    alignas(64) C out_buf[kChunk];
    std::array<const C*, N> in_ptr;
    for (size_t k = 0; k < N; ++k) {
      if constexpr (std::is_same_v<T, C>) {
        if (ops[k].contiguous) {
          in_ptr[k] = reinterpret_cast<const C*>(ops[k].base) + start;
          continue;
        }
      }
      gather_chunk<T, C>(ops[k], shape, start, n, in_buf[k]);
      in_ptr[k] = in_buf[k];
    }
    C* dst = out_buf;
    if constexpr (std::is_same_v<O, C>) dst = out_data + start;
    std::apply([&](auto... p) { f(dst, p..., n); }, in_ptr);
    if constexpr (!std::is_same_v<O, C>) store_contiguous<C, O>(out_buf, out_data + start, n);
  });
}

// random_bits(seed, offset, i) for increasing i, computing each Philox block once.
class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, uint64_t offset) : seed_(seed), offset_(offset) {}
  uint32_t operator()(uint64_t i) {
    const uint64_t block = i >> 2;
    if (block != block_) {
      block_ = block;
      words_ = philox4x32_10(
          {uint32_t(block), uint32_t(block >> 32), uint32_t(offset_), uint32_t(offset_ >> 32)},
          {uint32_t(seed_), uint32_t(seed_ >> 32)});
    }
    return words_[i & 3];
  }

 private:
  uint64_t seed_, offset_;
  uint64_t block_ = ~uint64_t(0);
  PhiloxBlock words_{};
};

// Calls f.template operator()<T>() with T the storage type of dtype (dispatch.h's switch).
template <typename F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  return switch_dtype<DTypeSet::All, DTypeTraits>(
      dtype, [&]<typename S>(Tag<S>) -> decltype(auto) { return f.template operator()<S>(); },
      [&]() -> decltype(auto) {
        MT_ASSERT(false, "unknown dtype");
        return f.template operator()<float>();
      });
}

// Floating dtypes only (the ops that need real numbers): the list's rows of kind Float.
template <typename F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  return switch_dtype<DTypeSet::Float, DTypeTraits>(
      dtype, [&]<typename S>(Tag<S>) -> decltype(auto) { return f.template operator()<S>(); },
      [&]() -> decltype(auto) {
        MT_CHECK(false, op, " needs a floating tensor, got ", dtype_name(dtype));
        return f.template operator()<float>();
      });
}

}  // namespace mantissa::backend::cpu
