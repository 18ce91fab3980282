// The optimizer base (parameter groups, gradients, per-parameter state and step counts, state
// dicts) and SGD / AdamW, whose run_group() hands all parameters of a group that have a gradient
// to one multi-tensor kernel.
#include "mantissa/optim/optimizer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <span>

#include "backend/backend.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::optim {
namespace {

void check_lr(double lr) {
  MT_CHECK(std::isfinite(lr) && lr >= 0, "the learning rate must be finite and >= 0, got ", lr);
}

// A copy on `device`, contiguous, detached: state the optimizer owns.
Tensor own_copy(const Tensor& t, Device device) {
  Tensor src = t.detach();
  if (src.device() != device) src = src.to(device);
  Tensor out = Tensor::empty(src.shape(), src.dtype(), device);
  out.copy_(src);
  return out;
}

Tensor int_scalar(int64_t v) {
  return Tensor::from_vector(std::vector<int64_t>{v}, Shape{}, DType::I64);
}

// The fields a GroupOptions sets, by name.
std::vector<std::string> fields_set(const GroupOptions& o) {
  std::vector<std::string> out;
  if (o.lr) out.emplace_back("lr");
  if (o.weight_decay) out.emplace_back("weight_decay");
  if (o.momentum) out.emplace_back("momentum");
  if (o.dampening) out.emplace_back("dampening");
  if (o.nesterov) out.emplace_back("nesterov");
  if (o.beta1) out.emplace_back("beta1");
  if (o.beta2) out.emplace_back("beta2");
  if (o.eps) out.emplace_back("eps");
  return out;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string group_label(size_t g, const std::string& name) {
  return "parameter group " + std::to_string(g) + (name.empty() ? "" : " ('" + name + "')");
}

}  // namespace

std::vector<ParamGroup> weight_decay_groups(const NamedTensors& named_params, double weight_decay) {
  MT_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
           "weight_decay_groups: weight_decay must be finite and >= 0, got ", weight_decay);
  ParamGroup decay{.params = {}, .options = {.weight_decay = weight_decay}, .name = "decay"};
  ParamGroup no_decay{.params = {}, .options = {.weight_decay = 0.0}, .name = "no_decay"};
  for (const auto& [name, p] : named_params) {
    MT_CHECK(p.defined(), "weight_decay_groups: parameter '", name, "' is an undefined tensor");
    (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  }
  std::vector<ParamGroup> out;
  if (!decay.params.empty()) out.push_back(std::move(decay));
  if (!no_decay.params.empty()) out.push_back(std::move(no_decay));
  MT_CHECK(!out.empty(), "weight_decay_groups: no parameters");
  return out;
}

// ---- Optimizer -------------------------------------------------------------------------------

static_assert(kMaxStateBlock == backend::kMaxStateBlockElements);

struct Optimizer::GroupStep {
  std::vector<size_t> index;  // into params_
  std::vector<Tensor> params;
  std::vector<Tensor> grads;
  std::vector<std::vector<Tensor>> states;  // [state name][k]
  std::vector<Tensor> scales;         // [state name * params + k] (empty: no state block-scaled)
  std::vector<Tensor> masters;        // [k]: empty without master weights; undefined: none
  std::vector<Tensor> compensations;  // [k]: empty without compensation; undefined: none
  std::vector<uint64_t> ids;          // [k]: the parameter's index
  std::vector<uint64_t> offsets;      // [k]: where its owned part starts (ZeRO-1)
  backend::MultiTensorOptions options;
};

Optimizer::~Optimizer() = default;

Optimizer::Optimizer(std::vector<ParamGroup> groups, double default_lr, const char* kind,
                     std::vector<std::string> accepted) {
  check_lr(default_lr);
  MT_CHECK(!groups.empty(), kind, " got no parameter groups");
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& pg = groups[g];
    MT_CHECK(!pg.params.empty(), kind, ": ", group_label(g, pg.name),
             " has no parameters; leave it out");
    for (const std::string& f : fields_set(pg.options)) {
      MT_CHECK(std::find(accepted.begin(), accepted.end(), f) != accepted.end(), kind, ": ",
               group_label(g, pg.name), " sets '", f, "', which ", kind,
               " does not have; a group may set: ", join(accepted));
    }
    if (pg.options.lr) check_lr(*pg.options.lr);
    Group group;
    group.name = pg.name;
    group.options = pg.options;
    group.base_lr = group.lr = pg.options.lr.value_or(default_lr);
    for (Tensor& p : pg.params) {
      const size_t i = params_.size();
      MT_CHECK(p.defined(), kind, ": parameter ", i, " (", group_label(g, pg.name),
               ") is an undefined tensor");
      MT_CHECK(p.is_floating_point(), kind, ": parameter ", i, " is a ", p.describe(),
               "; only floating tensors can be optimized");
      MT_CHECK(params_.empty() || p.device() == params_[0].device(), kind, ": parameter ", i,
               " is on ", p.device().str(), " but parameter 0 on ", params_[0].device().str(),
               "; one optimizer updates the parameters of one device");
      for (size_t j = 0; j < params_.size(); ++j) {
        MT_CHECK(!p.is_same(params_[j]), kind, ": parameters ", j, " and ", i,
                 " are the same tensor; pass each parameter once (in one group)");
      }
      group.members.push_back(i);
      group_of_.push_back(g);
      params_.push_back(p);
    }
    group_params_.push_back(std::move(pg.params));
    groups_.push_back(std::move(group));
  }
  state_.resize(params_.size());
  step_counts_ = Tensor::zeros(Shape{int64_t(params_.size()) + 1}, DType::I64, params_[0].device());
}

