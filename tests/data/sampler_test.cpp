// Samplers: each epoch's order is a pure function of the sampler and the epoch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "mantissa/core/error.h"
#include "mantissa/data/sampler.h"
#include "mantissa/numerics/philox.h"

namespace mantissa::data {
namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(size_t(n), 0);
  std::iota(v.begin(), v.end(), int64_t(0));
  return v;
}

// 64 Philox bits, written out here rather than taken from the library: the reference the
// samplers must match bit for bit (the golden training files record orders made this way).
uint64_t bits64(uint64_t seed, uint64_t stream, uint64_t i) {
  return uint64_t(random_bits(seed, stream, 2 * i)) << 32 | random_bits(seed, stream, 2 * i + 1);
}
uint64_t below(uint64_t bits, uint64_t n) {
  return uint64_t((unsigned __int128)bits * n >> 64);
}

// The loader's shuffle as it has always been: Fisher-Yates from the back, the swap partner of
// position i drawn from Philox(seed) at counter (epoch, i).
std::vector<int64_t> fisher_yates(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> o = iota(n);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(o[size_t(i)],
              o[size_t(below(bits64(seed, uint64_t(epoch), uint64_t(i)), uint64_t(i + 1)))]);
  return o;
}

TEST(Samplers, SequentialIsTheIdentityInEveryEpoch) {
  const SequentialSampler s(7);
  EXPECT_EQ(s.size(), 7);
  EXPECT_EQ(s.order(0), iota(7));
  EXPECT_EQ(s.order(5), iota(7));
  EXPECT_TRUE(SequentialSampler(0).order(0).empty());
}

TEST(Samplers, ShuffleIsAPermutationOfSeedAndEpoch) {
  const ShuffleSampler s(1000, 42);
  EXPECT_EQ(s.size(), 1000);
  for (int64_t epoch : {0, 1, 7}) {
    const std::vector<int64_t> o = s.order(epoch);
    EXPECT_EQ(o, fisher_yates(1000, 42, epoch)) << "epoch " << epoch;
    std::vector<int64_t> sorted = o;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, iota(1000));
    EXPECT_NE(o, iota(1000));
    EXPECT_EQ(s.order(epoch), o) << "a pure function of the epoch";
  }
  EXPECT_NE(s.order(0), s.order(1));
  EXPECT_NE(s.order(0), ShuffleSampler(1000, 43).order(0));
  EXPECT_EQ(ShuffleSampler(1, 3).order(4), iota(1));
}

TEST(Samplers, ReplacementDrawsAreReproducibleAndLaidOutInStreams) {
  const ReplacementSampler s(50, 24, 9, /*draws_per_stream=*/8);
  EXPECT_EQ(s.size(), 24);
  const std::vector<int64_t> e0 = s.order(0), e3 = s.order(3);
  EXPECT_EQ(s.order(3), e3);
  EXPECT_NE(e0, e3);
  EXPECT_NE(e0, ReplacementSampler(50, 24, 10, 8).order(0));
  // Draw g = epoch * 24 + i is Philox(9) at (g / 8, g % 8): epoch 3 holds streams 9, 10, 11.
  for (int64_t i = 0; i < 24; ++i) {
    const uint64_t g = 3 * 24 + uint64_t(i);
    EXPECT_EQ(e3[size_t(i)], int64_t(below(bits64(9, g / 8, g % 8), 50))) << i;
  }
  // With replacement: 2000 draws of 50 items repeat some and reach nearly all.
  const std::vector<int64_t> many = ReplacementSampler(50, 2000, 1).order(0);
  const std::set<int64_t> distinct(many.begin(), many.end());
  EXPECT_GT(distinct.size(), 45u);
  EXPECT_GE(*distinct.begin(), 0);
  EXPECT_LT(*distinct.rbegin(), 50);
  // The stream does not depend on how it is cut into epochs.
  const ReplacementSampler whole(50, 16, 9, 8), halves(50, 8, 9, 8);
  std::vector<int64_t> joined = halves.order(2);
  const std::vector<int64_t> second = halves.order(3);
  joined.insert(joined.end(), second.begin(), second.end());
  EXPECT_EQ(whole.order(1), joined);
}

TEST(Samplers, DistributedShardsAreDisjointAndCoverTheEpoch) {
  auto base = std::make_shared<ShuffleSampler>(103, 5);
  for (int64_t epoch : {0, 4}) {
    std::vector<int64_t> all;
    for (int rank = 0; rank < 4; ++rank) {
      const DistributedSampler s(base, rank, 4, Remainder::Drop);
      EXPECT_EQ(s.size(), 25);
      const std::vector<int64_t> mine = s.order(epoch);
      ASSERT_EQ(mine.size(), 25u);
      // Positions rank, rank + 4, ... of the shared order.
      const std::vector<int64_t> order = base->order(epoch);
      for (size_t j = 0; j < mine.size(); ++j)
        EXPECT_EQ(mine[j], order[size_t(rank) + 4 * j]);
      all.insert(all.end(), mine.begin(), mine.end());
    }
    std::set<int64_t> distinct(all.begin(), all.end());
    EXPECT_EQ(distinct.size(), 100u) << "disjoint: no item twice";
  }
  // Pad: ceil(103 / 4) = 26 each; the one missing position wraps to the order's beginning.
  std::vector<int64_t> padded;
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<int64_t> mine = DistributedSampler(base, rank, 4).order(2);
    EXPECT_EQ(mine.size(), 26u);
    padded.insert(padded.end(), mine.begin(), mine.end());
  }
  EXPECT_EQ(std::set<int64_t>(padded.begin(), padded.end()).size(), 103u) << "every item seen";
  EXPECT_EQ(DistributedSampler(base, 3, 4).order(2).back(), base->order(2)[0]);
  // The ranks follow the epoch together.
  EXPECT_NE(DistributedSampler(base, 1, 4).order(0), DistributedSampler(base, 1, 4).order(1));
}

TEST(Samplers, MistakesAreClearErrors) {
  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.message();
    }
    return "(no error)";
  };
  EXPECT_NE(message([] { ShuffleSampler(10, 1).order(-1); }).find("epochs count from 0"),
            std::string::npos);
  EXPECT_NE(message([] { ReplacementSampler(0, 10, 1); }).find("at least one item"),
            std::string::npos);
  auto base = std::make_shared<SequentialSampler>(10);
  const std::string m = message([&] { DistributedSampler(base, 4, 4); });
  EXPECT_NE(m.find("rank 4 out of range for a world of 4"), std::string::npos) << m;
  EXPECT_NE(message([] { DistributedSampler(nullptr, 0, 1); }).find("needs the sampler"),
            std::string::npos);
}

}  // namespace
}  // namespace mantissa::data
