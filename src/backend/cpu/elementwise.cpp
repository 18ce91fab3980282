// CPU elementwise kernels: copies and casts, fills, random fills, unary/binary ops and their
// derivatives, where, dropout. One templated loop per family (loops.h), instantiated per dtype.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numbers>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/stored.h"
#include "backend/cpu/vec_math.h"
#include "backend/cpu/vector_isa.h"
#include "backend/lstm_math.h"
#include "backend/op_math.h"
#include "mantissa/numerics/philox.h"

namespace mantissa::backend::cpu {
namespace {

template <typename C>
op_math::UnaryArgs<C> unary_args(Scalars s) {
  return {C(s.a), C(s.b), s.a == 2.0};
}

// The loops, compiled once for the baseline, AVX2 and AVX-512 (vector_isa.h).
#define MT_ISA_LOOPS "backend/cpu/elementwise_loops.inc"
#include "backend/cpu/isa_builds.inc"

template <typename C>
void run_unary(UnaryOp op, C* y, const C* x, int64_t n, Scalars s) {
  MT_ISA_CALL(run_unary<C>(op, y, x, n, s));
}

template <typename C>
void run_unary_backward(UnaryOp op, C* gx, const C* g, const C* x, const C* y, int64_t n,
                        Scalars s) {
  MT_ISA_CALL(run_unary_backward<C>(op, gx, g, x, y, n, s));
}

template <typename C>
void run_binary(BinaryOp op, C* o, const C* a, const C* b, int64_t n) {
  MT_ISA_CALL(run_binary<C>(op, o, a, b, n));
}

template <typename S>
void run_unary_stored(UnaryOp op, S* y, const S* x, int64_t n, Scalars s) {
  MT_ISA_CALL(run_unary_stored<S>(op, y, x, n, s));
}

template <typename S>
void run_unary_backward_stored(UnaryOp op, S* gx, const S* g, const S* v, int64_t n, Scalars s) {
  MT_ISA_CALL(run_unary_backward_stored<S>(op, gx, g, v, n, s));
}

template <typename S>
void run_binary_stored(BinaryOp op, S* o, const S* a, const S* b, int64_t n) {
  MT_ISA_CALL(run_binary_stored<S>(op, o, a, b, n));
}

// f(out + start, in_0 + start, ..., n) over out's chunks, when every operand is contiguous in
// out's shape (element i of each is element i of the output), so that a bf16 op converts inside
// its loop (run_*_stored) rather than through float chunks; false, doing nothing, otherwise.
template <typename T, size_t N, typename F>
bool run_contiguous(Tensor& out, const std::array<const Tensor*, N>& ins, F f) {
  if (!out.is_contiguous()) return false;
  std::array<const T*, N> in;
  for (size_t k = 0; k < N; ++k) {
    if (ins[k]->shape() != out.shape() || !ins[k]->is_contiguous()) return false;
    in[k] = static_cast<const T*>(ins[k]->data_ptr());
  }
  T* o = static_cast<T*>(out.data_ptr());
  parallel_chunks(out.numel(), [&](int64_t start, int64_t n) {
    std::apply([&](auto... p) { f(o + start, (p + start)..., n); }, in);
  });
  return true;
}

template <typename C>
void run_lstm_cell_row(const C* z, const C* cp, C* acts, C* c, C* h, int64_t n) {
  if (cp != nullptr) {
    MT_ISA_CALL(lstm_cell_row<C, true>(z, cp, acts, c, h, n));
  } else {
    MT_ISA_CALL(lstm_cell_row<C, false>(z, cp, acts, c, h, n));
  }
}

template <typename C>
void run_lstm_cell_backward_row(const C* acts, const C* c, const C* cp, const C* dh, const C* dc,
                                C* dz, C* dcp, int64_t n) {
  if (cp != nullptr) {
    MT_ISA_CALL(lstm_cell_backward_row<C, true>(acts, c, cp, dh, dc, dz, dcp, n));
  } else {
    MT_ISA_CALL(lstm_cell_backward_row<C, false>(acts, c, cp, dh, dc, dz, dcp, n));
  }
}

template <typename G, typename S>
void run_lstm_cell_row_stored(const G* z, const float* za, const S* cp, S* acts, S* c, S* h,
                              int64_t n) {
  if (cp != nullptr && za != nullptr) {
    MT_ISA_CALL(lstm_cell_row_stored<G, S, true, true>(z, za, cp, acts, c, h, n));
  } else if (cp != nullptr) {
    MT_ISA_CALL(lstm_cell_row_stored<G, S, true, false>(z, za, cp, acts, c, h, n));
  } else if (za != nullptr) {
    MT_ISA_CALL(lstm_cell_row_stored<G, S, false, true>(z, za, cp, acts, c, h, n));
  } else {
    MT_ISA_CALL(lstm_cell_row_stored<G, S, false, false>(z, za, cp, acts, c, h, n));
  }
}

template <typename G, typename S>
void run_lstm_cell_backward_row_stored(const S* acts, const S* c, const S* cp, const S* dh,
                                       const float* dha, const S* dc, G* dz, S* dcp, int64_t n) {
  if (cp != nullptr && dha != nullptr) {
    MT_ISA_CALL(
        lstm_cell_backward_row_stored<G, S, true, true>(acts, c, cp, dh, dha, dc, dz, dcp, n));
  } else if (cp != nullptr) {
    MT_ISA_CALL(
        lstm_cell_backward_row_stored<G, S, true, false>(acts, c, cp, dh, dha, dc, dz, dcp, n));
  } else if (dha != nullptr) {
    MT_ISA_CALL(
        lstm_cell_backward_row_stored<G, S, false, true>(acts, c, cp, dh, dha, dc, dz, dcp, n));
  } else {
    MT_ISA_CALL(
        lstm_cell_backward_row_stored<G, S, false, false>(acts, c, cp, dh, dha, dc, dz, dcp, n));
  }
}

#undef MT_ISA_CALL

// Walks rows [r0, r1) of a strided tensor's elements in row-major order (a row: the innermost
// dim): f(offset_in_elements, run_length, inner_stride) for each row.
template <typename F>
void for_each_run(const Tensor& t, int64_t r0, int64_t r1, F f) {
  const Shape& sh = t.shape();
  const Shape& st = t.strides();
  const int nd = sh.size();
  if (t.numel() == 0 || r0 >= r1) return;
  if (nd == 0) {
    f(int64_t(0), int64_t(1), int64_t(1));
    return;
  }
  std::array<int64_t, kMaxDims> idx{};
  int64_t off = 0;
  for (int64_t d = nd - 2, rest = r0; d >= 0; --d) {
    idx[size_t(d)] = rest % sh[d];
    rest /= sh[d];
    off += idx[size_t(d)] * st[d];
  }
  for (int64_t r = r0; r < r1; ++r) {
    f(off, sh[nd - 1], st[nd - 1]);
    for (int d = nd - 2; d >= 0; --d) {
      ++idx[size_t(d)];
      off += st[d];
      if (idx[size_t(d)] < sh[d]) break;
      off -= sh[d] * st[d];
      idx[size_t(d)] = 0;
    }
  }
}

template <typename F>
void for_each_run(const Tensor& t, F f) {
  const int64_t rows = t.dim() == 0 ? 1 : t.numel() / std::max<int64_t>(1, t.shape()[t.dim() - 1]);
  for_each_run(t, 0, rows, f);
}

// Whether no two elements of t share an address (no broadcast or overlapping strides): then its
// rows can be written by several threads at once.
bool elements_distinct(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size) of the dims that vary
  for (int d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(std::abs(t.strides()[d]), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t extent = 1;
  for (const auto& [stride, size] : dims) {
    if (stride < extent) return false;
    extent = stride * size;
  }
  return true;
}

// dst (any strides) = src (contiguous, same dtype and shape), element by element; rows spread
// over the threads when dst's elements are distinct and the copy is large (attention's stacked
// q/k/v gradients: one thread ran them alone, 0.7 % of a 2-thread GPT-2 tiny step).
void scatter_same_dtype(const Tensor& src, Tensor& dst) {
  const int64_t es = int64_t(dst.element_size());
  const char* s = static_cast<const char*>(src.data_ptr());
  char* d = static_cast<char*>(dst.data_ptr());
  const int64_t row = dst.dim() == 0 ? 1 : dst.shape()[dst.dim() - 1];
  const int64_t rows = row == 0 ? 0 : dst.numel() / row;
  auto copy_rows = [&](int64_t r0, int64_t r1) {
    int64_t i = r0 * row;
    for_each_run(dst, r0, r1, [&](int64_t off, int64_t run, int64_t stride) {
      if (stride == 1) {
        std::memcpy(d + off * es, s + i * es, size_t(run * es));
      } else {
        for (int64_t k = 0; k < run; ++k) {
          std::memcpy(d + (off + k * stride) * es, s + (i + k) * es, size_t(es));
        }
      }
      i += run;
    });
  };
  const int threads = omp_get_max_threads();
  if (dst.numel() < kParallelGrain || threads == 1 || omp_in_parallel() || rows < 2 ||
      !elements_distinct(dst)) {
    copy_rows(0, rows);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < threads; ++t)
    copy_rows(rows * t / threads, rows * (t + 1) / threads);
}

// Whether src (..., R, C) is the transpose of a contiguous (..., C, R) tensor: the view that
// .t() or transpose(-1, -2) makes of one.
bool is_transposed_contiguous(const Tensor& src) {
  const int nd = src.dim();
  if (nd < 2 || src.is_contiguous()) return false;
  const int64_t R = src.size(nd - 2), C = src.size(nd - 1);
  if (src.stride(nd - 2) != 1 || src.stride(nd - 1) != R) return false;
  int64_t expect = R * C;
  for (int d = nd - 3; d >= 0; --d) {
    if (src.size(d) != 1 && src.stride(d) != expect) return false;
    expect *= src.size(d);
  }
  return true;
}

// dst (..., R, C) contiguous = src, the transpose of a contiguous (..., C, R) tensor of the same
// dtype, in tiles of 32 x 32 elements, so that both sides are read and written a cache line at
// a time (fp8 training quantizes the transposed gradients and inputs for its block recipes).
// Element by element through the compute type, this was 10 % of an MXFP8 step.
template <typename E>
void transpose_tiles(const E* s, E* d, int64_t batches, int64_t R, int64_t C) {
  constexpr int64_t kTile = 32;
  const int64_t tr = (R + kTile - 1) / kTile, tc = (C + kTile - 1) / kTile;
  const int64_t tasks = batches * tr * tc;
  const bool parallel = batches * R * C >= kParallelGrain && omp_get_max_threads() > 1 &&
                        !omp_in_parallel() && tasks > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t b = t / (tr * tc), r0 = (t / tc) % tr * kTile, c0 = t % tc * kTile;
    const E* sb = s + b * R * C;  // element (r, c) at sb[c * R + r]
    E* db = d + b * R * C;
    const int64_t r1 = std::min(R, r0 + kTile), c1 = std::min(C, c0 + kTile);
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c)
        db[r * C + c] = sb[c * R + r];
  }
}

void transpose_same_dtype(const Tensor& src, Tensor& dst) {
  const int64_t R = src.size(-2), C = src.size(-1), batches = src.numel() / (R * C);
  auto run = [&]<typename E>() {
    transpose_tiles(static_cast<const E*>(src.data_ptr()), static_cast<E*>(dst.data_ptr()), batches,
                    R, C);
  };
  switch (src.element_size()) {
    case 1:
      return run.template operator()<uint8_t>();
    case 2:
      return run.template operator()<uint16_t>();
    case 4:
      return run.template operator()<uint32_t>();
    default:
      MT_ASSERT(src.element_size() == 8, "transpose of ", src.describe());
      return run.template operator()<uint64_t>();
  }
}

}  // namespace