const std::string& Optimizer::group_name(size_t group) const {
  MT_CHECK(group < groups_.size(), "parameter group ", group, " does not exist (", groups_.size(),
           " groups)");
  return groups_[group].name;
}

const std::vector<Tensor>& Optimizer::group_params(size_t group) const {
  MT_CHECK(group < groups_.size(), "parameter group ", group, " does not exist (", groups_.size(),
           " groups)");
  return group_params_[group];
}

double Optimizer::lr(size_t group) const {
  MT_CHECK(group < groups_.size(), "parameter group ", group, " does not exist (", groups_.size(),
           " groups)");
  return groups_[group].lr;
}

double Optimizer::base_lr(size_t group) const {
  MT_CHECK(group < groups_.size(), "parameter group ", group, " does not exist (", groups_.size(),
           " groups)");
  return groups_[group].base_lr;
}

void Optimizer::set_lr(double lr) {
  check_lr(lr);
  for (Group& g : groups_)
    g.lr = lr;
}

void Optimizer::set_lr(size_t group, double lr) {
  check_lr(lr);
  MT_CHECK(group < groups_.size(), "parameter group ", group, " does not exist (", groups_.size(),
           " groups)");
  groups_[group].lr = lr;
}

Tensor& Optimizer::step_counts() {
  const Device device = params_[0].device();
  if (step_counts_.device() != device) step_counts_ = own_copy(step_counts_, device);
  return step_counts_;
}

int64_t Optimizer::step_count() const {
  return int64_t(step_counts_.select(0, int64_t(params_.size())).item());
}

int64_t Optimizer::updates(size_t i) const {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  return int64_t(step_counts_.select(0, int64_t(i)).item());
}

Tensor Optimizer::gradient(size_t i) const {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  if (i < grad_shards_.size() && grad_shards_[i].defined()) return grad_shards_[i];
  return params_[i].grad();
}

std::vector<Tensor> Optimizer::gradients() const {
  std::vector<Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor g = gradient(i);
    if (g.defined()) out.push_back(std::move(g));
  }
  return out;
}

void Optimizer::set_gradient_shard(size_t i, Tensor g) {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  MT_CHECK(!g.defined() || (g.dim() == 1 && g.numel() == owned_range(i).size() &&
                            g.is_floating_point() && g.device() == params_[i].device()),
           "the gradient shard of optimizer parameter ", i, " must be a flat floating tensor of ",
           owned_range(i).size(), " elements (its owned range) on ", params_[i].device().str(),
           ", got ", g.defined() ? g.describe() : std::string("an undefined tensor"));
  if (grad_shards_.size() < params_.size()) grad_shards_.resize(params_.size());
  grad_shards_[i] = std::move(g);
}

void Optimizer::set_parameter_shard(size_t i, Tensor shard) {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  if (shard.defined()) {
    const Tensor& p = params_[i];
    const ElementRange r = owned_range(i);
    const Shape want = r.size() == p.numel() ? p.shape() : Shape{r.size()};
    MT_CHECK(shard.shape() == want && shard.dtype() == p.dtype() && shard.device() == p.device() &&
                 shard.is_contiguous(),
             "the parameter shard of optimizer parameter ", i, " must be a contiguous ",
             dtype_name(p.dtype()), " tensor of shape ", want.str(), " (its owned range) on ",
             p.device().str(), ", got ", shard.describe());
  }
  if (param_shards_.size() < params_.size()) param_shards_.resize(params_.size());
  param_shards_[i] = std::move(shard);
}

Tensor Optimizer::owned_param(size_t i) const {
  if (i < param_shards_.size() && param_shards_[i].defined()) return param_shards_[i];
  return owned_part(i, params_[i]);
}

void Optimizer::set_gradient(size_t i, Tensor g) {
  const Tensor now = gradient(i);
  MT_CHECK(now.defined() && g.defined() && g.shape() == now.shape(), "Optimizer::set_gradient: ",
           g.defined() ? g.describe() : std::string("an undefined tensor"),
           " for the gradient of parameter ", i, " (",
           now.defined() ? now.describe() : std::string("none"), ")");
  if (i < grad_shards_.size() && grad_shards_[i].defined()) {
    grad_shards_[i] = std::move(g);
  } else {
    params_[i].set_grad(g);
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  grad_shards_.clear();
  for (const Tensor& p : params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      g.zero_();
    }
  }
}

StateFormat Optimizer::state_format(size_t i, size_t k) const {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  const StateFormat f = options_state_format(k);
  if (state_format_info(f).block_scaled && params_[i].numel() < block_options().min_numel)
    return StateFormat::F32;
  return f;
}

DType Optimizer::state_dtype(size_t i, size_t k) const {
  const StateFormat f = state_format(i, k);
  return f == StateFormat::F32 ? backend::optimizer_state_dtype(params_[i].dtype())
                               : state_format_info(f).storage;
}

