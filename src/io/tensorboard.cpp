// TensorBoard event files: TFRecord framing around hand-encoded protobuf messages.
//
// The protobuf fields written (tensorflow/core/util/event.proto, framework/summary.proto,
// framework/tensor.proto):
//   Event          1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary
//   Summary        1 value (repeated Summary.Value)
//   Summary.Value  1 tag, 2 simple_value (float), 5 histo, 8 tensor, 9 metadata
//   HistogramProto 1 min, 2 max, 3 num, 4 sum, 5 sum_squares (double), 6 bucket_limit,
//                  7 bucket (packed doubles)
//   SummaryMetadata 1 plugin_data { 1 plugin_name, 2 content }
//   TensorProto    1 dtype (DT_STRING = 7), 2 tensor_shape (empty: a scalar), 8 string_val
#include "mantissa/io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "mantissa/core/error.h"

namespace mantissa::io {
namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Protobuf wire encoding, the few kinds used.
class Proto {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(char(v | 0x80));
      v >>= 7;
    }
    out_.push_back(char(v));
  }
  void key(int field, int wire_type) { varint(uint64_t(field) << 3 | uint64_t(wire_type)); }
  void int64_field(int field, int64_t v) {
    key(field, 0);
    varint(uint64_t(v));
  }
  void double_field(int field, double v) {
    key(field, 1);
    fixed(v);
  }
  void float_field(int field, float v) {
    key(field, 5);
    fixed(v);
  }
  void bytes_field(int field, std::string_view bytes) {
    key(field, 2);
    varint(bytes.size());
    out_.append(bytes);
  }
  void packed_doubles(int field, const std::vector<double>& v) {
    if (v.empty()) return;
    key(field, 2);
    varint(v.size() * sizeof(double));
    for (const double d : v)
      fixed(d);
  }
  const std::string& str() const { return out_; }

 private:
  template <typename T>
  void fixed(T v) {  // little-endian, as x86 stores it
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  std::string out_;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string summary_value(std::string_view tag, const Proto& value_fields) {
  Proto v;
  v.bytes_field(1, tag);
  std::string body = v.str() + value_fields.str();
  Proto summary;
  summary.bytes_field(1, body);
  return summary.str();
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i)
    crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

Histogram Histogram::of(std::span<const float> values, int buckets) {
  MT_CHECK(buckets >= 1, "a histogram needs at least one bucket, got ", buckets);
  Histogram h;
  h.min = std::numeric_limits<double>::infinity();
  h.max = -h.min;
  for (const float f : values) {
    if (!std::isfinite(f)) continue;
    const double x = f;
    h.min = std::min(h.min, x);
    h.max = std::max(h.max, x);
    h.num += 1;
    h.sum += x;
    h.sum_squares += x * x;
  }
  if (h.num == 0) {
    h.min = h.max = 0;
    return h;
  }
  const double width = (h.max - h.min) / buckets;
  if (width == 0) {  // one value: one bucket ending at it
    h.limits = {h.max};
    h.counts = {h.num};
    return h;
  }
  h.limits.resize(size_t(buckets));
  h.counts.assign(size_t(buckets), 0);
  for (int i = 0; i < buckets; ++i)
    h.limits[size_t(i)] = h.min + width * (i + 1);
  h.limits.back() = h.max;
  for (const float f : values) {
    if (!std::isfinite(f)) continue;
    const auto i = std::min<int64_t>(buckets - 1, int64_t((double(f) - h.min) / width));
    h.counts[size_t(i)] += 1;
  }
  return h;
}

SummaryWriter::SummaryWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  MT_CHECK(!ec, "--tensorboard: cannot create the directory '", log_dir, "': ", ec.message());
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  path_ = (std::filesystem::path(log_dir) /
           ("events.out.tfevents." + std::to_string(int64_t(now_seconds())) + "." + host + "." +
            std::to_string(getpid()) + ".mantissa"))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  MT_CHECK(file_ != nullptr, "--tensorboard: cannot write '", path_, "': ", std::strerror(errno));
  // The first event names the format version, as TensorFlow's writers do.
  Proto e;
  e.double_field(1, now_seconds());
  e.bytes_field(3, "brain.Event:2");
  write_record(e.str());
}

SummaryWriter::~SummaryWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void SummaryWriter::write_event(int64_t step, const std::string& summary) {
  Proto e;
  e.double_field(1, now_seconds());
  e.int64_field(2, step);
  e.bytes_field(5, summary);
  write_record(e.str());
}

void SummaryWriter::write_record(const std::string& bytes) {
  const uint64_t len = bytes.size();
  const uint32_t len_crc = masked_crc32c(&len, sizeof len), crc = masked_crc32c(bytes.data(), len);
  const bool ok = std::fwrite(&len, sizeof len, 1, file_) == 1 &&
                  std::fwrite(&len_crc, sizeof len_crc, 1, file_) == 1 &&
                  std::fwrite(bytes.data(), 1, len, file_) == len &&
                  std::fwrite(&crc, sizeof crc, 1, file_) == 1 && std::fflush(file_) == 0;
  MT_CHECK(ok, "--tensorboard: cannot write '", path_, "': ", std::strerror(errno));
}

void SummaryWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  Proto v;
  v.float_field(2, float(value));
  write_event(step, summary_value(tag, v));
}

void SummaryWriter::add_histogram(std::string_view tag, std::span<const float> values, int64_t step,
                                  int buckets) {
  add_histogram(tag, Histogram::of(values, buckets), step);
}

void SummaryWriter::add_histogram(std::string_view tag, const Histogram& h, int64_t step) {
  MT_CHECK(h.limits.size() == h.counts.size(), "a histogram has ", h.limits.size(),
           " bucket limits and ", h.counts.size(), " counts");
  // An empty histogram (no finite value: a skipped step's gradients) is not written: one in a
  // run keeps TensorBoard's Time Series page from drawing any of the run's cards (tested).
  if (h.counts.empty()) return;
  Proto histo;
  histo.double_field(1, h.min);
  histo.double_field(2, h.max);
  histo.double_field(3, h.num);
  histo.double_field(4, h.sum);
  histo.double_field(5, h.sum_squares);
  histo.packed_doubles(6, h.limits);
  histo.packed_doubles(7, h.counts);
  Proto v;
  v.bytes_field(5, histo.str());
  write_event(step, summary_value(tag, v));
}

void SummaryWriter::add_text(std::string_view tag, std::string_view text, int64_t step) {
  Proto plugin;
  plugin.bytes_field(1, "text");
  Proto metadata;
  metadata.bytes_field(1, plugin.str());
  Proto tensor;
  tensor.int64_field(1, 7);   // DT_STRING
  tensor.bytes_field(2, "");  // a scalar's shape: no dims
  tensor.bytes_field(8, text);
  Proto v;
  v.bytes_field(8, tensor.str());
  v.bytes_field(9, metadata.str());
  write_event(step, summary_value(tag, v));
}

}  // namespace mantissa::io
