// The event-file writer's framing and histograms. What TensorBoard itself reads back is tested
// with the real `tensorboard` package (tests/cli/tensorboard_cli_test.py).
#include "mantissa/io/tensorboard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "harness/temp_dir.h"
#include "mantissa/core/error.h"

namespace mantissa::io {
namespace {

TEST(Crc32c, MatchesPublishedCheckValues) {
  // The CRC catalogue's check value, and RFC 3720's (iSCSI) test vectors B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  const std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62a8ab43u);
  std::vector<unsigned char> up(32);
  std::iota(up.begin(), up.end(), 0);
  EXPECT_EQ(crc32c(up.data(), up.size()), 0x46dd794eu);
  // Incremental: the CRC of a whole is that of its parts chained.
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xe3069283u);
}

class EventFile : public testing::TempDirTest {};

// The records of an event file, their CRCs checked.
std::vector<std::string> read_records(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> out;
  uint64_t len = 0;
  while (in.read(reinterpret_cast<char*>(&len), sizeof len)) {
    uint32_t len_crc = 0, crc = 0;
    in.read(reinterpret_cast<char*>(&len_crc), sizeof len_crc);
    std::string data(len, '\0');
    in.read(data.data(), std::streamsize(len));
    in.read(reinterpret_cast<char*>(&crc), sizeof crc);
    EXPECT_TRUE(in.good());
    EXPECT_EQ(len_crc, masked_crc32c(&len, sizeof len));
    EXPECT_EQ(crc, masked_crc32c(data.data(), data.size()));
    out.push_back(data);
  }
  return out;
}

TEST_F(EventFile, IsFramedRecordsLedByTheFileVersion) {
  std::string path;
  {
    SummaryWriter w(file("runs/a"));
    path = w.path();
    EXPECT_NE(std::filesystem::path(path).filename().string().find("tfevents"), std::string::npos);
    w.add_scalar("train/loss", 0.5, 7);
    w.add_text("config", "lr = 0.1", 0);
    // Nothing finite to count (a skipped step's gradients): not written.
    w.add_histogram("gradients/w", std::vector<float>(4, std::numeric_limits<float>::quiet_NaN()),
                    8);
  }
  const std::vector<std::string> records = read_records(path);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_NE(records[0].find("brain.Event:2"), std::string::npos);
  // Event.step = 7 is field 2, varint: 0x10 0x07; the tag and the float 0.5 are in the summary.
  EXPECT_NE(records[1].find(std::string("\x10\x07", 2)), std::string::npos);
  EXPECT_NE(records[1].find("train/loss"), std::string::npos);
  const float half = 0.5f;
  EXPECT_NE(records[1].find(std::string("\x15", 1) +
                            std::string(reinterpret_cast<const char*>(&half), 4)),
            std::string::npos);
  EXPECT_NE(records[2].find("lr = 0.1"), std::string::npos);
}

TEST_F(EventFile, AnUnwritableDirectoryIsNamed) {
  std::ofstream(file("plain")) << "x";
  try {
    SummaryWriter w(file("plain/sub"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("plain/sub"), std::string::npos) << e.message();
  }
}

TEST(Histogram, CountsEveryFiniteValueOnceInEqualBuckets) {
  std::vector<float> v;
  for (int i = 0; i < 1000; ++i)
    v.push_back(float(i) / 10.0f - 20.0f);
  v.push_back(std::numeric_limits<float>::infinity());
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  const Histogram h = Histogram::of(v, 10);
  EXPECT_EQ(h.num, 1000);
  EXPECT_EQ(h.min, -20.0);
  EXPECT_DOUBLE_EQ(h.max, double(999.0f / 10.0f - 20.0f));
  ASSERT_EQ(h.limits.size(), 10u);
  EXPECT_EQ(h.limits.back(), h.max);
  double total = 0, sum = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    total += h.counts[i];
    if (i > 0) {
      EXPECT_GT(h.limits[i], h.limits[i - 1]);
    }
    EXPECT_NEAR(h.counts[i], 100, 1) << "bucket " << i;
  }
  for (int i = 0; i < 1000; ++i)
    sum += double(v[size_t(i)]);
  EXPECT_EQ(total, 1000);
  EXPECT_DOUBLE_EQ(h.sum, sum);

  const Histogram one = Histogram::of(std::vector<float>{3, 3, 3});
  EXPECT_EQ(one.limits, std::vector<double>{3});
  EXPECT_EQ(one.counts, std::vector<double>{3});
  const Histogram none = Histogram::of(std::vector<float>{});
  EXPECT_EQ(none.num, 0);
  EXPECT_TRUE(none.counts.empty());
}

}  // namespace
}  // namespace mantissa::io
