// CUDA elementwise kernels: copies and casts (plain and with a rounding mode), fills, random
// fills, rounding onto a format's grid, unary/binary ops and their derivatives, where, dropout.
// The semantics are the CPU backend's (src/backend/cpu/elementwise.cpp), expression for
// expression: loads go to the compute type (fp32, f64 for f64, the integer itself), one rounding
// on store. Random numbers are Philox element by element with the CPU's mapping of stream words
// to elements, so the same seed and offset give the same values on both devices.
#include <cmath>
#include <cstring>
#include <numbers>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/lstm_math.h"
#include "backend/op_math.h"
#include "backend/rounded_copy.h"

namespace mantissa::backend::cuda {
namespace {

// ---- storage helpers ----------------------------------------------------------------------------

// A value of storage type S from a format's bit pattern (as encode() returns it).
template <typename S>
__device__ __forceinline__ S from_bits(uint32_t bits) {
  if constexpr (is_native_float_v<S>) {
    return NativeFloat<S>::from_bits(bits);
  } else if constexpr (std::is_same_v<S, float>) {
    return __uint_as_float(bits);
  } else {
    return S::from_bits(static_cast<typename S::bits_type>(bits));
  }
}

// store() with the CPU's rule for doubles and integers into the narrow formats: one rounding,
// straight from double (never through float).
template <typename O, typename T>
__device__ __forceinline__ void store_value(O* p, T v) {
  if constexpr (is_narrow_v<O> && !std::is_same_v<T, float>) {
    *p = from_bits<O>(encode_as<format_of<O>()>(static_cast<double>(v), RoundingMode::NearestEven,
                                                Overflow::Infinity, 0u));
  } else {
    store(p, v);
  }
}

// The Philox block `block` of the stream (seed, offset): words 4 * block .. 4 * block + 3, as
// random_bits() and the CPU's PhiloxStream compute them.
__device__ __forceinline__ PhiloxBlock philox_block(uint64_t seed, uint64_t offset,
                                                    uint64_t block) {
  return philox4x32_10(
      {uint32_t(block), uint32_t(block >> 32), uint32_t(offset), uint32_t(offset >> 32)},
      {uint32_t(seed), uint32_t(seed >> 32)});
}

bool is_aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The device side of op_math.h's math policy: the float or double device functions (as the
// CPU's std:: overloads pick them) and a product nvcc may not fuse into a following addition.
struct DeviceMath {
  template <typename C>
  __device__ __forceinline__ static C exp(C x) {
    return m_exp(x);
  }
  template <typename C>
  __device__ __forceinline__ static C log(C x) {
    return m_log(x);
  }
  template <typename C>
  __device__ __forceinline__ static C sqrt(C x) {
    return m_sqrt(x);
  }
  template <typename C>
  __device__ __forceinline__ static C tanh(C x) {
    return m_tanh(x);
  }
  template <typename C>
  __device__ __forceinline__ static C normal_cdf(C x) {
    return m_normcdf(x);
  }
  template <typename C>
  __device__ __forceinline__ static C normal_pdf(C x) {
    return m_exp(C(-0.5) * (x * x)) * C(op_math::kInvSqrt2Pi);
  }
  template <typename C>
  __device__ __forceinline__ static C pow(C x, C y) {
    return m_pow(x, y);
  }
  template <typename C>
  __device__ __forceinline__ static C mul_rn(C a, C b) {
    return cuda::mul_rn(a, b);
  }
};

// ---- op functors: op_math.h's math, one element at a time -----------------------------------
// The op is a runtime value (one kernel per dtype serves every op); the switches over it are
// generated from the op lists. An op without a kernel for C (OnIntegers::F32 on an integer
// dtype) is refused on the host before the launch.

template <typename C>
struct UnaryFn {
  UnaryOp op;
  op_math::UnaryArgs<C> args;

  __device__ C operator()(C x) const {
    switch (op) {
#define MT_UNARY_FN_CASE(e, ...)                                                \
  case UnaryOp::e:                                                              \
    if constexpr (op_math::unary_runs_on<UnaryOp::e, C>()) {                    \
      return op_math::Unary<UnaryOp::e>::template forward<DeviceMath>(x, args); \
    }                                                                           \
    break;
      MT_FORALL_UNARY_OPS(MT_UNARY_FN_CASE)
#undef MT_UNARY_FN_CASE
    }
    return x;  // unreachable: the host checked op against the dtype
  }
};

template <typename C>
struct UnaryBackwardFn {
  UnaryOp op;
  op_math::UnaryArgs<C> args;

