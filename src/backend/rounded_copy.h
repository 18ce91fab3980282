// Internal: when Backend::copy_rounded is a plain copy(). The CPU and CUDA backends share this
// rule so that both take the same path, and so round the same way, for every dtype pair.
#pragma once

#include "mantissa/core/dtype.h"
#include "mantissa/numerics/convert.h"

namespace mantissa::backend {

// Whether every value of `from` is exactly a value of `to`: the same dtype, or a float widening
// (half and fp8 into f32/f64, f32 into f64, fp8 into f16/bf16). The float formats of the dtype
// list nest by width — each has at least the range and the precision of every narrower one, as
// the static_assert below checks for every pair — so a wider float holds every narrower value.
constexpr bool widens_exactly(DType from, DType to) {
  if (from == to) return true;
  return is_floating(from) && is_floating(to) && dtype_size(from) < dtype_size(to);
}

// Whether format a's values all lie on format b's grid: no more precision, no wider exponent
// range (normal and subnormal).
constexpr bool format_holds(Format b, Format a) {
  const FormatSpec sa = format_spec(a), sb = format_spec(b);
  return sa.mantissa_bits <= sb.mantissa_bits && sa.emax() <= sb.emax() &&
         sa.emin() - sa.mantissa_bits >= sb.emin() - sb.mantissa_bits;
}
constexpr bool floats_nest_by_width() {
  for (const DTypeInfo& a : kDTypeTable) {
    for (const DTypeInfo& b : kDTypeTable) {
      if (!a.is_float || !b.is_float || a.size >= b.size) continue;
      // f64 has no Format: it holds every narrower float (all of them lie inside fp32).
      if (!b.format) continue;
      if (!a.format || !format_holds(*b.format, *a.format)) return false;
    }
  }
  return true;
}
static_assert(floats_nest_by_width(),
              "a float dtype does not hold every value of a narrower one: widens_exactly and "
              "promote_types compare widths, give them a rule for this pair");

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
