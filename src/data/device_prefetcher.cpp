// DevicePrefetcher: the loader's next batch copied and normalized on a side stream while the
// model trains on the current one; handed to the consumer's stream with an event.
#include <algorithm>
#include <deque>
#include <exception>
#include <utility>

#include "data/rebase.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"
#include "mantissa/core/error.h"
#include "mantissa/data/loader.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::data {
namespace {

LoaderOptions options_for(LoaderOptions o, Device device) {
  if (!device.is_cuda()) return o;
  MT_CHECK(cuda::is_available(), "no CUDA device: ", cuda_info().status, "; run with --device cpu");
  MT_CHECK(device.index >= 0 && device.index < cuda::device_count(), device.str(),
           " does not exist: this machine has ", cuda::device_count(),
           " CUDA device(s); use cuda:0 .. cuda:", cuda::device_count() - 1);
  o.pin_memory = true;
  // A transform expects normalized batches (LoaderOptions::transform): those cross as they are.
  if (!o.transform) o.normalize = false;
  return o;
}

// One past the last byte of t's view in its storage.
size_t end_byte(const Tensor& t) {
  int64_t last = t.offset();
  if (t.numel() > 0) {
    for (int d = 0; d < t.dim(); ++d)
      last += (t.size(d) - 1) * t.stride(d);
    ++last;
  }
  return size_t(last) * t.element_size();
}

// Queues host -> device copies of a (pinned) batch on the current stream, without waiting.
Batch copy_to(const Batch& host, Device device) {
  Batch out;
  out.index = host.index;
  out.epoch = host.epoch;
  const std::shared_ptr<Storage>& block = host.x.storage();
  if (block == host.y.storage()) {
    // The loader's one block (x, then y): one transfer, views rebuilt over the device copy.
    const size_t span = std::max(end_byte(host.x), end_byte(host.y));
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = block;
    impl->shape = {int64_t(span)};
    impl->strides = {1};
    impl->dtype = DType::U8;
    const Tensor bytes = Tensor(std::move(impl)).to(device, /*non_blocking=*/true);
    out.x = rebase(host.x, bytes.storage());
    out.y = rebase(host.y, bytes.storage());
  } else {
    out.x = host.x.to(device, /*non_blocking=*/true);
    out.y = host.y.to(device, /*non_blocking=*/true);
  }
  return out;
}

}  // namespace

struct DevicePrefetcher::Cuda {
  struct InFlight {
    Batch batch;  // on the device, ready once `ready` has passed
    Batch host;   // the pinned source of the copy: alive until the copy is done
    cuda::Event ready;
  };

  cuda::Stream side;
  Tensor table;  // the loader's pixel table on the device; undefined: batches cross normalized
  std::optional<InFlight> ahead;
  std::exception_ptr error;   // making or copying the next batch failed: next() rethrows it
  bool ahead_is_end = false;  // the loader's epoch ended after the last batch handed out
  int64_t ended_epoch = 0;
  // Host batches of copies that may still be running, with the events that tell.
  std::deque<std::pair<cuda::Event, Batch>> copying;

  void release_copied() {
    while (!copying.empty() && copying.front().first.query())
      copying.pop_front();
  }
  void retire(InFlight& f) { copying.emplace_back(std::move(f.ready), std::move(f.host)); }
};

DevicePrefetcher::DevicePrefetcher(ImageDataset dataset, LoaderOptions options, Device device)
    : loader_(std::move(dataset), options_for(options, device)), device_(device) {
  if (!device_.is_cuda()) return;
  cuda_ = std::make_unique<Cuda>();
  cuda_->side = cuda::Stream::create(device_.index);
  if (options.normalize && !loader_.options().normalize) {
    cuda_->table = loader_.pixel_table().to(device_);
  }
}

DevicePrefetcher::~DevicePrefetcher() {
  if (!cuda_) return;
  // The pinned host batches must outlive the copies reading them. A destructor cannot throw;
  // a failing device reports itself again on the next CUDA call.
  try {
    cuda_->side.synchronize();
  } catch (const Error&) {
  }
}

int64_t DevicePrefetcher::epoch() const {
  if (cuda_ && cuda_->ahead) return cuda_->ahead->batch.epoch;
  if (cuda_ && cuda_->ahead_is_end) return cuda_->ended_epoch;
  return loader_.epoch();
}

int64_t DevicePrefetcher::next_index() const {
  if (cuda_ && cuda_->ahead) return cuda_->ahead->batch.index;
  if (cuda_ && cuda_->ahead_is_end) return loader_.num_batches();
  return loader_.next_index();
}

void DevicePrefetcher::drop_ahead() {
  Cuda& c = *cuda_;
  if (c.ahead) c.retire(*c.ahead);
  c.ahead.reset();
  c.ahead_is_end = false;
  c.error = nullptr;
}

void DevicePrefetcher::start_epoch(int64_t epoch, int64_t first_batch) {
  if (cuda_) {
    const auto& a = cuda_->ahead;
    if (a && a->batch.epoch == epoch && a->batch.index == first_batch) return;  // in flight
    drop_ahead();
  }
  loader_.start_epoch(epoch, first_batch);
}

void DevicePrefetcher::fetch_ahead() {
  Cuda& c = *cuda_;
  c.release_copied();
  try {
    const int64_t epoch = loader_.epoch();
    std::optional<Batch> host = loader_.next();
    if (!host) {
      c.ahead_is_end = true;
      c.ended_epoch = epoch;
      return;
    }
    NoGrad ng;
    cuda::StreamGuard on_side(c.side);
    Batch batch = copy_to(*host, device_);
    if (c.table.defined()) {
      // x = table[pixel]: the loader's own lookup, so the values are the CPU path's bit for bit.
      const Tensor pixels = batch.x.contiguous().reshape({batch.x.numel()}).to(DType::I64);
      batch.x = index_select(c.table, 0, pixels).view(batch.x.shape());
    }
    cuda::Event ready;
    ready.record(c.side);
    c.ahead = Cuda::InFlight{std::move(batch), std::move(*host), std::move(ready)};
  } catch (...) {
    // Rethrown by the next() that would have returned this batch (the loader stays at it, so
    // the next() after that retries it).
    c.error = std::current_exception();
  }
}

std::optional<Batch> DevicePrefetcher::next() {
  if (!cuda_) return loader_.next();
  Cuda& c = *cuda_;
  if (!c.ahead && !c.ahead_is_end && !c.error) fetch_ahead();
  if (c.error) {
    const std::exception_ptr error = std::exchange(c.error, nullptr);
    std::rethrow_exception(error);
  }
  if (c.ahead_is_end) {
    c.ahead_is_end = false;
    return std::nullopt;
  }
  Cuda::InFlight f = std::move(*c.ahead);
  c.ahead.reset();
  // The consumer's stream waits for the copy on the device, not the host; the allocator learns
  // that this stream uses the batch, so its memory outlives the work queued on it.
  const cuda::Stream current = cuda::current_stream(device_.index);
  f.ready.wait(current);
  cuda::record_stream(f.batch.x, current);
  cuda::record_stream(f.batch.y, current);
  c.retire(f);
  fetch_ahead();
  return std::move(f.batch);
}

}  // namespace mantissa::data