  __device__ C operator()(C g, C x, C y) const {
    switch (op) {
#define MT_UNARY_BACKWARD_FN_CASE(e, ...) \
  case UnaryOp::e:                        \
    return op_math::Unary<UnaryOp::e>::template backward<DeviceMath>(g, x, y, args);
      MT_FORALL_UNARY_OPS(MT_UNARY_BACKWARD_FN_CASE)
#undef MT_UNARY_BACKWARD_FN_CASE
    }
    return g;  // unreachable
  }
};

template <typename C>
struct BinaryFn {
  BinaryOp op;

  __device__ C operator()(C x, C y) const {
    switch (op) {
#define MT_BINARY_FN_CASE(e, ...)                                                             \
  case BinaryOp::e:                                                                           \
    if constexpr (!is_comparison(BinaryOp::e) && op_math::binary_runs_on<BinaryOp::e, C>()) { \
      return op_math::Binary<BinaryOp::e>::template apply<DeviceMath>(x, y);                  \
    }                                                                                         \
    break;
      MT_FORALL_BINARY_OPS(MT_BINARY_FN_CASE)
#undef MT_BINARY_FN_CASE
    }
    return x;  // unreachable: comparisons go to CompareFn, integer pow is refused on the host
  }
};

template <typename C>
struct CompareFn {
  BinaryOp op;

