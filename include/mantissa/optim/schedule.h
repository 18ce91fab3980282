// Learning-rate schedules: pure functions of the step, so a resumed run gets the same rates
// without any schedule state in its checkpoint. `step` is the number of optimizer steps already
// taken (0 before the first), i.e. call schedule.apply(opt, step) before each opt.step(): every
// parameter group follows the schedule from its own base learning rate (PyTorch's schedulers
// scale each group's initial_lr the same way; a cosine's min_lr is absolute, as its eta_min).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "mantissa/core/vocabulary.h"

namespace mantissa::optim {

class Optimizer;

#define MT_FORALL_SCHEDULES(_)                          \
  _(Constant, "constant", "the learning rate as given") \
  _(Step, "step", "times gamma every step_size steps")  \
  _(Cosine, "cosine", "linear warmup, then a cosine down to min_lr at total_steps")
MT_VOCABULARY(ScheduleKind, MT_FORALL_SCHEDULES)

// Everything a schedule may use; each kind reads its own fields.
struct ScheduleOptions {
  double lr = 1e-3;  // the base (peak) learning rate
  // step: lr * gamma^floor(step / step_size)
  int64_t step_size = 1;
  double gamma = 0.1;
  // cosine: linear warmup lr * (step + 1) / warmup_steps for step < warmup_steps, then
  // min_lr + (lr - min_lr) * (1 + cos(pi * (step - warmup_steps) / (total_steps - warmup_steps)))
  // / 2 down to min_lr at total_steps, and min_lr after.
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
  double min_lr = 0;
};

class LRSchedule {
 public:
  static LRSchedule constant(double lr);
  static LRSchedule step(double lr, int64_t step_size, double gamma);
  static LRSchedule cosine(double lr, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  // A schedule of `kind` with the fields that kind reads; a bad parameter is refused with a
  // mantissa::Error saying what is expected.
  static LRSchedule of_kind(ScheduleKind kind, const ScheduleOptions& options);

  // The learning rate for the optimizer step that follows `step` completed ones (step >= 0),
  // from the schedule's own base rate (options().lr) or from `base_lr`.
  double lr_at(int64_t step) const;
  double lr_at(int64_t step, double base_lr) const;
  // Sets every group's learning rate to lr_at(step, opt.base_lr(group)).
  void apply(Optimizer& opt, int64_t step) const;

  ScheduleKind kind() const { return kind_; }
  std::string_view name() const;
  const ScheduleOptions& options() const { return options_; }

 private:
  LRSchedule(ScheduleKind kind, const ScheduleOptions& options);
  ScheduleKind kind_;
  ScheduleOptions options_;
};

}  // namespace mantissa::optim
