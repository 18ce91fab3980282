// The loss scaler: torch.amp.GradScaler's per-optimizer stages and update rule
// (_amp_update_scale_), with hysteresis, min/max clamps and static/disabled modes on top. One
// path for every device: the state and the flags are tensors where the parameters live, and the
// decisions run there (Backend::unscale_and_check, the optimizers' skip flag,
// Backend::update_scale).
#include "mantissa/amp/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/step_math.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {
namespace {

// The scale is an fp32 value, as PyTorch's.
double to_f32(double x) {
  return backend::round_to_f32(x);
}

Tensor i64_scalar(int64_t v) {
  return Tensor::from_vector(std::vector<int64_t>{v}, Shape{}, DType::I64);
}

const char* mode_name(ScaleMode m) {
  switch (m) {
    case ScaleMode::Dynamic:
      return "dynamic";
    case ScaleMode::Static:
      return "static";
    case ScaleMode::Disabled:
      return "disabled";
  }
  return "?";
}

Tensor state_tensor(const std::array<double, 4>& v, Device device) {
  return Tensor::from_vector(std::vector<double>(v.begin(), v.end()), Shape{4}, DType::F64)
      .to(device);
}

}  // namespace

bool StepResult::skipped() const {
  return found_inf_.defined() && found_inf_.item() != 0;
}

GradScaler::GradScaler(const GradScalerOptions& options) : options_(options) {
  const GradScalerOptions& o = options_;
  const double scale = to_f32(o.init_scale);
  MT_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0 && std::isfinite(scale) && scale > 0,
           "GradScaler: init_scale must be positive and finite in fp32, got ", o.init_scale);
  MT_CHECK(std::isfinite(o.growth_factor) && o.growth_factor > 1,
           "GradScaler: growth_factor must be > 1, got ", o.growth_factor);
  MT_CHECK(o.backoff_factor > 0 && o.backoff_factor < 1,
           "GradScaler: backoff_factor must be in (0, 1), got ", o.backoff_factor);
  MT_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ",
           o.growth_interval);
  MT_CHECK(o.hysteresis >= 1, "GradScaler: hysteresis must be >= 1, got ", o.hysteresis);
  MT_CHECK(std::isfinite(o.min_scale) && std::isfinite(o.max_scale) && o.min_scale > 0 &&
               o.min_scale <= o.max_scale,
           "GradScaler: need 0 < min_scale <= max_scale (finite), got ", o.min_scale, " and ",
           o.max_scale);
  if (o.mode == ScaleMode::Dynamic) {
    MT_CHECK(scale >= o.min_scale && scale <= o.max_scale, "GradScaler: init_scale ", o.init_scale,
             " is outside [min_scale, max_scale] = [", o.min_scale, ", ", o.max_scale, "]");
  }
  state_ = state_tensor({scale, 0, 0, 0}, Device::cpu());
  skipped_ = Tensor::zeros(Shape{}, DType::F64);
  last_found_inf_ = Tensor::zeros(Shape{}, DType::F32);
}

void GradScaler::adopt_device(Device device, const char* what) const {
  if (!adopted_) {
    adopted_ = true;
    if (device != state_.device()) {
      state_ = state_.to(device);
      skipped_ = skipped_.to(device);
      last_found_inf_ = last_found_inf_.to(device);
    }
    return;
  }
  MT_CHECK(device == state_.device(), "GradScaler: ", what, " on ", device.str(),
           " but this scaler's state is on ", state_.device().str(),
           "; use one GradScaler per device");
}

