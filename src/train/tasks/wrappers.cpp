// train_gan and train_recommender (train/gan.h, train/recommender.h): the Trainer on those
// tasks, with their results as structs.
#include <cmath>

#include <nlohmann/json.hpp>

#include "mantissa/train/gan.h"
#include "mantissa/train/recommender.h"

namespace mantissa::train {
namespace {

// The Trainer's run of `config`, and its summary record.
std::pair<TrainResult, nlohmann::json> run(const TrainConfig& config, std::string_view task,
                                           std::function<void(const std::string&)> on_record,
                                           std::string* precision = nullptr) {
  MT_CHECK(task_name(config.model) == task, "this function trains a ", task, "; model '",
           config.model, "' is not one (a ", task_name(config.model), "): use train::Trainer");
  Trainer t(config);
  if (on_record) t.set_record_callback(std::move(on_record));
  TrainResult r = t.fit();
  MT_CHECK(r.diverged.empty(), "the run diverged: ", r.diverged);
  if (precision) *precision = t.describe_precision();
  return {std::move(r), nlohmann::json::parse(t.summary_json(r))};
}

double metric(const Metrics& m, const char* name) {
  for (const auto& [n, v] : m)
    if (n == name) return v;
  return std::nan("");
}

}  // namespace

GanResult train_gan(const TrainConfig& config,
                    std::function<void(const std::string& json)> on_record) {
  const auto [r, summary] = run(config, "GAN", std::move(on_record));
  GanResult g;
  g.frechet_distance = r.test.metric("frechet_distance");
  g.ms_ssim = r.test.metric("ms_ssim");
  g.seconds = r.train_seconds;
  g.steps = r.steps;
  g.skipped_steps = r.skipped_steps;
  g.loss_scale = r.loss_scale;
  g.peak_memory_bytes = summary.value("peak_memory_bytes", int64_t(0));
  g.final_loss_d = metric(r.last_step, "loss_d");
  g.final_loss_g = metric(r.last_step, "loss_g");
  return g;
}

RecommenderResult train_recommender(const TrainConfig& config,
                                    std::function<void(const std::string& json)> on_record) {
  std::string precision;
  const auto [r, summary] = run(config, "recommender", std::move(on_record), &precision);
  RecommenderResult out;
  out.log_loss = r.test.loss;
  out.auc = r.test.metric("auc");
  out.bayes_log_loss = r.test.metric("bayes_log_loss");
  out.constant_log_loss = r.test.metric("constant_log_loss");
  out.held_out_examples = r.test.samples;
  out.seconds = r.train_seconds;
  out.steps = r.steps;
  out.skipped_steps = r.skipped_steps;
  out.loss_scale = r.loss_scale;
  out.peak_memory_bytes = r.peak_memory_bytes;
  out.table_update_seconds = summary.value("table_update_seconds", 0.0);
  out.optimizer_seconds_rest = summary.value("optimizer_seconds_rest", 0.0);
  out.embedding_update = summary.value("embedding_update", "");
  out.precision = precision;
  return out;
}

}  // namespace mantissa::train