// ---- data movement
// -------------------------------------------------------------------------------

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  if (dst.numel() == 0) return;  // (an empty view need not look contiguous: no staging loop)
  if (!dst.is_contiguous()) {
    // Into a strided view (the stacked gradients of attention's q, k and v, every step): straight
    // from a contiguous source of the same dtype, unless the two share storage (then the source
    // is read whole first, into the staging copy below).
    if (src.is_contiguous() && src.dtype() == dst.dtype() && src.shape() == dst.shape() &&
        !src.shares_storage(dst)) {
      scatter_same_dtype(src, dst);
      return;
    }
    Tensor tmp = Tensor::empty(dst.shape(), dst.dtype(), dst.device());
    copy(src, tmp);
    scatter_same_dtype(tmp, dst);
    return;
  }
  if (src.dtype() == dst.dtype() && src.shape() == dst.shape() && is_transposed_contiguous(src) &&
      !src.shares_storage(dst)) {
    transpose_same_dtype(src, dst);
    return;
  }
  const bool direct = src.is_contiguous() && src.shape() == dst.shape();
  dispatch_dtype(src.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    dispatch_dtype(dst.dtype(), [&]<typename O>() {
      // Contiguous to contiguous between f32 and a narrower float (autocast's casts, every
      // step): one conversion pass, no staging buffer.
      constexpr bool kWidenOrNarrow = (std::is_same_v<T, float> && is_small_float_v<O>) ||
                                      (is_small_float_v<T> && std::is_same_v<O, float>);
      // fp8 codes to bf16 (fp8 training hands its codes to a bf16 GEMM): every fp8 value is
      // exact in bf16, so one 256-entry table of bf16 patterns does it.
      constexpr bool kFp8ToBf16 = (std::is_same_v<T, float8_e4m3> ||
                                   std::is_same_v<T, float8_e5m2>)&&std::is_same_v<O, bfloat16>;
      if constexpr (kFp8ToBf16) {
        if (direct) {
          static const std::array<uint16_t, 256> kTable = [] {
            std::array<uint16_t, 256> t{};
            for (uint32_t b = 0; b < 256; ++b)
              t[b] = uint16_t(encode(Format::BF16, decode(T::format, b)));
            return t;
          }();
          const T* s = static_cast<const T*>(src.data_ptr());
          uint16_t* d = static_cast<uint16_t*>(dst.data_ptr());
          parallel_chunks(dst.numel(), [&](int64_t start, int64_t n) {
            for (int64_t i = start; i < start + n; ++i)
              d[i] = kTable[s[i].bits];
          });
          return;
        }
      }
      if constexpr (kWidenOrNarrow || std::is_same_v<T, O>) {
        if (direct) {
          const T* s = static_cast<const T*>(src.data_ptr());
          O* d = static_cast<O*>(dst.data_ptr());
          parallel_chunks(dst.numel(), [&](int64_t start, int64_t n) {
            if constexpr (std::is_same_v<T, O>) {
              std::memcpy(d + start, s + start, size_t(n) * sizeof(T));
            } else if constexpr (std::is_same_v<T, float>) {
              store_contiguous<float, O>(s + start, d + start, n);
            } else {
              load_contiguous<T, float>(s + start, d + start, n);
            }
          });
          return;
        }
      }
      elementwise<T, C, O, 1>(dst, {&src}, [](C* o, const C* x, int64_t n) {
        std::memcpy(o, x, size_t(n) * sizeof(C));
      });
    });
  });
}