  __device__ bool operator()(C x, C y) const {
    switch (op) {
#define MT_COMPARE_FN_CASE(e, ...)                                           \
  case BinaryOp::e:                                                          \
    if constexpr (is_comparison(BinaryOp::e)) {                              \
      return op_math::Binary<BinaryOp::e>::template apply<DeviceMath>(x, y); \
    }                                                                        \
    break;
      MT_FORALL_BINARY_OPS(MT_COMPARE_FN_CASE)
#undef MT_COMPARE_FN_CASE
    }
    return false;  // unreachable: arithmetic goes to BinaryFn
  }
};

// x + alpha * y rounded twice, as the CPU computes it (nvcc would fuse it into one fma).
template <typename C>
__device__ __forceinline__ C axpy_rn(C x, C alpha, C y) {
  return add_rn(x, mul_rn(alpha, y));
}

template <typename C>
struct AxpyFn {
  C alpha;
  __device__ C operator()(C x, C y) const { return axpy_rn(x, alpha, y); }
};

// ---- the map engine: out (contiguous) = op(inputs...), inputs broadcast to out's shape ----------

template <typename S, int N>
struct Inputs {
  const S* ptr[N];
  StridedIndex index[N];
};

template <typename S, int N>
struct Pointers {
  const S* ptr[N];
};

template <typename Op, typename C, int N>
__device__ __forceinline__ auto apply(const Op& op, const C (&v)[N]) {
  if constexpr (N == 1) {
    return op(v[0]);
  } else if constexpr (N == 2) {
    return op(v[0], v[1]);
  } else {
    return op(v[0], v[1], v[2]);
  }
}

template <typename O, typename S, int N, typename Op>
__global__ void map_kernel(int64_t n, O* out, Inputs<S, N> in, Op op) {
  MT_GRID_STRIDE_LOOP(i, n) {
    compute_t<S> v[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
      v[k] = load(in.ptr[k] + in.index[k].offset(i));
    store_value(out + i, apply(op, v));
  }
}

// Every operand contiguous, one storage type, 16-byte aligned: one 16-byte load per input and
// one store per group of 16 / sizeof(S) elements.
template <typename S, int N, typename Op>
__global__ void map_vec_kernel(int64_t groups, S* out, Pointers<S, N> in, Op op) {
  constexpr int kVec = 16 / sizeof(S);
  MT_GRID_STRIDE_LOOP(j, groups) {
    uint4 raw[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
      raw[k] = reinterpret_cast<const uint4*>(in.ptr[k])[j];
    uint4 res;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      compute_t<S> v[N];
#pragma unroll
      for (int k = 0; k < N; ++k)
        v[k] = load(reinterpret_cast<const S*>(&raw[k]) + e);
      store_value(reinterpret_cast<S*>(&res) + e, apply(op, v));
    }
    reinterpret_cast<uint4*>(out)[j] = res;
  }
}

template <typename O, typename S, int N, typename Op>
void run_map(const std::array<const Tensor*, N>& inputs, Tensor& out, const Op& op) {
  MT_ASSERT(out.is_contiguous(), "elementwise output must be contiguous");
  int64_t n = out.numel();
  if (n == 0) return;
  const int device = out.device().index;
  Inputs<S, N> in;
  bool fast = is_aligned16(out.data_ptr());
  for (int k = 0; k < N; ++k) {
    MT_ASSERT(inputs[k]->device() == out.device(), "elementwise operands on one device");
    in.ptr[k] = device_ptr<const S>(*inputs[k]);
    in.index[k] = strided_index(*inputs[k], out.shape());
    fast = fast && in.index[k].contiguous && is_aligned16(in.ptr[k]);
  }
  O* o = device_ptr<O>(out);
  if constexpr (std::is_same_v<O, S>) {
    if (fast) {
      constexpr int64_t kVec = 16 / sizeof(S);
      const int64_t groups = n / kVec;
      Pointers<S, N> p;
      for (int k = 0; k < N; ++k)
        p.ptr[k] = in.ptr[k];
      launch(groups, device, map_vec_kernel<S, N, Op>, groups, o, p, op);
      // The tail (fewer than kVec elements) element by element: every index is contiguous.
      const int64_t done = groups * kVec;
      for (int k = 0; k < N; ++k)
        in.ptr[k] += done;
      o += done;
      n -= done;
    }
  }
  launch(n, device, map_kernel<O, S, N, Op>, n, o, in, op);
}

// ---- copies ------------------------------------------------------------------------------------

template <typename O, typename S>
__global__ void copy_kernel(int64_t n, O* dst, StridedIndex dst_index, const S* src,
                            StridedIndex src_index) {
  MT_GRID_STRIDE_LOOP(i, n) {
    store_value(dst + dst_index.offset(i), load(src + src_index.offset(i)));
  }
}

// copy_rounded's store: element i (row-major) draws random_bits(seed, offset, index + i).
template <typename O, typename S>
__global__ void copy_rounded_kernel(int64_t n, O* dst, StridedIndex dst_index, const S* src,
                                    StridedIndex src_index, RoundingOptions r) {
  // Float sources round from float, f64 and integers from double: the CPU's choice.
  using T = std::conditional_t<std::is_same_v<compute_t<S>, float>, float, double>;
  MT_GRID_STRIDE_LOOP(i, n) {
    const T v = static_cast<T>(load(src + src_index.offset(i)));
    const uint32_t bits = r.mode == RoundingMode::Stochastic
                              ? random_bits(r.seed, r.offset, r.index + uint64_t(i))
                              : 0u;
    dst[dst_index.offset(i)] = from_bits<O>(encode_as<format_of<O>()>(v, r.mode, r.overflow, bits));
  }
}

// `value` in the host storage type T, converted exactly as the CPU backend's fill converts it,
// as raw bits.
template <typename T>
uint64_t storage_bits(double value) {
  T v;
  if constexpr (std::is_class_v<T>) {
    v = T::from_bits(typename T::bits_type(encode(T::format, value)));
  } else {
    v = static_cast<T>(value);
  }
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  return bits;
}

template <typename U>
__global__ void fill_kernel(int64_t n, U* dst, StridedIndex index, U value) {
  MT_GRID_STRIDE_LOOP(i, n) {
    dst[index.offset(i)] = value;
  }
}

// ---- random ------------------------------------------------------------------------------------

// Element i takes word i: a + (b - a) * (its top 24 bits / 2^24), in double, explicitly rounded
// multiply and add (no fused multiply-add: the CPU rounds twice).
template <typename S>
__global__ void uniform_kernel(int64_t n, S* out, double a, double span, uint64_t seed,
                               uint64_t offset) {
  const int64_t blocks = (n + 3) / 4;
  MT_GRID_STRIDE_LOOP(j, blocks) {
    const PhiloxBlock r = philox_block(seed, offset, uint64_t(j));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t i = 4 * j + w;
      if (i < n) {
        const double u = double(r[w] >> 8) * 0x1p-24;
        store_value(out + i, compute_t<S>(__dadd_rn(a, __dmul_rn(span, u))));
      }
    }
  }
}

// Box-Muller on words 2i and 2i + 1: block j holds elements 2j and 2j + 1.
template <typename S>
__global__ void normal_kernel(int64_t n, S* out, double mean, double stddev, uint64_t seed,
                              uint64_t offset) {
  constexpr double kTwoPi = 2.0 * std::numbers::pi;
  const int64_t blocks = (n + 1) / 2;
  MT_GRID_STRIDE_LOOP(j, blocks) {
    const PhiloxBlock r = philox_block(seed, offset, uint64_t(j));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t i = 2 * j + h;
      if (i < n) {
        const double u1 = (double(r[2 * h]) + 1.0) * 0x1p-32;  // (0, 1]
        const double u2 = double(r[2 * h + 1]) * 0x1p-32;
        const double radius = sqrt(__dmul_rn(-2.0, log(u1)));
        const double v =
            __dadd_rn(mean, __dmul_rn(__dmul_rn(stddev, radius), cos(__dmul_rn(kTwoPi, u2))));
        store_value(out + i, compute_t<S>(v));
      }
    }
  }
}

// Keep element i when its word is at or above p * 2^32; kept values are scaled by 1 / (1 - p).
template <typename S>
__global__ void dropout_kernel(int64_t n, const S* x, S* out, bool* mask, uint64_t threshold,
                               compute_t<S> scale, uint64_t seed, uint64_t offset) {
  const int64_t blocks = (n + 3) / 4;
  MT_GRID_STRIDE_LOOP(j, blocks) {
    const PhiloxBlock r = philox_block(seed, offset, uint64_t(j));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t i = 4 * j + w;
      if (i < n) {
        const bool keep = r[w] >= threshold;
        mask[i] = keep;
        store_value(out + i, keep ? load(x + i) * scale : compute_t<S>(0));
      }
    }
  }
}

