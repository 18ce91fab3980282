// Internal: the arithmetic of the mixed-precision recipe that every backend's multi-tensor
// kernels share, host and device: the dynamic loss scale's update rule (Backend::update_scale;
// the CUDA backend runs it in a one-thread kernel) and AdamW's bias corrections from a step count
// (the step counts live on the parameters' device). One definition, so the CPU and the GPU
// follow the same trajectory bit for bit. Pure functions of plain values, no library calls: nvcc
// compiles them for the device too.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "backend/host_device.h"

namespace mantissa::backend {

struct ScaleState {
  double scale = 1.0;  // an fp32 value, as PyTorch's
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
  int64_t min_scale_overflows = 0;
};

// The scale is an fp32 value: a double rounded to float after every change.
MT_HOST_DEVICE constexpr double round_to_f32(double x) {
  return double(float(x));
}

// Neither inf nor NaN (x - x is NaN for both), without <cmath> on the device.
MT_HOST_DEVICE constexpr bool is_finite_value(double x) {
  return x - x == 0.0;
}

// One update() of a dynamic scaler. An overflow resets the growth tracker and, once
// `hysteresis` overflowing updates came in a row, backs the scale off (never below min_scale);
// an overflow with the scale already at min_scale is counted. A clean update resets the
// hysteresis count and, after growth_interval of them, grows the scale (never above max_scale,
// not at all when the grown value overflows fp32).
MT_HOST_DEVICE constexpr ScaleState next_scale_state(ScaleState s, bool found_inf,
                                                     const ScaleUpdate& rule) {
  if (found_inf) {
    const bool at_min = s.scale <= rule.min_scale;
    s.growth_tracker = 0;
    if (++s.hysteresis_tracker >= rule.hysteresis) {
      s.hysteresis_tracker = 0;
      const double backed_off = round_to_f32(s.scale * rule.backoff_factor);
      // std::max(backed_off, min_scale): the first argument unless it is less.
      s.scale = round_to_f32(backed_off < rule.min_scale ? rule.min_scale : backed_off);
    }
    if (at_min) ++s.min_scale_overflows;
    return s;
  }
  s.hysteresis_tracker = 0;
  const int64_t successful = s.growth_tracker + 1;
  if (successful >= rule.growth_interval) {
    const double grown = round_to_f32(s.scale * rule.growth_factor);
    // std::min(grown, max_scale): the second argument only when it is less.
    if (is_finite_value(grown))
      s.scale = round_to_f32(rule.max_scale < grown ? rule.max_scale : grown);
    s.growth_tracker = 0;
  } else {
    s.growth_tracker = successful;
  }
  return s;
}

// base^n for n >= 0 by binary exponentiation: only IEEE double multiplications, so the host and
// the device compute the very same value (a library pow may differ in the last bit between them).
MT_HOST_DEVICE constexpr double pow_int(double base, int64_t n) {
  double result = 1.0, b = base;
  while (n > 0) {
    if (n & 1) result *= b;
    b *= b;
    n >>= 1;
  }
  return result;
}

// AdamW's per-tensor constants at its t-th update (t >= 1): step_size = lr / (1 - beta1^t) and
// bc2_sqrt = sqrt(1 - beta2^t). IEEE division and square root are correctly rounded on both
// sides; `sqrt` is passed in because <cmath>'s is not a device function.
struct AdamWBiasCorrection {
  double step_size;
  double bc2_sqrt;
};
template <typename Sqrt>
MT_HOST_DEVICE constexpr AdamWBiasCorrection adamw_bias_correction(double lr, double beta1,
                                                                   double beta2, int64_t t,
                                                                   Sqrt sqrt) {
  return {lr / (1.0 - pow_int(beta1, t)), sqrt(1.0 - pow_int(beta2, t))};
}

}  // namespace mantissa::backend
