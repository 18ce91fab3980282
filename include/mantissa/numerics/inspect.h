// What happens to one number in each format: its bits, the stored value, the rounding error and
// the class. This is what `mantissa formats` prints; it lives in the library so it is tested.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "mantissa/numerics/format.h"

namespace mantissa {

// A number as the user typed it, parsed to the nearest double (decimal, scientific, hex float,
// inf, nan). A finite decimal beyond double's range parses to ±inf with `finite_input` still
// true, so the formats report an overflow rather than pretend the user typed inf.
struct ParsedNumber {
  std::string text;
  double value = 0;
  bool finite_input = true;
};

// nullopt when `text` is not a number (empty, "abc", "1.5x").
std::optional<ParsedNumber> parse_number(std::string_view text);

enum class ValueClass : uint8_t { Zero, Subnormal, Normal, Inf, NaN };
std::string_view value_class_name(ValueClass c);

struct FormatReport {
  Format format;
  uint32_t bits;       // the format's own pattern, right-aligned
  uint32_t container;  // the bits as stored: tf32 in its fp32 container, else == bits
  std::string sign_bits, exponent_bits, mantissa_bits;  // "" where the format has none (e8m0)
  std::string hex;   // of the container, e.g. "0x4144f5c3", "0x4a25"
  double value;      // the stored value, exactly
  double abs_error;  // |value - input| (inf when one of them is infinite and they differ)
  double rel_error;  // abs_error / |input| (0 for an exact zero)
  ValueClass value_class;
  bool overflow;   // a finite input beyond the largest value: became inf/NaN, or saturated
  bool underflow;  // a non-zero input below the smallest normal could not be stored exactly
};

FormatReport inspect(Format f, const ParsedNumber& x, RoundingMode mode,
                     Overflow overflow = Overflow::Infinity);

}  // namespace mantissa
