// Internal: when Backend::copy_rounded is a plain copy(). The CPU and CUDA backends share this
// rule so that both take the same path, and so round the same way, for every dtype pair.
#pragma once

#include "mantissa/core/dtype.h"
#include "mantissa/numerics/convert.h"

namespace mantissa::backend {

// Whether every value of `from` is exactly a value of `to`: the same dtype, or a float widening
// (half and fp8 into f32/f64, f32 into f64, fp8 into f16/bf16).
constexpr bool widens_exactly(DType from, DType to) {
  if (from == to) return true;
  const bool from_fp8 = from == DType::FP8_E4M3 || from == DType::FP8_E5M2;
  const bool from_half = from == DType::F16 || from == DType::BF16;
  switch (to) {
    case DType::F64:
      return from == DType::F32 || from_half || from_fp8;
    case DType::F32:
      return from_half || from_fp8;
    case DType::F16:
    case DType::BF16:
      return from_fp8;
    default:
      return false;
  }
}

// copy_rounded is copy() when it rounds as copy() does (to nearest even, with the format's own
// overflow), when dst has no narrower format to round onto (integers, bool, f64), and when every
// source value is exact in dst.
constexpr bool rounded_copy_is_plain(DType src, DType dst, const RoundingOptions& rounding) {
  if (rounding.mode == RoundingMode::NearestEven && rounding.overflow == Overflow::Infinity) {
    return true;
  }
  if (!is_floating(dst) || dst == DType::F64) return true;
  return widens_exactly(src, dst);
}

}  // namespace mantissa::backend
