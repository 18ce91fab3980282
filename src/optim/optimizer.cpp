// The optimizer base (gradients, per-parameter state, state dicts) and SGD / AdamW, whose step()
// gathers the parameters that have a gradient and hands them all to one multi-tensor kernel.
#include "mantissa/optim/optimizer.h"

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

// fp32 state for f32 and half parameters (the mixed-precision recipe), f64 for f64.
DType state_dtype(DType param) {
  return param == DType::F64 ? DType::F64 : DType::F32;
}

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

}  // namespace

// ---- Optimizer
// -----------------------------------------------------------------------------------

Optimizer::Optimizer(std::vector<Tensor> params, double lr)
    : params_(std::move(params)), state_(params_.size()), lr_(lr) {
  check_lr(lr);
  MT_CHECK(!params_.empty(), "an optimizer got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MT_CHECK(p.defined(), "optimizer parameter ", i, " is an undefined tensor");
    MT_CHECK(p.is_floating_point(), "optimizer parameter ", i, " is a ", p.describe(),
             "; only floating tensors can be optimized");
    MT_CHECK(p.device() == params_[0].device(), "optimizer parameter ", i, " is on ",
             p.device().str(), " but parameter 0 on ", params_[0].device().str(),
             "; one optimizer updates the parameters of one device");
    for (size_t j = 0; j < i; ++j) {
      MT_CHECK(!p.is_same(params_[j]), "optimizer parameters ", j, " and ", i,
               " are the same tensor; pass each parameter once");
    }
  }
}

void Optimizer::set_lr(double lr) {
  check_lr(lr);
  lr_ = lr;
}

void Optimizer::zero_grad(bool set_to_none) {
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

Optimizer::StepBatch Optimizer::begin_step(size_t num_states) {
  StepBatch b;
  b.states.resize(num_states);
  const Device device = params_[0].device();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    // A parameter may have been converted (Module::to) since the optimizer was made.
    MT_CHECK(p.is_floating_point() && p.device() == device, "optimizer parameter ", i, " is now a ",
             p.describe(), "; parameters must stay floating and on ", device.str());
    MT_CHECK(p.is_contiguous(), "optimizer parameter ", i, " (", p.describe(),
             ") is not contiguous; the fused step updates contiguous parameters in place");
    MT_CHECK(g.is_floating_point() && g.device() == device && g.shape() == p.shape(),
             "the gradient of optimizer parameter ", i, " is a ", g.describe(), " for a ",
             p.describe());
    if (!g.is_contiguous()) g = g.contiguous();

    ParamState& s = state_[i];
    const DType sd = state_dtype(p.dtype());
    if (s.steps == 0) {
      s.tensors.clear();
      // A step the device may skip must leave defined state: zeros, what a first update starts
      // from, so that the next update (no longer a first one) reads the same.
      for (size_t k = 0; k < num_states; ++k) {
        s.tensors.push_back(found_inf_.defined() ? Tensor::zeros(p.shape(), sd, device)
                                                 : Tensor::empty(p.shape(), sd, device));
      }
    } else {
      MT_ASSERT(s.tensors.size() == num_states, "optimizer state of parameter ", i);
      for (Tensor& t : s.tensors) {
        MT_CHECK(t.shape() == p.shape(), "optimizer parameter ", i, " changed shape from ",
                 t.shape().str(), " to ", p.shape().str(), " after its state was made");
        if (t.dtype() != sd) t = own_copy(t.to(sd), device);
      }
    }
    b.index.push_back(i);
    b.params.push_back(p);
    b.grads.push_back(std::move(g));
    for (size_t k = 0; k < num_states; ++k)
      b.states[k].push_back(s.tensors[k]);
    b.steps.push_back(s.steps + 1);
    b.ids.push_back(uint64_t(i));
    if (master_weights_) b.masters.push_back(prepare_master(i));
  }
  return b;
}

