// Optimizers: SGD and AdamW with PyTorch's exact update rules, each step ONE fused pass over the
// parameters of each parameter group (a single multi-tensor backend call per group, docs/design.md
// §5), whatever their number and dtype.
//
// Parameters are loaded in their storage dtype (f32, bf16, f16, f64), updated in fp32 (f64 for
// f64) and rounded once on store (round to nearest even). The state (momentum, exp_avg,
// exp_avg_sq) is fp32 for f32 and half parameters, f64 for f64 ones, unless the options pick a
// narrower StateFormat for it (state_format.h: bf16, fp8 or bitsandbytes' blockwise 8-bit, each
// moment its own). Parameters whose gradient is undefined are skipped and their state is left
// alone, as in PyTorch.
//
// Parameter groups, as PyTorch's param_groups: each group has its own parameters and may set its
// own learning rate, weight decay and the optimizer's other hyper-parameters; what a group does
// not set comes from the optimizer's options. The common case, no weight decay on biases and
// norm weights:
//
//   optim::AdamW opt(optim::weight_decay_groups(model->named_parameters(), 0.1), {.lr = 3e-4});
//
// Parameters are numbered across the groups in order (parameter i of state_dict() is params()[i]).
// LR schedules act on every group (LRSchedule::apply): each group follows the schedule from its
// own base learning rate.
//
// Step counts live where the parameters do, as PyTorch's fused optimizers keep theirs: each
// parameter counts its own updates on the device (AdamW's bias corrections use that count), and a
// step the loss scaler skips on the device (skip_next_step_if) does not count, without the host
// waiting to find out.
//
// Mixed precision (docs/design.md §4), inside the same fused kernels: with set_master_weights(true)
// the optimizer keeps an fp32 master copy of every parameter stored narrower than f32 (f16, bf16,
// fp8); the update reads and writes the master in fp32 and the parameter receives the result
// rounded once. set_store_rounding() picks how updated values are rounded into narrow
// parameters, with or without masters: to nearest even, stochastically (unbiased: small
// updates survive in expectation, which is what bf16 parameters without a master need), or
// truncated toward zero (biased: what the BFLOAT16 study compared round-to-nearest with).
// Without masters, set_compensation(Compensation::Kahan) keeps a buffer of each narrow
// parameter's rounding error and adds it back at the next update (state_format.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mantissa/numerics/format.h"
#include "mantissa/optim/state_format.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::optim {

// The hyper-parameters a parameter group may set for itself; unset fields take the optimizer's
// options. Each optimizer accepts the fields it has (SGD: lr, weight_decay, momentum, dampening,
// nesterov; AdamW: lr, weight_decay, beta1, beta2, eps) and refuses a group that sets another.
struct GroupOptions {
  std::optional<double> lr = {};
  std::optional<double> weight_decay = {};
  std::optional<double> momentum = {};
  std::optional<double> dampening = {};
  std::optional<bool> nesterov = {};
  std::optional<double> beta1 = {};
  std::optional<double> beta2 = {};
  std::optional<double> eps = {};
};

struct ParamGroup {
  std::vector<Tensor> params = {};
  GroupOptions options = {};
  std::string name = {};  // for messages and logs, e.g. "decay", "no_decay"
};

// nanoGPT's and Hugging Face Trainer's split: parameters of two or more dims (weights of linear
// layers, convolutions, embeddings) decay with `weight_decay`, the others (biases, norm weights
// and biases) do not. Two groups, "decay" and "no_decay", in the order of `named_params`; an
// empty one is left out.
std::vector<ParamGroup> weight_decay_groups(const NamedTensors& named_params, double weight_decay);

// Elements [begin, end) of a tensor, in its row-major order.
struct ElementRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const ElementRange&) const = default;
};

// The blocks of `block` elements (counted from element 0) that elements `r` touch: a
// block-scaled state's scales of that range (state_format.h).
constexpr ElementRange blocks_of(ElementRange r, int64_t block) {
  return {r.begin / block, (r.end + block - 1) / block};
}