void CpuBackend::fill(Tensor& dst, double value) {
  dispatch_dtype(dst.dtype(), [&]<typename T>() {
    T v;
    if constexpr (is_small_float_v<T>) {
      v = T::from_bits(typename T::bits_type(encode(T::format, value)));
    } else {
      v = static_cast<T>(value);
    }
    T* d = static_cast<T*>(dst.data_ptr());
    for_each_run(dst, [&](int64_t off, int64_t run, int64_t stride) {
      if (stride == 1) {
        std::fill(d + off, d + off + run, v);
      } else {
        for (int64_t k = 0; k < run; ++k)
          d[off + k * stride] = v;
      }
    });
  });
}

namespace {

// Uniform in [0, 1) with 24 random bits (exact in float).
inline double unit_uniform(uint32_t bits) {
  return double(bits >> 8) * 0x1p-24;
}

template <typename Gen>
void random_fill(Tensor& dst, uint64_t seed, uint64_t offset, Gen gen) {
  MT_ASSERT(dst.is_contiguous(), "random fills write contiguous tensors");
  dispatch_float(dst.dtype(), "random fill", [&]<typename T>() {
    using C = compute_t<T>;
    T* d = static_cast<T*>(dst.data_ptr());
    parallel_chunks(dst.numel(), [&](int64_t start, int64_t n) {
      alignas(64) C buf[kChunk];
      PhiloxStream rng(seed, offset);
      for (int64_t i = 0; i < n; ++i)
        buf[i] = C(gen(rng, start + i));
      store_contiguous<C, T>(buf, d + start, n);
    });
  });
}

}  // namespace