// One thread per (row, state element) of an LSTM step (backend/lstm_math.h, as the CPU's loop).
template <typename G, typename S>
__global__ void lstm_cell_kernel(int64_t rows, int64_t n, const G* z, const compute_t<S>* za,
                                 const S* cp, S* acts, S* c, S* h) {
  using C = compute_t<S>;
  MT_GRID_STRIDE_LOOP(k, rows * n) {
    const int64_t r = k / n, j = k % n;
    const G* zr = z + r * 4 * n;
    const C* zar = za != nullptr ? za + r * 4 * n : nullptr;
    auto gate = [&](int64_t q) { return zar ? C(load(zr + q) + zar[q]) : C(load(zr + q)); };
    const bool has_prev = cp != nullptr;
    lstm_math::Acts<C> a;
    C cv, hv;
    lstm_math::forward<DeviceMath>(gate(j), gate(n + j), gate(2 * n + j), gate(3 * n + j),
                                   has_prev ? load(cp + k) : C(0), has_prev, a, cv, hv);
    S* ar = acts + r * 4 * n;
    store_value(ar + j, a.i);
    store_value(ar + n + j, a.f);
    store_value(ar + 2 * n + j, a.g);
    store_value(ar + 3 * n + j, a.o);
    store_value(c + k, cv);
    store_value(h + k, hv);
  }
}

template <typename G, typename S>
__global__ void lstm_cell_backward_kernel(int64_t rows, int64_t n, const S* acts, const S* c,
                                          const S* cp, const S* dh, int64_t dh_stride,
                                          const compute_t<S>* dha, const S* dc, G* dz, S* dcp) {
  using C = compute_t<S>;
  MT_GRID_STRIDE_LOOP(k, rows * n) {
    const int64_t r = k / n, j = k % n;
    const S* ar = acts + r * 4 * n;
    const lstm_math::Acts<C> a{load(ar + j), load(ar + n + j), load(ar + 2 * n + j),
                               load(ar + 3 * n + j)};
    const bool has_prev = cp != nullptr;
    lstm_math::Acts<C> d;
    C dcpv;
    lstm_math::backward<DeviceMath>(
        a, load(c + k), has_prev ? load(cp + k) : C(0), has_prev,
        C((dh != nullptr ? load(dh + r * dh_stride + j) : C(0)) + (dha != nullptr ? dha[k] : C(0))),
        dc != nullptr ? load(dc + k) : C(0), d, dcpv);
    G* dr = dz + r * 4 * n;
    store_value(dr + j, d.i);
    store_value(dr + n + j, d.f);
    store_value(dr + 2 * n + j, d.g);
    store_value(dr + 3 * n + j, d.o);
    store_value(dcp + k, dcpv);
  }
}

