// Internal: how another library (oneDNN, cuBLASLt, cuDNN) names each dtype of the one list
// (MT_FORALL_DTYPES). A map is a constexpr array with one row per dtype, in the list's order; a
// dtype the library does not take has an explicit kUnsupported row. A map checked with
// dtype_map_complete fails to compile while it lacks a row, and the error names the dtype
// (dtype_map_has_no_row_for<DType::X>): a new dtype cannot reach a library file's fall-through
// unnoticed, someone decides what each library does with it.
//
//   constexpr DTypeMapRow<cudaDataType_t> kCublasTypes[] = {
//       {DType::F64, CUDA_R_64F}, {DType::F32, CUDA_R_32F}, ..., {DType::Bool, kUnsupported}};
//   static_assert(dtype_map_complete<kCublasTypes>());
//   std::optional<cudaDataType_t> t = dtype_map_lookup(kCublasTypes, DType::BF16);
#pragma once

#include <cstddef>
#include <iterator>
#include <optional>

#include "mantissa/core/dtype.h"
#include "mantissa/numerics/format.h"

namespace mantissa::backend {

template <typename T>
struct DTypeMapRow {
  DType dtype;
  std::optional<T> value;  // nullopt (kUnsupported): the library has no such type
};

inline constexpr std::nullopt_t kUnsupported = std::nullopt;

// Never defined: instantiated only for a dtype whose row is missing, so the compiler names it.
template <DType D>
struct dtype_map_has_no_row_for;

template <const auto& Map, DType D>
constexpr bool dtype_map_has_row() {
  if constexpr (size_t(D) < std::size(Map) && Map[size_t(D)].dtype == D) {
    return true;
  } else {
    return sizeof(dtype_map_has_no_row_for<D>) == 0;
  }
}

// Every dtype has its row, at its index, and there are no others.
template <const auto& Map>
constexpr bool dtype_map_complete() {
#define MT_DTYPE_MAP_ROW(e, ...) &&dtype_map_has_row<Map, DType::e>()
  return std::size(Map) == size_t(kNumDTypes) MT_FORALL_DTYPES(MT_DTYPE_MAP_ROW);
#undef MT_DTYPE_MAP_ROW
}

template <typename T, size_t N>
constexpr std::optional<T> dtype_map_lookup(const DTypeMapRow<T> (&map)[N], DType d) {
  return map[size_t(d)].value;
}

// Whether a GEMM or convolution library takes inputs of dtype `d` under
// MatmulOptions::input_rounding as they are: f64 ignores the rounding (the reference path);
// fp32 and tf32 are what the library's f32 modes compute (cuBLASLt/cuDNN: tf32 tensor cores;
// oneDNN: strict f32, on copies rounded to tf32 first); a float's own format rounds nothing.
// The library must also have the type (its map's row).
constexpr bool takes_rounding(DType d, Format rounding) {
  const std::optional<Format> own = dtype_format(d);
  return !own || rounding == Format::FP32 || rounding == Format::TF32 || rounding == *own;
}

}  // namespace mantissa::backend
