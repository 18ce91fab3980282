// DataLoader: a ring of `prefetch` slots filled by worker threads. Batch j goes to slot
// j % prefetch, and a worker may claim batch j only once the consumer has taken batch
// j - prefetch, so the queue is bounded and the consumer takes batches strictly in index order.
#include "mantissa/data/loader.h"

#include "data/rebase.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <thread>

#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/philox.h"

namespace mantissa::data {
namespace {

uint64_t draw64(uint64_t seed, uint64_t stream, uint64_t i) {
  return uint64_t(random_bits(seed, stream, 2 * i)) << 32 | random_bits(seed, stream, 2 * i + 1);
}

uint64_t below(uint64_t bits, uint64_t n) {
  return uint64_t((unsigned __int128)bits * n >> 64);
}

// Every batch's bytes come from here: one block holding x, then y at a 64-byte boundary, so that
// pinning a batch (for asynchronous device copies) is one copy and moving it to a device is one
// transfer.
std::shared_ptr<Storage> allocate_batch_storage(size_t bytes) {
  return std::make_shared<Storage>(bytes, Device::cpu());
}

// A contiguous tensor over part of a storage (offset in elements of dtype).
Tensor tensor_on(std::shared_ptr<Storage> storage, const Shape& shape, int64_t offset,
                 DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

// out[i] = table[in[i]] for elements of one size: normalization is a 256-entry lookup, which
// also makes every output dtype (rounded once, RNE, when the table is built) equally cheap.
template <typename T>
void gather_pixels(const uint8_t* in, int64_t n, const uint8_t* table_bytes, uint8_t* out_bytes) {
  T table[256];
  std::memcpy(table, table_bytes, sizeof(table));
  T* out = reinterpret_cast<T*>(out_bytes);
  for (int64_t i = 0; i < n; ++i)
    out[i] = table[in[i]];
}

}  // namespace

struct DataLoader::Source {
  ImageDataset dataset;
  LoaderOptions options;
  int64_t num_batches = 0;
  int64_t num_samples = 0;
  std::vector<uint8_t> table;  // 256 normalized values in options.dtype

  std::vector<int64_t> order(int64_t epoch) const {
    const int64_t n = dataset.size();
    std::vector<int64_t> o(size_t(n), 0);
    std::iota(o.begin(), o.end(), int64_t(0));
    if (!options.shuffle) return o;
    for (int64_t i = n - 1; i > 0; --i) {
      const auto j =
          int64_t(below(draw64(options.seed, uint64_t(epoch), uint64_t(i)), uint64_t(i + 1)));
      std::swap(o[size_t(i)], o[size_t(j)]);
    }
    return o;
  }

  Batch make(const std::vector<int64_t>& order, int64_t epoch, int64_t index) const {
    const int64_t start = index * options.batch_size;
    const int64_t b = std::min(options.batch_size, num_samples - start);
    const int64_t per_image = dataset.channels() * dataset.height() * dataset.width();
    const DType x_dtype = options.normalize ? options.dtype : DType::U8;
    const size_t esize = dtype_size(x_dtype);
    const size_t x_bytes = size_t(b * per_image) * esize;
    const size_t y_at = (x_bytes + kAllocAlignment - 1) / kAllocAlignment * kAllocAlignment;
    auto storage = allocate_batch_storage(y_at + size_t(b) * sizeof(int64_t));

    Batch batch;
    batch.x =
        tensor_on(storage, {b, dataset.channels(), dataset.height(), dataset.width()}, 0, x_dtype);
    batch.y = tensor_on(storage, {b}, int64_t(y_at / sizeof(int64_t)), DType::I64);
    batch.index = index;
    batch.epoch = epoch;
    const uint8_t* images = static_cast<const uint8_t*>(dataset.images.data_ptr());
    const int64_t* labels = static_cast<const int64_t*>(dataset.labels.data_ptr());
    auto* x = static_cast<uint8_t*>(batch.x.data_ptr());
    auto* y = static_cast<int64_t*>(batch.y.data_ptr());
    for (int64_t i = 0; i < b; ++i) {
      const int64_t item = order[size_t(start + i)];
      const uint8_t* src = images + item * per_image;
      uint8_t* dst = x + size_t(i * per_image) * esize;
      if (!options.normalize) {
        std::memcpy(dst, src, size_t(per_image));
        y[i] = labels[item];
        continue;
      }
      switch (esize) {
        case 1:
          gather_pixels<uint8_t>(src, per_image, table.data(), dst);
          break;
        case 2:
          gather_pixels<uint16_t>(src, per_image, table.data(), dst);
          break;
        case 4:
          gather_pixels<uint32_t>(src, per_image, table.data(), dst);
          break;
        case 8:
          gather_pixels<uint64_t>(src, per_image, table.data(), dst);
          break;
        default:
          MT_ASSERT(false, "no pixel gather for elements of ", esize, " bytes");
      }
      y[i] = labels[item];
    }
    if (options.transform) options.transform(batch);
    if (options.pin_memory) pin(batch, storage);
    return batch;
  }

