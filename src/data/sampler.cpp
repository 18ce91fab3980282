// Samplers: each epoch's order as a pure function of (sampler, epoch).
#include "mantissa/data/sampler.h"

#include <numeric>
#include <utility>

#include "data/random.h"
#include "mantissa/core/error.h"

namespace mantissa::data {
namespace {

void check_epoch(int64_t epoch, const char* who) {
  MT_CHECK(epoch >= 0, who, ": epochs count from 0, not ", epoch);
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> o(size_t(n), 0);
  std::iota(o.begin(), o.end(), int64_t(0));
  return o;
}

}  // namespace

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  MT_CHECK(n >= 0, "SequentialSampler: the dataset size must be >= 0, not ", n);
}

std::vector<int64_t> SequentialSampler::order(int64_t epoch) const {
  check_epoch(epoch, "SequentialSampler");
  return iota(n_);
}

ShuffleSampler::ShuffleSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  MT_CHECK(n >= 0, "ShuffleSampler: the dataset size must be >= 0, not ", n);
}

std::vector<int64_t> ShuffleSampler::order(int64_t epoch) const {
  check_epoch(epoch, "ShuffleSampler");
  std::vector<int64_t> o = iota(n_);
  for (int64_t i = n_ - 1; i > 0; --i) {
    const auto j = int64_t(below(draw64(seed_, uint64_t(epoch), uint64_t(i)), uint64_t(i + 1)));
    std::swap(o[size_t(i)], o[size_t(j)]);
  }
  return o;
}

ReplacementSampler::ReplacementSampler(int64_t n, int64_t num_samples, uint64_t seed,
                                       int64_t draws_per_stream)
    : n_(n), num_samples_(num_samples), seed_(seed), draws_per_stream_(draws_per_stream) {
  MT_CHECK(n >= 1, "ReplacementSampler: needs a dataset of at least one item to draw from, got ",
           n);
  MT_CHECK(num_samples >= 0, "ReplacementSampler: num_samples (draws per epoch) must be >= 0, not ",
           num_samples);
  MT_CHECK(draws_per_stream >= 1, "ReplacementSampler: draws_per_stream must be >= 1, not ",
           draws_per_stream, " (use the batch size to share lm_batch's layout, else 1)");
}

std::vector<int64_t> ReplacementSampler::order(int64_t epoch) const {
  check_epoch(epoch, "ReplacementSampler");
  std::vector<int64_t> o(static_cast<size_t>(num_samples_));
  const auto per = uint64_t(draws_per_stream_);
  const uint64_t first = uint64_t(epoch) * uint64_t(num_samples_);
  for (int64_t i = 0; i < num_samples_; ++i) {
    const uint64_t g = first + uint64_t(i);
    o[size_t(i)] = int64_t(below(draw64(seed_, g / per, g % per), uint64_t(n_)));
  }
  return o;
}

DistributedSampler::DistributedSampler(std::shared_ptr<const Sampler> base, int rank,
                                       int world_size, Remainder remainder)
    : base_(std::move(base)), rank_(rank), world_size_(world_size) {
  MT_CHECK(base_ != nullptr, "DistributedSampler: needs the sampler whose order it shards");
  MT_CHECK(world_size >= 1, "DistributedSampler: world_size must be >= 1, not ", world_size);
  MT_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank,
           " out of range for a world of ", world_size, " (ranks are 0..", world_size - 1, ")");
  const int64_t m = base_->size();
  per_rank_ = remainder == Remainder::Drop ? m / world_size : (m + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::order(int64_t epoch) const {
  check_epoch(epoch, "DistributedSampler");
  const std::vector<int64_t> all = base_->order(epoch);
  const auto m = int64_t(all.size());
  MT_CHECK(m == base_->size(), "DistributedSampler: the base sampler's order(", epoch, ") has ", m,
           " indices but its size() is ", base_->size());
  std::vector<int64_t> mine(static_cast<size_t>(per_rank_));
  for (int64_t j = 0; j < per_rank_; ++j) {
    // Positions past the end wrap around to the order's beginning (Remainder::Pad).
    const int64_t p = rank_ + j * world_size_;
    mine[size_t(j)] = all[size_t(p % m)];
  }
  return mine;
}

}  // namespace mantissa::data
