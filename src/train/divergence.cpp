#include "train/divergence.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "mantissa/core/error.h"

namespace mantissa::train {
namespace {

// NaN, inf, -inf or the number (printf writes "-nan" for a NaN with its sign bit set).
std::string loss_text(float loss) {
  if (std::isnan(loss)) return "NaN";
  if (std::isinf(loss)) return loss > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", double(loss));
  return buf;
}

}  // namespace

DivergenceGuard::DivergenceGuard(int64_t patience) : patience_(patience) {
  MT_CHECK(patience >= 1, "--divergence-patience must be at least 1, got ", patience);
}

std::string DivergenceGuard::observe(const StepOutcome& s, bool dynamic_scale, bool at_min_scale) {
  char why[256];
  skipped_in_a_row_ = s.skipped ? skipped_in_a_row_ + 1 : 0;
  if (!s.skipped) {
    streak_ = 0;
    if (std::isfinite(s.loss)) return "";
    std::snprintf(why, sizeof why,
                  "step %lld: the loss is %s and the step was applied, so the weights are no "
                  "longer finite",
                  (long long)s.step, loss_text(s.loss).c_str());
    return why;
  }
  if (dynamic_scale && !at_min_scale) {
    streak_ = 0;  // the scaler backs off: what it is for
    return "";
  }
  if (++streak_ < patience_) return "";
  std::snprintf(
      why, sizeof why,
      "steps %lld to %lld: %lld steps in a row skipped for inf/NaN gradients%s (the last "
      "loss %s)",
      (long long)(s.step - streak_ + 1), (long long)s.step, (long long)streak_,
      dynamic_scale ? " with the loss scale at its minimum, where it cannot back off" : "",
      loss_text(s.loss).c_str());
  return why;
}

}  // namespace mantissa::train
