// Internal: a model being trained, with what trains it: its optimizer(s), its precision (amp, with
// fp8 where the recipe has it), the gradient check of --on-divergence skip and, data parallel, its
// DDP wrapper. The Trainer makes one per network from the run's configuration (the GAN has two);
// a task's step runs forward, backward() and step() on them, and the loop does the rest.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mantissa/amp/amp.h"
#include "mantissa/amp/grad_scaler.h"
#include "mantissa/dist/ddp.h"
#include "mantissa/nn/module.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/train/checkpoint.h"

namespace mantissa::train {

struct Run;

class Trainee {
 public:
  // `model` (fp32, on the run's device) with the optimizer of the run's configuration over
  // `groups`, set up for the run's precision; data parallel when the run is. `name` is "" for
  // the main model, else the prefix of its tensors in checkpoints ("discriminator").
  Trainee(std::string name, std::shared_ptr<nn::Module> model,
          std::vector<optim::ParamGroup> groups, Run& run);
  ~Trainee();

  const std::string& name() const { return name_; }
  nn::Module& model() { return *model_; }
  const nn::Module& model() const { return *model_; }
  optim::Optimizer& optimizer() { return *optimizers_.front().second; }
  const optim::Optimizer& optimizer() const { return *optimizers_.front().second; }
  // Every optimizer: the main one, then those add_optimizer added.
  std::vector<optim::Optimizer*> optimizers() const;
  amp::Amp& amp() { return *amp_; }
  const amp::Amp& amp() const { return *amp_; }
  // The precision's loss scaler, or the gradient check of --on-divergence skip.
  amp::GradScaler& scaler() { return check_ ? *check_ : amp_->scaler(); }
  const amp::GradScaler& scaler() const { return check_ ? *check_ : amp_->scaler(); }
  dist::DistributedDataParallel* ddp() { return ddp_.get(); }
  const dist::DistributedDataParallel* ddp() const { return ddp_.get(); }
  // ZeRO-3: the model's parameters whole while the result lives (null otherwise): a collective,
  // opened at the same point on every rank.
  std::unique_ptr<dist::DistributedDataParallel::FullParameters> whole_parameters() const;

  // Another optimizer over parameters of this model that the main one does not hold (the
  // recommender's embedding tables): the same masters and rounding, stepped with the main one
  // (a skip skips both), its state under "optimizer.<name>." in checkpoints.
  void add_optimizer(const std::string& name, std::unique_ptr<optim::Optimizer> opt);

  // model(x) in the run's precision (amp's forward, inside the fp8 region for fp8).
  Tensor forward(const Tensor& x) const { return amp_->forward(*model_, x); }
  nn::TensorList forward(const nn::TensorList& x) const { return amp_->forward(*model_, x); }
  // The run's --zero-grad, before a step's backward.
  void zero_grad();
  // scaler().scale(loss).backward()
  void backward(const Tensor& loss);

  // The optimizer step after backward: the data-parallel gradients finished, gradient
  // histograms and the gradient norm when the loop asks for them (run.step), clipping, the
  // scaler's unscale, check, step and update, fp8's scales and ZeRO-1's gather. `overflow`
  // also skips it (the recommender's lazily updated tables held inf/NaN). Returns whether it
  // was skipped, as far as the host knows (a GPU's scaler decides on the device).
  bool step(Run& run, bool overflow = false);
  // Whether the last step() was skipped (host-known) and its gradient norm (F64 on the device;
  // undefined unless the loop asked for it).
  bool last_skipped() const { return last_skipped_; }
  const Tensor& last_grad_norm() const { return grad_norm_; }

  // The state a checkpoint holds, names prefixed with name() (the main model's unprefixed):
  // the model's tensors, the optimizers' ("optimizer." is added by the checkpoint), and the
  // scaler's and fp8's (under "scaler.").
  void save(NamedTensors& model, NamedTensors& optimizer, NamedTensors& scaler,
            const Run& run) const;
  // The model's weights (and fp8's scales) from a checkpoint; with `everything`, the optimizers
  // and the scaler too. `others`: the other trainees' names (the main model's unprefixed names
  // leave their tensors out).
  void load(const Checkpoint& ckpt, bool everything, const std::vector<std::string>& others);

 private:
  std::string prefix() const { return name_.empty() ? "" : name_ + "."; }
  void write_gradient_histograms(Run& run, int64_t step);
  bool skip_and_record(Run& run, const amp::StepResult& result);

  std::string name_;
  std::shared_ptr<nn::Module> model_;
  std::vector<std::pair<std::string, std::unique_ptr<optim::Optimizer>>> optimizers_;
  std::unique_ptr<amp::Amp> amp_;
  std::unique_ptr<amp::GradScaler> check_;  // --on-divergence skip without a loss scaler
  std::unique_ptr<dist::DistributedDataParallel> ddp_;
  std::vector<Tensor> flags_;  // the overflow flags of this step's unscales (several optimizers)
  bool overflow_ = false;      // step()'s `overflow`, while it runs
  uint64_t seed_;              // of stochastic rounding
  bool set_to_none_;           // --zero-grad none
  bool last_skipped_ = false;
  Tensor grad_norm_;
};

// The optimizer of the run's configuration (sgd or adamw with their options) over `groups`.
std::unique_ptr<optim::Optimizer> make_optimizer(const config::TrainConfig& c,
                                                 std::vector<optim::ParamGroup> groups);

}  // namespace mantissa::train