Tensor GradScaler::scale(const Tensor& loss) const {
  MT_CHECK(loss.defined(), "GradScaler::scale of an undefined tensor");
  if (!enabled()) return loss;
  adopt_device(loss.device(), "the loss");
  // The scale as an fp32 scalar where it lives (exact: it is an fp32 value); a narrower loss is
  // multiplied in fp32 and rounded back, as mul(loss, double) does.
  const Tensor s = state_.select(0, 0).to(DType::F32);
  const Tensor scaled = mul(loss, s);
  return scaled.dtype() == loss.dtype() ? scaled : cast(scaled, loss.dtype());
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!enabled()) return;
  PerOptimizer& st = per_optimizer_[&opt];
  MT_CHECK(st.stage != Stage::Unscaled,
           "GradScaler::unscale_() has already been called on this optimizer since the last "
           "update()");
  MT_CHECK(st.stage != Stage::Stepped,
           "GradScaler::unscale_() is being called after step() on this optimizer; call it "
           "before step(), once per update()");
  const std::vector<Tensor>& params = opt.params();
  adopt_device(params[0].device(), "optimizer parameters");
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    Tensor g = opt.gradient(i);  // .grad, or ZeRO-2's shard
    if (!g.defined()) continue;
    MT_CHECK(g.is_floating_point() && g.device() == p.device(),
             "GradScaler: the gradient of optimizer parameter ", i, " is a ", g.describe(),
             " for a ", p.describe());
    if (g.dtype() == DType::F16) {
      // An fp16 gradient (of an fp16 parameter: O2/O3) is unscaled into fp32: S * g fits fp16,
      // but g itself may be below fp16's smallest subnormal. The fused step reads any dtype.
      g = g.to(DType::F32).contiguous();
      opt.set_gradient(i, g);
    } else if (!g.is_contiguous()) {
      g = g.contiguous();
      opt.set_gradient(i, g);
    }
    grads.push_back(std::move(g));
  }
  st.flag = Tensor::zeros(Shape{}, DType::F32, state_.device());
  if (!grads.empty()) {
    // 1 / S (rounded to fp32) is taken from the state where it lives: no host wait.
    backend::backend_for(state_.device()).unscale_with_state(grads, state_, st.flag);
    for (const Tensor& g : grads)
      g.bump_version();
  }
  if (reducer_) reducer_(st.flag);  // every rank's overflow, before the step reads it
  st.stage = Stage::Unscaled;
}

StepResult GradScaler::step(optim::Optimizer& opt) {
  if (!enabled()) {
    opt.step();
    return StepResult();
  }
  {
    const auto it = per_optimizer_.find(&opt);
    MT_CHECK(it == per_optimizer_.end() || it->second.stage != Stage::Stepped,
             "GradScaler::step() has already been called on this optimizer since the last "
             "update()");
    if (it == per_optimizer_.end() || it->second.stage == Stage::Ready) unscale_(opt);
  }
  PerOptimizer& st = per_optimizer_[&opt];
  st.stage = Stage::Stepped;
  NoGrad ng;
  skipped_ = add(skipped_, st.flag);
  // The optimizer's kernels read the flag and leave everything as it is when it is set.
  opt.skip_next_step_if(st.flag);
  opt.step();
  return StepResult(st.flag);
}

Tensor GradScaler::take_flags() {
  NoGrad ng;
  Tensor combined;
  for (const auto& [opt, st] : per_optimizer_)
    combined = combined.defined() ? add(combined, st.flag) : st.flag;
  per_optimizer_.clear();
  return combined;
}

std::array<double, 4> GradScaler::read_state() const {
  std::array<double, 4> host{};
  state_.copy_to_host(host.data(), sizeof(host));
  return host;
}

void GradScaler::update() {
  if (!enabled()) return;
  MT_CHECK(!per_optimizer_.empty(),
           "GradScaler::update(): no optimizer was unscaled or stepped since the last update()");
  const GradScalerOptions& o = options_;
  last_found_inf_ = take_flags();
  if (o.mode == ScaleMode::Static) return;
  const backend::ScaleUpdate rule{.growth_factor = o.growth_factor,
                                  .backoff_factor = o.backoff_factor,
                                  .growth_interval = o.growth_interval,
                                  .hysteresis = o.hysteresis,
                                  .min_scale = o.min_scale,
                                  .max_scale = o.max_scale};
  const int64_t overflows_before = o.error_at_min_scale ? min_scale_overflows() : 0;
  backend::backend_for(state_.device()).update_scale(state_, last_found_inf_, rule);
  if (o.error_at_min_scale) {
    const int64_t overflows = min_scale_overflows();
    MT_CHECK(overflows == overflows_before,
             "GradScaler: inf/NaN gradients with the loss scale at its minimum ", o.min_scale, " (",
             overflows, " such steps so far); training has diverged or min_scale is too high");
  }
}

void GradScaler::update(double new_scale) {
  if (!enabled()) return;
  const double s = to_f32(new_scale);
  MT_CHECK(std::isfinite(s) && s > 0,
           "GradScaler::update(new_scale): the scale must be positive and finite in fp32, got ",
           new_scale);
  // The flags are folded into the last-update flag the way update() does; the scale is set
  // where it lives, the trackers are left as they are (PyTorch).
  const Tensor combined = take_flags();
  if (combined.defined()) last_found_inf_ = combined;
  state_.select(0, 0).fill_(s);
}

double GradScaler::get_scale() const {
  if (!enabled()) return 1.0;
  return read_state()[0];
}

bool GradScaler::found_inf() const {
  if (per_optimizer_.empty()) return last_found_inf_.item() != 0;
  for (const auto& [opt, st] : per_optimizer_) {
    if (st.flag.defined() && st.flag.item() != 0) return true;
  }
  return false;
}

