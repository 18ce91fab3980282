// A network with what trains it (trainee.h).
#include "train/trainee.h"

#include <cmath>
#include <span>
#include <unordered_map>

#include "mantissa/amp/precision.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/optim/clip.h"
#include "mantissa/tensor/ops.h"
#include "train/run.h"

namespace mantissa::train {

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c,
                                                 std::vector<optim::ParamGroup> groups) {
  switch (c.optimizer) {
    case config::OptimizerKind::Sgd: {
      optim::SGDOptions o;
      o.lr = c.lr;
      o.momentum = c.momentum;
      o.weight_decay = c.weight_decay;
      o.nesterov = c.nesterov;
      o.momentum_format = c.optim_state;
      o.blocks.block = c.state_block;
      return std::make_unique<optim::SGD>(std::move(groups), o);
    }
    case config::OptimizerKind::AdamW: {
      optim::AdamWOptions o;
      o.lr = c.lr;
      o.beta1 = c.beta1;
      o.beta2 = c.beta2;
      o.eps = c.eps;
      o.weight_decay = c.weight_decay;
      o.exp_avg_format = config::exp_avg_format_of(c);
      o.exp_avg_sq_format = config::exp_avg_sq_format_of(c);
      o.blocks.block = c.state_block;
      return std::make_unique<optim::AdamW>(std::move(groups), o);
    }
  }
  MT_ASSERT(false, "no optimizer ", int(c.optimizer));
}

Trainee::Trainee(std::string name, std::shared_ptr<nn::Module> model,
                 std::vector<optim::ParamGroup> groups, Run& run)
    : name_(std::move(name)),
      model_(std::move(model)),
      seed_(run.config.seed),
      set_to_none_(run.config.zero_grad == config::ZeroGrad::None) {
  const TrainConfig& c = run.config;
  // Before the optimizer and amp::initialize: their state (momenta, fp32 masters, the scaler's
  // flag) is made where the parameters are.
  model_->to(run.device);
  optimizers_.emplace_back("", make_optimizer(c, std::move(groups)));
  amp_ = std::make_unique<amp::Amp>(amp::initialize(*model_, optimizer(), config::recipe_of(c)));
  if (c.on_divergence == config::OnDivergence::Skip &&
      amp_->scaler().options().mode == amp::ScaleMode::Disabled) {
    // A precision without a loss scaler applies every step: checking the gradients (one fused
    // pass) lets a step with inf/NaN be skipped instead.
    amp::GradScalerOptions check;
    check.init_scale = 1;
    check.mode = amp::ScaleMode::Static;
    check_ = std::make_unique<amp::GradScaler>(check);
  }
  if (run.comm) {
    // After amp::initialize, which may replace the parameters by half copies: the hooks go on
    // the tensors that train. Broadcasts rank 0's weights.
    dist::DdpOptions o;
    o.bucket_mb = c.bucket_mb;
    o.grad_comm = config::grad_comm_dtype(c.grad_comm);
    o.zero_stage = c.zero;
    ddp_ = std::make_unique<dist::DistributedDataParallel>(*model_, run.comm, o);
    // ZeRO-1, 2: this rank's optimizer keeps state for, and updates, its own share (ZeRO-2:
    // from the gradient shards DDP hands it).
    ddp_->set_optimizer(optimizer());
  }
  // Each unscale's overflow flag passes here: data parallel, the averaged gradients carry an inf
  // from any rank to all, and the flag's all-reduce makes the skip the same everywhere whatever
  // a rank sees alone (one 4-byte collective a step); `overflow` raises it; with several
  // optimizers the flags are kept to be combined.
  if (scaler().options().mode != amp::ScaleMode::Disabled) {
    scaler().set_overflow_reducer([this, comm = ddp_ ? run.comm : nullptr](Tensor& flag) {
      if (overflow_) flag.fill_(1.0);
      if (comm) comm->all_reduce(flag, dist::ReduceOp::Max);
      flags_.push_back(flag);
    });
  }
}

Trainee::~Trainee() = default;

std::vector<optim::Optimizer*> Trainee::optimizers() const {
  std::vector<optim::Optimizer*> out;
  for (const auto& [n, o] : optimizers_)
    out.push_back(o.get());
  return out;
}

void Trainee::add_optimizer(const std::string& name, std::unique_ptr<optim::Optimizer> opt) {
  MT_ASSERT(!name.empty() && !ddp_, "an added optimizer needs a name and no data parallelism");
  opt->set_master_weights(optimizer().master_weights());
  opt->set_store_rounding(optimizer().store_rounding(), seed_);
  opt->set_compensation(optimizer().compensation());
  optimizers_.emplace_back(name, std::move(opt));
}

