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
#include "mantissa/core/dtype.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"
#include "mantissa/numerics/types.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend::cuda {

// ---- storage and compute types --------------------------------------------------------------
// f16/bf16 live as CUDA's own types (hardware conversions, RNE, bit-identical to round.h for
// every non-NaN value); fp8 as Mantissa's (round.h's constexpr encode/decode, called on the
// device through --expt-relaxed-constexpr).
template <DType D>
struct DeviceStorage;
template <>
struct DeviceStorage<DType::F64> {
  using type = double;
};
template <>
struct DeviceStorage<DType::F32> {
  using type = float;
};
template <>
struct DeviceStorage<DType::F16> {
  using type = __half;
};
template <>
struct DeviceStorage<DType::BF16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceStorage<DType::FP8_E4M3> {
  using type = float8_e4m3;
};
template <>
struct DeviceStorage<DType::FP8_E5M2> {
  using type = float8_e5m2;
};
template <>
struct DeviceStorage<DType::I64> {
  using type = int64_t;
};
template <>
struct DeviceStorage<DType::I32> {
  using type = int32_t;
};
template <>
struct DeviceStorage<DType::U8> {
  using type = uint8_t;
};
template <>
struct DeviceStorage<DType::Bool> {
  using type = bool;
};

// The type arithmetic happens in: double for double, float for every other float, the integer
// itself otherwise.
template <typename S>
using compute_t = std::conditional_t<std::is_same_v<S, double>, double,
                                     std::conditional_t<std::is_integral_v<S>, S, float>>;

template <typename S>
__device__ __forceinline__ compute_t<S> load(const S* p) {
  if constexpr (std::is_same_v<S, __half>) {
    return __half2float(*p);
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    return __bfloat162float(*p);
  } else if constexpr (std::is_same_v<S, float8_e4m3> || std::is_same_v<S, float8_e5m2>) {
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
  if constexpr (std::is_same_v<S, __half>) {
    *p = __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    *p = __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, float8_e4m3> || std::is_same_v<S, float8_e5m2>) {
    *p = S(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, bool>) {
    *p = v != T(0);
  } else {
    *p = static_cast<S>(v);
  }
}

// ---- dtype dispatch ---------------------------------------------------------------------------
// f(Tag<S>{}) with S the device storage type of `dtype`; errors name the op for other dtypes.
template <typename S>
struct Tag {
  using type = S;
};

template <typename F>
decltype(auto) dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F64:
      return f(Tag<double>{});
    case DType::F32:
      return f(Tag<float>{});
    case DType::F16:
      return f(Tag<__half>{});
    case DType::BF16:
      return f(Tag<__nv_bfloat16>{});
    case DType::FP8_E4M3:
      return f(Tag<float8_e4m3>{});
    case DType::FP8_E5M2:
      return f(Tag<float8_e5m2>{});
    case DType::I64:
    case DType::I32:
    case DType::U8:
    case DType::Bool:
      break;
  }
  // Not dtype_name(dtype): after the switch gcc cannot see dtype is in range and warns about
  // reading past the dtype table (-Warray-bounds).
  MT_CHECK(false, op, " on cuda: needs a floating dtype, got an integer or bool one (",
           static_cast<int>(dtype), ")");
  return f(Tag<float>{});  // unreachable
}

template <typename F>
decltype(auto) dispatch_all(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::I64:
      return f(Tag<int64_t>{});
    case DType::I32:
      return f(Tag<int32_t>{});
    case DType::U8:
      return f(Tag<uint8_t>{});
    case DType::Bool:
      return f(Tag<bool>{});
    default:
      return dispatch_float(dtype, op, std::forward<F>(f));
  }
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
__device__ __forceinline__ float m_erf(float x) {
  return erff(x);
}
__device__ __forceinline__ double m_erf(double x) {
  return erf(x);
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
