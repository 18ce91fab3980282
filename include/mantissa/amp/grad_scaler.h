// Dynamic loss scaling (docs/design.md §4, step 3-4): torch.amp.GradScaler's state machine, plus
// DeepSpeed's hysteresis, a min/max clamp, a static mode and a disabled mode (bf16).
//
// One iteration, as PyTorch:
//
//   scaler.scale(loss).backward();       // gradients are S * dL/dw
//   scaler.unscale_(opt);                // optional: only to touch the true gradients, e.g.
//   optim::clip_grad_norm(params, 1.0);  //   clipping (docs/design.md §4.5) between unscale_ and
//   step amp::StepResult r = scaler.step(opt);  // unscales if not done yet; skips on inf/NaN
//   scaler.update();                     // adjusts S from this iteration's overflows
//   ... r.skipped() ...                  // when the host needs to know (a wait on a GPU)
//
// The unscale and the inf/NaN check are one fused pass over all gradients of the optimizer
// (Backend::unscale_with_state). Clipping after unscale_ is safe even with inf/NaN gradients (it
// may turn them into NaN): the overflow was recorded by unscale_, so step() skips.
//
// Several losses: call scale(loss_i).backward() for each, then step every optimizer once and
// update() once. Several optimizers: each has its own unscale/step stage and overflow flag;
// update() combines the flags (an overflow anywhere backs off the scale) and resets them all.
// Gradient accumulation: the scale only changes in update(), so call it once per optimizer step,
// after the micro-batches' backward passes have accumulated (scale(loss / n).backward() each).
//
// The scale is kept as an fp32 value, as PyTorch's (a double rounded to float after every
// change), and 1 / S is rounded to fp32 before the unscale, as PyTorch's inv_scale.
//
// One implementation on every device, as PyTorch's: the state (the scale, the trackers, the
// overflow flags, the skipped-step count) lives in tensors on the device of the first tensor
// the scaler meets (the loss in scale(), or the parameters in unscale_/step), so that an
// iteration never waits for a GPU. unscale_ leaves each optimizer's overflow flag on the device;
// step() hands it to the optimizer, whose fused kernel skips itself when it is set (weights,
// moments, masters and the parameters' update counts stay bit-identical: AdamW's bias
// correction does not count a skipped step, as PyTorch's fused Adam); update() runs the update
// rule where the state lives (Backend::update_scale). What the host asks for is read back when
// asked: get_scale(), found_inf(), the trackers, the counters, StepResult::skipped() and
// state_dict() wait for a GPU; so does update() with error_at_min_scale. On the CPU these reads
// cost nothing.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <unordered_map>

#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::amp {

// What GradScaler::step() did, asked when the host needs to know. The answer lives with the
// parameters: skipped() reads it (on a GPU it waits for the step's kernels), so a training loop
// on a GPU asks once per log interval, not every step. A disabled scaler never skips.
class StepResult {
 public:
  StepResult() = default;
  explicit StepResult(Tensor found_inf) : found_inf_(std::move(found_inf)) {}
  // Whether the step was skipped because a gradient was inf or NaN.
  bool skipped() const;
  // The overflow flag itself: a one-element F32 tensor on the parameters' device (non-zero:
  // skipped), or undefined when nothing could be skipped (a disabled scaler).
  const Tensor& found_inf() const { return found_inf_; }

 private:
  Tensor found_inf_;
};