std::unique_ptr<dist::DistributedDataParallel::FullParameters> Trainee::whole_parameters() const {
  if (!ddp_ || ddp_->zero_stage() < 3) return nullptr;
  return std::make_unique<dist::DistributedDataParallel::FullParameters>(ddp_.get());
}

void Trainee::zero_grad() {
  for (auto& [n, o] : optimizers_)
    o->zero_grad(set_to_none_);
}

void Trainee::backward(const Tensor& loss) {
  scaler().scale(loss).backward();
}

void Trainee::write_gradient_histograms(Run& run, int64_t step) {
  NoGrad ng;
  const double factor = 1.0 / scaler().get_scale();
  for (const auto& [pname, p] : model_->named_parameters()) {
    if (!p.grad().defined()) continue;
    std::vector<float> v = p.grad().to(DType::F32).to_vector<float>();
    if (factor != 1.0)
      for (float& x : v)
        x = float(double(x) * factor);
    run.log->histogram("gradients/" + prefix() + pname, v, step);
  }
}

// Whether the step was skipped (known on the host: the CPU's), and the record that names the
// parameters whose gradients held inf/NaN.
bool Trainee::skip_and_record(Run& run, const amp::StepResult& result) {
  const bool skipped = !scaler().on_device() && result.skipped();
  if (!skipped || !run.log->enabled()) return skipped;
  NoGrad ng;
  Json layers = Json::array();
  for (const auto& [pname, p] : model_->named_parameters()) {
    if (!p.grad().defined()) continue;
    for (const float g : p.grad().to(DType::F32).to_vector<float>()) {
      if (!std::isfinite(g)) {
        layers.push_back(prefix() + pname);
        break;
      }
    }
  }
  auto j = record("skipped_step");
  j["step"] = run.state.step + 1;
  j["loss_scale"] = scaler().get_scale();
  j["nonfinite_gradients"] = std::move(layers);
  run.log->write(j);
  return skipped;
}

bool Trainee::step(Run& run, bool overflow) {
  const TrainConfig& c = run.config;
  amp::GradScaler& sc = scaler();
  overflow_ = overflow;
  flags_.clear();
  // Every rank's gradients become their mean over the ranks (an inf or NaN anywhere reaches
  // every rank, so all skip the same steps); a rank's norm is then the global norm.
  if (ddp_) ddp_->finish_gradients();
  if (run.request.histograms) write_gradient_histograms(run, run.state.step + 1);
  const bool several = optimizers_.size() > 1;
  grad_norm_ = Tensor();
  if (c.clip_grad_norm > 0 || (several && sc.options().mode != amp::ScaleMode::Disabled)) {
    for (optim::Optimizer* o : optimizers())
      sc.unscale_(*o);  // clip the true gradients, not the scaled ones
  }
  // What the optimizers apply: the parameters' .grad, or ZeRO-2's shards.
  std::vector<Tensor> grads;
  for (optim::Optimizer* o : optimizers())
    for (Tensor& g : o->gradients())
      grads.push_back(std::move(g));
  if (c.clip_grad_norm > 0) {
    // ZeRO: each rank holds its own share of the gradients; the norm is over all ranks'.
    const Tensor norm =
        optim::clip_gradients(grads, c.clip_grad_norm, 2.0,
                              ddp_ ? ddp_->norm_combiner() : optim::NormCombiner{}, run.device);
    if (run.request.record_norm) grad_norm_ = norm;
  } else if (run.request.record_norm && c.zero == 0) {
    // The norm of the true gradients (over the loss scale); ZeRO without clipping records none
    // (a rank holds only its share of the gradients).
    NoGrad ng;
    grad_norm_ = div(optim::gradients_norm(grads, 2.0, {}, run.device), sc.get_scale());
  }
  if (several && flags_.size() > 1) {
    // Either optimizer's overflow skips both (on the device: no host wait).
    NoGrad ng;
    Tensor any = flags_[0];
    for (size_t i = 1; i < flags_.size(); ++i)
      any = maximum(any, flags_[i]);
    for (Tensor& f : flags_)
      f.copy_(any);
  }
  bool skipped = false;
  for (optim::Optimizer* o : optimizers())
    skipped = skip_and_record(run, sc.step(*o)) || skipped;
  sc.update();
  overflow_ = false;
  // Delayed scaling: the next step's scales from this step's amaxes, their maximum over the
  // ranks (every rank quantizes with the same scales, and rank 0's checkpoint holds them all).
  if (amp::Fp8Context* fp8 = amp_->fp8()) {
    amp::Fp8Context::AmaxReduce over_ranks;
    if (run.comm) {
      // On the device, through the gradients' communicator (NCCL for GPUs): no host read.
      over_ranks = [comm = run.comm](Tensor& amaxes) {
        comm->all_reduce(amaxes, dist::ReduceOp::Max);
      };
    }
    fp8->update(over_ranks);
  }
  if (ddp_) ddp_->all_gather_parameters();  // ZeRO-1: every owner's update to every rank
  last_skipped_ = skipped;
  return skipped;
}