void Optimizer::fill_options(StepBatch& b, backend::MultiTensorOptions& o) const {
  o.masters = b.masters;
  o.store_rounding = store_rounding_;
  o.seed = rounding_seed_;
  o.offset = uint64_t(step_count_ + 1);
  o.tensor_ids = b.ids;
  o.found_inf = found_inf_.defined() ? &found_inf_ : nullptr;
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
    const Tensor& p = params_[i];
    if (p.dtype() == DType::F64) continue;
    Master& m = masters_[i];
    m.value = own_copy(p.to(DType::F32), p.device());
    m.data = p.data_ptr();
    m.version = p.version();
  }
}

const Tensor& Optimizer::master(size_t i) const {
  MT_CHECK(i < params_.size(), "optimizer parameter ", i, " does not exist (", params_.size(),
           " parameters)");
  static const Tensor kNone;
  return i < masters_.size() ? masters_[i].value : kNone;
}

void Optimizer::set_store_rounding(RoundingMode mode, uint64_t seed) {
  MT_CHECK(mode == RoundingMode::NearestEven || mode == RoundingMode::Stochastic,
           "an optimizer stores parameters rounded to nearest even or stochastically, not ",
           rounding_name(mode));
  store_rounding_ = mode;
  rounding_seed_ = seed;
}

namespace {

// Whether every element of `p` (stored narrower than f32) is one of the two values of its
// format next to the master's: what a rounding of the master (nearest or stochastic) gives.
bool is_rounding_of(const Tensor& p, const Tensor& master) {
  NoGrad ng;
  const FormatInfo& f = kFormatTable[size_t(*dtype_format(p.dtype()))];
  const double rel = f.epsilon, tiny = f.min_subnormal;
  const Tensor diff = abs(sub(p.to(DType::F32), master));
  // The floor on the master's device: a binary op takes no cpu scalar with a cuda tensor.
  const Tensor bound =
      maximum(mul(abs(master), rel), Tensor::scalar(tiny, DType::F32, master.device()));
  return sum(gt(diff, bound)).item() == 0;
}

}  // namespace

Tensor& Optimizer::prepare_master(size_t i) {
  const Tensor& p = params_[i];
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

void Optimizer::end_step(const StepBatch& b) {
  ++step_count_;
  found_inf_ = Tensor();
  for (size_t k = 0; k < b.index.size(); ++k) {
    state_[b.index[k]].steps = b.steps[k];
    b.params[k].bump_version();  // written in place: saved copies of it are now stale
    if (master_weights_) masters_[b.index[k]].version = b.params[k].version();
  }
}

StateDict Optimizer::state_dict() const {
  StateDict out;
  out.emplace_back("step", int_scalar(step_count_));
  out.emplace_back("lr", Tensor::scalar(lr_, DType::F64));
  const std::vector<std::string> names = state_names();
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& s = state_[i];
    if (s.steps == 0) continue;
    const std::string prefix = "state." + std::to_string(i) + ".";
    out.emplace_back(prefix + "step", int_scalar(s.steps));
    for (size_t k = 0; k < names.size(); ++k)
      out.emplace_back(prefix + names[k], own_copy(s.tensors[k], s.tensors[k].device()));
  }
  for (size_t i = 0; i < masters_.size(); ++i) {
    const Tensor& m = masters_[i].value;
    if (m.defined()) out.emplace_back("master." + std::to_string(i), own_copy(m, m.device()));
  }
  return out;
}

