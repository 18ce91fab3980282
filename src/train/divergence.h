// Internal: the divergence guard of the Trainer (TrainConfig::on_divergence, docs/training.md).
// It is told each optimizer step's loss and whether the step was skipped for inf/NaN gradients,
// and says when the run has diverged:
//  - a step whose loss is not finite was applied: the weights are no longer trustworthy (fp32,
//    tf32 and bf16 have no loss scaler to skip such a step);
//  - `patience` steps in a row were skipped where skipping cannot help: the dynamic loss scale
//    is at its minimum, or there is no dynamic scale to lower (a static scale, or the check that
//    --on-divergence skip adds).
// A dynamic scaler's skips above its minimum are its normal back-off and count for nothing.
#pragma once

#include <cstdint>
#include <string>

namespace mantissa::train {

struct StepOutcome {
  int64_t step = 0;  // the step's number, from 1
  float loss = 0;
  bool skipped = false;  // not applied: its gradients held inf/NaN
};

class DivergenceGuard {
 public:
  explicit DivergenceGuard(int64_t patience);

  // `dynamic_scale`: a dynamic loss scaler decides the skips; `at_min_scale`: its scale is at
  // its minimum after this step. Returns why the run has diverged with this step, or "".
  std::string observe(const StepOutcome& s, bool dynamic_scale, bool at_min_scale);
  // Whether the last step was applied: a checkpoint of the state after a skipped step waits,
  // so that the last one written stays a state the run could go on from (a dynamic scaler's
  // long back-off can be the start of a divergence too).
  bool trusted() const { return skipped_in_a_row_ == 0; }
  // Forget the skips counted so far (after a rollback).
  void reset() { streak_ = skipped_in_a_row_ = 0; }

 private:
  int64_t patience_;
  int64_t streak_ = 0;            // skipped steps in a row that count
  int64_t skipped_in_a_row_ = 0;  // all of them
};

}  // namespace mantissa::train