enum class ScaleMode {
  Dynamic,   // grow / back off (PyTorch's GradScaler)
  Static,    // the scale stays init_scale; steps with inf/NaN gradients are still skipped
  Disabled,  // scale 1, no unscale, no checks: step() is opt.step() (bf16 / fp32 training)
};

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;      // > 1
  double backoff_factor = 0.5;     // in (0, 1)
  int64_t growth_interval = 2000;  // clean steps in a row before the scale grows, >= 1
  // DeepSpeed: back off only after this many overflowing steps in a row (a clean step resets
  // the count); 1 = PyTorch. Every overflow resets the growth tracker, as PyTorch.
  int64_t hysteresis = 1;
  double min_scale = 1.0;           // backoff never goes below (clamped to) this
  double max_scale = 16777216.0;    // 2^24: growth never goes above (clamped to) this
  bool error_at_min_scale = false;  // throw when an overflow happens with the scale at min_scale
  ScaleMode mode = ScaleMode::Dynamic;
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  // loss * S, differentiable (the loss itself when disabled).
  Tensor scale(const Tensor& loss) const;

  // Divides the gradients of `opt` by S and records whether any is inf/NaN, in one fused pass.
  // At most once per optimizer between update() calls, and not after step(): a mantissa::Error
  // says so. Parameters without a gradient are skipped. No-op when disabled. An f16 gradient
  // (an f16 parameter's) is replaced by an f32 one first, so that the true gradient does not
  // underflow in fp16 (PyTorch refuses f16 gradients here; Apex O2 copies them to fp32 masters).
  // The first use of GradScaler::step(opt) includes this: once per optimizer per iteration.
  void unscale_(optim::Optimizer& opt);

  // Unscales if unscale_(opt) was not called, then steps `opt` with its overflow flag, so that
  // the step does nothing if a gradient of `opt` was inf/NaN (decided where the flag lives, no
  // host wait). Once per optimizer between update()s.
  StepResult step(optim::Optimizer& opt);

  // Ends the iteration: combines the overflow flags of all optimizers stepped or unscaled since
  // the last update() and adjusts the scale (Dynamic): an overflow backs off (after `hysteresis`
  // overflowing updates in a row; never below min_scale) and resets the growth tracker; a clean
  // update counts, and after growth_interval of them the scale grows (never above max_scale;
  // not at all if it would overflow fp32) and the tracker resets. Static: only counts overflows.
  // An overflow at min_scale is counted (min_scale_overflows()) and, with error_at_min_scale,
  // throws a mantissa::Error after the update is done. update() with no optimizer unscaled since
  // the last one changes nothing. No-op when disabled.
  void update();
  // Sets the scale to new_scale (> 0, finite; rounded to fp32; not clamped) and ends the
  // iteration without the automatic adjustment; the trackers are left as they are (PyTorch).
  void update(double new_scale);

  double get_scale() const;  // 1 when disabled
  // Whether the last update() saw an overflow (or, before it, whether any optimizer stepped or
  // unscaled since then did).
  bool found_inf() const;
  int64_t growth_tracker() const;
  int64_t hysteresis_tracker() const;
  // Whether the scale has reached min_scale (a dynamic scaler there cannot back off further).
  bool at_min_scale() const;
  // Overflowing updates that happened with the scale already at min_scale: a counter a trainer
  // can log (a run that keeps overflowing there has diverged).
  int64_t min_scale_overflows() const;
  // Skipped steps so far (every optimizer counted), for logs.
  int64_t skipped_steps() const;
  const GradScalerOptions& options() const { return options_; }

  // Data parallel: called with each optimizer's overflow flag (a one-element F32 tensor where the
  // state lives, non-zero when a gradient was inf/NaN) as soon as unscale_ has set it, before
  // anything reads it. It must leave the flag non-zero on every rank if it is on any (an
  // all-reduce with max, as PyTorch's ShardedGradScaler does), so that every rank skips the same
  // steps and keeps the same scale even when each unscales only part of the gradients. Unset
  // (the default): the flag is this process's alone.
  using OverflowReducer = std::function<void(Tensor& flag)>;
  void set_overflow_reducer(OverflowReducer reducer) { reducer_ = std::move(reducer); }
  // Where the state lives (see above), and whether that is a GPU.
  Device device() const { return state_.device(); }
  bool on_device() const { return state_.device().is_cuda(); }

  // The state as named tensors, as optim::Optimizer's (they go into the same safetensors
  // checkpoint, e.g. prefixed "scaler."):
  //   "scale" F64, "growth_factor" F64, "backoff_factor" F64, "growth_interval" I64,
  //   "growth_tracker" I64, "hysteresis_tracker" I64, "min_scale_overflows" I64,
  //   "skipped_steps" I64 (scalars). Empty when disabled (as PyTorch's).
  // The per-iteration stages are not saved: save after update().
  NamedTensors state_dict() const;
  // Strict: exactly those keys, with those dtypes; nothing changes unless the whole dict is
  // accepted. Growth/backoff factors and interval are taken from the dict, as PyTorch does. An
  // empty dict is refused (it comes from a disabled scaler); ignored when this one is disabled.
  void load_state_dict(const NamedTensors& dict);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    Tensor flag;  // the one-element F32 overflow flag of this iteration, on the state's device
  };
  bool enabled() const { return options_.mode != ScaleMode::Disabled; }
  // Moves the state onto `device` the first time the scaler meets a tensor; afterwards every
  // tensor must be there.
  void adopt_device(Device device, const char* what) const;
  // The flags of every optimizer since the last update() added up (non-zero: an overflow), and
  // the iteration's stages cleared.
  Tensor take_flags();
  // The host copy of state_ {scale, growth_tracker, hysteresis_tracker, min_scale_overflows}.
  std::array<double, 4> read_state() const;

  GradScalerOptions options_;
  // Mutable: the state moves to its device at the first tensor met, also in scale() const.
  mutable bool adopted_ = false;
  // F64 {scale, growth_tracker, hysteresis_tracker, min_scale_overflows}: the layout of
  // Backend::update_scale.
  mutable Tensor state_;
  mutable Tensor skipped_;         // F64 scalar: steps skipped so far (every optimizer counted)
  mutable Tensor last_found_inf_;  // F32 scalar: the last update()'s combined flag
  // Keyed by address: an optimizer must stay alive between its unscale_/step and update().
  std::unordered_map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
  OverflowReducer reducer_;
};

}  // namespace mantissa::amp
