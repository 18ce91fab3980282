// DataLoader: a ring of `prefetch` slots filled by worker threads. Batch j goes to slot
// j % prefetch, and a worker may claim batch j only once the consumer has taken batch
// j - prefetch, so the queue is bounded and the consumer takes batches strictly in index order.
#include "mantissa/data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include "data/batch_block.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"
#include "mantissa/core/error.h"
#include "mantissa/core/stop_signals.h"

namespace mantissa::data {
namespace {

std::string describe(const FieldNames& names) {
  std::string s;
  for (const std::string& n : names)
    s += (s.empty() ? "" : ", ") + n;
  return s;
}

}  // namespace

struct DataLoader::Source {
  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  std::shared_ptr<const Sampler> sampler;
  std::shared_ptr<const FieldNames> names;
  int64_t size = 0;  // the dataset's
  int64_t num_batches = 0;
  int64_t num_samples = 0;

  std::vector<int64_t> order(int64_t epoch) const {
    MT_CHECK(epoch >= 0, "DataLoader: epochs count from 0, not ", epoch);
    std::vector<int64_t> o = sampler->order(epoch);
    MT_CHECK(int64_t(o.size()) == sampler->size(), "DataLoader: the sampler's order(", epoch,
             ") has ", o.size(), " indices but its size() says ", sampler->size(),
             "; a Sampler must return size() indices for every epoch");
    return o;
  }

  Batch make(const std::vector<int64_t>& order, int64_t epoch, int64_t index) const {
    const int64_t start = index * options.batch_size;
    const int64_t b = std::min(options.batch_size, num_samples - start);
    const std::span<const int64_t> indices(order.data() + start, size_t(b));
    for (const int64_t i : indices) {
      MT_CHECK(i >= 0 && i < size, "DataLoader: the sampler gave index ", i, " in batch ", index,
               " of epoch ", epoch, ", but '", dataset->name(), "' holds ", size, " items (0 .. ",
               size - 1, "); build the sampler with the dataset's size()");
    }
    Batch batch;
    batch.index = index;
    batch.epoch = epoch;
    batch.names = names;
    if (options.collate) {
      std::vector<Sample> samples;
      samples.reserve(size_t(b));
      for (const int64_t i : indices)
        samples.push_back(dataset->get(i));
      batch.fields = options.collate(samples);
    } else {
      batch.fields = dataset->get_batch(indices);
    }
    MT_CHECK(!batch.fields.empty(), "DataLoader: batch ", index, " of '", dataset->name(),
             "' has no fields; ", options.collate ? "LoaderOptions::collate" : "Dataset::get_batch",
             " must return at least one tensor");
    MT_CHECK(names->empty() || names->size() == batch.fields.size(), "DataLoader: batch ", index,
             " of '", dataset->name(), "' has ", batch.fields.size(), " fields but ", names->size(),
             " names (", describe(*names), ") from ",
             options.collate_names.empty() ? "the dataset's field_names()"
                                           : "LoaderOptions::collate_names",
             options.collate && options.collate_names.empty()
                 ? "; a collate that changes the fields names its own in "
                   "LoaderOptions::collate_names"
                 : "; name every field the batches have");
    if (options.transform) options.transform(batch);
    if (options.pin_memory) pin(batch);
    return batch;
  }

  static void pin(Batch& batch) {
    if (const std::shared_ptr<Storage> block = own_block(batch.fields)) {
      // One page-locked copy of the whole block, the fields rebuilt over it with their layouts:
      // the batch still crosses to the device as one transfer.
      const Tensor pinned = tensor_on(block, {int64_t(block->nbytes)}, 0, DType::U8).pin_memory();
      MT_ASSERT(pinned.offset() == 0 && pinned.nbytes() == block->nbytes,
                "pin_memory must copy the block as it is");
      for (Tensor& f : batch.fields)
        f = rebase(f, pinned.storage());
    } else {
      for (Tensor& f : batch.fields)
        f = f.pin_memory();
    }
  }
};

struct DataLoader::Run {
  struct Slot {
    int64_t index = -1;  // the batch this slot holds, -1 while empty
    std::optional<Batch> batch;
    std::exception_ptr error;
  };

