// Dynamic loss scaling (DESIGN.md §4, step 3-4): torch.amp.GradScaler's state machine, plus
// DeepSpeed's hysteresis, a min/max clamp, a static mode and a disabled mode (bf16).
//
// One iteration, as PyTorch:
//
//   scaler.scale(loss).backward();       // gradients are S * dL/dw
//   scaler.unscale_(opt);                // optional: only to touch the true gradients, e.g.
//   optim::clip_grad_norm(params, 1.0);  //   clipping (DESIGN.md §4.5) between unscale_ and step
//   bool skipped = scaler.step(opt);     // unscales if not done yet; skips on inf/NaN
//   scaler.update();                     // adjusts S from this iteration's overflows
//
// The unscale and the inf/NaN check are one fused pass over all gradients of the optimizer
// (Backend::unscale_and_check). A skipped step calls nothing on the optimizer: its weights,
// moments and step counts stay bit-identical. Clipping after unscale_ is safe even with inf/NaN
// gradients (it may turn them into NaN): the overflow was recorded by unscale_, so step() skips.
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
// On a GPU (the first optimizer unscaled or stepped has its parameters on CUDA) the scaler keeps
// its state on that device, as PyTorch's does, so that an iteration never waits for the GPU:
// scale(loss) multiplies by the device scale, unscale_/step leave the overflow flag on the
// device and hand it to the optimizer, whose fused kernel then skips itself (no host decision),
// and update() runs the same update rule in a one-thread kernel (Backend::update_scale). What
// the host asks for is read back when asked: get_scale(), found_inf(), the trackers, the
// counters and state_dict() wait for the GPU; so does update() with error_at_min_scale, and
// update(new_scale). Two differences from the host path follow from not deciding on the host:
// step() returns false (skipped_steps() and found_inf() tell, later), and the optimizer still
// counts a skipped step in its step counts (AdamW's bias correction then sees one more step;
// its weights, moments and masters are left bit-identical all the same).
#pragma once

#include <cstdint>
#include <unordered_map>

#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::amp {

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

  // Unscales if unscale_(opt) was not called, then calls opt.step() unless a gradient of `opt`
  // was inf/NaN. Returns true when the step was skipped (on a GPU: always false, the skip being
  // decided on the device; see above). Once per optimizer between update()s.
  bool step(optim::Optimizer& opt);

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
  // Whether the state lives on a GPU (see above).
  bool on_device() const { return device_state_.defined(); }

  // The state as named tensors, as optim::Optimizer's (they go into the same safetensors
  // checkpoint, e.g. prefixed "scaler."):
  //   "scale" F64, "growth_factor" F64, "backoff_factor" F64, "growth_interval" I64,
  //   "growth_tracker" I64, "hysteresis_tracker" I64, "min_scale_overflows" I64,
  //   "skipped_steps" I64 (scalars). Empty when disabled (as PyTorch's).
  // The per-iteration stages are not saved: save after update().
  optim::StateDict state_dict() const;
  // Strict: exactly those keys, with those dtypes; nothing changes unless the whole dict is
  // accepted. Growth/backoff factors and interval are taken from the dict, as PyTorch does. An
  // empty dict is refused (it comes from a disabled scaler); ignored when this one is disabled.
  void load_state_dict(const optim::StateDict& dict);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    bool found_inf = false;
    Tensor flag;  // on a GPU: the one-element F32 overflow flag, left there
  };
  bool enabled() const { return options_.mode != ScaleMode::Disabled; }
  // Moves the state onto `device` the first time a CUDA optimizer comes by.
  void adopt_device(Device device);
  // The host copy of the state, read back from the device when it lives there.
  void pull() const;
  void push();

  GradScalerOptions options_;
  // The host state; on a GPU, a copy refreshed by pull() (hence mutable).
  mutable double scale_;
  mutable int64_t growth_tracker_ = 0;
  mutable int64_t hysteresis_tracker_ = 0;
  mutable int64_t min_scale_overflows_ = 0;
  int64_t skipped_steps_ = 0;  // on a GPU: those counted before (state dicts); see below
  bool last_found_inf_ = false;
  // On a GPU: F64 {scale, growth_tracker, hysteresis_tracker, min_scale_overflows} (the layout
  // of Backend::update_scale), the skipped steps counted there since (F32), and the last
  // update()'s combined flag. Undefined on the host path.
  Tensor device_state_;
  Tensor device_skipped_;
  Tensor device_last_found_inf_;
  // Keyed by address: an optimizer must stay alive between its unscale_/step and update().
  std::unordered_map<const optim::Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace mantissa::amp
