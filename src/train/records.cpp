// What a run records beyond its losses (docs/training.md, "Metrics"): the summary and the
// per-layer fp8 record.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mantissa/autocast/fp8.h"
#include "mantissa/core/warning.h"
#include "mantissa/dist/communicator.h"
#include "mantissa/numerics/format.h"
#include "train/run.h"

namespace mantissa::train {

Json fp8_record(const Run& run) {
  // Per layer and tensor: the last amax, the scale used (the smallest over blocks) and how full
  // fp8's range was (amax * scale / fp8_max: 1 is the top, more has saturated; with delayed
  // scaling this is how late the history's scale was).
  const amp::Fp8Context& fp8 = *run.main().amp().fp8();
  // FP4 scales come from each tensor's amax (NVFP4: its fp32 scale 2688 / amax; MX: 1, the
  // blocks' powers of two), so its range is full by construction: amax and scale only.
  const bool fp4 = fp8.options().fp4.has_value();
  auto j = record(fp4 ? "fp4" : "fp8");
  j["step"] = run.state.step;
  Json layers = Json::array();
  for (const auto& l : fp8.layers()) {
    Json e;
    e["layer"] = l->name;
    for (int r = 0; r < amp::kNumFp8Roles; ++r) {
      const amp::Fp8Role role = amp::Fp8Role(r);
      // {amax, scale, nonfinite}: read from the device here, once per record.
      const std::vector<float> st = (*l)[role].stats.to(Device::cpu()).to_vector<float>();
      Json& entry = e[std::string(amp::fp8_role_name(role))];
      entry = {{"amax", st[0]}, {"scale", st[1]}};
      if (!fp4) {
        const double fp8_max =
            format_info(*dtype_format(amp::fp8_dtype(fp8.options().resolved_format(), role)))
                .max_finite;
        entry["range_used"] = double(st[0]) * st[1] / fp8_max;
      }
      if (st[2] > 0) {
        const std::string what = fp4 ? "fp4" : "fp8";
        warn(what + ":nonfinite", what + ": the " + std::string(amp::fp8_role_name(role)) +
                                      " of layer '" + l->name +
                                      "' held inf or NaN; its GEMM gave NaN, so the loss scaler "
                                      "skipped the step (the amax was not recorded)");
      }
    }
    layers.push_back(e);
  }
  j["layers"] = layers;
  return j;
}

namespace {

Json underflow_summary(const UnderflowStats& u) {
  Json j = {{"measurements", u.measurements},   {"nonzero", u.nonzero},
            {"cast_unscaled", u.cast_unscaled}, {"cast_scaled", u.cast_scaled},
            {"observed", u.observed},           {"zero_rows", u.zero_rows}};
  Json worst = Json::array();
  for (const LayerUnderflow& l : u.worst(5)) {
    worst.push_back({{"name", l.name},
                     {"nonzero", l.nonzero},
                     {"cast_unscaled", l.cast_unscaled},
                     {"cast_scaled", l.cast_scaled},
                     {"observed", l.observed},
                     {"zero_rows", l.zero_rows}});
  }
  j["worst_layers"] = std::move(worst);
  return j;
}

// Gradient communication over the run, as this rank (0) saw it: the buckets and bytes of a step,
// the seconds inside the all-reduces and those the step waited for (not overlapped with
// backward), in all.
Json comm_summary(const Run& run, Json& j) {
  const dist::DistributedDataParallel& ddp = *run.main().ddp();
  const dist::DdpStepStats& last = ddp.last_step();
  const dist::DdpStepStats& total = ddp.totals();
  j["world_size"] = run.world_size();
  j["grad_comm"] = std::string(name_of(run.config.grad_comm));
  j["comm_backend"] = run.comm->backend();
  j["zero"] = run.config.zero;
  return {{"steps", ddp.steps()},
          {"buckets", last.buckets},
          {"bytes_per_step", last.bytes},
          {"comm_seconds", total.comm_seconds},
          {"exposed_seconds", total.exposed_seconds},
          {"launched_in_backward", total.launched_in_backward},
          {"gathers", total.gathers},
          {"gather_wait_seconds", total.gather_wait_seconds}};
}

}  // namespace

std::string summary_of(const Run& run, const TrainResult& result) {
  Json j;
  // The last evaluation's numbers, as the task's eval records name them.
  for (const auto& [name, v] : result.test.metrics)
    j[name] = v;
  j["train_seconds"] = result.train_seconds;
  j["peak_memory_bytes"] = result.peak_memory_bytes;
  j["optimizer_state_bytes"] = result.optimizer_state_bytes;
  j["dataset_bytes"] = result.dataset_bytes;
  j["steps"] = result.steps;
  j["skipped_steps"] = result.skipped_steps;
  j["loss_scale"] = result.loss_scale;
  for (const auto& [name, v] : result.last_step)
    j["final_" + name] = v;
  const Trainee& main = run.main();
  j["precision"] = std::string(name_of(run.config.precision));
  j["opt_level"] = std::string(name_of(main.amp().properties().level));
  if (const amp::Fp8Context* fp8 = main.amp().fp8()) {
    int64_t nonfinite = 0;
    for (const auto& l : fp8->layers())
      for (const amp::Fp8TensorMeta& m : l->meta)
        nonfinite += m.nonfinite();
    if (const auto& fp4 = fp8->options().fp4) {
      j["fp4"] = {{"recipe", std::string(name_of(fp4->recipe))},
                  {"rht", fp4->rht},
                  {"2d", fp4->two_d},
                  {"sr", fp4->sr},
                  {"layers", fp8->layers().size()},
                  {"nonfinite_amaxes", nonfinite}};
    } else {
      const amp::Fp8Options& o = fp8->options();
      j["fp8"] = {{"recipe", std::string(name_of(o.recipe))},
                  {"format", std::string(name_of(o.resolved_format()))},
                  {"pow2_scales", o.resolved_pow2_scales()},
                  {"accumulate", o.accumulate.str()},
                  {"layers", fp8->layers().size()},
                  {"nonfinite_amaxes", nonfinite}};
    }
  }
  if (result.underflow.measurements > 0) j["underflow"] = underflow_summary(result.underflow);
  j["model"] = run.config.model;
  j["data"] = std::string(name_of(run.config.data));
  int64_t parameters = 0;
  for (const auto& t : run.trainees)
    parameters += t->model().num_parameters();
  j["parameters"] = parameters;
  j["device"] = run.device.str();
  if (main.ddp()) j["comm"] = comm_summary(run, j);
  run.task->summarize(result, j);
  return j.dump();
}

}  // namespace mantissa::train
