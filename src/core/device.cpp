#include "mantissa/core/device.h"

#include <climits>
#include <cstdlib>
#include <string>

#include "mantissa/core/error.h"

namespace mantissa {

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text[5] >= '0' && text[5] <= '9') {
    char* end = nullptr;
    const long idx = std::strtol(text.c_str() + 5, &end, 10);
    // All of the text (a NUL inside it is no end) and an index an int holds.
    if (end == text.c_str() + text.size() && idx <= INT_MAX) return Device::cuda(int(idx));
  }
  MT_CHECK(false, "unknown device '", text, "'; use cpu, cuda or cuda:N");
  return {};
}

}  // namespace mantissa
