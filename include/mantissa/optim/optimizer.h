// Optimizers: SGD and AdamW with PyTorch's exact update rules, each step ONE fused pass over all
// parameters (a single multi-tensor backend call, DESIGN.md §5), whatever their number and dtype.
//
// Parameters are loaded in their storage dtype (f32, bf16, f16, f64), updated in fp32 (f64 for
// f64) and rounded once on store (round to nearest even). The state (momentum, exp_avg,
// exp_avg_sq) is fp32 for f32 and half parameters, f64 for f64 ones. Parameters whose gradient is
// undefined are skipped and their state is left alone, as in PyTorch; each parameter counts its
// own updates (AdamW's bias corrections use that count).
//
// Mixed precision (DESIGN.md §4), inside the same fused kernels: with set_master_weights(true)
// the optimizer keeps an fp32 master copy of every parameter stored narrower than f32 (f16, bf16,
// fp8); the update reads and writes the master in fp32 and the parameter receives the result
// rounded once. set_store_rounding() picks how updated values are rounded into narrow
// parameters, with or without masters: to nearest even, or stochastically (unbiased: small
// updates survive in expectation, which is what bf16 parameters without a master need). Steps
// with inf/NaN gradients are skipped by amp::GradScaler: on the CPU before step() is called, on
// a GPU by the step's kernel itself (skip_next_step_if).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mantissa/numerics/format.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend {
struct MultiTensorOptions;
}

