// Internal, device side of the CUDA backend: storage types, load/store with one rounding, strided
// and broadcast indexing, dtype dispatch and launch shapes. Kernels load any float dtype to float
// (double for f64), compute, and round once on store (RNE), as the CPU backend does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/dispatch.h"
#include "mantissa/core/dtype.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"
#include "mantissa/numerics/types.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend::cuda {

// ---- storage and compute types --------------------------------------------------------------
// The host storage type of each dtype (MT_FORALL_DTYPES) serves on the device too — Mantissa's
// fp8 structs through round.h's constexpr encode/decode (--expt-relaxed-constexpr) — except
// where CUDA has its own type with hardware conversions (RNE, bit-identical to round.h for every
// non-NaN value): f16 and bf16. Such a type comes with its conversions in NativeFloat below; a
// NaN goes through round.h (the hardware makes every NaN 0x7fff, round.h keeps the sign and the
// top payload bits, as the CPU does).
template <DType D>
struct DeviceStorage {
  using type = typename DTypeTraits<D>::type;
};
template <>
struct DeviceStorage<DType::F16> {
  using type = __half;
};
template <>
struct DeviceStorage<DType::BF16> {
  using type = __nv_bfloat16;
};

// round.h's encode() for a format fixed at compile time, from a float or a double. Device code
// must not call encode(format, ...) with the format as a run-time argument: it reads round.h's
// table, host data (address 0 plus an offset on the device).
template <Format F, typename T>
__device__ __forceinline__ uint32_t encode_as(T x, RoundingMode mode, Overflow overflow,
                                              uint32_t random) {
  constexpr FormatSpec spec = format_spec(F);
  if constexpr (std::is_same_v<T, double>) {
    return detail::encode_bits<double>(static_cast<uint64_t>(__double_as_longlong(x)), spec, mode,
                                       overflow, random);
  } else {
    return detail::encode_bits<float>(__float_as_uint(x), spec, mode, overflow, random);
  }
}

// round.h's bits of a NaN in format F.
template <Format F>
__device__ __forceinline__ uint32_t nan_bits(float v) {
  return encode_as<F>(v, RoundingMode::NearestEven, Overflow::Infinity, 0u);
}

// The conversions of CUDA's own float types: to float, from float (RNE), from a format's bits.
template <typename S>
struct NativeFloat;
template <>
struct NativeFloat<__half> {
  __device__ __forceinline__ static float to_float(__half v) {
    const float f = __half2float(v);
    if (!isnan(f)) return f;
    constexpr FormatSpec spec = format_spec(Format::FP16);
    return detail::decode_bits(__half_as_ushort(v), spec);  // the quiet bit set, as F16C does
  }
  __device__ __forceinline__ static __half from_float(float v) {
    return isnan(v) ? from_bits(nan_bits<Format::FP16>(v)) : __float2half_rn(v);
  }
  __device__ __forceinline__ static __half from_bits(uint32_t bits) {
    __half_raw r;
    r.x = static_cast<unsigned short>(bits);
    return __half(r);
  }
};
template <>
struct NativeFloat<__nv_bfloat16> {
  __device__ __forceinline__ static float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float v) {
    return isnan(v) ? from_bits(nan_bits<Format::BF16>(v)) : __float2bfloat16_rn(v);
  }
  __device__ __forceinline__ static __nv_bfloat16 from_bits(uint32_t bits) {
    __nv_bfloat16_raw r;
    r.x = static_cast<unsigned short>(bits);
    return __nv_bfloat16(r);
  }
};
template <typename S>
inline constexpr bool is_native_float_v = requires {
  sizeof(NativeFloat<S>);
};

// The dtype of a device storage type (each is the storage of exactly one dtype).
template <typename S>
struct DeviceDType;
#define MT_DEVICE_DTYPE(e, ...)                       \
  template <>                                         \
  struct DeviceDType<DeviceStorage<DType::e>::type> { \
    static constexpr DType value = DType::e;          \
  };
MT_FORALL_DTYPES(MT_DEVICE_DTYPE)
#undef MT_DEVICE_DTYPE

