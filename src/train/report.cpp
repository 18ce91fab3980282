#include "mantissa/train/report.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "mantissa/core/error.h"

namespace mantissa::train {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "a");
  MT_CHECK(file_ != nullptr, "cannot open the metrics file '", path, "': ", std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const std::string& json_line) {
  if (!file_) return;
  const bool ok = std::fputs(json_line.c_str(), file_) >= 0 && std::fputc('\n', file_) != EOF &&
                  std::fflush(file_) == 0;
  MT_CHECK(ok, "cannot write the metrics file '", path_, "': ", std::strerror(errno));
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const int64_t t = int64_t(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600),
                  (long long)(t / 60 % 60), (long long)(t % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  }
  return buf;
}

std::string format_bytes(int64_t bytes) {
  char buf[32];
  const double b = double(bytes);
  if (b >= double(1 << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1 << 30));
  } else if (b >= double(1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  }
  return buf;
}

Progress::Progress(bool enabled, int64_t every)
    : enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0), every_(every) {}

namespace {

// "  scale 32768 (2 skipped)" for a run with loss scaling, else "".
std::string scale_text(const StepStats& s) {
  if (s.loss_scale <= 0) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "  scale %g", s.loss_scale);
  std::string out = buf;
  if (s.skipped > 0) out += " (" + std::to_string(s.skipped) + " skipped)";
  return out;
}

}  // namespace

void Progress::update(const StepStats& s) {
  if (!enabled_) return;
  if (tty_) {
    // Redraw at most ~10 times a second, and always on the last batch.
    const auto now = std::chrono::steady_clock::now();
    if (s.batch != s.batches && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 24;
    const int filled = s.batches ? int(kWidth * s.batch / s.batches) : 0;
    std::string bar(size_t(filled), '=');
    if (filled < kWidth) bar += '>';
    bar.resize(kWidth, ' ');
    std::fprintf(stderr,
                 "\r\033[Kepoch %lld/%lld [%s] %lld/%lld  loss %.4f  acc %.2f%%  %.0f %s/s  "
                 "lr %.3g%s  ETA %s",
                 (long long)s.epoch, (long long)s.epochs, bar.c_str(), (long long)s.batch,
                 (long long)s.batches, s.loss, 100 * s.accuracy, s.samples_per_s, s.unit, s.lr,
                 scale_text(s).c_str(), format_duration(s.eta_s).c_str());
    std::fflush(stderr);
  } else if (s.step % every_ == 0 || s.batch == s.batches) {
    std::fprintf(stderr,
                 "epoch %lld/%lld batch %lld/%lld step %lld: loss %.4f acc %.2f%% %.0f %s/s "
                 "lr %.3g%s ETA %s\n",
                 (long long)s.epoch, (long long)s.epochs, (long long)s.batch, (long long)s.batches,
                 (long long)s.step, s.loss, 100 * s.accuracy, s.samples_per_s, s.unit, s.lr,
                 scale_text(s).c_str(), format_duration(s.eta_s).c_str());
  }
}

void Progress::end_epoch(const std::string& summary) {
  if (enabled_ && tty_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", summary.c_str());
  std::fflush(stderr);
}

}  // namespace mantissa::train