int64_t Optimizer::state_blocks(int64_t numel) const {
  return blocks_of({0, numel}, block_options().block).end;
}

ElementRange Optimizer::owned_blocks(size_t i) const {
  return blocks_of(owned_range(i), block_options().block);
}

const Optimizer::ParamState& Optimizer::prepare_state(size_t i, const Tensor& part, size_t count) {
  ParamState& s = state_[i];
  const Device device = part.device();
  const bool fresh = s.tensors.empty();
  for (size_t k = 0; k < count; ++k) {
    const DType sd = state_dtype(i, k);
    const bool scaled = state_format_info(state_format(i, k)).block_scaled;
    MT_CHECK(!scaled || owned_range(i).begin % block_options().block == 0, "optimizer parameter ",
             i, " is owned from element ", owned_range(i).begin, ", inside a block of its ",
             name_of(state_format(i, k)), " state (blocks of ", block_options().block,
             "); shard on multiples of the block (kMaxStateBlock)");
    if (fresh) {
      // A step the device may skip must leave defined state: zeros, what a first update starts
      // from, so that the next update (then the first the kernel counts) reads the same.
      auto make = [&](Shape shape, DType dtype) {
        return found_inf_.defined() ? Tensor::zeros(shape, dtype, device)
                                    : Tensor::empty(shape, dtype, device);
      };
      s.tensors.push_back(make(part.shape(), sd));
      s.scales.push_back(scaled ? make(Shape{state_blocks(part.numel())}, DType::F32) : Tensor());
      continue;
    }
    MT_ASSERT(s.tensors.size() == count && s.scales.size() == count,
              "optimizer state of parameter ", i);
    Tensor& t = s.tensors[k];
    MT_CHECK(t.shape() == part.shape(), "optimizer parameter ", i, " changed shape from ",
             t.shape().str(), " to ", part.shape().str(), " after its state was made");
    if (scaled) {
      MT_ASSERT(t.dtype() == sd, "a block-scaled state of parameter ", i, " is ", t.describe());
      if (t.device() != device) {
        t = own_copy(t, device);
        s.scales[k] = own_copy(s.scales[k], device);
      }
    } else if (t.dtype() != sd || t.device() != device) {
      t = own_copy(t.to(sd), device);
    }
  }
  return s;
}

std::unique_ptr<Optimizer::GroupStep> Optimizer::begin_group(size_t group) {
  auto b = std::make_unique<GroupStep>();
  const std::vector<std::string> names = state_names(group);
  b->states.resize(names.size());
  std::vector<std::vector<Tensor>> scales(names.size());
  bool any_scaled = false;
  const Device device = params_[0].device();
  MT_CHECK(compensation_ == Compensation::None || store_rounding_ == RoundingMode::NearestEven,
           "Kahan compensation stores updates to nearest even, but the store rounding is ",
           rounding_name(store_rounding_),
           "; set_store_rounding(RoundingMode::NearestEven) with it (--rounding nearest)");
  for (size_t i : groups_[group].members) {
    const Tensor& p = params_[i];
    const bool shard = i < grad_shards_.size() && grad_shards_[i].defined();
    Tensor g = gradient(i);
    if (!g.defined() || !owns(i)) continue;
    // A parameter may have been converted (Module::to) since the optimizer was made.
    MT_CHECK(p.is_floating_point() && p.device() == device, "optimizer parameter ", i, " is now a ",
             p.describe(), "; parameters must stay floating and on ", device.str());
    MT_CHECK(p.is_contiguous(), "optimizer parameter ", i, " (", p.describe(),
             ") is not contiguous; the fused step updates contiguous parameters in place");
    MT_CHECK(g.is_floating_point() && g.device() == device &&
                 (shard ? g.numel() == owned_range(i).size() : g.shape() == p.shape()),
             "the gradient of optimizer parameter ", i, " is a ", g.describe(), " for a ",
             p.describe());
    if (!g.is_contiguous()) g = g.contiguous();
    // ZeRO-1: a slice of the parameter and the same slice of its gradient (ZeRO-2: the slice's
    // own gradient, its shard).
    const Tensor part = owned_param(i);
    g = shard ? g.reshape(part.shape()) : owned_part(i, g);

    const ParamState& s = prepare_state(i, part, names.size());
    for (size_t k = 0; k < names.size(); ++k) {
      b->states[k].push_back(s.tensors[k]);
      scales[k].push_back(s.scales[k]);
      any_scaled = any_scaled || s.scales[k].defined();
    }
    b->index.push_back(i);
    b->params.push_back(part);
    b->grads.push_back(std::move(g));
    b->ids.push_back(uint64_t(i));
    b->offsets.push_back(uint64_t(owned_range(i).begin));
    if (master_weights_) b->masters.push_back(prepare_master(i, part));
    if (compensation_ != Compensation::None)
      b->compensations.push_back(prepare_compensation(i, part));
  }
  if (any_scaled) {
    for (std::vector<Tensor>& per_state : scales)
      b->scales.insert(b->scales.end(), per_state.begin(), per_state.end());
  }
  backend::MultiTensorOptions& o = b->options;
  o.ids = b->ids;
  if (!owned_.empty()) o.element_offsets = b->offsets;
  o.step_counts = &step_counts();
  o.masters = b->masters;
  o.compensations = b->compensations;
  o.state_scales = b->scales;
  o.state_block = block_options().block;
  o.store_rounding = store_rounding_;
  o.seed = rounding_seed_;
  o.found_inf = found_inf_.defined() ? &found_inf_ : nullptr;
  return b;
}