// A float stored narrower than its compute type (f16, bf16, fp8): one rounding on every store.
template <typename S>
inline constexpr bool is_narrow_v = is_native_float_v<S> || is_small_float_v<S>;

// The format a float storage type holds (the dtype list's format column). Kernels take it as a
// template constant: round.h's format table is host data, readable on the device only in
// constant expressions.
template <typename S>
constexpr Format format_of() {
  return *dtype_format(DeviceDType<S>::value);
}

// The type arithmetic happens in: double for double, float for every other float, the integer
// itself otherwise.
template <typename S>
using compute_t = std::conditional_t<std::is_same_v<S, double>, double,
                                     std::conditional_t<std::is_integral_v<S>, S, float>>;

template <typename S>
__device__ __forceinline__ compute_t<S> load(const S* p) {
  if constexpr (is_native_float_v<S>) {
    return NativeFloat<S>::to_float(*p);
  } else if constexpr (is_small_float_v<S>) {
    return static_cast<float>(*p);
  } else {
    return *p;
  }
}

// Loads any storage type as the compute type T (e.g. an I64 index as float, a bool mask).
template <typename T, typename S>
__device__ __forceinline__ T load_as(const S* p) {
  return static_cast<T>(load(p));
}

// One rounding, to nearest even (integers: C++ conversion, as the CPU backend's copy).
template <typename S, typename T>
__device__ __forceinline__ void store(S* p, T v) {
  if constexpr (is_native_float_v<S>) {
    *p = NativeFloat<S>::from_float(static_cast<float>(v));
  } else if constexpr (is_small_float_v<S>) {
    *p = S(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, bool>) {
    *p = v != T(0);
  } else {
    *p = static_cast<S>(v);
  }
}

// ---- dtype dispatch ---------------------------------------------------------------------------
// f(Tag<S>{}) with S the device storage type of `dtype`; errors name the op for other dtypes. The
// cases come from MT_FORALL_DTYPES: a new dtype is dispatched without a line here.
template <typename F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  return switch_dtype<DTypeSet::Float, DeviceStorage>(dtype, f, [&]() -> decltype(auto) {
    // Not dtype_name(dtype): gcc cannot see here that dtype is in range and warns about reading
    // past the dtype table (-Warray-bounds).
    MT_CHECK(false, op, " on cuda: needs a floating dtype, got an integer or bool one (",
             static_cast<int>(dtype), ")");
    return f(Tag<float>{});  // unreachable
  });
}

// The same on the device, for a dtype known only there (a multi-tensor launch's per-tensor
// dtypes): f(Tag<S>{}) for a float dtype, nothing for the others (the host's checks ruled them
// out).
template <typename F>
__device__ __forceinline__ void device_dispatch_float(DType dtype, F&& f) {
  switch_dtype<DTypeSet::Float, DeviceStorage>(dtype, f, [] {});
}

template <typename F>
decltype(auto) dispatch_all(DType dtype, const char* op, F&& f) {
  return switch_dtype<DTypeSet::All, DeviceStorage>(dtype, f, [&]() -> decltype(auto) {
    MT_ASSERT(false, op, ": unknown dtype ", static_cast<int>(dtype));
    return f(Tag<float>{});  // unreachable
  });
}

// An unsigned integer of a dtype's size: copying, filling and selecting move bits unchanged.
template <typename F>
decltype(auto) dispatch_size(size_t bytes, F&& f) {
  switch (bytes) {
    case 1:
      return f(Tag<uint8_t>{});
    case 2:
      return f(Tag<uint16_t>{});
    case 4:
      return f(Tag<uint32_t>{});
    default:
      MT_ASSERT(bytes == 8, "no dtype has ", bytes, " bytes");
      return f(Tag<uint64_t>{});
  }
}

// ---- strided and broadcast indexing -----------------------------------------------------------
// A tensor's elements seen through `shape` (its own or one it broadcasts to): element strides,
// 0 on broadcast dims. Passed to kernels by value.
struct StridedIndex {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  bool contiguous = true;  // linear index == element offset

  __host__ __device__ __forceinline__ int64_t offset(int64_t linear) const {
    if (contiguous) return linear;
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      off += i * strides[d];
    }
    return off;
  }
};

