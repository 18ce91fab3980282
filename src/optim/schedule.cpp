// Learning-rate schedules as pure functions of the step.
#include "mantissa/optim/schedule.h"

#include <cmath>
#include <numbers>

#include "mantissa/core/error.h"
#include "mantissa/optim/optimizer.h"

namespace mantissa::optim {

LRSchedule::LRSchedule(ScheduleKind kind, const ScheduleOptions& o) : kind_(kind), options_(o) {
  MT_CHECK(std::isfinite(o.lr) && o.lr >= 0, name(),
           " schedule: the learning rate must be finite and >= 0, got ", o.lr);
  switch (kind) {
    case ScheduleKind::Constant:
      break;
    case ScheduleKind::Step:
      MT_CHECK(o.step_size >= 1, "step schedule: step_size must be >= 1, got ", o.step_size);
      MT_CHECK(std::isfinite(o.gamma) && o.gamma > 0, "step schedule: gamma must be > 0, got ",
               o.gamma);
      break;
    case ScheduleKind::Cosine:
      MT_CHECK(o.total_steps >= 1, "cosine schedule: total_steps must be >= 1, got ",
               o.total_steps);
      MT_CHECK(o.warmup_steps >= 0 && o.warmup_steps <= o.total_steps,
               "cosine schedule: warmup_steps must be in [0, total_steps = ", o.total_steps,
               "], got ", o.warmup_steps);
      MT_CHECK(std::isfinite(o.min_lr) && o.min_lr >= 0 && o.min_lr <= o.lr,
               "cosine schedule: min_lr must be in [0, lr = ", o.lr, "], got ", o.min_lr);
      break;
  }
}

LRSchedule LRSchedule::constant(double lr) {
  ScheduleOptions o;
  o.lr = lr;
  return LRSchedule(ScheduleKind::Constant, o);
}

LRSchedule LRSchedule::step(double lr, int64_t step_size, double gamma) {
  ScheduleOptions o;
  o.lr = lr;
  o.step_size = step_size;
  o.gamma = gamma;
  return LRSchedule(ScheduleKind::Step, o);
}

LRSchedule LRSchedule::cosine(double lr, int64_t warmup_steps, int64_t total_steps, double min_lr) {
  ScheduleOptions o;
  o.lr = lr;
  o.warmup_steps = warmup_steps;
  o.total_steps = total_steps;
  o.min_lr = min_lr;
  return LRSchedule(ScheduleKind::Cosine, o);
}

LRSchedule LRSchedule::of_kind(ScheduleKind kind, const ScheduleOptions& options) {
  return LRSchedule(kind, options);
}

std::string_view LRSchedule::name() const {
  return name_of(kind_);
}

double LRSchedule::lr_at(int64_t step) const {
  return lr_at(step, options_.lr);
}

double LRSchedule::lr_at(int64_t step, double base_lr) const {
  MT_CHECK(step >= 0, "a learning-rate schedule's step must be >= 0, got ", step);
  MT_CHECK(std::isfinite(base_lr) && base_lr >= 0,
           "a learning-rate schedule's base learning rate must be finite and >= 0, got ", base_lr);
  const ScheduleOptions& o = options_;
  switch (kind_) {
    case ScheduleKind::Constant:
      return base_lr;
    case ScheduleKind::Step:
      return base_lr * std::pow(o.gamma, double(step / o.step_size));
    case ScheduleKind::Cosine: {
      if (step < o.warmup_steps) return base_lr * double(step + 1) / double(o.warmup_steps);
      if (step >= o.total_steps) return o.min_lr;
      const double progress =
          double(step - o.warmup_steps) / double(o.total_steps - o.warmup_steps);
      return o.min_lr + (base_lr - o.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return base_lr;
}

void LRSchedule::apply(Optimizer& opt, int64_t step) const {
  for (size_t g = 0; g < opt.num_groups(); ++g)
    opt.set_lr(g, lr_at(step, opt.base_lr(g)));
}

}  // namespace mantissa::optim
