// Batches for training: DataLoader (images; worker threads, seeded shuffle, bounded prefetch,
// in-order delivery) and TokenLoader (language-model windows).
//
// Determinism: batch k of epoch e is a pure function of (dataset, options, seed, e, k). It does
// not depend on num_workers, prefetch or thread timing, so a run resumed with start_epoch(e, k)
// sees exactly the batches the uninterrupted run would have seen.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "mantissa/core/dtype.h"
#include "mantissa/data/dataset.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::data {

struct Batch {
  Tensor x;           // (B, C, H, W) normalized, LoaderOptions::dtype (U8 pixels: !normalize)
  Tensor y;           // I64 (B)
  int64_t index = 0;  // batch number within its epoch
  int64_t epoch = 0;
};

struct LoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;  // drop a last batch smaller than batch_size
  uint64_t seed = 0;
  int num_workers = 2;  // 0: batches are made on the calling thread, in next()
  int prefetch = 4;     // batches queued ahead of the consumer (bound on memory), >= 1
  // x = (pixel / 255 - mean) / std, rounded (RNE) to dtype. Defaults: Fashion-MNIST.
  float mean = kFashionMnistMean;
  float std = kFashionMnistStd;
  DType dtype = DType::F32;  // a floating dtype
  // false: x holds the raw U8 pixels and the consumer normalizes them with pixel_table() (the
  // device prefetcher does so on the GPU: a quarter of the bytes of f32 cross the bus).
  bool normalize = true;
  // Each batch in page-locked memory (Tensor::pin_memory), made on the worker threads, so that
  // its copy to a GPU is asynchronous; x and y stay views of one block (one transfer) unless
  // the transform replaced them. Needs a CUDA device.
  bool pin_memory = false;
  // Runs on a worker thread on each finished batch (augmentation, checks). Must be thread-safe
  // and deterministic in (batch.epoch, batch.index) to keep runs reproducible; what it throws
  // reaches the consumer's next().
  std::function<void(Batch&)> transform = nullptr;
};

// Range-for support shared by the loaders: pulls loader.next() until it returns nullopt.
template <typename Loader, typename Item>
class LoaderIterator {
 public:
  using value_type = Item;
  using difference_type = std::ptrdiff_t;
  LoaderIterator() = default;
  explicit LoaderIterator(Loader* loader) : loader_(loader), item_(loader->next()) {}
  Item& operator*() { return *item_; }
  Item* operator->() { return &*item_; }
  LoaderIterator& operator++() {
    item_ = loader_->next();
    return *this;
  }
  void operator++(int) { ++*this; }
  friend bool operator==(const LoaderIterator& it, std::default_sentinel_t) {
    return !it.item_.has_value();
  }

 private:
  Loader* loader_ = nullptr;
  std::optional<Item> item_;
};

// Batches of an ImageDataset.
//
// Epochs: next() delivers the batches of the current epoch in order, then returns nullopt once
// and moves on to the next epoch (so `for (auto& b : loader)` run twice sees epochs e and e + 1).
// set_epoch(e) / start_epoch(e, k) choose the epoch (and first batch) explicitly and start the
// workers at once. A loop left early (break) resumes where it stopped unless an epoch is set.
//
// Workers fill a bounded queue of `prefetch` batches while the consumer trains; batches come out
// in index order whatever the workers' timing. Destroying the loader mid-epoch stops and joins
// the workers. An exception thrown while making batch k is rethrown by the next() that would
// have returned batch k.
class DataLoader {
 public:
  explicit DataLoader(ImageDataset dataset, LoaderOptions options = {});
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t num_batches() const;  // per epoch
  int64_t num_samples() const;  // per epoch (fewer than the dataset's with drop_last)
  const ImageDataset& dataset() const;
  const LoaderOptions& options() const;

  // The epoch next() is delivering (or will start) and the index of the batch it returns next.
  int64_t epoch() const { return epoch_; }
  int64_t next_index() const { return cursor_; }

  void set_epoch(int64_t epoch) { start_epoch(epoch, 0); }
  // Batches first_batch .. num_batches() - 1 of `epoch` come next (first_batch == num_batches()
  // means the epoch is over: next() returns nullopt).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);

  std::optional<Batch> next();
  LoaderIterator<DataLoader, Batch> begin() { return LoaderIterator<DataLoader, Batch>(this); }
  std::default_sentinel_t end() { return {}; }

