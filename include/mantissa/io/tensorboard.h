// TensorBoard event files, written without TensorFlow or protobuf: what `tensorboard --logdir`
// reads (scalars, histograms, text), as PyTorch's torch.utils.tensorboard.SummaryWriter writes
// them. The file is TFRecord framing (length, masked CRC-32C of the length, the bytes, their
// masked CRC-32C) around protobuf `Event` messages, encoded here by hand: the four messages
// used (Event, Summary, Summary.Value, HistogramProto) are a few fields each (docs/training.md,
// "TensorBoard").
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mantissa::io {

// CRC-32C (Castagnoli, reflected 0x82f63b78), as TFRecord uses: crc32c("123456789") = 0xe3069283.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's mask of a CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

// A histogram as TensorBoard's HistogramProto holds it: bucket i counts the values in
// (limits[i-1], limits[i]] (the first from `min`).
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> limits, counts;
  // `buckets` equal-width buckets from the smallest to the largest finite value (non-finite
  // values are left out, as TensorBoard cannot place them).
  static Histogram of(std::span<const float> values, int buckets = 64);
};

class SummaryWriter {
 public:
  // Creates `log_dir` (and its parents) and a new event file in it,
  // events.out.tfevents.<seconds>.<host>.<pid>.mantissa; throws naming the path when it cannot.
  explicit SummaryWriter(const std::string& log_dir);
  ~SummaryWriter();
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;

  // Each call writes one event and flushes it: a crash loses nothing written, and a running
  // TensorBoard sees the point at once.
  void add_scalar(std::string_view tag, double value, int64_t step);
  // A histogram without a finite value is not written (TensorBoard cannot draw it).
  void add_histogram(std::string_view tag, std::span<const float> values, int64_t step,
                     int buckets = 64);
  void add_histogram(std::string_view tag, const Histogram& h, int64_t step);
  // Markdown text (TensorBoard's text plugin), e.g. a run's configuration.
  void add_text(std::string_view tag, std::string_view text, int64_t step);

  const std::string& path() const { return path_; }

 private:
  void write_event(int64_t step, const std::string& summary);
  void write_record(const std::string& bytes);  // TFRecord framing, flushed
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace mantissa::io