void CpuBackend::uniform(Tensor& dst, double a, double b, uint64_t seed, uint64_t offset) {
  random_fill(dst, seed, offset, [=](PhiloxStream& rng, int64_t i) {
    return a + (b - a) * unit_uniform(rng(uint64_t(i)));
  });
}

void CpuBackend::normal(Tensor& dst, double mean, double stddev, uint64_t seed, uint64_t offset) {
  // Box-Muller on the two words 2i and 2i+1 of the stream: element i is a pure function of i.
  random_fill(dst, seed, offset, [=](PhiloxStream& rng, int64_t i) {
    const uint32_t w1 = rng(2 * uint64_t(i));
    const uint32_t w2 = rng(2 * uint64_t(i) + 1);
    const double u1 = (double(w1) + 1.0) * 0x1p-32;  // (0, 1]
    const double u2 = double(w2) * 0x1p-32;
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  });
}

void CpuBackend::round_to_format(Tensor& t, Format format) {
  MT_ASSERT(t.dtype() == DType::F32 && t.is_contiguous(),
            "round_to_format works on contiguous f32");
  float* p = static_cast<float*>(t.data_ptr());
  parallel_chunks(t.numel(),
                  [&](int64_t start, int64_t n) { round_in_place(format, p + start, size_t(n)); });
}