void Optimizer::step() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::unique_ptr<GroupStep> b = begin_group(g);
    if (b->params.empty()) continue;
    run_group(g, *b);
    for (size_t k = 0; k < b->index.size(); ++k) {
      b->params[k].bump_version();  // written in place: saved copies of it are now stale
      if (master_weights_) masters_[b->index[k]].version = b->params[k].version();
    }
  }
  // The optimizer's own count (the last row) advances unless the step was skipped: by
  // 1 - (flag != 0), computed where the flag is; without a flag by a kept 1 (no allocation).
  NoGrad ng;
  Tensor total = step_counts().select(0, int64_t(params_.size()));
  if (found_inf_.defined()) {
    total.add_(eq(found_inf_, Tensor::zeros(Shape{}, DType::F32, total.device())).to(DType::I64));
  } else {
    if (!one_.defined() || one_.device() != total.device())
      one_ = Tensor::scalar(1.0, DType::I64, total.device());
    total.add_(one_);
  }
  found_inf_ = Tensor();
}

void Optimizer::skip_next_step_if(Tensor found_inf) {
  MT_CHECK(found_inf.defined() && found_inf.dtype() == DType::F32 && found_inf.numel() == 1 &&
               found_inf.device() == params_[0].device(),
           "Optimizer::skip_next_step_if takes a one-element f32 flag on ",
           params_[0].device().str(), ", got ",
           found_inf.defined() ? found_inf.describe() : std::string("an undefined tensor"));
  found_inf_ = found_inf.is_contiguous() ? std::move(found_inf) : found_inf.contiguous();
}

void Optimizer::set_master_weights(bool on) {
  master_weights_ = on;
  masters_.assign(params_.size(), Master{});
  if (!on) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].dtype() == DType::F64 || !owns(i)) continue;
    const Tensor p = owned_param(i);
    Master& m = masters_[i];
    m.value = own_copy(p.to(DType::F32), p.device());
    m.data = p.data_ptr();
    m.version = p.version();
  }
}

void Optimizer::set_compensation(Compensation c) {
  compensation_ = c;
  compensations_.assign(params_.size(), Tensor());
}

const Tensor& Optimizer::compensation_buffer(size_t i) const {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  static const Tensor kNone;
  return i < compensations_.size() ? compensations_[i] : kNone;
}

Tensor& Optimizer::prepare_compensation(size_t i, const Tensor& p) {
  Tensor& c = compensations_[i];
  const bool narrow = p.dtype() != DType::F32 && p.dtype() != DType::F64;
  const bool has_master = master_weights_ && masters_[i].value.defined();
  if (!narrow || has_master) {
    c = Tensor();  // nothing is lost on store, or the master keeps it
    return c;
  }
  // Kept across writes by anything but step() (ZeRO-1's all-gather bumps every parameter's
  // version each step): |c| is at most half an ulp of p, so a stale one moves a rewritten weight
  // by less than the write's own rounding.
  const bool fits =
      c.defined() && c.shape() == p.shape() && c.dtype() == p.dtype() && c.device() == p.device();
  if (!fits) c = Tensor::zeros(p.shape(), p.dtype(), p.device());
  return c;
}

void Optimizer::set_owned_ranges(std::vector<ElementRange> owned) {
  MT_CHECK(owned.empty() || owned.size() == params_.size(),
           "Optimizer::set_owned_ranges: ", owned.size(), " ranges for ", params_.size(),
           " parameters");
  for (size_t i = 0; i < owned.size(); ++i) {
    const ElementRange r = owned[i];
    MT_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= params_[i].numel(),
             "Optimizer::set_owned_ranges: elements [", r.begin, ", ", r.end, ") of parameter ", i,
             " (", params_[i].describe(), ") are not a range of it");
  }
  const std::vector<ElementRange> before(owned_);
  owned_ = std::move(owned);
  param_shards_.clear();  // (made for the ranges before)
  for (size_t i = 0; i < params_.size(); ++i) {
    const ElementRange was = before.empty() ? ElementRange{0, params_[i].numel()} : before[i];
    if (owned_range(i) == was) continue;
    state_[i] = ParamState{};
    if (i < compensations_.size()) compensations_[i] = Tensor();
    if (i >= masters_.size()) continue;
    const Tensor old = masters_[i].value;
    masters_[i] = Master{};
    if (!master_weights_ || !owns(i) || params_[i].dtype() == DType::F64) continue;
    // The master follows the owned part: cut from the whole one (which may hold more than the
    // parameter's rounding: the fp32 weights amp::initialize captured), or made from the part.
    const Tensor p = owned_param(i);
    const bool whole_before = was.begin == 0 && was.end == params_[i].numel();
    const Tensor from = old.defined() && whole_before ? owned_part(i, old) : p.to(DType::F32);
    masters_[i] = Master{own_copy(from, p.device()), p.data_ptr(), p.version()};
  }
}