template <Format F>
__global__ void round_kernel(int64_t n, float* p) {
  constexpr FormatSpec spec = format_spec(F);
  MT_GRID_STRIDE_LOOP(i, n) {
    p[i] = detail::decode_bits(
        detail::encode_bits<float>(__float_as_uint(p[i]), spec, RoundingMode::NearestEven,
                                   Overflow::Infinity, 0u),
        spec);
  }
}

template <typename U>
__global__ void where_kernel(int64_t n, U* out, const uint8_t* cond, StridedIndex cond_index,
                             const U* a, StridedIndex a_index, const U* b, StridedIndex b_index) {
  MT_GRID_STRIDE_LOOP(i, n) {
    out[i] = cond[cond_index.offset(i)] ? a[a_index.offset(i)] : b[b_index.offset(i)];
  }
}

}  // namespace

// ---- data movement -----------------------------------------------------------------------------

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  DeviceGuard guard(device_);
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous() &&
      src.shape() == dst.shape()) {
    MT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                  cudaMemcpyDeviceToDevice, stream_for(device_)));
    return;
  }
  const StridedIndex dst_index = strided_index(dst);
  const StridedIndex src_index = strided_index(src, dst.shape());
  if (src.dtype() == dst.dtype()) {
    // The same dtype moves bits: one kernel per element size.
    dispatch_size(dst.element_size(), [&]<typename U>(Tag<U>) {
      launch(n, device_, copy_kernel<U, U>, n, device_ptr<U>(dst), dst_index,
             device_ptr<const U>(src), src_index);
    });
    return;
  }
  dispatch_all(src.dtype(), "copy", [&]<typename S>(Tag<S>) {
    dispatch_all(dst.dtype(), "copy", [&]<typename O>(Tag<O>) {
      launch(n, device_, copy_kernel<O, S>, n, device_ptr<O>(dst), dst_index,
             device_ptr<const S>(src), src_index);
    });
  });
}

void CudaBackend::fill(Tensor& dst, double value) {
  DeviceGuard guard(device_);
  uint64_t bits = 0;
  switch (dst.dtype()) {
#define MT_FILL_CASE(e, name, T, ...) \
  case DType::e:                      \
    bits = storage_bits<T>(value);    \
    break;
    MT_FORALL_DTYPES(MT_FILL_CASE)
#undef MT_FILL_CASE
  }
  const int64_t n = dst.numel();
  const StridedIndex index = strided_index(dst);
  dispatch_size(dst.element_size(), [&]<typename U>(Tag<U>) {
    U v;
    std::memcpy(&v, &bits, sizeof(U));
    launch(n, device_, fill_kernel<U>, n, device_ptr<U>(dst), index, v);
  });
}

void CudaBackend::copy_rounded(const Tensor& src, Tensor& dst, const RoundingOptions& rounding) {
  DeviceGuard guard(device_);
  MT_ASSERT(src.shape() == dst.shape(), "copy_rounded: ", src.describe(), " into ", dst.describe());
  if (rounded_copy_is_plain(src.dtype(), dst.dtype(), rounding)) {
    copy(src, dst);
    return;
  }
  const int64_t n = dst.numel();
  const StridedIndex dst_index = strided_index(dst);
  const StridedIndex src_index = strided_index(src);
  dispatch_all(src.dtype(), "copy_rounded", [&]<typename S>(Tag<S>) {
    dispatch_float(dst.dtype(), "copy_rounded", [&]<typename O>(Tag<O>) {
      if constexpr (std::is_same_v<O, double>) {
        MT_ASSERT(false, "copy_rounded into f64 is a plain copy");
      } else {
        launch(n, device_, copy_rounded_kernel<O, S>, n, device_ptr<O>(dst), dst_index,
               device_ptr<const S>(src), src_index, rounding);
      }
    });
  });
}