  int64_t epoch = 0;
  std::shared_ptr<const std::vector<int64_t>> order;
  std::mutex mutex;
  std::condition_variable space;  // workers wait for a free slot
  std::condition_variable ready;  // the consumer waits for its batch
  std::vector<Slot> slots;
  int64_t next_claim = 0;  // the next batch a worker takes
  int64_t consumed = 0;    // batches before this one have been taken by the consumer
  int64_t end = 0;
  bool stopping = false;
  std::vector<std::thread> threads;

  void work(const Source& source) {
    block_stop_signals_on_this_thread();  // Ctrl-C is the main thread's (stop_signals.h)
    const auto ring = int64_t(slots.size());
    while (true) {
      int64_t j = 0;
      {
        std::unique_lock lock(mutex);
        space.wait(lock,
                   [&] { return stopping || next_claim >= end || next_claim < consumed + ring; });
        if (stopping || next_claim >= end) return;
        j = next_claim++;
      }
      std::optional<Batch> batch;
      std::exception_ptr error;
      try {
        batch = source.make(*order, epoch, j);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex);
        Slot& s = slots[size_t(j % ring)];
        s.batch = std::move(batch);
        s.error = error;
        s.index = j;
      }
      ready.notify_all();
    }
  }

  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    space.notify_all();
    for (std::thread& t : threads) {
      if (t.joinable()) t.join();
    }
    threads.clear();
  }
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options) {
  MT_CHECK(dataset != nullptr, "DataLoader: needs a dataset (got a null pointer)");
  const int64_t n = dataset->size();
  MT_CHECK(n > 0, "DataLoader: the dataset '", dataset->name(),
           "' is empty; there is nothing to load (check its path, or the filter or slice that "
           "made it)");
  MT_CHECK(options.batch_size >= 1, "DataLoader: batch_size must be >= 1, not ",
           options.batch_size);
  MT_CHECK(options.num_workers >= 0 && options.num_workers <= 256,
           "DataLoader: num_workers must be in 0..256, not ", options.num_workers);
  MT_CHECK(options.prefetch >= 1, "DataLoader: prefetch (batches queued ahead) must be >= 1, not ",
           options.prefetch);
  MT_CHECK(!options.pin_memory || cuda::is_available(),
           "DataLoader: pin_memory needs a CUDA device (", cuda_info().status,
           "); leave it off on the cpu");

  auto source = std::make_shared<Source>();
  source->size = n;
  MT_CHECK(options.collate || options.collate_names.empty(),
           "DataLoader: collate_names name the fields of LoaderOptions::collate, but no collate is "
           "set; drop them (the batches carry the dataset's field_names())");
  source->names = std::make_shared<const FieldNames>(
      options.collate_names.empty() ? dataset->field_names() : options.collate_names);
  source->sampler = options.sampler;
  if (!source->sampler) {
    source->sampler =
        options.shuffle
            ? std::shared_ptr<const Sampler>(std::make_shared<ShuffleSampler>(n, options.seed))
            : std::make_shared<SequentialSampler>(n);
  }
  const int64_t m = source->sampler->size();
  MT_CHECK(m >= 0, "DataLoader: the sampler's size() is ", m);
  const int64_t bs = options.batch_size;
  source->num_batches = options.drop_last ? m / bs : (m + bs - 1) / bs;
  source->num_samples = options.drop_last ? source->num_batches * bs : m;
  source->dataset = std::move(dataset);
  source->options = std::move(options);
  source_ = std::move(source);
}

DataLoader::~DataLoader() {
  stop();
}

DataLoader::DataLoader(DataLoader&& other) noexcept
    : source_(std::move(other.source_)),
      run_(std::move(other.run_)),
      epoch_(other.epoch_),
      cursor_(other.cursor_) {}

DataLoader& DataLoader::operator=(DataLoader&& other) noexcept {
  if (this != &other) {
    stop();
    source_ = std::move(other.source_);
    run_ = std::move(other.run_);
    epoch_ = other.epoch_;
    cursor_ = other.cursor_;
  }
  return *this;
}

int64_t DataLoader::num_batches() const {
  return source_->num_batches;
}
int64_t DataLoader::num_samples() const {
  return source_->num_samples;
}
const Dataset& DataLoader::dataset() const {
  return *source_->dataset;
}
const std::shared_ptr<const Dataset>& DataLoader::dataset_ptr() const {
  return source_->dataset;
}
const Sampler& DataLoader::sampler() const {
  return *source_->sampler;
}
const LoaderOptions& DataLoader::options() const {
  return source_->options;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  return source_->order(epoch);
}