bool GradScaler::at_min_scale() const {
  return enabled() && get_scale() <= options_.min_scale;
}

int64_t GradScaler::growth_tracker() const {
  return int64_t(read_state()[1]);
}

int64_t GradScaler::hysteresis_tracker() const {
  return int64_t(read_state()[2]);
}

int64_t GradScaler::min_scale_overflows() const {
  return int64_t(read_state()[3]);
}

int64_t GradScaler::skipped_steps() const {
  return int64_t(skipped_.item());
}

NamedTensors GradScaler::state_dict() const {
  NamedTensors out;
  if (!enabled()) return out;
  const std::array<double, 4> st = read_state();
  out.emplace_back("scale", Tensor::scalar(st[0], DType::F64));
  out.emplace_back("growth_factor", Tensor::scalar(options_.growth_factor, DType::F64));
  out.emplace_back("backoff_factor", Tensor::scalar(options_.backoff_factor, DType::F64));
  out.emplace_back("growth_interval", i64_scalar(options_.growth_interval));
  out.emplace_back("growth_tracker", i64_scalar(int64_t(st[1])));
  out.emplace_back("hysteresis_tracker", i64_scalar(int64_t(st[2])));
  out.emplace_back("min_scale_overflows", i64_scalar(int64_t(st[3])));
  out.emplace_back("skipped_steps", i64_scalar(skipped_steps()));
  return out;
}

void GradScaler::load_state_dict(const NamedTensors& dict) {
  if (!enabled()) return;
  MT_CHECK(!dict.empty(),
           "GradScaler::load_state_dict: the dict is empty, possibly because it "
           "was saved from a disabled GradScaler (this one is ",
           mode_name(options_.mode), ")");
  static const std::vector<std::pair<std::string, DType>> kKeys = {
      {"scale", DType::F64},
      {"growth_factor", DType::F64},
      {"backoff_factor", DType::F64},
      {"growth_interval", DType::I64},
      {"growth_tracker", DType::I64},
      {"hysteresis_tracker", DType::I64},
      {"min_scale_overflows", DType::I64},
      {"skipped_steps", DType::I64}};
  std::string expected;
  for (const auto& [k, dt] : kKeys)
    expected += (expected.empty() ? "" : ", ") + k;
  std::vector<double> values(kKeys.size());
  std::set<std::string> seen;
  for (const auto& [name, t] : dict) {
    const auto it =
        std::find_if(kKeys.begin(), kKeys.end(), [&](const auto& k) { return k.first == name; });
    MT_CHECK(it != kKeys.end(), "GradScaler::load_state_dict: unexpected key '", name,
             "'; expected ", expected);
    MT_CHECK(seen.insert(name).second, "GradScaler::load_state_dict: key '", name, "' twice");
    MT_CHECK(t.defined() && t.numel() == 1 && t.dtype() == it->second,
             "GradScaler::load_state_dict: '", name, "' must be one ", dtype_name(it->second),
             " element, got ", t.defined() ? t.describe() : std::string("an undefined tensor"));
    values[size_t(it - kKeys.begin())] = t.item();
  }
  for (const auto& [k, dt] : kKeys)
    MT_CHECK(seen.count(k) == 1, "GradScaler::load_state_dict: key '", k, "' is missing");
  const double s = values[0], gf = values[1], bf = values[2];
  const auto gi = int64_t(values[3]), gt = int64_t(values[4]), ht = int64_t(values[5]);
  const auto mo = int64_t(values[6]), sk = int64_t(values[7]);
  MT_CHECK(std::isfinite(s) && s > 0 && to_f32(s) == s,
           "GradScaler::load_state_dict: 'scale' must be a positive finite fp32 value, got ", s);
  MT_CHECK(std::isfinite(gf) && gf > 1, "GradScaler::load_state_dict: 'growth_factor' ", gf);
  MT_CHECK(bf > 0 && bf < 1, "GradScaler::load_state_dict: 'backoff_factor' ", bf);
  MT_CHECK(gi >= 1 && gt >= 0 && ht >= 0 && mo >= 0 && sk >= 0,
           "GradScaler::load_state_dict: negative counter or growth_interval < 1");
  options_.growth_factor = gf;
  options_.backoff_factor = bf;
  options_.growth_interval = gi;
  state_ = state_tensor({s, double(gt), double(ht), double(mo)}, state_.device());
  skipped_ = Tensor::scalar(double(sk), DType::F64, state_.device());
}

}  // namespace mantissa::amp