class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient: one fused pass per group. Counts a step
  // (step_count()) even when no parameter has a gradient, but not when the loss scaler skips it.
  void step();

  // set_to_none drops the gradient tensors (free, and the next backward allocates fresh ones);
  // otherwise they are zeroed in place. Gradient shards (set_gradient_shard) are dropped.
  void zero_grad(bool set_to_none = true);

  // ---- gradients ------------------------------------------------------------------------------
  // The gradient the next step applies to parameter i: its shard (below) when one is set, else
  // the parameter's .grad (undefined: none).
  Tensor gradient(size_t i) const;
  // The defined gradients of every parameter, in order (what clipping and the loss scaler's
  // check go over).
  std::vector<Tensor> gradients() const;
  // ZeRO-2: the gradient of the part of parameter i this optimizer owns (set_owned_ranges), as
  // a flat tensor of owned_range(i).size() elements, in place of .grad (which the caller drops:
  // a rank keeps the gradient of what it updates alone). Undefined: none. Kept until the next
  // zero_grad().
  void set_gradient_shard(size_t i, Tensor g);
  // ZeRO-3: where the part of parameter i this optimizer owns lives between steps, in place of
  // the parameter's own storage (released outside its module's forward and backward): a
  // contiguous tensor of the parameter's dtype and device with owned_range(i).size() elements,
  // the owned part's shape (the parameter's when it is owned whole, else flat). A step reads and
  // writes it (and its version) instead of the parameter; masters and compensations follow it.
  // Set it after set_owned_ranges(), holding the owned values. Undefined: the parameter again.
  void set_parameter_shard(size_t i, Tensor shard);
  // Replaces what gradient(i) returns (its shard, or the parameter's .grad), e.g. by an fp32
  // copy: of the same shape.
  void set_gradient(size_t i, Tensor g);

  // ---- groups and learning rates -------------------------------------------------------------
  size_t num_groups() const { return groups_.size(); }
  const std::string& group_name(size_t group) const;
  // The parameters of a group, and all of them in order (the numbering of state_dict()).
  const std::vector<Tensor>& group_params(size_t group) const;
  const std::vector<Tensor>& params() const { return params_; }
  // The learning rate the next step uses: of group 0, or of the given group.
  double lr() const { return lr(0); }
  double lr(size_t group) const;
  // The group's learning rate as it was made (its own, or the optimizer's): what schedules
  // scale (PyTorch's initial_lr).
  double base_lr(size_t group) const;
  // Sets the learning rate of every group (>= 0 and finite); with one group, what a schedule
  // does. set_lr(group, lr) sets one.
  void set_lr(double lr);
  void set_lr(size_t group, double lr);
  // Completed step() calls, skipped ones not counted, and the updates parameter i has received
  // (its AdamW t). Both are counted on the parameters' device: reading one waits for a GPU.
  int64_t step_count() const;
  int64_t updates(size_t i) const;

  // All state as tensors with stable names (copies, safe to keep or write out):
  //   "step"               I64 scalar: step_count()
  //   "lr"                 F64 scalar: lr() (group 0)
  //   "group.<g>.lr"       F64 scalar: lr(g), for every group when there are several
  //   "state.<i>.step"     I64 scalar: updates(i)
  //   "state.<i>.<name>"   state tensor `name` of parameter i (state_names()), its shape, in
  //                        its format's dtype (state_format(i, k): f32/f64, bf16, fp8_e4m3
  //                        or u8 codes)
  //   "state.<i>.<name>.absmax"  F32 (blocks): a block-scaled state's absmax per block
  //   "master.<i>"         F32: the fp32 master of parameter i (with master weights on)
  //   "compensation.<i>"   the Kahan compensation of parameter i (its dtype and shape)
  // Parameters never updated have no "state.<i>.*" entries. A sharded optimizer
  // (set_owned_ranges) writes the entries of what it owns, a slice's state and master flat.
  virtual NamedTensors state_dict() const;
  // Strict: every key must be one state_dict() could write for these parameters, "step" and
  // "lr" must be there, a parameter's entries must be complete, and dtypes and shapes must
  // match; an error names the offending key. Nothing changes unless the whole dict is accepted.
  // The tensors are copied. Masters are accepted only with master weights on; a parameter whose
  // master is not in the dict keeps its current one.
  virtual void load_state_dict(const NamedTensors& dict);

  // The state tensors each parameter of `group` keeps, in state_dict order ("momentum_buffer"
  // for SGD with momentum; "exp_avg", "exp_avg_sq").
  virtual std::vector<std::string> state_names(size_t group = 0) const = 0;
  // How parameter i keeps its state k (of state_names()): the options' format for that state,
  // except fp32 for a block-scaled format on a parameter under BlockOptions::min_numel elements.
  StateFormat state_format(size_t i, size_t k) const;
  // The storage dtype of that state (the compute type's for fp32).
  DType state_dtype(size_t i, size_t k) const;
  // How block-scaled states are cut (the options' BlockOptions).
  virtual BlockOptions block_options() const = 0;

  // ---- sharding (ZeRO-1) ---------------------------------------------------------------------
  // Which elements of each parameter this optimizer updates: owned[i] for parameter i (an empty
  // vector: all of every parameter, the default). ZeRO-1's memory saving: each rank of a
  // data-parallel run owns a share of the elements, updates it, keeps state and masters for it
  // alone, and sends the result to the others (dist::DistributedDataParallel with zero_stage
  // 1). A parameter may be owned whole, not at all (an empty range: never stepped, even with a
  // gradient; no state, no master) or in part: a step then updates that slice of it (the
  // gradient's same slice; stochastic rounding draws the bits the whole parameter would), and
  // its state and master hold the slice alone, flat. Setting it drops what is no longer owned
  // (a changed range starts its state afresh). state_dict() holds the owned entries (a slice's
  // flat), for dist::DistributedDataParallel::gather_optimizer_state to assemble; and
  // load_state_dict() takes a whole optimizer's dict and keeps what it owns.
  void set_owned_ranges(std::vector<ElementRange> owned);
  // Whole parameters or none: owned[i] for parameter i.
  void set_owned(const std::vector<bool>& owned);
  // Whether any element of parameter i is owned, and which.
  bool owns(size_t i) const { return owned_.empty() || owned_[i].size() > 0; }
  ElementRange owned_range(size_t i) const;
  // Bytes of state this optimizer holds: its state tensors and their block scales, fp32 masters
  // and compensations.
  int64_t state_nbytes() const;

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
  // NearestEven (the default) or Stochastic, where element j of parameter i at its t-th update
  // (1-based, updates(i) after it) draws random_bits(seed, t, (i << 40) + j): reproducible, and
  // fresh bits at every update.
  void set_store_rounding(RoundingMode mode, uint64_t seed = 0);
  RoundingMode store_rounding() const { return store_rounding_; }
  // Kahan: each parameter stored narrower than f32 that has no master gets a compensation
  // buffer of its dtype (zeros at first), and a step stores to nearest through it
  // (state_format.h). A write by anything but step() leaves it as it is (at most half an ulp of
  // the weight: less than that write's own rounding). Needs nearest-even store rounding (a step
  // refuses stochastic or truncated stores with it). None drops them.
  void set_compensation(Compensation c);
  Compensation compensation() const { return compensation_; }
  // The compensation of parameter i; undefined when it has none.
  const Tensor& compensation_buffer(size_t i) const;

  // The loss scaler's device-side skip (amp::GradScaler), for the next step() only: `found_inf`
  // is a one-element F32 tensor on the parameters' device, and the step's kernels change nothing
  // (parameters, masters, state, the parameters' update counts) when it holds a non-zero value,
  // without the host reading it; step_count() does not count it either.
  void skip_next_step_if(Tensor found_inf);

 protected:
  // All parameters on one device, each at most once over all groups; `defaults` fills what a
  // group leaves unset (its lr is the optimizer's default lr). `accepted` lists the
  // GroupOptions fields this optimizer has ("lr", "weight_decay", ...): a group setting another
  // is refused.
  Optimizer(std::vector<ParamGroup> groups, double default_lr, const char* kind,
            std::vector<std::string> accepted);

  // What a subclass's fused pass gets for one group: the group's parameters that have a
  // gradient this step, their gradients and state, and the kernel options (defined in
  // optimizer.cpp, with the backend's types).
  struct GroupStep;
  // Runs the fused update of one group (called by step() for each group with a gradient).
  virtual void run_group(size_t group, GroupStep& batch) = 0;
  // The group's options as the caller set them.
  const GroupOptions& group_options(size_t group) const { return groups_[group].options; }
  // The format the options give state k (of state_names()).
  virtual StateFormat options_state_format(size_t k) const = 0;

 private:
  struct Group {
    std::string name;
    GroupOptions options;
    std::vector<size_t> members;  // indices into params_
    double base_lr = 0;
    double lr = 0;
  };
  struct ParamState {
    std::vector<Tensor> tensors;  // one per state_names(group), once the parameter had a step
    std::vector<Tensor> scales;   // beside each: its block absmaxes, undefined when unscaled
  };
  struct Master {
    Tensor value;                // F32; undefined: none
    const void* data = nullptr;  // the parameter's storage and version when it was last
    uint32_t version = 0;        //   known to be the master's rounding
  };

  std::unique_ptr<GroupStep> begin_group(size_t group);
  // The step counts on the parameters' device (they follow the parameters there).
  Tensor& step_counts();
  // The master of parameter i for this step (made, kept, dropped or restarted as documented);
  // `p` is the part of it owned.
  Tensor& prepare_master(size_t i, const Tensor& p);
  // The state of parameter i for this step, `count` tensors of `part`'s shape in their formats
  // (made, or kept and moved to part's device), with their block scales.
  const ParamState& prepare_state(size_t i, const Tensor& part, size_t count);
  // The compensation of parameter i for this step (made at zeros, or kept), or an undefined
  // tensor where it has none.
  Tensor& prepare_compensation(size_t i, const Tensor& p);
  // The block scales a state of `part` takes: ceil(numel / block) of them.
  int64_t state_blocks(int64_t numel) const;
  // The elements of parameter i a state's block scales cover: the owned range in blocks.
  ElementRange owned_blocks(size_t i) const;

  std::vector<Tensor> params_;
  std::vector<size_t> group_of_;  // the group of each parameter
  std::vector<Group> groups_;
  std::vector<std::vector<Tensor>> group_params_;
  std::vector<ParamState> state_;
  std::vector<ElementRange> owned_;   // set_owned_ranges(); empty: all
  std::vector<Tensor> grad_shards_;   // set_gradient_shard(); empty: none
  std::vector<Tensor> param_shards_;  // set_parameter_shard(); empty: none
  // Parameter i, or the slice of it owned (a flat view of the same storage).
  Tensor owned_part(size_t i, const Tensor& whole) const;
  // What a step updates of parameter i: its shard (set_parameter_shard), or owned_part of it.
  Tensor owned_param(size_t i) const;
  // I64 (params + 1), on the parameters' device: the updates of each parameter so far, then
  // the optimizer's completed steps.
  Tensor step_counts_;
  bool master_weights_ = false;
  std::vector<Master> masters_;
  Compensation compensation_ = Compensation::None;
  std::vector<Tensor> compensations_;  // [parameter]: undefined where none
  RoundingMode store_rounding_ = RoundingMode::NearestEven;
  uint64_t rounding_seed_ = 0;
  Tensor found_inf_;  // skip_next_step_if's flag; undefined: none
  Tensor one_;        // I64 1 on the parameters' device: what a step adds to the step count
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
  StateFormat momentum_format = StateFormat::F32;
  BlockOptions blocks = {};
};

