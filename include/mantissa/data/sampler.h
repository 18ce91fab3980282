// Samplers: the order in which a loader visits a dataset's items in each epoch.
//
// A sampler's order for epoch e is a pure function of the sampler (its size, seed, ...) and e:
// there is no state that advances between epochs, so epoch 7 can be asked for directly (a
// resumed run, a worker thread, another rank) and is the same on every machine and thread count.
// All randomness is Philox (numerics/philox.h) at explicit counters.
//
// Write your own by deriving from Sampler (e.g. weighted sampling, or batches grouped by
// sequence length): size() indices per epoch, order(e) returns them. The loader cuts the order
// into consecutive batches of batch_size.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace mantissa::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The number of indices of each epoch.
  virtual int64_t size() const = 0;
  // The indices of epoch `epoch` (>= 0), size() of them, each in [0, the dataset's size).
  virtual std::vector<int64_t> order(int64_t epoch) const = 0;
};

// 0, 1, ..., n - 1 in every epoch.
class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> order(int64_t epoch) const override;

 private:
  int64_t n_;
};

// A permutation of 0..n-1 per epoch (without replacement): a Fisher-Yates shuffle whose swap at
// position i is drawn from Philox(seed) at counter (epoch, i). What DataLoader uses by default
// (LoaderOptions::shuffle); its orders are part of the golden training files, so they never
// change.
class ShuffleSampler final : public Sampler {
 public:
  ShuffleSampler(int64_t n, uint64_t seed);
  int64_t size() const override { return n_; }
  std::vector<int64_t> order(int64_t epoch) const override;

 private:
  int64_t n_;
  uint64_t seed_;
};

// `num_samples` indices per epoch drawn uniformly from 0..n-1 with replacement (random windows of
// a token stream, oversampling). The draws form one endless stream: draw g (g = epoch *
// num_samples + i) is Philox(seed) at counter (g / draws_per_stream, g % draws_per_stream), so
// any draw is computable on its own. With draws_per_stream = the batch size, batch j's draws
// share Philox stream j: the layout of lm_batch (tokens.h), which this sampler reproduces.
class ReplacementSampler final : public Sampler {
 public:
  ReplacementSampler(int64_t n, int64_t num_samples, uint64_t seed, int64_t draws_per_stream = 1);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> order(int64_t epoch) const override;

 private:
  int64_t n_, num_samples_;
  uint64_t seed_;
  int64_t draws_per_stream_;
};

// What DistributedSampler does when the order does not split evenly across the ranks.
enum class Remainder {
  Pad,   // every rank gets ceil(m / world) indices: the order is extended by its own beginning
         // (as PyTorch's DistributedSampler does), so up to world - 1 items are seen twice
  Drop,  // every rank gets floor(m / world): the last m % world indices of the order are skipped,
         // and the shards are disjoint
};

// One rank's share of another sampler's order, for data-parallel training: rank r of `world`
// takes positions r, r + world, r + 2 * world, ... of base.order(epoch). All ranks build the
// same base sampler (e.g. ShuffleSampler(n, seed)), so they agree on each epoch's order and
// their shards of it are disjoint (Remainder::Drop) and together cover it.
class DistributedSampler final : public Sampler {
 public:
  DistributedSampler(std::shared_ptr<const Sampler> base, int rank, int world_size,
                     Remainder remainder = Remainder::Pad);
  int64_t size() const override { return per_rank_; }
  std::vector<int64_t> order(int64_t epoch) const override;

 private:
  std::shared_ptr<const Sampler> base_;
  int rank_, world_size_;
  int64_t per_rank_;
};

}  // namespace mantissa::data
