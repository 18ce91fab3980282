// What a run records beyond its losses (docs/training.md, "Metrics" and "TensorBoard"): the
// summary, the per-layer fp8 record, and TensorBoard's histograms of the weights, the gradients
// and the underflow measurement's log2|g|.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mantissa/autocast/fp8.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/dist/communicator.h"
#include "mantissa/numerics/format.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/trainer.h"
#include "train/run_log.h"

namespace mantissa::train {

void Trainer::write_histograms(bool gradients, int64_t step, double factor) {
  NoGrad ng;
  for (const auto& [name, p] : model_->named_parameters()) {
    const Tensor t = gradients ? p.grad() : p;
    if (!t.defined()) continue;
    std::vector<float> v = t.to(DType::F32).to_vector<float>();
    if (factor != 1.0)
      for (float& x : v)
        x = float(double(x) * factor);
    log_->histogram((gradients ? "gradients/" : "weights/") + name, v, step);
  }
}

void Trainer::write_log2_histogram(const std::vector<Tensor>& reference, int64_t step) {
  // The distribution the measurement looks at: log2|g| of the fp32 gradients, one bucket per
  // binary exponent (fp16's normals start at 2^-14, its subnormals at 2^-24).
  NoGrad ng;
  std::vector<float> all;
  for (const Tensor& g : reference) {
    if (!g.defined()) continue;
    const std::vector<float> v = g.to(DType::F32).to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  log_->histogram("underflow/log2_abs_gradient", log2_histogram(all), step);
}

std::string Trainer::describe_precision() const {
  if (!fp8_) return amp_->describe();
  return "fp8 " + config_.fp8_recipe + " (" + config_.fp8_format + ") in " +
         std::to_string(fp8_->layers().size()) + " Linear layers; " + amp_->describe();
}

std::string Trainer::fp8_record() const {
  // Per layer and tensor: the last amax, the scale used (the smallest over blocks) and how full
  // fp8's range was (amax * scale / fp8_max: 1 is the top, more has saturated; with delayed
  // scaling this is how late the history's scale was).
  auto j = record("fp8");
  j["step"] = state_.step;
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& l : fp8_->layers()) {
    nlohmann::ordered_json e;
    e["layer"] = l->name;
    for (int r = 0; r < amp::kNumFp8Roles; ++r) {
      const amp::Fp8Role role = amp::Fp8Role(r);
      const amp::Fp8TensorMeta& m = (*l)[role];
      const double fp8_max =
          format_info(*dtype_format(amp::fp8_dtype(fp8_->options().format, role))).max_finite;
      e[std::string(amp::fp8_role_name(role))] = {
          {"amax", m.last_amax},
          {"scale", m.last_scale},
          {"range_used", double(m.last_amax) * double(m.last_scale) / fp8_max}};
    }
    layers.push_back(e);
  }
  j["layers"] = layers;
  return j.dump();
}

std::string Trainer::summary_json(const TrainResult& result) const {
  nlohmann::ordered_json j;
  j["test_accuracy"] = result.test.accuracy;
  j["test_loss"] = result.test.loss;
  if (language_model_) j["val_perplexity"] = result.test.perplexity();
  j["train_seconds"] = result.train_seconds;
  j["peak_memory_bytes"] = result.peak_memory_bytes;
  j["optimizer_state_bytes"] = result.optimizer_state_bytes;
  j["dataset_bytes"] = result.dataset_bytes;
  j["steps"] = result.steps;
  j["skipped_steps"] = result.skipped_steps;
  j["loss_scale"] = result.loss_scale;
  j["precision"] = config_.precision;
  j["opt_level"] = std::string(amp::opt_level_name(amp_->properties().level));
  if (fp8_) {
    int64_t nonfinite = 0;
    for (const auto& l : fp8_->layers())
      for (const amp::Fp8TensorMeta& m : l->meta)
        nonfinite += m.nonfinite;
    j["fp8"] = {{"recipe", config_.fp8_recipe},
                {"format", config_.fp8_format},
                {"layers", fp8_->layers().size()},
                {"nonfinite_amaxes", nonfinite}};
  }
  const UnderflowStats& u = result.underflow;
  if (u.measurements > 0) {
    j["underflow"] = {{"measurements", u.measurements},   {"nonzero", u.nonzero},
                      {"cast_unscaled", u.cast_unscaled}, {"cast_scaled", u.cast_scaled},
                      {"observed", u.observed},           {"zero_rows", u.zero_rows}};
    nlohmann::ordered_json worst = nlohmann::ordered_json::array();
    for (const LayerUnderflow& l : u.worst(5)) {
      worst.push_back({{"name", l.name},
                       {"nonzero", l.nonzero},
                       {"cast_unscaled", l.cast_unscaled},
                       {"cast_scaled", l.cast_scaled},
                       {"observed", l.observed},
                       {"zero_rows", l.zero_rows}});
    }
    j["underflow"]["worst_layers"] = std::move(worst);
  }
  j["model"] = config_.model;
  j["parameters"] = model_->num_parameters();
  j["device"] = device_.str();
  if (ddp_) {
    // Gradient communication over the run, as this rank (0) saw it: the buckets and bytes of a
    // step, the seconds inside the all-reduces and those the step waited for (not overlapped
    // with backward), in all.
    const dist::DdpStepStats& last = ddp_->last_step();
    const dist::DdpStepStats& total = ddp_->totals();
    j["world_size"] = world_size();
    j["grad_comm"] = config_.grad_comm;
    j["comm_backend"] = comm_->backend();
    j["zero"] = config_.zero;
    j["comm"] = {{"steps", ddp_->steps()},
                 {"buckets", last.buckets},
                 {"bytes_per_step", last.bytes},
                 {"comm_seconds", total.comm_seconds},
                 {"exposed_seconds", total.exposed_seconds},
                 {"launched_in_backward", total.launched_in_backward}};
  }
  return j.dump();
}

}  // namespace mantissa::train