void Optimizer::set_owned(const std::vector<bool>& owned) {
  std::vector<ElementRange> ranges;
  for (size_t i = 0; i < owned.size() && i < params_.size(); ++i)
    ranges.push_back({0, owned[i] ? params_[i].numel() : 0});
  MT_CHECK(owned.size() == params_.size() || owned.empty(), "Optimizer::set_owned: ", owned.size(),
           " flags for ", params_.size(), " parameters");
  set_owned_ranges(std::move(ranges));
}

ElementRange Optimizer::owned_range(size_t i) const {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  return owned_.empty() ? ElementRange{0, params_[i].numel()} : owned_[i];
}

Tensor Optimizer::owned_part(size_t i, const Tensor& whole) const {
  const ElementRange r = owned_range(i);
  if (r.begin == 0 && r.end == whole.numel()) return whole;
  MT_ASSERT(whole.is_contiguous(), "a slice of a non-contiguous tensor");
  return whole.reshape({whole.numel()}).narrow(0, r.begin, r.size());
}

int64_t Optimizer::state_nbytes() const {
  int64_t n = 0;
  for (const ParamState& s : state_) {
    for (const std::vector<Tensor>* list : {&s.tensors, &s.scales}) {
      for (const Tensor& t : *list)
        n += t.defined() ? int64_t(t.nbytes()) : 0;
    }
  }
  for (const Master& m : masters_)
    n += m.value.defined() ? int64_t(m.value.nbytes()) : 0;
  for (const Tensor& c : compensations_)
    n += c.defined() ? int64_t(c.nbytes()) : 0;
  return n;
}

const Tensor& Optimizer::master(size_t i) const {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  static const Tensor kNone;
  return i < masters_.size() ? masters_[i].value : kNone;
}

void Optimizer::set_store_rounding(RoundingMode mode, uint64_t seed) {
  store_rounding_ = mode;
  rounding_seed_ = seed;
}

namespace {

// Whether every element of `p` (stored narrower than f32) is one of the two values of its
// format next to the master's: what a rounding of the master (nearest or stochastic) gives.
// A slice of 2^20 elements at a time: its fp32 temporaries are 4 MB, not four of the largest
// parameter's size (GPT-2's 38.6 M-element embedding: 460 MB at the first step of an O2 run).
bool is_rounding_of(const Tensor& p, const Tensor& master) {
  NoGrad ng;
  const FormatInfo& f = kFormatTable[size_t(*dtype_format(p.dtype()))];
  const double rel = f.epsilon, tiny = f.min_subnormal;
  // The floor on the master's device: a binary op takes no cpu scalar with a cuda tensor.
  const Tensor floor = Tensor::scalar(tiny, DType::F32, master.device());
  const Tensor pf = p.reshape({p.numel()}), mf = master.reshape({master.numel()});
  constexpr int64_t kSlice = int64_t(1) << 20;
  Tensor outside = Tensor::zeros(Shape{}, DType::I64, master.device());
  for (int64_t start = 0; start < pf.numel(); start += kSlice) {
    const int64_t n = std::min(kSlice, pf.numel() - start);
    const Tensor m = mf.narrow(0, start, n);
    const Tensor diff = abs(sub(pf.narrow(0, start, n).to(DType::F32), m));
    outside = add(outside, sum(gt(diff, maximum(mul(abs(m), rel), floor))));
  }
  return outside.item() == 0;
}

}  // namespace

Tensor& Optimizer::prepare_master(size_t i, const Tensor& p) {
  Master& m = masters_[i];
  if (p.dtype() == DType::F32 || p.dtype() == DType::F64) {
    m = Master{};  // the update is exact in the parameter itself
    return m.value;
  }
  const bool untouched = m.value.defined() && m.data == p.data_ptr() && m.version == p.version();
  if (!untouched) {
    if (!m.value.defined() || m.value.shape() != p.shape() || !is_rounding_of(p, m.value)) {
      m.value = own_copy(p.to(DType::F32), p.device());
    }
  }
  m.data = p.data_ptr();
  return m.value;
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  const std::vector<int64_t> counts = step_counts_.to(Device::cpu()).to_vector<int64_t>();
  out.emplace_back("step", int_scalar(counts.back()));
  out.emplace_back("lr", Tensor::scalar(lr(), DType::F64));
  if (groups_.size() > 1) {
    for (size_t g = 0; g < groups_.size(); ++g)
      out.emplace_back("group." + std::to_string(g) + ".lr",
                       Tensor::scalar(groups_[g].lr, DType::F64));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& s = state_[i];
    if (counts[i] == 0 || s.tensors.empty()) continue;
    const std::vector<std::string> names = state_names(group_of_[i]);
    const std::string prefix = "state." + std::to_string(i) + ".";
    out.emplace_back(prefix + "step", int_scalar(counts[i]));
    for (size_t k = 0; k < names.size(); ++k) {
      out.emplace_back(prefix + names[k], own_copy(s.tensors[k], s.tensors[k].device()));
      const Tensor& scale = s.scales[k];
      if (scale.defined())
        out.emplace_back(prefix + names[k] + ".absmax", own_copy(scale, scale.device()));
    }
  }
  for (size_t i = 0; i < masters_.size(); ++i) {
    const Tensor& m = masters_[i].value;
    if (m.defined()) out.emplace_back("master." + std::to_string(i), own_copy(m, m.device()));
  }
  for (size_t i = 0; i < compensations_.size(); ++i) {
    const Tensor& c = compensations_[i];
    if (c.defined()) out.emplace_back("compensation." + std::to_string(i), own_copy(c, c.device()));
  }
  return out;
}