void Optimizer::load_state_dict(const StateDict& dict) {
  const std::vector<std::string> names = state_names();
  std::string expected_names = "step";
  for (const std::string& n : names)
    expected_names += ", " + n;
  const Device device = params_[0].device();

  std::set<std::string> seen;
  bool have_step = false, have_lr = false;
  int64_t step = 0;
  double lr = 0;
  std::vector<ParamState> fresh(params_.size());
  std::vector<Tensor> masters(params_.size());
  std::vector<std::vector<bool>> found(params_.size(), std::vector<bool>(names.size() + 1, false));

  auto one_element = [](const std::string& key, const Tensor& t, bool integer) {
    MT_CHECK(t.numel() == 1 && (integer ? t.dtype() == DType::I64 : t.is_floating_point()),
             "optimizer state '", key, "' must be one ", integer ? "i64" : "floating",
             " element, got a ", t.describe());
    return t.item();
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
      lr = one_element(key, t, false);
      MT_CHECK(std::isfinite(lr) && lr >= 0, "optimizer state 'lr' is ", lr,
               "; a learning rate is finite and >= 0");
      have_lr = true;
      continue;
    }
    const std::string_view k(key);
    if (k.starts_with("master.")) {
      size_t i = 0;
      const auto r = std::from_chars(k.data() + 7, k.data() + k.size(), i);
      MT_CHECK(r.ec == std::errc() && r.ptr == k.data() + k.size() && k.size() > 7,
               "unexpected optimizer state '", key, "'; a master weight is 'master.<index>'");
      MT_CHECK(i < params_.size(), "optimizer state '", key, "' is for parameter ", i,
               " but this optimizer has ", params_.size(), " parameters");
      MT_CHECK(master_weights_, "optimizer state '", key,
               "' is an fp32 master weight but this optimizer keeps none; turn master weights "
               "on first (set_master_weights(true), or amp::initialize with O2)");
      MT_CHECK(t.dtype() == DType::F32 && t.shape() == params_[i].shape(), "optimizer state '", key,
               "' is a ", t.describe(), " but the master of parameter ", i, " is f32 of shape ",
               params_[i].shape().str());
      masters[i] = own_copy(t, device);
      continue;
    }
    // state.<i>.<name>
    const size_t dot = k.find('.', 6);
    size_t i = 0;
    bool ok = k.starts_with("state.") && dot != std::string_view::npos && dot > 6;
    if (ok) {
      const auto r = std::from_chars(k.data() + 6, k.data() + dot, i);
      ok = r.ec == std::errc() && r.ptr == k.data() + dot;
    }
    MT_CHECK(
        ok, "unexpected optimizer state '", key,
        "'; expected 'step', 'lr' or 'state.<index>.<name>' with a name among: ", expected_names);
    MT_CHECK(i < params_.size(), "optimizer state '", key, "' is for parameter ", i,
             " but this optimizer has ", params_.size(), " parameters");
    const std::string_view name = k.substr(dot + 1);
    const Tensor& p = params_[i];
    if (name == "step") {
      const double v = one_element(key, t, true);
      MT_CHECK(v >= 1, "optimizer state '", key, "' is ", v, "; a parameter with state has >= 1");
      fresh[i].steps = int64_t(v);
      found[i][0] = true;
      continue;
    }
    size_t slot = names.size();
    for (size_t n = 0; n < names.size(); ++n) {
      if (names[n] == name) slot = n;
    }
    MT_CHECK(slot < names.size(), "unexpected optimizer state '", key, "': this optimizer keeps ",
             expected_names, " per parameter");
    MT_CHECK(t.shape() == p.shape(), "optimizer state '", key, "' has shape ", t.shape().str(),
             " but parameter ", i, " has shape ", p.shape().str());
    const DType sd = state_dtype(p.dtype());
    MT_CHECK(t.dtype() == sd, "optimizer state '", key, "' is ", dtype_name(t.dtype()),
             " but the state of a ", dtype_name(p.dtype()), " parameter is ", dtype_name(sd));
    if (fresh[i].tensors.empty()) fresh[i].tensors.resize(names.size());
    fresh[i].tensors[slot] = own_copy(t, device);
    found[i][slot + 1] = true;
  }
  MT_CHECK(have_step, "optimizer state 'step' is missing");
  MT_CHECK(have_lr, "optimizer state 'lr' is missing");
  for (size_t i = 0; i < params_.size(); ++i) {
    bool any = false;
    for (bool f : found[i])
      any = any || f;
    if (!any) continue;
    for (size_t n = 0; n <= names.size(); ++n) {
      MT_CHECK(found[i][n], "optimizer state 'state.", i, ".", n == 0 ? "step" : names[n - 1],
               "' is missing (the other state of parameter ", i, " is there)");
    }
  }
  state_ = std::move(fresh);
  step_count_ = step;
  lr_ = lr;
  for (size_t i = 0; i < masters.size(); ++i) {
    if (!masters[i].defined()) continue;
    masters_[i] = Master{masters[i], params_[i].data_ptr(), params_[i].version()};
  }
}