// `t` indexed by the row-major positions of `shape` (t's own shape when omitted); t's shape must
// broadcast to it (checked by the op layer).
inline StridedIndex strided_index(const Tensor& t, const Shape& shape) {
  StridedIndex s;
  s.ndim = shape.size();
  const int lead = shape.size() - t.dim();
  bool contiguous = t.shape() == shape;
  int64_t expect = 1;
  for (int d = s.ndim - 1; d >= 0; --d) {
    s.sizes[d] = shape[d];
    const int td = d - lead;
    s.strides[d] = (td < 0 || t.shape()[td] == 1) ? 0 : t.strides()[td];
    if (shape[d] != 1 && s.strides[d] != expect) contiguous = false;
    expect *= shape[d];
  }
  s.contiguous = contiguous;
  return s;
}
inline StridedIndex strided_index(const Tensor& t) {
  return strided_index(t, t.shape());
}

// The element pointer of `t` (its storage offset applied), typed as the device storage type.
template <typename S>
S* device_ptr(const Tensor& t) {
  return static_cast<S*>(t.data_ptr());
}

// ---- launch shapes ----------------------------------------------------------------------------
inline constexpr int kThreads = 256;
// Blocks for a grid-stride loop over n elements (or a block-per-row loop over n rows with
// threads = 1): one per `threads` elements, at most max_grid_blocks() for the current device.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, max_grid_blocks()));
}

// A grid-stride kernel over `work` elements on `device`'s current stream (nothing for none).
template <typename Kernel, typename... Args>
void launch(int64_t work, int device, Kernel kernel, const Args&... args) {
  if (work <= 0) return;
  kernel<<<grid_for(work), kThreads, 0, stream_for(device)>>>(args...);
  MT_CUDA_CHECK_LAUNCH();
}

#define MT_GRID_STRIDE_LOOP(i, n)                                           \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(blockDim.x) * gridDim.x)

// ---- math: the float or double function, as the CPU's std:: overloads pick it ------------------

__device__ __forceinline__ float m_exp(float x) {
  return expf(x);
}
__device__ __forceinline__ double m_exp(double x) {
  return exp(x);
}
__device__ __forceinline__ float m_log(float x) {
  return logf(x);
}
__device__ __forceinline__ double m_log(double x) {
  return log(x);
}
__device__ __forceinline__ float m_sqrt(float x) {
  return sqrtf(x);
}
__device__ __forceinline__ double m_sqrt(double x) {
  return sqrt(x);
}
__device__ __forceinline__ float m_tanh(float x) {
  return tanhf(x);
}
__device__ __forceinline__ double m_tanh(double x) {
  return tanh(x);
}
__device__ __forceinline__ float m_normcdf(float x) {
  return normcdff(x);
}
__device__ __forceinline__ double m_normcdf(double x) {
  return normcdf(x);
}
__device__ __forceinline__ float m_pow(float x, float y) {
  return powf(x, y);
}
__device__ __forceinline__ double m_pow(double x, double y) {
  return pow(x, y);
}

// ---- arithmetic without contraction ------------------------------------------------------------
// Each operation rounded on its own, as the CPU build (no FMA) computes: nvcc would otherwise
// contract a * b + c into one fma, and results that should match the CPU bit for bit would not.
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rn(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ __forceinline__ float sub_rn(float a, float b) {
  return __fsub_rn(a, b);
}
__device__ __forceinline__ double sub_rn(double a, double b) {
  return __dsub_rn(a, b);
}
__device__ __forceinline__ float div_rn(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ double div_rn(double a, double b) {
  return __ddiv_rn(a, b);
}
__device__ __forceinline__ float sqrt_rn(float a) {
  return __fsqrt_rn(a);
}
__device__ __forceinline__ double sqrt_rn(double a) {
  return __dsqrt_rn(a);
}

// ---- warp and block reductions (fp32 or f64) -----------------------------------------------
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : T(0);
  return warp_sum(v);
}
template <typename T>
__device__ T block_max(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? partial[lane] : T(-INFINITY);
  return warp_max(v);
}

}  // namespace mantissa::backend::cuda