namespace mantissa::optim {

// Named tensors, as written to a safetensors checkpoint.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

class Optimizer {
 public:
  // All parameters on one device, each at most once.
  Optimizer(std::vector<Tensor> params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient, in one fused pass. Counts a step even
  // when no parameter has a gradient.
  virtual void step() = 0;

  // set_to_none drops the gradient tensors (free, and the next backward allocates fresh ones);
  // otherwise they are zeroed in place.
  void zero_grad(bool set_to_none = true);

  double lr() const { return lr_; }
  void set_lr(double lr);  // >= 0 and finite; what LR schedules call before each step
  // Completed step() calls.
  int64_t step_count() const { return step_count_; }
  const std::vector<Tensor>& params() const { return params_; }

  // All state as tensors with stable names (copies, safe to keep or write out):
  //   "step"               I64 scalar: step_count()
  //   "lr"                 F64 scalar: lr()
  //   "state.<i>.step"     I64 scalar: updates of parameter i so far
  //   "state.<i>.<name>"   state tensor `name` of parameter i (state_names()), its shape
  //   "master.<i>"         F32: the fp32 master of parameter i (with master weights on)
  // Parameters never updated have no "state.<i>.*" entries.
  virtual StateDict state_dict() const;
  // Strict: every key must be one state_dict() could write for these parameters, "step" and
  // "lr" must be there, a parameter's entries must be complete, and dtypes and shapes must
  // match; an error names the offending key. Nothing changes unless the whole dict is accepted.
  // The tensors are copied. Masters are accepted only with master weights on; a parameter whose
  // master is not in the dict keeps its current one.
  virtual void load_state_dict(const StateDict& dict);

  // The per-parameter state tensors, in state_dict order ("momentum_buffer"; "exp_avg",
  // "exp_avg_sq").
  virtual std::vector<std::string> state_names() const = 0;

  // ---- mixed precision -----------------------------------------------------------------------
  // On: copies every parameter not stored in f64 into an fp32 master now (call it while the
  // parameters still hold their fp32 values, i.e. before casting the model, as
  // amp::initialize does; a parameter that is narrower already starts its master from its
  // rounded value). From then on, a step updates the master of each parameter stored narrower
  // than f32 and writes its rounding into the parameter; parameters stored in f32/f64 need no
  // master and theirs is dropped. A parameter written by anything but step() (e.g. a
  // load_state_dict into the model) is detected at the next step: if it no longer is a
  // rounding of its master, the master restarts from it. Off: drops the masters.
  // state_dict() saves the masters as "master.<i>" (F32).
  void set_master_weights(bool on);
  bool master_weights() const { return master_weights_; }
  // The master of parameter i; undefined when it has none.
  const Tensor& master(size_t i) const;
  // How a step rounds updated values into parameters stored narrower than the compute type:
  // NearestEven (the default) or Stochastic, where element j of parameter i at step s (1-based)
  // draws random_bits(seed, s, (i << 40) + j): reproducible, and fresh bits every step.
  void set_store_rounding(RoundingMode mode, uint64_t seed = 0);
  RoundingMode store_rounding() const { return store_rounding_; }

  // The loss scaler's device-side skip (amp::GradScaler on a GPU), for the next step() only:
  // `found_inf` is a one-element F32 tensor on the parameters' device, and the step's kernel
  // changes nothing (parameters, masters, state) when it holds a non-zero value, without the
  // host reading it. The step still counts (step_count() and each parameter's update count are
  // host state); state made by that step starts at zero, so a skipped first update leaves
  // valid state behind.
  void skip_next_step_if(Tensor found_inf);

 protected:
  struct ParamState {
    int64_t steps = 0;            // updates of this parameter so far; 0: no state yet
    std::vector<Tensor> tensors;  // one per state_names(), once steps > 0
  };

  // The parameters with a gradient this step, with their gradients, state and step numbers
  // (already incremented: 1 on a first update). State is allocated (uninitialized: the kernels
  // write it on a first update) and converted if the parameter's dtype changed (set_data).
  struct StepBatch {
    std::vector<size_t> index;
    std::vector<Tensor> params;
    std::vector<Tensor> grads;
    std::vector<std::vector<Tensor>> states;  // [state name][k]
    std::vector<int64_t> steps;
    std::vector<Tensor> masters;  // [k]: empty without master weights; undefined: none
    std::vector<uint64_t> ids;    // [k]: the parameter's index (stochastic rounding's stream)
  };
  StepBatch begin_step(size_t num_states);
  // Counts the step and bumps the versions of what the kernel wrote.
  void end_step(const StepBatch& batch);
  // Tells the kernel about this batch's masters and the store rounding.
  void fill_options(StepBatch& batch, backend::MultiTensorOptions& options) const;

  std::vector<Tensor> params_;
  std::vector<ParamState> state_;
  double lr_;
  int64_t step_count_ = 0;

 private:
  // The master of parameter i for this step (made, kept, dropped or restarted as documented).
  Tensor& prepare_master(size_t i);

  bool master_weights_ = false;
  struct Master {
    Tensor value;                // F32; undefined: none
    const void* data = nullptr;  // the parameter's storage and version when it was last
    uint32_t version = 0;        //   known to be the master's rounding
  };
  std::vector<Master> masters_;
  RoundingMode store_rounding_ = RoundingMode::NearestEven;
  uint64_t rounding_seed_ = 0;
  Tensor found_inf_;  // skip_next_step_if's flag; undefined: none
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
};

// torch.optim.SGD: g += wd * p; with momentum, buf = momentum * buf + (1 - dampening) * g
// (buf = g on a parameter's first update) and g = nesterov ? g + momentum * buf : buf;
// p -= lr * g. State: "momentum_buffer" (only with momentum).
class SGD final : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  void step() override;
  std::vector<std::string> state_names() const override;
  // The options, with lr as set_lr() last left it.
  SGDOptions options() const;

 private:
  SGDOptions options_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// torch.optim.AdamW: p *= 1 - lr * wd; m = beta1 * m + (1 - beta1) * g;
// v = beta2 * v + (1 - beta2) * g^2; p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
// with t the parameter's update count. State: "exp_avg", "exp_avg_sq".
class AdamW final : public Optimizer {
 public:
  explicit AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  void step() override;
  std::vector<std::string> state_names() const override;
  AdamWOptions options() const;

 private:
  AdamWOptions options_;
};

}  // namespace mantissa::optim
