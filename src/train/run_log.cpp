#include "train/run_log.h"

#include <cmath>
#include <map>

namespace mantissa::train {
namespace {

// The records whose numbers become scalars, and the keys that are coordinates, not values.
bool charted(const std::string& kind) {
  return kind == "train" || kind == "eval" || kind == "underflow";
}
bool coordinate(const std::string& key) {
  return key == "kind" || key == "step" || key == "epoch";
}

}  // namespace

RunLog::RunLog(const std::string& metrics_path, const std::string& tensorboard_dir) {
  if (!metrics_path.empty()) metrics_ = std::make_unique<MetricsWriter>(metrics_path);
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<io::SummaryWriter>(tensorboard_dir);
}

void RunLog::write(const nlohmann::ordered_json& record) {
  // Bytes that are not UTF-8 (a user's path) as U+FFFD, not an exception mid-run.
  const std::string line =
      record.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  if (metrics_) metrics_->write(line);
  if (callback_) callback_(line);
  if (!tensorboard_) return;
  const std::string kind = record.value("kind", "");
  if (record.contains("step") && record["step"].is_number_integer())
    last_step_ = record["step"].get<int64_t>();
  const int64_t step = last_step_;
  // Non-finite numbers (a skipped step's gradient norm) are left out, as the metrics file
  // writes them as null: TensorBoard's Time Series page draws no curve of a run whose batch of
  // scalars holds one (tested: the screenshot of tests/cli/tensorboard_cli_test.py went blank).
  auto scalar = [&](const std::string& tag, const nlohmann::ordered_json& value) {
    if (value.is_boolean()) tensorboard_->add_scalar(tag, value.get<bool>(), step);
    if (value.is_number() && std::isfinite(value.get<double>()))
      tensorboard_->add_scalar(tag, value.get<double>(), step);
  };
  if (charted(kind)) {
    for (const auto& [key, value] : record.items())
      if (!coordinate(key)) scalar(kind + "/" + key, value);
  } else if (kind == "fp8" || kind == "fp4") {
    // Per layer and role: fp8/<layer>/<role>/{amax,scale,range_used} (fp4: amax, scale).
    for (const auto& layer : record["layers"]) {
      const std::string name = layer.value("layer", "");
      for (const auto& [role, stats] : layer.items()) {
        if (!stats.is_object()) continue;
        for (const auto& [key, value] : stats.items())
          scalar(kind + "/" + name + "/" + role + "/" + key, value);
      }
    }
  } else if (kind == "divergence" || kind == "skipped_step") {
    tensorboard_->add_text(kind, "```\n" + record.dump(2) + "\n```", step);
  }
}

void RunLog::histogram(const std::string& tag, std::span<const float> values, int64_t step) {
  if (tensorboard_) tensorboard_->add_histogram(tag, values, step);
}

void RunLog::histogram(const std::string& tag, const io::Histogram& h, int64_t step) {
  if (tensorboard_) tensorboard_->add_histogram(tag, h, step);
}

void RunLog::text(const std::string& tag, const std::string& markdown, int64_t step) {
  if (tensorboard_) tensorboard_->add_text(tag, markdown, step);
}

io::Histogram log2_histogram(std::span<const float> values) {
  std::map<int, double> by_exponent;
  io::Histogram h;
  for (const float f : values) {
    if (f == 0 || !std::isfinite(f)) continue;
    int e = 0;
    std::frexp(f, &e);  // |f| = m * 2^e, 0.5 <= m < 1: 2^(e-1) <= |f| < 2^e
    by_exponent[e - 1] += 1;
    const double l = std::log2(std::fabs(double(f)));
    h.num += 1;
    h.sum += l;
    h.sum_squares += l * l;
  }
  if (by_exponent.empty()) return h;
  h.min = by_exponent.begin()->first;
  h.max = by_exponent.rbegin()->first + 1;
  for (int e = by_exponent.begin()->first; e <= by_exponent.rbegin()->first; ++e) {
    const auto it = by_exponent.find(e);
    h.limits.push_back(e + 1);
    h.counts.push_back(it == by_exponent.end() ? 0 : it->second);
  }
  return h;
}

}  // namespace mantissa::train
