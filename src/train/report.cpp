#include "mantissa/train/report.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <fmt/core.h>

#include "mantissa/core/error.h"

namespace mantissa::train {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  const bool existed = ::access(path.c_str(), F_OK) == 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  MT_CHECK(f != nullptr, "cannot open the metrics file '", path, "': ", std::strerror(errno));
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const std::string& json_line) {
  if (path_.empty()) return;
  if (!file_) {
    file_ = std::fopen(path_.c_str(), "a");
    MT_CHECK(file_ != nullptr, "cannot open the metrics file '", path_,
             "': ", std::strerror(errno));
  }
  const bool ok = std::fputs(json_line.c_str(), file_) >= 0 && std::fputc('\n', file_) != EOF &&
                  std::fflush(file_) == 0;
  MT_CHECK(ok, "cannot write the metrics file '", path_, "': ", std::strerror(errno));
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  return fmt::format("{}:{:02}", t / 60, t % 60);
}

std::string format_bytes(int64_t bytes) {
  const double b = double(bytes);
  if (b >= double(1 << 30)) return fmt::format("{:.2f} GiB", b / double(1 << 30));
  if (b >= double(1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

Progress::Progress(bool enabled, int64_t every)
    : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), every_(every) {}

namespace {

// What follows the loss: "  acc 85.10%", "  123 samples/s", "  lr 0.05", "  scale 32768 (2
// skipped)" for a run with loss scaling.
std::string details(const StepStats& s) {
  std::string out;
  if (s.accuracy >= 0) out += fmt::format("  acc {:.2f}%", 100 * s.accuracy);
  out += fmt::format("  {:.0f} {}/s  lr {:.3g}", s.samples_per_s, s.unit, s.lr);
  if (s.loss_scale > 0) {
    out += fmt::format("  scale {:g}", s.loss_scale);
    if (s.skipped > 0) out += fmt::format(" ({} skipped)", s.skipped);
  }
  return out;
}

}  // namespace

void Progress::update(const StepStats& s) {
  if (!enabled_) return;
  const std::string steps =
      s.steps > 0 ? fmt::format("{}/{}", s.step, s.steps) : std::to_string(s.step);
  if (tty_) {
    // Redraw at most ~10 times a second, and always on the last batch.
    const auto now = std::chrono::steady_clock::now();
    if (s.batch != s.batches && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int64_t kWidth = 24;
    const int64_t filled = s.batches ? kWidth * s.batch / s.batches : 0;
    std::string bar(size_t(filled), '=');
    if (filled < kWidth) bar += '>';
    bar.resize(kWidth, ' ');
    fmt::print(stderr, "\r\033[Kepoch {}/{} [{}] {}/{}  step {}  loss {:.4f}{}  ETA {}", s.epoch,
               s.epochs, bar, s.batch, s.batches, steps, s.loss, details(s),
               format_duration(s.eta_s));
    std::fflush(stderr);
  } else if (s.step % every_ == 0 || s.batch == s.batches) {
    fmt::print(stderr, "epoch {}/{} batch {}/{} step {}: loss {:.4f}{}  ETA {}\n", s.epoch,
               s.epochs, s.batch, s.batches, steps, s.loss, details(s), format_duration(s.eta_s));
  }
}

void Progress::end_epoch(const std::string& summary) {
  if (enabled_ && tty_) fmt::print(stderr, "\r\033[K");
  fmt::print(stderr, "{}\n", summary);
  std::fflush(stderr);
}

}  // namespace mantissa::train
