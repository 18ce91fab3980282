// DataLoader: batches of any Dataset (dataset.h) in the order of a Sampler (sampler.h), made by
// worker threads into a bounded prefetch queue and delivered in order; DevicePrefetcher: the
// same batches arriving on a GPU, the next one already in flight; token_loader: a DataLoader of
// random language-model windows.
//
// Determinism: batch k of epoch e is a pure function of (dataset, options, sampler, e, k). It does
// not depend on num_workers, prefetch or thread timing, so a run resumed with start_epoch(e, k)
// sees exactly the batches the uninterrupted run would have seen.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mantissa/core/device.h"
#include "mantissa/core/vocabulary.h"
#include "mantissa/data/dataset.h"
#include "mantissa/data/images.h"
#include "mantissa/data/sampler.h"
#include "mantissa/data/tokens.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::data {

struct LoaderOptions {
  int64_t batch_size = 64;
  // Without a `sampler`: true visits the items in a ShuffleSampler(size, seed) order, false in
  // order (SequentialSampler).
  bool shuffle = true;
  bool drop_last = false;  // drop a last batch smaller than batch_size
  uint64_t seed = 0;
  int num_workers = 2;  // 0: batches are made on the calling thread, in next()
  int prefetch = 4;     // batches queued ahead of the consumer (bound on memory), >= 1
  // Each batch in page-locked memory (Tensor::pin_memory), made on the worker threads, so that
  // its copy to a GPU is asynchronous; fields sharing one allocation (allocate_batch) stay views
  // of one pinned block (one transfer) unless the transform replaced them. Needs a CUDA device.
  bool pin_memory = false;
  // The order of each epoch; overrides `shuffle` and `seed`. Its indices must be in
  // [0, dataset size).
  std::shared_ptr<const Sampler> sampler = nullptr;
  // Makes a batch's fields from its samples (Dataset::get of each). Null: Dataset::get_batch
  // (stack_samples by default, or the dataset's faster batched fetch).
  Collate collate = nullptr;
  // The names of the fields `collate` returns, when they are not the dataset's (e.g. a collate
  // that pads sequences and adds their lengths). Empty: the dataset's field_names().
  FieldNames collate_names = {};
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

// A concrete dataset passed by value (DataLoader(load_fashion_mnist(), ...)): the loader keeps
// its own copy, shared with the worker threads.
template <typename D>
concept DatasetValue = std::derived_from<std::remove_cvref_t<D>, Dataset>;

// Batches of a Dataset.
//
// Epochs: next() delivers the batches of the current epoch in order, then returns nullopt once
// and moves on to the next epoch (so `for (auto& b : loader)` run twice sees epochs e and e + 1).
// set_epoch(e) / start_epoch(e, k) choose the epoch (and first batch) explicitly and start the
// workers at once. A loop left early (break) resumes where it stopped unless an epoch is set.
//
// Workers fill a ring of `prefetch` slots while the consumer trains: batch j goes to slot
// j % prefetch, and a worker may claim batch j only after the consumer took batch j - prefetch,
// so the queue is bounded and batches come out in index order whatever the workers' timing.
// Destroying the loader mid-epoch stops and joins the workers. An exception thrown while making
// batch k (by the dataset, the collate or the transform) is rethrown by the next() that would
// have returned batch k; the loader stays at batch k, so calling next() again retries it.
class DataLoader {
 public:
  explicit DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options = {});
  template <DatasetValue D>
  explicit DataLoader(D&& dataset, LoaderOptions options = {})
      : DataLoader(std::shared_ptr<const Dataset>(
                       std::make_shared<const std::remove_cvref_t<D>>(std::forward<D>(dataset))),
                   std::move(options)) {}
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t num_batches() const;  // per epoch
  int64_t num_samples() const;  // per epoch (fewer than the sampler's with drop_last)
  const Dataset& dataset() const;
  const std::shared_ptr<const Dataset>& dataset_ptr() const;
  const Sampler& sampler() const;
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

