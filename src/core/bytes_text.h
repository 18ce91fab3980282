// Internal: a byte count with a readable unit next to it, for the messages a user sizes a batch
// by ("1610612736 bytes (1.50 GiB)"): the out-of-memory errors of the host and device allocators.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace mantissa {

inline std::string with_unit(int64_t bytes) {
  static const char* const units[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  double v = double(bytes);
  int u = -1;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char text[64];
  std::snprintf(text, sizeof text, "%lld bytes (%.2f %s)", static_cast<long long>(bytes), v,
                units[u]);
  return text;
}

}  // namespace mantissa