void Trainee::save(NamedTensors& model, NamedTensors& optimizer, NamedTensors& scaler,
                   const Run& run) const {
  (void)run;
  // ZeRO-3: copies of the gathered parameters (released again when the scope closes).
  const auto whole = whole_parameters();
  for (auto& [n, t] : model_->state_dict())
    model.emplace_back(prefix() + n, whole ? t.clone() : t);
  for (const auto& [oname, o] : optimizers_) {
    // ZeRO-1: the optimizer's state is spread over the ranks; every rank sends its share to
    // rank 0, which writes the whole of it, as an unsharded run would.
    const NamedTensors state = ddp_ ? ddp_->gather_optimizer_state(*o) : o->state_dict();
    const std::string p = prefix() + (oname.empty() ? "" : oname + ".");
    for (const auto& [n, t] : state)
      optimizer.emplace_back(p + n, t);
  }
  for (auto& [n, t] : amp_->scaler().state_dict())
    scaler.emplace_back(prefix() + n, t);
  if (amp_->fp8()) {
    for (auto& [n, t] : amp_->fp8()->state_dict())
      scaler.emplace_back(prefix() + n, t);
  }
}

namespace {

// The tensors of `all` whose names start with `prefix` and, with `fp8`, then "fp8." (or not),
// the prefix taken off. The main trainee (prefix "") leaves other trainees' tensors out by
// `others`.
NamedTensors with_prefix(const NamedTensors& all, const std::string& prefix,
                         const std::vector<std::string>& others) {
  NamedTensors out;
  for (const auto& [n, t] : all) {
    if (!n.starts_with(prefix)) continue;
    bool other = false;
    for (const std::string& o : others)
      other = other || (!o.empty() && n.starts_with(o + "."));
    if (prefix.empty() && other) continue;
    out.emplace_back(n.substr(prefix.size()), t);
  }
  return out;
}

// The model was built from the data given now (its columns, vocabulary, image channels): a
// tensor shaped otherwise than the checkpoint's means other data than the run trained on.
void check_fits_the_data(const nn::Module& model, const NamedTensors& saved) {
  const NamedTensors state = model.state_dict();
  std::unordered_map<std::string, const Tensor*> mine;
  for (const auto& [name, t] : state)
    mine.emplace(name, &t);
  for (const auto& [n, s] : saved) {
    const auto it = mine.find(n);
    if (it == mine.end() || s.shape() == it->second->shape()) continue;
    MT_CHECK(false, "the data given does not fit the checkpoint's model: its tensor '", n, "' is ",
             s.shape().str(), ", but the model this data builds has ", it->second->shape().str(),
             " (the data's columns, vocabulary or images differ from the data the run trained "
             "on); give that data, or a checkpoint of a run on this one");
  }
}

}  // namespace

void Trainee::load(const Checkpoint& ckpt, bool everything,
                   const std::vector<std::string>& others) {
  const NamedTensors saved = with_prefix(ckpt.model, prefix(), others);
  check_fits_the_data(*model_, saved);
  {
    const auto whole = whole_parameters();  // ZeRO-3: written whole, then resharded
    model_->load_state_dict(saved);
  }
  NamedTensors scaler_state, fp8_state;
  for (auto& [n, t] : with_prefix(ckpt.scaler, prefix(), others))
    (n.starts_with("fp8.") ? fp8_state : scaler_state).emplace_back(n, t);
  if (amp_->fp8()) amp_->fp8()->load_state_dict({fp8_state.begin(), fp8_state.end()});
  if (!everything) return;
  const NamedTensors opt_state = with_prefix(ckpt.optimizer, prefix(), others);
  for (const auto& [oname, o] : optimizers_) {
    if (oname.empty()) {
      NamedTensors own;
      for (const auto& [n, t] : opt_state) {
        bool added = false;
        for (const auto& [other, unused] : optimizers_)
          added = added || (!other.empty() && n.starts_with(other + "."));
        if (!added) own.emplace_back(n, t);
      }
      o->load_state_dict(own);
    } else {
      o->load_state_dict(with_prefix(opt_state, oname + ".", {}));
    }
  }
  // (The gradient check of --on-divergence skip, a static scale of 1, keeps no state.)
  if (amp_->scaler().options().mode != amp::ScaleMode::Disabled && !scaler_state.empty()) {
    amp_->scaler().load_state_dict(scaler_state);
  }
}

}  // namespace mantissa::train