Batch DataLoader::make_batch(int64_t epoch, int64_t index) const {
  MT_CHECK(index >= 0 && index < source_->num_batches, "DataLoader: batch ", index,
           " out of range: an epoch has ", source_->num_batches, " batches");
  return source_->make(epoch_order(epoch), epoch, index);
}

void DataLoader::stop() {
  if (!run_) return;
  run_->shutdown();
  run_.reset();
}

void DataLoader::launch() {
  auto run = std::make_unique<Run>();
  run->epoch = epoch_;
  run->order = std::make_shared<const std::vector<int64_t>>(source_->order(epoch_));
  run->next_claim = run->consumed = cursor_;
  run->end = source_->num_batches;
  const int workers = source_->options.num_workers;
  if (workers > 0) {
    run->slots.resize(size_t(source_->options.prefetch));
    // No point in more workers than batches left.
    const int64_t count = std::min<int64_t>(workers, run->end - cursor_);
    try {
      for (int64_t w = 0; w < count; ++w) {
        run->threads.emplace_back([r = run.get(), s = source_] { r->work(*s); });
      }
    } catch (...) {
      run->shutdown();
      throw;
    }
  }
  run_ = std::move(run);
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  MT_CHECK(epoch >= 0, "DataLoader: epochs count from 0, not ", epoch);
  MT_CHECK(first_batch >= 0 && first_batch <= source_->num_batches, "DataLoader: first batch ",
           first_batch, " out of range: an epoch has ", source_->num_batches, " batches");
  if (run_ && epoch_ == epoch && cursor_ == first_batch) return;  // already there, keep prefetch
  stop();
  epoch_ = epoch;
  cursor_ = first_batch;
  if (cursor_ < source_->num_batches) launch();
}

std::optional<Batch> DataLoader::next() {
  if (cursor_ >= source_->num_batches) {
    stop();
    ++epoch_;
    cursor_ = 0;
    return std::nullopt;
  }
  if (!run_) launch();
  Run& run = *run_;
  if (run.threads.empty()) {
    Batch b = source_->make(*run.order, epoch_, cursor_);
    ++cursor_;
    return b;
  }
  std::optional<Batch> batch;
  std::exception_ptr error;
  {
    std::unique_lock lock(run.mutex);
    Run::Slot& slot = run.slots[size_t(cursor_ % int64_t(run.slots.size()))];
    run.ready.wait(lock, [&] { return slot.index == cursor_; });
    batch = std::move(slot.batch);
    error = slot.error;
    slot = Run::Slot{};
    run.consumed = cursor_ + 1;
  }
  run.space.notify_all();
  if (error) {
    // The epoch stays at this batch: calling next() again retries it with fresh workers.
    stop();
    std::rethrow_exception(error);
  }
  ++cursor_;
  return batch;
}

// ---- token_loader
// --------------------------------------------------------------------------------

DataLoader token_loader(TokenDataset dataset, TokenLoaderOptions options) {
  MT_CHECK(options.batch_size >= 1 && options.seq_len >= 1,
           "token_loader: batch_size and seq_len must be >= 1, got ", options.batch_size, " and ",
           options.seq_len);
  MT_CHECK(options.batches_per_epoch >= 0, "token_loader: batches_per_epoch must be >= 0, not ",
           options.batches_per_epoch);
  const int64_t num_batches =
      options.batches_per_epoch > 0
          ? options.batches_per_epoch
          : std::max<int64_t>(1, dataset.size() / (options.batch_size * options.seq_len));
  auto windows = std::make_shared<const TokenWindows>(std::move(dataset), options.seq_len);
  LoaderOptions lo;
  lo.batch_size = options.batch_size;
  lo.num_workers = options.num_workers;
  // Batch j of the endless stream (j = epoch * num_batches + k) draws from Philox stream j:
  // lm_batch's layout.
  lo.sampler = std::make_shared<const ReplacementSampler>(
      windows->size(), num_batches * options.batch_size, options.seed, options.batch_size);
  return DataLoader(std::shared_ptr<const Dataset>(windows), std::move(lo));
}

}  // namespace mantissa::data