namespace {

// The index after `prefix` in `key` up to `end` (npos: the key's end), or nullopt.
std::optional<size_t> index_in(std::string_view key, size_t begin, size_t end) {
  if (end == std::string_view::npos) end = key.size();
  if (end <= begin) return std::nullopt;
  size_t i = 0;
  const auto r = std::from_chars(key.data() + begin, key.data() + end, i);
  if (r.ec != std::errc() || r.ptr != key.data() + end) return std::nullopt;
  return i;
}

}  // namespace

void Optimizer::load_state_dict(const NamedTensors& dict) {
  const Device device = params_[0].device();
  std::set<std::string> seen;
  bool have_step = false, have_lr = false;
  int64_t step = 0;
  double lr0 = 0;
  std::vector<std::optional<double>> group_lr(groups_.size());
  std::vector<ParamState> fresh(params_.size());
  std::vector<int64_t> counts(params_.size() + 1, 0);
  std::vector<Tensor> masters(params_.size()), compensations(params_.size());
  // found[i][0]: the step; found[i][1 + 2k]: state tensor k of the parameter's group,
  // found[i][2 + 2k] its block scales (where it has them).
  std::vector<std::vector<bool>> found(params_.size());
  for (size_t i = 0; i < params_.size(); ++i)
    found[i].assign(2 * state_names(group_of_[i]).size() + 1, false);

  auto one_element = [](const std::string& key, const Tensor& t, bool integer) {
    MT_CHECK(t.numel() == 1 && (integer ? t.dtype() == DType::I64 : t.is_floating_point()),
             "optimizer state '", key, "' must be one ", integer ? "i64" : "floating",
             " element, got a ", t.describe());
    return t.item();
  };
  auto check_lr_value = [](const std::string& key, double v) {
    MT_CHECK(std::isfinite(v) && v >= 0, "optimizer state '", key, "' is ", v,
             "; a learning rate is finite and >= 0");
  };

  for (const auto& [key, t] : dict) {
    MT_CHECK(seen.insert(key).second, "optimizer state '", key, "' appears twice");
    MT_CHECK(t.defined(), "optimizer state '", key, "' is an undefined tensor");
    if (key == "step") {
      const double v = one_element(key, t, true);
      MT_CHECK(v >= 0, "optimizer state 'step' is negative (", v, ")");
      step = int64_t(v);
      have_step = true;
      continue;
    }
    if (key == "lr") {
      lr0 = one_element(key, t, false);
      check_lr_value(key, lr0);
      have_lr = true;
      continue;
    }
    const std::string_view k(key);
    if (k.starts_with("group.") && k.ends_with(".lr")) {
      const std::optional<size_t> g = index_in(k, 6, k.size() - 3);
      MT_CHECK(g && *g < groups_.size(), "optimizer state '", key, "' names no group of the ",
               groups_.size(), " this optimizer has");
      group_lr[*g] = one_element(key, t, false);
      check_lr_value(key, *group_lr[*g]);
      continue;
    }
    if (k.starts_with("master.")) {
      const std::optional<size_t> i = index_in(k, 7, std::string_view::npos);
      MT_CHECK(i.has_value(), "unexpected optimizer state '", key,
               "'; a master weight is 'master.<index>'");
      MT_CHECK(*i < params_.size(), "optimizer state '", key, "' is for parameter ", *i,
               " but this optimizer has ", params_.size(), " parameters");
      MT_CHECK(master_weights_, "optimizer state '", key,
               "' is an fp32 master weight but this optimizer keeps none; turn master weights "
               "on first (set_master_weights(true), or amp::initialize with O2)");
      MT_CHECK(t.dtype() == DType::F32 && t.shape() == params_[*i].shape(), "optimizer state '",
               key, "' is a ", t.describe(), " but the master of parameter ", *i,
               " is f32 of shape ", params_[*i].shape().str());
      masters[*i] = own_copy(t, device);
      continue;
    }
    if (k.starts_with("compensation.")) {
      const std::optional<size_t> i = index_in(k, 13, std::string_view::npos);
      MT_CHECK(i && *i < params_.size(), "unexpected optimizer state '", key,
               "'; a compensation is 'compensation.<index>' of one of the ", params_.size(),
               " parameters");
      MT_CHECK(compensation_ == Compensation::Kahan, "optimizer state '", key,
               "' is a Kahan compensation but this optimizer keeps none; turn it on first "
               "(set_compensation(Compensation::Kahan), --compensation kahan)");
      MT_CHECK(t.dtype() == params_[*i].dtype() && t.shape() == params_[*i].shape(),
               "optimizer state '", key, "' is a ", t.describe(),
               " but the compensation of parameter ", *i, " is ", params_[*i].describe());
      compensations[*i] = own_copy(t, device);
      continue;
    }
    // state.<i>.<name>
    const size_t dot = k.find('.', 6);
    const std::optional<size_t> parsed = k.starts_with("state.") && dot != std::string_view::npos
                                             ? index_in(k, 6, dot)
                                             : std::nullopt;
    MT_CHECK(parsed.has_value(), "unexpected optimizer state '", key,
             "'; expected 'step', 'lr', 'group.<g>.lr', 'master.<i>' or 'state.<i>.<name>'");
    const size_t i = *parsed;
    MT_CHECK(i < params_.size(), "optimizer state '", key, "' is for parameter ", i,
             " but this optimizer has ", params_.size(), " parameters");
    const std::vector<std::string> names = state_names(group_of_[i]);
    std::string_view name = k.substr(dot + 1);
    const Tensor& p = params_[i];
    if (name == "step") {
      const double v = one_element(key, t, true);
      MT_CHECK(v >= 1, "optimizer state '", key, "' is ", v, "; a parameter with state has >= 1");
      counts[i] = int64_t(v);
      found[i][0] = true;
      continue;
    }
    const bool absmax = name.ends_with(".absmax");
    if (absmax) name.remove_suffix(7);
    const auto slot = size_t(std::find(names.begin(), names.end(), name) - names.begin());
    MT_CHECK(slot < names.size(), "unexpected optimizer state '", key, "': parameter ", i,
             " keeps step", names.empty() ? "" : ", ", join(names));
    const StateFormat f = state_format(i, slot);
    if (fresh[i].tensors.empty()) {
      fresh[i].tensors.resize(names.size());
      fresh[i].scales.resize(names.size());
    }
    if (absmax) {
      MT_CHECK(state_format_info(f).block_scaled, "unexpected optimizer state '", key, "': the ",
               name, " of parameter ", i, " is kept in ", name_of(f),
               ", which has no block scales");
      const int64_t blocks = state_blocks(p.numel());
      MT_CHECK(t.dtype() == DType::F32 && t.shape() == Shape{blocks}, "optimizer state '", key,
               "' is a ", t.describe(), " but parameter ", i, "'s ", name, " has ", blocks,
               " f32 block scales (blocks of ", block_options().block, ")");
      fresh[i].scales[slot] = own_copy(t, device);
      found[i][2 + 2 * slot] = true;
      continue;
    }
    MT_CHECK(t.shape() == p.shape(), "optimizer state '", key, "' has shape ", t.shape().str(),
             " but parameter ", i, " has shape ", p.shape().str());
    const DType sd = state_dtype(i, slot);
    MT_CHECK(t.dtype() == sd, "optimizer state '", key, "' is ", dtype_name(t.dtype()),
             " but this optimizer keeps the ", name, " of parameter ", i, " (",
             dtype_name(p.dtype()), ") in ", name_of(f), " (", dtype_name(sd),
             "); a checkpoint resumes with the state format it was written with");
    fresh[i].tensors[slot] = own_copy(t, device);
    found[i][1 + 2 * slot] = true;
    // An unscaled state has no scales to find.
    if (!state_format_info(f).block_scaled) found[i][2 + 2 * slot] = true;
  }
  MT_CHECK(have_step, "optimizer state 'step' is missing");
  MT_CHECK(have_lr, "optimizer state 'lr' is missing");
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool any = std::find(found[i].begin(), found[i].end(), true) != found[i].end();
    if (!any) continue;
    const std::vector<std::string> names = state_names(group_of_[i]);
    for (size_t n = 0; n < found[i].size(); ++n) {
      MT_CHECK(found[i][n], "optimizer state 'state.", i, ".",
               n == 0 ? "step" : names[(n - 1) / 2] + (n % 2 == 0 ? ".absmax" : ""),
               "' is missing (the other state of parameter ", i, " is there)");
    }
  }
  // A sharded optimizer (set_owned_ranges) keeps what it owns: whole entries, or their slices.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!owns(i)) {
      fresh[i] = ParamState{};
      counts[i] = 0;
      masters[i] = compensations[i] = Tensor();
      continue;
    }
    if (owned_range(i).size() == params_[i].numel()) continue;
    for (Tensor& t : fresh[i].tensors)
      t = own_copy(owned_part(i, t), device);
    const ElementRange blocks = owned_blocks(i);
    for (Tensor& t : fresh[i].scales) {
      if (t.defined()) t = own_copy(t.narrow(0, blocks.begin, blocks.size()), device);
    }
    for (Tensor* t : {&masters[i], &compensations[i]}) {
      if (t->defined()) *t = own_copy(owned_part(i, *t), device);
    }
  }
  state_ = std::move(fresh);
  counts.back() = step;
  step_counts_ = Tensor::from_vector(counts, Shape{int64_t(counts.size())}).to(device);
  for (size_t g = 0; g < groups_.size(); ++g)
    groups_[g].lr = group_lr[g].value_or(lr0);
  for (size_t i = 0; i < masters.size(); ++i) {
    if (!masters[i].defined()) continue;
    const Tensor p = owned_param(i);
    masters_[i] = Master{masters[i], p.data_ptr(), p.version()};
  }
  for (size_t i = 0; i < compensations.size(); ++i) {
    if (compensations[i].defined()) compensations_[i] = compensations[i];
  }
}

