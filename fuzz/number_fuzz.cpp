// Fuzz target: a number as `mantissa formats` parses it (decimal, scientific, hex float, inf,
// nan), then inspected in every format, rounding mode and overflow mode. A stored value is
// representable, so inspecting it again must give the same bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fuzz_input.h"
#include "mantissa/numerics/inspect.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::optional<ParsedNumber> x = parse_number(text);
  if (!x) return 0;
  FUZZ_REQUIRE(std::memchr(data, 0, size) == nullptr, "a number with a NUL byte was accepted");
  for (int f = 0; f < kNumFormats; ++f) {
    for (RoundingMode mode : {RoundingMode::NearestEven, RoundingMode::TowardZero}) {
      for (Overflow overflow : {Overflow::Infinity, Overflow::Saturate}) {
        const FormatReport r = inspect(Format(f), *x, mode, overflow);
        if (std::isnan(r.value)) continue;
        ParsedNumber stored;
        stored.value = r.value;
        stored.finite_input = std::isfinite(r.value);
        const FormatReport again = inspect(Format(f), stored, mode, overflow);
        FUZZ_REQUIRE(again.bits == r.bits && again.abs_error == 0,
                     "format %d: %.17g stored as 0x%x, again as 0x%x", f, r.value, r.bits,
                     again.bits);
      }
    }
  }
  return 0;
}
