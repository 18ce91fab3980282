// The run log's log2 histogram of the underflow measurement (src/train/run_log.h).
#include "train/run_log.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace mantissa::train {
namespace {

TEST(Log2Histogram, OneBucketPerBinaryExponent) {
  const float tiny = std::numeric_limits<float>::denorm_min();  // 2^-149
  const std::vector<float> v = {1.0f,  1.5f, -1.99f, 2.0f,
                                0.25f, 0.0f, tiny,   std::numeric_limits<float>::infinity()};
  const io::Histogram h = log2_histogram(v);
  EXPECT_EQ(h.num, 6);  // zero and inf left out
  EXPECT_EQ(h.min, -149);
  EXPECT_EQ(h.max, 2);
  ASSERT_EQ(h.limits.size(), size_t(1 - (-149) + 1));
  EXPECT_EQ(h.limits.front(), -148);
  EXPECT_EQ(h.counts.front(), 1);            // 2^-149
  EXPECT_EQ(h.counts[size_t(-2 + 149)], 1);  // 0.25
  EXPECT_EQ(h.counts[size_t(0 + 149)], 3);   // 1, 1.5, -1.99
  EXPECT_EQ(h.counts.back(), 1);             // 2
  EXPECT_EQ(h.limits.back(), 2);
}

}  // namespace
}  // namespace mantissa::train