// ---- elementwise
// ---------------------------------------------------------------------------------

void CpuBackend::unary(UnaryOp op, const Tensor& x, Tensor& out, Scalars s) {
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      MT_CHECK(false, "unary ops are not defined on bool tensors");
    } else {
      if constexpr (std::is_same_v<T, bfloat16>) {
        if (run_contiguous<T, 1>(out, {&x}, [&](T* y, const T* a, int64_t n) {
              run_unary_stored<T>(op, y, a, n, s);
            })) {
          return;
        }
      }
      elementwise<T, C, T, 1>(out, {&x},
                              [&](C* y, const C* a, int64_t n) { run_unary<C>(op, y, a, n, s); });
    }
  });
}

void CpuBackend::unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y,
                                Tensor& gx, Scalars s) {
  // A derivative reads the input or the output (the op list's "needs"), never both: only that
  // one is loaded, and its chunk stands for both arguments. Loading both (x twice when y was
  // absent) cost a third more conversions in a bf16 GELU or ReLU backward. y may be absent for
  // an op that needs its output: x then holds it (what the op layer passes).
  const UnaryNeeds needs = unary_info(op).needs;
  const Tensor& v = needs == UnaryNeeds::Output && y.defined() ? y : x;
  dispatch_float(x.dtype(), "a derivative", [&]<typename T>() {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bfloat16>) {
      if (run_contiguous<T, 2>(gx, {&grad, &v}, [&](T* o, const T* g, const T* xy, int64_t n) {
            run_unary_backward_stored<T>(op, o, g, xy, n, s);
          })) {
        return;
      }
    }
    if (needs == UnaryNeeds::Nothing) {
      elementwise<T, C, T, 1>(gx, {&grad}, [&](C* o, const C* g, int64_t n) {
        run_unary_backward<C>(op, o, g, g, g, n, s);
      });
    } else {
      elementwise<T, C, T, 2>(gx, {&grad, &v}, [&](C* o, const C* g, const C* xy, int64_t n) {
        run_unary_backward<C>(op, o, g, xy, xy, n, s);
      });
    }
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  MT_ASSERT(a.dtype() == b.dtype(), "binary kernel inputs must share a dtype");
  dispatch_dtype(a.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      MT_CHECK(is_comparison(op), "arithmetic is not defined on bool tensors");
    }
    if (is_comparison(op)) {
      elementwise<T, C, bool, 2>(out, {&a, &b}, [&](C* o, const C* x, const C* y, int64_t n) {
        run_binary<C>(op, o, x, y, n);
      });
    } else if constexpr (!std::is_same_v<T, bool>) {
      if constexpr (std::is_same_v<T, bfloat16>) {
        if (run_contiguous<T, 2>(out, {&a, &b}, [&](T* o, const T* x, const T* y, int64_t n) {
              run_binary_stored<T>(op, o, x, y, n);
            })) {
          return;
        }
      }
      elementwise<T, C, T, 2>(out, {&a, &b}, [&](C* o, const C* x, const C* y, int64_t n) {
        run_binary<C>(op, o, x, y, n);
      });
    }
  });
}