// ---- SGD ---------------------------------------------------------------------------------------

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  MT_CHECK(std::isfinite(options.momentum) && options.momentum >= 0,
           "SGD momentum must be finite and >= 0, got ", options.momentum);
  MT_CHECK(std::isfinite(options.dampening), "SGD dampening must be finite, got ",
           options.dampening);
  MT_CHECK(std::isfinite(options.weight_decay) && options.weight_decay >= 0,
           "SGD weight_decay must be finite and >= 0, got ", options.weight_decay);
  MT_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
           "SGD with nesterov needs momentum > 0 and dampening == 0 (got momentum ",
           options.momentum, ", dampening ", options.dampening, ")");
}

std::vector<std::string> SGD::state_names() const {
  if (options_.momentum == 0) return {};
  return {"momentum_buffer"};
}

SGDOptions SGD::options() const {
  SGDOptions o = options_;
  o.lr = lr_;
  return o;
}

void SGD::step() {
  const bool momentum = options_.momentum != 0;
  StepBatch b = begin_step(momentum ? 1 : 0);
  if (!b.params.empty()) {
    backend::SgdStep h;
    h.lr = lr_;
    h.momentum = options_.momentum;
    h.dampening = options_.dampening;
    h.weight_decay = options_.weight_decay;
    h.nesterov = options_.nesterov;
    fill_options(b, h.options);
    std::span<Tensor> bufs;
    if (momentum) bufs = b.states[0];
    backend::backend_for(params_[0].device()).sgd_step(b.params, b.grads, bufs, b.steps, h);
  }
  end_step(b);
}

// ---- AdamW -------------------------------------------------------------------------------------

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(std::move(params), options.lr), options_(options) {
  MT_CHECK(options.beta1 >= 0 && options.beta1 < 1, "AdamW beta1 must be in [0, 1), got ",
           options.beta1);
  MT_CHECK(options.beta2 >= 0 && options.beta2 < 1, "AdamW beta2 must be in [0, 1), got ",
           options.beta2);
  MT_CHECK(std::isfinite(options.eps) && options.eps >= 0,
           "AdamW eps must be finite and >= 0, got ", options.eps);
  MT_CHECK(std::isfinite(options.weight_decay) && options.weight_decay >= 0,
           "AdamW weight_decay must be finite and >= 0, got ", options.weight_decay);
}

std::vector<std::string> AdamW::state_names() const {
  return {"exp_avg", "exp_avg_sq"};
}

AdamWOptions AdamW::options() const {
  AdamWOptions o = options_;
  o.lr = lr_;
  return o;
}

void AdamW::step() {
  StepBatch b = begin_step(2);
  if (!b.params.empty()) {
    backend::AdamWStep h;
    h.lr = lr_;
    h.beta1 = options_.beta1;
    h.beta2 = options_.beta2;
    h.eps = options_.eps;
    h.weight_decay = options_.weight_decay;
    fill_options(b, h.options);
    backend::backend_for(params_[0].device())
        .adamw_step(b.params, b.grads, b.states[0], b.states[1], b.steps, h);
  }
  end_step(b);
}

}  // namespace mantissa::optim