  // The dataset indices of `epoch` in visiting order: sampler().order(epoch).
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // Batch `index` of `epoch`, made on the calling thread (what the workers run).
  Batch make_batch(int64_t epoch, int64_t index) const;

 private:
  struct Source;  // dataset, options, sampler: shared with the workers
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
// CPU: a pass-through (the loader's batches as they are). CUDA: the loader makes its batches in
// page-locked memory on its workers. Where the dataset offers a split (Dataset::split_for_device)
// and no collate or transform is set (they expect the dataset's own samples), the loader loads
// the split's host dataset instead (the image dataset: raw U8 pixels) and the prefetcher finishes
// each batch on the device (the image dataset: the pixel table lookup, bit for bit the CPU's
// values). The prefetcher copies batch k + 1 to the GPU on a side stream (non_blocking; one
// transfer when the fields share one block) while the model trains on batch k. next() makes the
// current stream wait for the copy with an event (no host wait), tells the caching allocator
// that the current stream uses the batch (cuda::record_stream), then starts the following copy.
// Batches, order, values and epochs are those of the DataLoader over the dataset as given.
//
// One consumer thread; the current stream at each next() is the one the batch is handed to.
//
// `transfer` chooses the simpler ways a training loop may move its batches instead (the precision
// study's time/memory ladder measures what each step buys; the batches are the same values):
// - Pinned: the loader finishes each batch on the host (no DeviceSplit) in page-locked memory;
//   next() queues its copy on the current stream (non_blocking) and returns without waiting.
// - Pageable: the loader finishes each batch on the host in ordinary memory; next() copies it
//   and waits for the copy.
// On the CPU all three are the pass-through.
#define MT_FORALL_TRANSFERS(_)                                                                   \
  _(Prefetch, "prefetch",                                                                        \
    "the loader's workers pin raw pixels, a side stream copies the next batch while this "       \
    "one trains, the normalization runs on the device")                                          \
  _(Pinned, "pinned", "batches finished on the host in page-locked memory, copied non_blocking") \
  _(Pageable, "pageable", "batches finished on the host in ordinary memory, blocking copies")
MT_VOCABULARY(Transfer, MT_FORALL_TRANSFERS)

class DevicePrefetcher {
 public:
  // Throws a mantissa::Error when `device` is CUDA and there is none.
  DevicePrefetcher(std::shared_ptr<const Dataset> dataset, LoaderOptions options, Device device,
                   Transfer transfer = Transfer::Prefetch);
  template <DatasetValue D>
  DevicePrefetcher(D&& dataset, LoaderOptions options, Device device,
                   Transfer transfer = Transfer::Prefetch)
      : DevicePrefetcher(
            std::shared_ptr<const Dataset>(
                std::make_shared<const std::remove_cvref_t<D>>(std::forward<D>(dataset))),
            std::move(options), device, transfer) {}
  ~DevicePrefetcher();
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  Device device() const { return device_; }
  Transfer transfer() const { return transfer_; }
  // The loader that makes the host batches (over the split's host dataset on a GPU).
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
  struct Plan;  // what the loader loads and what is left to the device
  struct Cuda;  // side stream, the batch in flight
  static Plan make_plan(std::shared_ptr<const Dataset> dataset, LoaderOptions options,
                        Device device, Transfer transfer);
  DevicePrefetcher(Plan p, Device device, Transfer transfer);
  void fetch_ahead();
  void drop_ahead();
  std::optional<Batch> next_on_current_stream();  // Pinned, Pageable

  DataLoader loader_;
  Device device_;
  Transfer transfer_;
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
  // A batch is B * T int64 copies: cheap enough for the calling thread by default.
  int num_workers = 0;
};

// A DataLoader of random LM windows: TokenWindows(dataset, seq_len) sampled with replacement by
// ReplacementSampler(windows, num_batches * B, seed, /*draws_per_stream=*/B), so that batch k of
// epoch e is lm_batch(dataset, B, T, seed, e * num_batches() + k). Batches are {x, y}, I64 (B, T).
DataLoader token_loader(TokenDataset dataset, TokenLoaderOptions options = {});

}  // namespace mantissa::data
