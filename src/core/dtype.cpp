#include "mantissa/core/dtype.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace mantissa {

std::optional<DType> parse_dtype(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s.empty()) return std::nullopt;
  for (const auto& info : kDTypeTable) {
    if (s == info.name) return info.dtype;
    // The aliases column: words separated by single spaces.
    std::string_view rest = info.aliases;
    while (!rest.empty()) {
      const size_t end = std::min(rest.find(' '), rest.size());
      if (s == rest.substr(0, end)) return info.dtype;
      rest.remove_prefix(std::min(end + 1, rest.size()));
    }
  }
  return std::nullopt;
}

}  // namespace mantissa