// ---- SGD ---------------------------------------------------------------------------------------

namespace {

std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  MT_CHECK(!params.empty(), "an optimizer got an empty parameter list");
  return {ParamGroup{.params = std::move(params), .options = {}, .name = ""}};
}

void check_sgd(const SGDOptions& o, const std::string& where) {
  MT_CHECK(std::isfinite(o.momentum) && o.momentum >= 0, "SGD momentum", where,
           " must be finite and >= 0, got ", o.momentum);
  MT_CHECK(std::isfinite(o.dampening), "SGD dampening", where, " must be finite, got ",
           o.dampening);
  MT_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "SGD weight_decay", where,
           " must be finite and >= 0, got ", o.weight_decay);
  MT_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD with nesterov", where,
           " needs momentum > 0 and dampening == 0 (got momentum ", o.momentum, ", dampening ",
           o.dampening, ")");
}

void check_blocks(const BlockOptions& b, const char* kind) {
  MT_CHECK(b.block >= 32 && b.block <= kMaxStateBlock && (b.block & (b.block - 1)) == 0, kind,
           ": a state block is a power of two from 32 to ", kMaxStateBlock, " elements, got ",
           b.block);
  MT_CHECK(b.min_numel >= 0, kind,
           ": the smallest parameter with block-scaled state must be >= 0, got ", b.min_numel);
}