  static void pin(Batch& batch, const std::shared_ptr<Storage>& block) {
    if (batch.x.storage() == block && batch.y.storage() == block) {
      // One page-locked copy of the whole block, x and y rebuilt over it with their layouts:
      // the batch still crosses to the device as one transfer.
      const Tensor pinned = tensor_on(block, {int64_t(block->nbytes)}, 0, DType::U8).pin_memory();
      MT_ASSERT(pinned.offset() == 0 && pinned.nbytes() == block->nbytes,
                "pin_memory must copy the block as it is");
      batch.x = rebase(batch.x, pinned.storage());
      batch.y = rebase(batch.y, pinned.storage());
    } else {
      batch.x = batch.x.pin_memory();
      batch.y = batch.y.pin_memory();
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

DataLoader::DataLoader(ImageDataset dataset, LoaderOptions options) {
  MT_CHECK(
      dataset.images.defined() && dataset.images.dim() == 4 && dataset.images.dtype() == DType::U8,
      "DataLoader needs U8 images of shape (N, C, H, W), got ",
      dataset.images.defined() ? dataset.images.describe() : std::string("no images"));
  const int64_t n = dataset.size();
  MT_CHECK(dataset.labels.defined() && dataset.labels.dim() == 1 &&
               dataset.labels.dtype() == DType::I64 && dataset.labels.size(0) == n,
           "DataLoader needs I64 labels of shape (", n, ") for ", n, " images, got ",
           dataset.labels.defined() ? dataset.labels.describe() : std::string("no labels"));
  MT_CHECK(n > 0, "DataLoader: the dataset '", dataset.name, "' is empty");
  MT_CHECK(dataset.images.device().is_cpu() && dataset.labels.device().is_cpu(),
           "DataLoader: the dataset must be in host memory");
  MT_CHECK(options.batch_size >= 1, "DataLoader: batch_size must be >= 1, not ",
           options.batch_size);
  MT_CHECK(options.num_workers >= 0 && options.num_workers <= 256,
           "DataLoader: num_workers must be in 0..256, not ", options.num_workers);
  MT_CHECK(options.prefetch >= 1, "DataLoader: prefetch (batches queued ahead) must be >= 1, not ",
           options.prefetch);
  MT_CHECK(is_floating(options.dtype), "DataLoader: dtype must be a floating type, not ",
           dtype_name(options.dtype));
  MT_CHECK(std::isfinite(options.mean) && std::isfinite(options.std) && options.std > 0,
           "DataLoader: normalization needs a finite mean and a positive std, got mean=",
           options.mean, " std=", options.std);
  MT_CHECK(!options.pin_memory || cuda::is_available(),
           "DataLoader: pin_memory needs a CUDA device (", cuda_info().status,
           "); leave it off on the cpu");

  auto source = std::make_shared<Source>();
  dataset.images = dataset.images.contiguous();
  dataset.labels = dataset.labels.contiguous();
  source->dataset = std::move(dataset);
  source->options = std::move(options);
  const int64_t bs = source->options.batch_size;
  source->num_batches = source->options.drop_last ? n / bs : (n + bs - 1) / bs;
  source->num_samples = source->options.drop_last ? source->num_batches * bs : n;
  const int64_t* labels = source->dataset.labels.data<int64_t>();
  const int64_t classes = source->dataset.num_classes;
  for (int64_t i = 0; i < n; ++i) {
    MT_CHECK(labels[i] >= 0 && (classes <= 0 || labels[i] < classes), "DataLoader: label ", i,
             " of '", source->dataset.name, "' is ", labels[i], ", out of range for ", classes,
             " classes");
  }
  std::vector<float> values(256);
  for (int v = 0; v < 256; ++v)
    values[size_t(v)] = (float(v) / 255.f - source->options.mean) / source->options.std;
  const Tensor table = Tensor::from_vector(values, {256}, DType::F32).to(source->options.dtype);
  source->table.resize(table.nbytes());
  table.copy_to_host(source->table.data(), source->table.size());
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
const ImageDataset& DataLoader::dataset() const {
  return source_->dataset;
}
const LoaderOptions& DataLoader::options() const {
  return source_->options;
}

Tensor DataLoader::pixel_table() const {
  const Tensor t = Tensor::empty({256}, source_->options.dtype);
  std::memcpy(t.data_ptr(), source_->table.data(), source_->table.size());
  return t;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  MT_CHECK(epoch >= 0, "DataLoader: epochs count from 0, not ", epoch);
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

// ---- TokenLoader
// ---------------------------------------------------------------------------------

TokenLoader::TokenLoader(TokenDataset dataset, TokenLoaderOptions options)
    : dataset_(std::make_shared<const TokenDataset>(std::move(dataset))), options_(options) {
  MT_CHECK(options_.batch_size >= 1 && options_.seq_len >= 1,
           "TokenLoader: batch_size and seq_len must be >= 1, got ", options_.batch_size, " and ",
           options_.seq_len);
  MT_CHECK(dataset_->size() >= options_.seq_len + 1, "TokenLoader: '", dataset_->name, "' has ",
           dataset_->size(),
           " tokens, too few for windows of seq_len + 1 = ", options_.seq_len + 1);
  MT_CHECK(options_.batches_per_epoch >= 0, "TokenLoader: batches_per_epoch must be >= 0, not ",
           options_.batches_per_epoch);
  num_batches_ =
      options_.batches_per_epoch > 0
          ? options_.batches_per_epoch
          : std::max<int64_t>(1, dataset_->size() / (options_.batch_size * options_.seq_len));
}

void TokenLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  MT_CHECK(epoch >= 0, "TokenLoader: epochs count from 0, not ", epoch);
  MT_CHECK(first_batch >= 0 && first_batch <= num_batches_, "TokenLoader: first batch ",
           first_batch, " out of range: an epoch has ", num_batches_, " batches");
  epoch_ = epoch;
  cursor_ = first_batch;
}

LMBatch TokenLoader::make_batch(int64_t epoch, int64_t index) const {
  MT_CHECK(epoch >= 0 && index >= 0 && index < num_batches_, "TokenLoader: batch ", index,
           " of epoch ", epoch, " out of range (", num_batches_, " batches per epoch)");
  LMBatch b = lm_batch(*dataset_, options_.batch_size, options_.seq_len, options_.seed,
                       epoch * num_batches_ + index);
  b.index = index;
  b.epoch = epoch;
  return b;
}

std::optional<LMBatch> TokenLoader::next() {
  if (cursor_ >= num_batches_) {
    ++epoch_;
    cursor_ = 0;
    return std::nullopt;
  }
  LMBatch b = make_batch(epoch_, cursor_);
  ++cursor_;
  return b;
}

}  // namespace mantissa::data