// ---- the LSTM step's pointwise math ----------------------------------------------------------

namespace {

// Row r of a (rows, width) tensor with unit stride along its rows (any row stride) in the compute
// type: the storage itself when the types match, else converted into buf.
template <typename T, typename C>
const C* row_in(const Tensor& t, int64_t r, int64_t width, C* buf) {
  if (!t.defined()) return nullptr;
  const T* p = static_cast<const T*>(t.data_ptr()) + r * t.stride(0);
  if constexpr (std::is_same_v<T, C>) {
    return p;
  } else {
    load_contiguous<T, C>(p, buf, width);
    return buf;
  }
}

template <typename T, typename C>
C* row_out(Tensor& t, int64_t r, int64_t width, C* buf) {
  if constexpr (std::is_same_v<T, C>) {
    return static_cast<T*>(t.data_ptr()) + r * width;
  } else {
    (void)t, (void)r, (void)width;
    return buf;
  }
}

template <typename T, typename C>
void row_store(Tensor& t, int64_t r, int64_t width, const C* buf) {
  if constexpr (!std::is_same_v<T, C>) {
    store_contiguous<C, T>(buf, static_cast<T*>(t.data_ptr()) + r * width, width);
  } else {
    (void)t, (void)r, (void)width, (void)buf;
  }
}

}  // namespace

