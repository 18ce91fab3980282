// The loss scaler: torch.amp.GradScaler's per-optimizer stages and update rule
// (_amp_update_scale_), with hysteresis, min/max clamps and static/disabled modes on top.
#include "mantissa/amp/grad_scaler.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "amp/scale_update.h"
#include "backend/backend.h"
#if defined(MANTISSA_HAS_CUDA)
#include "backend/cuda/multi_tensor.h"
#endif
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {
namespace {

// The scale is an fp32 value, as PyTorch's.
double to_f32(double x) {
  return detail::round_to_f32(x);
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

}  // namespace

GradScaler::GradScaler(const GradScalerOptions& options)
    : options_(options), scale_(to_f32(options.init_scale)) {
  const GradScalerOptions& o = options_;
  MT_CHECK(std::isfinite(o.init_scale) && o.init_scale > 0 && std::isfinite(scale_) && scale_ > 0,
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
    MT_CHECK(scale_ >= o.min_scale && scale_ <= o.max_scale, "GradScaler: init_scale ",
             o.init_scale, " is outside [min_scale, max_scale] = [", o.min_scale, ", ", o.max_scale,
             "]");
  }
}

Tensor GradScaler::scale(const Tensor& loss) const {
  MT_CHECK(loss.defined(), "GradScaler::scale of an undefined tensor");
  if (!enabled()) return loss;
  if (device_state_.defined() && loss.device() == device_state_.device()) {
    // The device scale as an fp32 scalar (exact: it is an fp32 value); a narrower loss is
    // multiplied in fp32 and rounded back, as mul(loss, double) does.
    const Tensor s = device_state_.select(0, 0).to(DType::F32);
    const Tensor scaled = mul(loss, s);
    return scaled.dtype() == loss.dtype() ? scaled : cast(scaled, loss.dtype());
  }
  if (device_state_.defined()) pull();
  return mul(loss, scale_);
}

void GradScaler::adopt_device(Device device) {
  if (device_state_.defined() || !device.is_cuda()) return;
  device_state_ = Tensor::empty(Shape{4}, DType::F64, device);
  device_skipped_ = Tensor::zeros(Shape{}, DType::F32, device);
  device_last_found_inf_ = Tensor::scalar(last_found_inf_ ? 1.0 : 0.0, DType::F32, device);
  push();
}

void GradScaler::push() {
  const double host[4] = {scale_, double(growth_tracker_), double(hysteresis_tracker_),
                          double(min_scale_overflows_)};
  device_state_.copy_from_host(host, sizeof(host));
}

void GradScaler::pull() const {
  if (!device_state_.defined()) return;
  double host[4];
  device_state_.copy_to_host(host, sizeof(host));
  scale_ = host[0];
  growth_tracker_ = int64_t(host[1]);
  hysteresis_tracker_ = int64_t(host[2]);
  min_scale_overflows_ = int64_t(host[3]);
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
  std::vector<Tensor> grads;
  const std::vector<Tensor>& params = opt.params();
  adopt_device(params[0].device());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    MT_CHECK(g.is_floating_point() && g.device() == p.device(),
             "GradScaler: the gradient of "
             "optimizer parameter ",
             i, " is a ", g.describe(), " for a ", p.describe());
    if (g.dtype() == DType::F16) {
      // An fp16 gradient (of an fp16 parameter: O2/O3) is unscaled into fp32: S * g fits fp16,
      // but g itself may be below fp16's smallest subnormal. The fused step reads any dtype.
      g = g.to(DType::F32).contiguous();
      p.set_grad(g);
    } else if (!g.is_contiguous()) {
      g = g.contiguous();
      p.set_grad(g);
    }
    grads.push_back(std::move(g));
  }
  if (device_state_.defined()) {
    // The flag stays on the device: step() hands it to the optimizer's kernel.
    st.flag = Tensor::zeros(Shape{}, DType::F32, device_state_.device());
    if (!grads.empty()) {
      MT_CHECK(params[0].device() == device_state_.device(), "GradScaler: optimizer parameters on ",
               params[0].device().str(), " but this scaler's state is on ",
               device_state_.device().str(), "; use one GradScaler per device");
#if defined(MANTISSA_HAS_CUDA)
      // The kernel takes 1 / S (rounded to fp32, as below) from the device state itself.
      backend::cuda::unscale_and_check_by_state(grads, device_state_, st.flag);
#else
      MT_ASSERT(false, "a scaler state on a GPU in a build without CUDA");
#endif
      for (const Tensor& g : grads)
        g.bump_version();
    }
    st.stage = Stage::Unscaled;
    return;
  }
  // 1 / S rounded to fp32, as PyTorch's inv_scale = scale.double().reciprocal().float().
  const double inv_scale = to_f32(1.0 / scale_);
  bool found = false;
  if (!grads.empty()) {
    const Device device = params[0].device();
    // The flag as a device tensor (what a GPU backend would keep on the device); read back here
    // because step() decides on the host whether to call the optimizer.
    Tensor flag = Tensor::zeros(Shape{}, DType::F32, device);
    const bool returned = backend::backend_for(device).unscale_and_check(grads, inv_scale, &flag);
    found = returned || flag.item() != 0;
    for (const Tensor& g : grads)
      g.bump_version();
  }
  st.found_inf = found;
  st.stage = Stage::Unscaled;
}

bool GradScaler::step(optim::Optimizer& opt) {
  if (!enabled()) {
    opt.step();
    return false;
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
  if (st.flag.defined()) {
    // The optimizer's kernel reads the flag and leaves everything as it is when it is set.
    device_skipped_ = add(device_skipped_, st.flag);
    opt.skip_next_step_if(st.flag);
    opt.step();
    return false;
  }
  if (st.found_inf) {
    ++skipped_steps_;
    return true;
  }
  opt.step();
  return false;
}

void GradScaler::update() {
  if (!enabled()) return;
  MT_CHECK(!per_optimizer_.empty(),
           "GradScaler::update(): no optimizer was unscaled or stepped since the last update()");
  const GradScalerOptions& o = options_;
  const backend::ScaleUpdate rule{.growth_factor = o.growth_factor,
                                  .backoff_factor = o.backoff_factor,
                                  .growth_interval = o.growth_interval,
                                  .hysteresis = o.hysteresis,
                                  .min_scale = o.min_scale,
                                  .max_scale = o.max_scale};
  if (device_state_.defined()) {
    // The flags of all optimizers combined on the device (non-zero: an overflow somewhere).
    Tensor combined;
    for (const auto& [opt, st] : per_optimizer_)
      combined = combined.defined() ? add(combined, st.flag) : st.flag;
    per_optimizer_.clear();
    device_last_found_inf_ = combined;
    if (o.mode == ScaleMode::Static) return;
    const int64_t overflows_before = o.error_at_min_scale ? min_scale_overflows() : 0;
    backend::backend_for(device_state_.device()).update_scale(device_state_, combined, rule);
    if (o.error_at_min_scale) {
      const int64_t overflows = min_scale_overflows();
      MT_CHECK(overflows == overflows_before,
               "GradScaler: inf/NaN gradients with the loss scale at its minimum ", o.min_scale,
               " (", overflows,
               " such steps so far); training has diverged or min_scale is too "
               "high");
    }
    return;
  }
  bool found = false;
  for (const auto& [opt, st] : per_optimizer_)
    found = found || st.found_inf;
  per_optimizer_.clear();
  last_found_inf_ = found;
  if (o.mode == ScaleMode::Static) return;

  const detail::ScaleState next = detail::next_scale_state(
      {scale_, growth_tracker_, hysteresis_tracker_, min_scale_overflows_}, found, rule);
  const bool overflow_at_min = next.min_scale_overflows != min_scale_overflows_;
  scale_ = next.scale;
  growth_tracker_ = next.growth_tracker;
  hysteresis_tracker_ = next.hysteresis_tracker;
  min_scale_overflows_ = next.min_scale_overflows;
  MT_CHECK(!(overflow_at_min && o.error_at_min_scale),
           "GradScaler: inf/NaN gradients with the loss scale at its minimum ", o.min_scale, " (",
           min_scale_overflows_,
           " such steps so far); training has diverged or min_scale is too high");
}

void GradScaler::update(double new_scale) {
  if (!enabled()) return;
  const double s = to_f32(new_scale);
  MT_CHECK(std::isfinite(s) && s > 0,
           "GradScaler::update(new_scale): the scale must be positive "
           "and finite in fp32, got ",
           new_scale);
  if (device_state_.defined()) {
    // The flags are folded into the last-update flag the way update() does; the scale is set
    // where it lives (a short wait: this is not an every-iteration call).
    Tensor combined;
    for (const auto& [opt, st] : per_optimizer_)
      combined = combined.defined() ? add(combined, st.flag) : st.flag;
    per_optimizer_.clear();
    if (combined.defined()) device_last_found_inf_ = combined;
    pull();
    scale_ = s;
    push();
    return;
  }
  bool found = false;
  for (const auto& [opt, st] : per_optimizer_)
    found = found || st.found_inf;
  per_optimizer_.clear();
  last_found_inf_ = found;
  scale_ = s;
}

double GradScaler::get_scale() const {
  if (!enabled()) return 1.0;
  pull();
  return scale_;
}

bool GradScaler::found_inf() const {
  if (device_state_.defined()) {
    if (per_optimizer_.empty()) return device_last_found_inf_.item() != 0;
    for (const auto& [opt, st] : per_optimizer_) {
      if (st.flag.defined() && st.flag.item() != 0) return true;
    }
    return false;
  }
  if (per_optimizer_.empty()) return last_found_inf_;
  for (const auto& [opt, st] : per_optimizer_) {
    if (st.found_inf) return true;
  }
  return false;
}

bool GradScaler::at_min_scale() const {
  return enabled() && get_scale() <= options_.min_scale;
}

int64_t GradScaler::growth_tracker() const {
  pull();
  return growth_tracker_;
}

int64_t GradScaler::hysteresis_tracker() const {
  pull();
  return hysteresis_tracker_;
}

int64_t GradScaler::min_scale_overflows() const {
  pull();
  return min_scale_overflows_;
}

int64_t GradScaler::skipped_steps() const {
  if (!device_skipped_.defined()) return skipped_steps_;
  return skipped_steps_ + int64_t(device_skipped_.item());
}

optim::StateDict GradScaler::state_dict() const {
  optim::StateDict out;
  if (!enabled()) return out;
  pull();
  out.emplace_back("scale", Tensor::scalar(scale_, DType::F64));
  out.emplace_back("growth_factor", Tensor::scalar(options_.growth_factor, DType::F64));
  out.emplace_back("backoff_factor", Tensor::scalar(options_.backoff_factor, DType::F64));
  out.emplace_back("growth_interval", i64_scalar(options_.growth_interval));
  out.emplace_back("growth_tracker", i64_scalar(growth_tracker_));
  out.emplace_back("hysteresis_tracker", i64_scalar(hysteresis_tracker_));
  out.emplace_back("min_scale_overflows", i64_scalar(min_scale_overflows_));
  out.emplace_back("skipped_steps", i64_scalar(skipped_steps()));
  return out;
}

void GradScaler::load_state_dict(const optim::StateDict& dict) {
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
  scale_ = s;
  options_.growth_factor = gf;
  options_.backoff_factor = bf;
  options_.growth_interval = gi;
  growth_tracker_ = gt;
  hysteresis_tracker_ = ht;
  min_scale_overflows_ = mo;
  skipped_steps_ = sk;
  if (device_state_.defined()) {
    device_skipped_ = Tensor::zeros(Shape{}, DType::F32, device_state_.device());
    push();
  }
}

}  // namespace mantissa::amp
