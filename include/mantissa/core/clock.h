// Wall-clock time of the host, for the timings runs and benchmarks report.
#pragma once

#include <chrono>

namespace mantissa {

using Clock = std::chrono::steady_clock;

// Seconds from `t0` to now.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace mantissa