// torch.optim.SGD: g += wd * p; with momentum, buf = momentum * buf + (1 - dampening) * g
// (buf = g on a parameter's first update) and g = nesterov ? g + momentum * buf : buf;
// p -= lr * g. State: "momentum_buffer" (for the parameters of groups with momentum).
class SGD final : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults);
  std::vector<std::string> state_names(size_t group = 0) const override;
  // The options of a group (its own settings over the defaults), with lr as set_lr() last left
  // it.
  SGDOptions options(size_t group = 0) const;

 private:
  void run_group(size_t group, GroupStep& batch) override;
  StateFormat options_state_format(size_t k) const override;
  BlockOptions block_options() const override { return defaults_.blocks; }
  SGDOptions defaults_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // How the two moments are kept (state_format.h): fp32 is PyTorch's AdamW; 8bit both keeps
  // bitsandbytes' AdamW8bit's state (its maps, blocks of 256, fp32 state under 4096 elements;
  // docs/memory.md says where the two differ).
  StateFormat exp_avg_format = StateFormat::F32;
  StateFormat exp_avg_sq_format = StateFormat::F32;
  BlockOptions blocks = {};
};

// torch.optim.AdamW: p *= 1 - lr * wd; m = beta1 * m + (1 - beta1) * g;
// v = beta2 * v + (1 - beta2) * g^2; p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
// with t the parameter's update count. State: "exp_avg", "exp_avg_sq".
class AdamW final : public Optimizer {
 public:
  explicit AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults);
  std::vector<std::string> state_names(size_t group = 0) const override;
  AdamWOptions options(size_t group = 0) const;

 private:
  void run_group(size_t group, GroupStep& batch) override;
  StateFormat options_state_format(size_t k) const override;
  BlockOptions block_options() const override { return defaults_.blocks; }
  AdamWOptions defaults_;
};

}  // namespace mantissa::optim
