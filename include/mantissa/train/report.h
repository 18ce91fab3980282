// What a training run tells the user while it runs: JSON-lines metrics for tools, and a progress
// bar for people (plain periodic lines when stderr is not a terminal).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace mantissa::train {

// Appends one JSON object per line to a file, flushed per record (a crash loses nothing written).
class MetricsWriter {
 public:
  MetricsWriter() = default;  // writes nothing
  // Appends to `path` (a resumed run continues the same file), which is opened at the first
  // record: a run refused before it trains leaves no file behind. Whether it can be written is
  // checked here; throws naming the path.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  bool enabled() const { return !path_.empty(); }
  void write(const std::string& json_line);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

struct StepStats {
  int64_t epoch = 0, epochs = 0;
  int64_t batch = 0, batches = 0;  // batch counts from 1 in this epoch
  int64_t step = 0;                // optimizer steps so far
  int64_t steps = 0;               // of the run (0: not known)
  double loss = 0;                 // running mean over the epoch
  double accuracy = 0;             // running train accuracy (0..1; < 0: the task has none)
  double samples_per_s = 0;
  const char* unit = "samples";  // what samples_per_s counts: samples, or tokens
  double lr = 0;
  double eta_s = 0;       // for the epoch
  double loss_scale = 0;  // > 0: shown (a run with loss scaling)
  int64_t skipped = 0;    // steps skipped for inf/NaN gradients so far (with loss_scale)
};

class Progress {
 public:
  // tty: redraw one line on stderr; otherwise print a line every `every` steps.
  Progress(bool enabled, int64_t every);
  void update(const StepStats& s);
  void end_epoch(const std::string& summary);  // a line of its own, even when disabled

 private:
  bool enabled_, tty_;
  int64_t every_;
  std::chrono::steady_clock::time_point last_draw_{};
};

std::string format_duration(double seconds);  // "1:05", "1:02:03"
std::string format_bytes(int64_t bytes);      // "12.3 MiB"

}  // namespace mantissa::train
