// Where a run's records go: the JSON-lines metrics file (--metrics) and TensorBoard event files
// (--tensorboard). Both get the same records; TensorBoard shows each number of a train, eval,
// underflow or fp8 record as a scalar named after its kind and key ("train/loss"), at the
// record's step, so the curves are the metrics file's values.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "mantissa/io/tensorboard.h"
#include "mantissa/train/report.h"

namespace mantissa::train {

class RunLog {
 public:
  RunLog() = default;  // writes nothing
  RunLog(const std::string& metrics_path, const std::string& tensorboard_dir);

  bool enabled() const {
    return metrics_ != nullptr || tensorboard_ != nullptr || callback_ != nullptr;
  }
  // Also hands every record to `callback` as its JSON text (Trainer::set_record_callback).
  void set_callback(std::function<void(const std::string&)> callback) {
    callback_ = std::move(callback);
  }
  bool tensorboard() const { return tensorboard_ != nullptr; }
  void write(const nlohmann::ordered_json& record);
  // TensorBoard only (the metrics file keeps numbers, not distributions).
  void histogram(const std::string& tag, std::span<const float> values, int64_t step);
  void histogram(const std::string& tag, const io::Histogram& h, int64_t step);
  void text(const std::string& tag, const std::string& markdown, int64_t step);

 private:
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<io::SummaryWriter> tensorboard_;
  std::function<void(const std::string&)> callback_;
  int64_t last_step_ = 0;  // for records without a step
};

// A metrics record of `kind` ({"kind": kind}), to add its fields to. Numbers keep every bit a
// float/double has (a resumed run is compared bitwise).
inline nlohmann::ordered_json record(const char* kind) {
  nlohmann::ordered_json j;
  j["kind"] = kind;
  return j;
}

// The log2|x| distribution of a record's values as a TensorBoard histogram with one bucket per
// binary exponent: bucket e counts the non-zero finite values with 2^e <= |x| < 2^(e+1) (fp32
// subnormals by their true exponent, down to -149), its limit e + 1.
io::Histogram log2_histogram(std::span<const float> values);

}  // namespace mantissa::train