void CudaBackend::uniform(Tensor& dst, double a, double b, uint64_t seed, uint64_t offset) {
  DeviceGuard guard(device_);
  MT_ASSERT(dst.is_contiguous(), "random fills write contiguous tensors");
  const int64_t n = dst.numel();
  dispatch_float(dst.dtype(), "uniform", [&]<typename S>(Tag<S>) {
    launch((n + 3) / 4, device_, uniform_kernel<S>, n, device_ptr<S>(dst), a, b - a, seed, offset);
  });
}

void CudaBackend::normal(Tensor& dst, double mean, double stddev, uint64_t seed, uint64_t offset) {
  DeviceGuard guard(device_);
  MT_ASSERT(dst.is_contiguous(), "random fills write contiguous tensors");
  const int64_t n = dst.numel();
  dispatch_float(dst.dtype(), "normal", [&]<typename S>(Tag<S>) {
    launch((n + 1) / 2, device_, normal_kernel<S>, n, device_ptr<S>(dst), mean, stddev, seed,
           offset);
  });
}

void CudaBackend::round_to_format(Tensor& t, Format format) {
  DeviceGuard guard(device_);
  MT_ASSERT(t.dtype() == DType::F32 && t.is_contiguous(),
            "round_to_format works on contiguous f32");
  const int64_t n = t.numel();
  float* p = device_ptr<float>(t);
  if (format == Format::FP32) return;
  with_format(format, [&](auto f) { launch(n, device_, round_kernel<decltype(f)::value>, n, p); });
}

// ---- elementwise -------------------------------------------------------------------------------

void CudaBackend::unary(UnaryOp op, const Tensor& x, Tensor& out, Scalars s) {
  DeviceGuard guard(device_);
  MT_CHECK(x.dtype() != DType::Bool, "unary ops are not defined on bool tensors");
  MT_CHECK(x.is_floating_point() || unary_info(op).integers != OnIntegers::F32, "unary op ",
           int(op), " is not defined on ", dtype_name(x.dtype()),
           " tensors; cast to a floating dtype");
  dispatch_all(x.dtype(), "unary", [&]<typename S>(Tag<S>) {
    using C = compute_t<S>;
    if constexpr (!std::is_same_v<S, bool>) {
      const UnaryFn<C> fn{op, {C(s.a), C(s.b), s.a == 2.0}};
      run_map<S, S, 1>({&x}, out, fn);
    }
  });
}

void CudaBackend::unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y,
                                 Tensor& gx, Scalars s) {
  DeviceGuard guard(device_);
  // y is only needed by some ops; x stands in for it when absent.
  const Tensor& yy = y.defined() ? y : x;
  dispatch_float(x.dtype(), "a derivative", [&]<typename S>(Tag<S>) {
    using C = compute_t<S>;
    const UnaryBackwardFn<C> fn{op, {C(s.a), C(s.b), s.a == 2.0}};
    run_map<S, S, 3>({&grad, &x, &yy}, gx, fn);
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  DeviceGuard guard(device_);
  MT_ASSERT(a.dtype() == b.dtype(), "binary kernel inputs must share a dtype");
  const bool comparison = is_comparison(op);
  MT_CHECK(comparison || a.dtype() != DType::Bool, "arithmetic is not defined on bool tensors");
  MT_CHECK(binary_info(op).integers != OnIntegers::F32 || a.is_floating_point(),
           binary_info(op).name, " is not defined on ", dtype_name(a.dtype()),
           " tensors; cast to a floating dtype");
  dispatch_all(a.dtype(), "binary", [&]<typename S>(Tag<S>) {
    using C = compute_t<S>;
    if (comparison) {
      run_map<bool, S, 2>({&a, &b}, out, CompareFn<C>{op});
    } else if constexpr (!std::is_same_v<S, bool>) {
      run_map<S, S, 2>({&a, &b}, out, BinaryFn<C>{op});
    }
  });
}

void CudaBackend::add_scaled(const Tensor& a, const Tensor& b, double alpha, Tensor& out) {
  DeviceGuard guard(device_);
  MT_ASSERT(a.dtype() == b.dtype() && a.dtype() == out.dtype(), "add_scaled dtypes");
  dispatch_float(a.dtype(), "add_scaled", [&]<typename S>(Tag<S>) {
    using C = compute_t<S>;
    run_map<S, S, 2>({&a, &b}, out, AxpyFn<C>{C(alpha)});
  });
}

void CudaBackend::where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) {
  DeviceGuard guard(device_);
  MT_ASSERT(a.dtype() == b.dtype() && cond.dtype() == DType::Bool && out.dtype() == a.dtype(),
            "where kernel dtypes");
  MT_ASSERT(out.is_contiguous(), "elementwise output must be contiguous");
  const int64_t n = out.numel();
  const StridedIndex ci = strided_index(cond, out.shape());
  const StridedIndex ai = strided_index(a, out.shape());
  const StridedIndex bi = strided_index(b, out.shape());
  // Selecting moves a value unchanged: one kernel per element size serves every dtype.
  dispatch_size(out.element_size(), [&]<typename U>(Tag<U>) {
    launch(n, device_, where_kernel<U>, n, device_ptr<U>(out), device_ptr<const uint8_t>(cond), ci,
           device_ptr<const U>(a), ai, device_ptr<const U>(b), bi);
  });
}

void CudaBackend::dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, Tensor& out,
                          Tensor& mask) {
  DeviceGuard guard(device_);
  MT_ASSERT(x.is_contiguous() && out.is_contiguous() && mask.is_contiguous(), "dropout layout");
  const uint64_t threshold = uint64_t(std::ldexp(p, 32));
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), "dropout", [&]<typename S>(Tag<S>) {
    using C = compute_t<S>;
    launch((n + 3) / 4, device_, dropout_kernel<S>, n, device_ptr<const S>(x), device_ptr<S>(out),
           device_ptr<bool>(mask), threshold, C(1.0 / (1.0 - p)), seed, offset);
  });
}