void check_adamw(const AdamWOptions& o, const std::string& where) {
  MT_CHECK(o.beta1 >= 0 && o.beta1 < 1, "AdamW beta1", where, " must be in [0, 1), got ", o.beta1);
  MT_CHECK(o.beta2 >= 0 && o.beta2 < 1, "AdamW beta2", where, " must be in [0, 1), got ", o.beta2);
  MT_CHECK(std::isfinite(o.eps) && o.eps >= 0, "AdamW eps", where, " must be finite and >= 0, got ",
           o.eps);
  MT_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "AdamW weight_decay", where,
           " must be finite and >= 0, got ", o.weight_decay);
}

std::string in_group(size_t g, size_t groups) {
  return groups > 1 ? " (parameter group " + std::to_string(g) + ")" : "";
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : SGD(one_group(std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults)
    : Optimizer(std::move(groups), defaults.lr, "SGD",
                {"lr", "weight_decay", "momentum", "dampening", "nesterov"}),
      defaults_(defaults) {
  check_blocks(defaults.blocks, "SGD");
  for (size_t g = 0; g < num_groups(); ++g)
    check_sgd(options(g), in_group(g, num_groups()));
}

StateFormat SGD::options_state_format(size_t) const {
  return defaults_.momentum_format;
}

std::vector<std::string> SGD::state_names(size_t group) const {
  if (options(group).momentum == 0) return {};
  return {"momentum_buffer"};
}

SGDOptions SGD::options(size_t group) const {
  const GroupOptions& g = group_options(group);
  SGDOptions o = defaults_;
  o.lr = lr(group);
  o.weight_decay = g.weight_decay.value_or(o.weight_decay);
  o.momentum = g.momentum.value_or(o.momentum);
  o.dampening = g.dampening.value_or(o.dampening);
  o.nesterov = g.nesterov.value_or(o.nesterov);
  return o;
}

void SGD::run_group(size_t group, GroupStep& b) {
  const SGDOptions o = options(group);
  const backend::SgdStep h{.lr = o.lr,
                           .momentum = o.momentum,
                           .dampening = o.dampening,
                           .weight_decay = o.weight_decay,
                           .nesterov = o.nesterov,
                           .options = b.options};
  std::span<Tensor> bufs;
  if (o.momentum != 0) bufs = b.states[0];
  backend::backend_for(b.params[0].device()).sgd_step(b.params, b.grads, bufs, h);
}

// ---- AdamW -------------------------------------------------------------------------------------

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW(one_group(std::move(params)), options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults)
    : Optimizer(std::move(groups), defaults.lr, "AdamW",
                {"lr", "weight_decay", "beta1", "beta2", "eps"}),
      defaults_(defaults) {
  check_blocks(defaults.blocks, "AdamW");
  for (size_t g = 0; g < num_groups(); ++g)
    check_adamw(options(g), in_group(g, num_groups()));
}

StateFormat AdamW::options_state_format(size_t k) const {
  return k == 0 ? defaults_.exp_avg_format : defaults_.exp_avg_sq_format;
}

std::vector<std::string> AdamW::state_names(size_t) const {
  return {"exp_avg", "exp_avg_sq"};
}

AdamWOptions AdamW::options(size_t group) const {
  const GroupOptions& g = group_options(group);
  AdamWOptions o = defaults_;
  o.lr = lr(group);
  o.weight_decay = g.weight_decay.value_or(o.weight_decay);
  o.beta1 = g.beta1.value_or(o.beta1);
  o.beta2 = g.beta2.value_or(o.beta2);
  o.eps = g.eps.value_or(o.eps);
  return o;
}

void AdamW::run_group(size_t group, GroupStep& b) {
  const AdamWOptions o = options(group);
  const backend::AdamWStep h{.lr = o.lr,
                             .beta1 = o.beta1,
                             .beta2 = o.beta2,
                             .eps = o.eps,
                             .weight_decay = o.weight_decay,
                             .options = b.options};
  backend::backend_for(b.params[0].device())
      .adamw_step(b.params, b.grads, b.states[0], b.states[1], h);
}

}  // namespace mantissa::optim