  // The order of the dataset's items in `epoch` (identity without shuffle): a seeded
  // Fisher-Yates shuffle driven by Philox(seed) at counter (epoch, i).
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // Batch `index` of `epoch`, made on the calling thread (what the workers run).
  Batch make_batch(int64_t epoch, int64_t index) const;
  // The normalization as a lookup: (256) in options().dtype, entry v = (v / 255 - mean) / std
  // rounded once (RNE). A normalized batch's x is exactly pixel_table()[raw pixels].
  Tensor pixel_table() const;

 private:
  struct Source;  // dataset, options, normalization table: shared with the workers
  struct Run;     // the worker threads and queue of one epoch
  void stop();
  void launch();

  std::shared_ptr<const Source> source_;
  std::unique_ptr<Run> run_;
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;
};

// ---- device prefetcher -----------------------------------------------------------------------

// A DataLoader whose batches arrive on `device`, the next one already in flight.
//
// CPU: a pass-through (the loader's batches as they are). CUDA: the loader makes raw U8 pixels
// in page-locked memory on its workers (normalized f32/bf16 batches when a transform is set,
// which expects them); the prefetcher copies batch k + 1 to the GPU on a side stream
// (non_blocking) and normalizes it there (the loader's lookup table, so the values are bit for
// bit the CPU's) while the model trains on batch k. next() makes the current stream wait for the
// copy with an event (no host wait), tells the caching allocator that the current stream uses
// the batch (cuda::record_stream), then starts the following copy. Batches, order, values and
// epochs are those of the DataLoader.
//
// One consumer thread; the current stream at each next() is the one the batch is handed to.
class DevicePrefetcher {
 public:
  // Throws a mantissa::Error when `device` is CUDA and there is none.
  DevicePrefetcher(ImageDataset dataset, LoaderOptions options, Device device);
  ~DevicePrefetcher();
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  Device device() const { return device_; }
  const DataLoader& loader() const { return loader_; }
  int64_t num_batches() const { return loader_.num_batches(); }
  int64_t num_samples() const { return loader_.num_samples(); }
  // As DataLoader's: the epoch next() delivers and the index of the batch it returns next.
  int64_t epoch() const;
  int64_t next_index() const;

  void set_epoch(int64_t epoch) { start_epoch(epoch, 0); }
  void start_epoch(int64_t epoch, int64_t first_batch = 0);

  std::optional<Batch> next();
  LoaderIterator<DevicePrefetcher, Batch> begin() {
    return LoaderIterator<DevicePrefetcher, Batch>(this);
  }
  std::default_sentinel_t end() { return {}; }

 private:
  struct Cuda;  // side stream, lookup table, the batch in flight
  void fetch_ahead();
  void drop_ahead();

  DataLoader loader_;
  Device device_;
  std::unique_ptr<Cuda> cuda_;  // null on the CPU
};

// ---- language-model batches ------------------------------------------------------------------

struct TokenLoaderOptions {
  int64_t batch_size = 8;
  int64_t seq_len = 128;
  uint64_t seed = 0;
  // Batches per "epoch" (a bookkeeping unit: windows are drawn at random, with replacement).
  // 0: tokens / (batch_size * seq_len), at least 1.
  int64_t batches_per_epoch = 0;
};

// LM batches of random windows: batch k of epoch e is lm_batch(dataset, B, T, seed,
// e * num_batches() + k). Made on the calling thread (a batch is B*T int64 copies). Epochs behave
// as in DataLoader: next() returns nullopt once at the end of each.
class TokenLoader {
 public:
  explicit TokenLoader(TokenDataset dataset, TokenLoaderOptions options = {});

  int64_t num_batches() const { return num_batches_; }
  int64_t vocab_size() const { return dataset_->vocab_size; }
  const TokenDataset& dataset() const { return *dataset_; }
  const TokenLoaderOptions& options() const { return options_; }
  int64_t epoch() const { return epoch_; }
  int64_t next_index() const { return cursor_; }

  void set_epoch(int64_t epoch) { start_epoch(epoch, 0); }
  void start_epoch(int64_t epoch, int64_t first_batch = 0);

  std::optional<LMBatch> next();
  LoaderIterator<TokenLoader, LMBatch> begin() {
    return LoaderIterator<TokenLoader, LMBatch>(this);
  }
  std::default_sentinel_t end() { return {}; }

  LMBatch make_batch(int64_t epoch, int64_t index) const;

 private:
  std::shared_ptr<const TokenDataset> dataset_;
  TokenLoaderOptions options_;
  int64_t num_batches_ = 1;
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;
};

}  // namespace mantissa::data