void CpuBackend::lstm_cell(const Tensor& gates, const Tensor& gates_add, const Tensor& c_prev,
                           Tensor& acts, Tensor& c, Tensor& h) {
  const int64_t rows = gates.size(0), n = gates.size(1) / 4;
  dispatch_float(acts.dtype(), "lstm_cell", [&]<typename T>() {
    using C = compute_t<T>;
    dispatch_float(gates.dtype(), "lstm_cell", [&]<typename G>() {
      if constexpr (kStoredInLoop<T> && kStoredInLoop<G>) {
        const G* z = static_cast<const G*>(gates.data_ptr());
        const float* za = gates_add.defined() ? gates_add.data<float>() : nullptr;
        const T* cp = c_prev.defined() ? static_cast<const T*>(c_prev.data_ptr()) : nullptr;
        T *a = static_cast<T*>(acts.data_ptr()), *cn = static_cast<T*>(c.data_ptr());
        T* hn = static_cast<T*>(h.data_ptr());
        parallel_rows<float>(rows, rows * 4 * n, 0, [&](int64_t r, float*) {
          run_lstm_cell_row_stored<G, T>(z + r * 4 * n, za ? za + r * 4 * n : nullptr,
                                         cp ? cp + r * n : nullptr, a + r * 4 * n, cn + r * n,
                                         hn + r * n, n);
        });
      } else if constexpr (std::is_same_v<compute_t<G>, C>) {
        parallel_rows<C>(rows, rows * 4 * n, 15 * n, [&](int64_t r, C* buf) {
          const C* z = row_in<G, C>(gates, r, 4 * n, buf);
          if (gates_add.defined()) {
            C* sum = buf + 11 * n;
            run_binary<C>(BinaryOp::Add, sum, z, gates_add.data<C>() + r * 4 * n, 4 * n);
            z = sum;
          }
          const C* cp = row_in<T, C>(c_prev, r, n, buf + 4 * n);
          C* a = row_out<T, C>(acts, r, 4 * n, buf + 5 * n);
          C* cn = row_out<T, C>(c, r, n, buf + 9 * n);
          C* hn = row_out<T, C>(h, r, n, buf + 10 * n);
          run_lstm_cell_row<C>(z, cp, a, cn, hn, n);
          row_store<T, C>(acts, r, 4 * n, a);
          row_store<T, C>(c, r, n, cn);
          row_store<T, C>(h, r, n, hn);
        });
      } else {
        MT_ASSERT(false, "lstm_cell: gates and state must share a compute type");
      }
    });
  });
}

void CpuBackend::lstm_cell_backward(const Tensor& acts, const Tensor& c, const Tensor& c_prev,
                                    const Tensor& dh, const Tensor& dh_add, const Tensor& dc,
                                    Tensor& dgates, Tensor& dc_prev) {
  const int64_t rows = acts.size(0), n = acts.size(1) / 4;
  dispatch_float(acts.dtype(), "lstm_cell_backward", [&]<typename T>() {
    using C = compute_t<T>;
    dispatch_float(dgates.dtype(), "lstm_cell_backward", [&]<typename G>() {
      if constexpr (kStoredInLoop<T> && kStoredInLoop<G>) {
        if (dh.defined() && dc.defined()) {
          auto in = [](const Tensor& t) {
            return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
          };
          const T *a = in(acts), *cn = in(c), *cp = in(c_prev), *gh = in(dh), *gc = in(dc);
          const float* gha = dh_add.defined() ? dh_add.data<float>() : nullptr;
          const int64_t dh_ld = dh.stride(0);
          G* dz = static_cast<G*>(dgates.data_ptr());
          T* dcp = static_cast<T*>(dc_prev.data_ptr());
          parallel_rows<float>(rows, rows * 4 * n, 0, [&](int64_t r, float*) {
            run_lstm_cell_backward_row_stored<G, T>(
                a + r * 4 * n, cn + r * n, cp ? cp + r * n : nullptr, gh + r * dh_ld,
                gha ? gha + r * n : nullptr, gc + r * n, dz + r * 4 * n, dcp + r * n, n);
          });
          return;
        }
      }
      if constexpr (std::is_same_v<compute_t<G>, C>) {
        parallel_rows<C>(rows, rows * 4 * n, 15 * n, [&](int64_t r, C* buf) {
          const C* a = row_in<T, C>(acts, r, 4 * n, buf);
          const C* cn = row_in<T, C>(c, r, n, buf + 4 * n);
          const C* cp = row_in<T, C>(c_prev, r, n, buf + 5 * n);
          // An undefined dh or dc is zero.
          C* zeros = buf + 6 * n;
          if (!dh.defined() || !dc.defined()) std::fill(zeros, zeros + n, C(0));
          const C* gh = dh.defined() ? row_in<T, C>(dh, r, n, buf + 7 * n) : zeros;
          if (dh_add.defined()) {
            C* sum = buf + 14 * n;
            run_binary<C>(BinaryOp::Add, sum, gh, dh_add.data<C>() + r * n, n);
            gh = sum;
          }
          const C* gc = dc.defined() ? row_in<T, C>(dc, r, n, buf + 8 * n) : zeros;
          C* dz = row_out<G, C>(dgates, r, 4 * n, buf + 9 * n);
          C* dcp = row_out<T, C>(dc_prev, r, n, buf + 13 * n);
          run_lstm_cell_backward_row<C>(a, cn, cp, gh, gc, dz, dcp, n);
          row_store<G, C>(dgates, r, 4 * n, dz);
          row_store<T, C>(dc_prev, r, n, dcp);
        });
      } else {
        MT_ASSERT(false, "lstm_cell_backward: dgates and state must share a compute type");
      }
    });
  });
}