void CudaBackend::lstm_cell(const Tensor& gates, const Tensor& gates_add, const Tensor& c_prev,
                            Tensor& acts, Tensor& c, Tensor& h) {
  DeviceGuard guard(device_);
  const int64_t rows = gates.size(0), n = gates.size(1) / 4;
  dispatch_float(acts.dtype(), "lstm_cell", [&]<typename S>(Tag<S>) {
    dispatch_float(gates.dtype(), "lstm_cell", [&]<typename G>(Tag<G>) {
      if constexpr (std::is_same_v<compute_t<G>, compute_t<S>>) {
        using C = compute_t<S>;
        launch(rows * n, device_, lstm_cell_kernel<G, S>, rows, n, device_ptr<const G>(gates),
               gates_add.defined() ? device_ptr<const C>(gates_add) : nullptr,
               c_prev.defined() ? device_ptr<const S>(c_prev) : nullptr, device_ptr<S>(acts),
               device_ptr<S>(c), device_ptr<S>(h));
      } else {
        MT_ASSERT(false, "lstm_cell: gates and state must share a compute type");
      }
    });
  });
}

void CudaBackend::lstm_cell_backward(const Tensor& acts, const Tensor& c, const Tensor& c_prev,
                                     const Tensor& dh, const Tensor& dh_add, const Tensor& dc,
                                     Tensor& dgates, Tensor& dc_prev) {
  DeviceGuard guard(device_);
  const int64_t rows = acts.size(0), n = acts.size(1) / 4;
  auto ptr = []<typename S>(const Tensor& t, Tag<S>) -> const S* {
    return t.defined() ? device_ptr<const S>(t) : nullptr;
  };
  dispatch_float(acts.dtype(), "lstm_cell_backward", [&]<typename S>(Tag<S> tag) {
    dispatch_float(dgates.dtype(), "lstm_cell_backward", [&]<typename G>(Tag<G>) {
      if constexpr (std::is_same_v<compute_t<G>, compute_t<S>>) {
        launch(rows * n, device_, lstm_cell_backward_kernel<G, S>, rows, n,
               device_ptr<const S>(acts), device_ptr<const S>(c), ptr(c_prev, tag), ptr(dh, tag),
               dh.defined() ? dh.stride(0) : n, ptr(dh_add, Tag<compute_t<S>>{}), ptr(dc, tag),
               device_ptr<G>(dgates), device_ptr<S>(dc_prev));
      } else {
        MT_ASSERT(false, "lstm_cell_backward: dgates and state must share a compute type");
      }
    });
  });
}

}  // namespace mantissa::backend::cuda
