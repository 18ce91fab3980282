#include "mantissa/core/warning.h"

#include <cstdio>
#include <map>
#include <mutex>

namespace mantissa {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, int64_t, std::less<>> counts;
  WarningHandler handler;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void warn(std::string_view key, const std::string& message) {
  Registry& r = registry();
  WarningHandler handler;
  {
    std::lock_guard lock(r.mutex);
    auto it = r.counts.find(key);
    if (it != r.counts.end()) {
      ++it->second;
      return;
    }
    r.counts.emplace(std::string(key), 1);
    handler = r.handler;
  }
  if (handler) {
    handler(key, message);
  } else {
    std::fprintf(stderr, "mantissa: warning: %s\n", message.c_str());
  }
}

int64_t warning_count(std::string_view key) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const auto it = r.counts.find(key);
  return it == r.counts.end() ? 0 : it->second;
}

std::vector<std::pair<std::string, int64_t>> warning_counts() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return {r.counts.begin(), r.counts.end()};
}

void reset_warnings() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.counts.clear();
}

WarningHandler set_warning_handler(WarningHandler handler) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::swap(r.handler, handler);
  return handler;
}

}  // namespace mantissa