void CpuBackend::add_scaled(const Tensor& a, const Tensor& b, double alpha, Tensor& out) {
  MT_ASSERT(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "add_scaled dtypes");
  dispatch_float(a.dtype(), "add_scaled", [&]<typename T>() {
    using C = compute_t<T>;
    const C s = C(alpha);
    elementwise<T, C, T, 2>(out, {&a, &b}, [s](C* o, const C* x, const C* y, int64_t n) {
      for (int64_t i = 0; i < n; ++i)
        o[i] = x[i] + s * y[i];
    });
  });
}

void CpuBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  MT_ASSERT(a.dtype() == b.dtype() && cond.dtype() == DType::Bool, "where kernel dtypes");
  // The condition in the values' dtype (0/1), so one loop type serves all three inputs.
  Tensor c = Tensor::empty(cond.shape(), a.dtype(), a.device());
  copy(cond, c);
  dispatch_dtype(a.dtype(), [&]<typename T>() {
    using C = compute_t<T>;
    elementwise<T, C, T, 3>(out, {&c, &a, &b},
                            [](C* o, const C* k, const C* x, const C* y, int64_t n) {
                              for (int64_t i = 0; i < n; ++i) {
                                const C xv = x[i], yv = y[i];
                                o[i] = k[i] != C(0) ? xv : yv;
                              }
                            });
  });
}

void CpuBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, Tensor& out,
                         Tensor& mask) {
  MT_ASSERT(x.is_contiguous() && out.is_contiguous() && mask.is_contiguous(), "dropout layout");
  // Keep an element when its 32 random bits are at or above p * 2^32.
  const uint64_t threshold = uint64_t(std::ldexp(p, 32));
  bool* m = static_cast<bool*>(mask.data_ptr());
  dispatch_float(x.dtype(), "dropout", [&]<typename T>() {
    using C = compute_t<T>;
    const C scale = C(1.0 / (1.0 - p));
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    parallel_chunks(x.numel(), [&](int64_t start, int64_t n) {
      alignas(64) C buf[kChunk];
      load_contiguous<T, C>(xp + start, buf, n);
      PhiloxStream rng(seed, offset);
      for (int64_t i = 0; i < n; ++i) {
        const bool keep = rng(uint64_t(start + i)) >= threshold;
        m[start + i] = keep;
        buf[i] = keep ? buf[i] * scale : C(0);
      }
      store_contiguous<C, T>(buf, op + start, n);
    });
  });
}

}  // namespace mantissa::backend::cpu
