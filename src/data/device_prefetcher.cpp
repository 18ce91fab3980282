// DevicePrefetcher: the loader's next batch copied (and finished: the dataset's DeviceSplit) on a
// side stream while the model trains on the current one; handed to the consumer's stream with an
// event.
#include <algorithm>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "data/batch_block.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"
#include "mantissa/core/error.h"
#include "mantissa/data/loader.h"

namespace mantissa::data {
namespace {

void check_device(Device device) {
  if (!device.is_cuda()) return;
  MT_CHECK(cuda::is_available(), "no CUDA device: ", cuda_info().status, "; run with --device cpu");
  MT_CHECK(device.index >= 0 && device.index < cuda::device_count(), device.str(),
           " does not exist: this machine has ", cuda::device_count(),
           " CUDA device(s); use cuda:0 .. cuda:", cuda::device_count() - 1);
}

// Host -> device copies of a batch on the current stream: queued without waiting when
// non_blocking (the batch pinned), else waited for.
Batch copy_to(const Batch& host, Device device, bool non_blocking) {
  Batch out;
  out.index = host.index;
  out.epoch = host.epoch;
  out.names = host.names;
  if (const std::shared_ptr<Storage> block = own_block(host.fields)) {
    // The loader's one block: one transfer, views rebuilt over the device copy.
    size_t span = 0;
    for (const Tensor& f : host.fields)
      span = std::max(span, end_byte(f));
    const Tensor bytes = tensor_on(block, {int64_t(span)}, 0, DType::U8).to(device, non_blocking);
    for (const Tensor& f : host.fields)
      out.fields.push_back(rebase(f, bytes.storage()));
  } else {
    for (const Tensor& f : host.fields)
      out.fields.push_back(f.to(device, non_blocking));
  }
  return out;
}

}  // namespace

// What the loader loads on the host, with which options, and what is left to the device.
struct DevicePrefetcher::Plan {
  std::shared_ptr<const Dataset> dataset;
  LoaderOptions options;
  std::function<void(Batch&)> finish;  // null: batches cross finished
};

struct DevicePrefetcher::Cuda {
  struct InFlight {
    Batch batch;  // on the device, ready once `ready` has passed
    Batch host;   // the pinned source of the copy: alive until the copy is done
    cuda::Event ready;
  };

  cuda::Stream side;
  std::function<void(Batch&)> finish;  // the dataset's device half (DeviceSplit); null: none
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

DevicePrefetcher::Plan DevicePrefetcher::make_plan(std::shared_ptr<const Dataset> dataset,
                                                   LoaderOptions options, Device device,
                                                   Transfer transfer) {
  MT_CHECK(dataset != nullptr, "DevicePrefetcher: needs a dataset (got a null pointer)");
  Plan p;
  if (device.is_cuda()) {
    check_device(device);
    options.pin_memory = transfer != Transfer::Pageable;
    // A collate or transform expects the dataset's own samples and batches: those cross as made.
    // The simpler transfers finish every batch on the host.
    if (!options.collate && !options.transform && transfer == Transfer::Prefetch) {
      if (std::optional<DeviceSplit> split = dataset->split_for_device(device)) {
        MT_ASSERT(split->host != nullptr && split->finish,
                  "a DeviceSplit needs both a host dataset and a finish step");
        dataset = std::move(split->host);
        p.finish = std::move(split->finish);
      }
    }
  }
  p.dataset = std::move(dataset);
  p.options = std::move(options);
  return p;
}

DevicePrefetcher::DevicePrefetcher(std::shared_ptr<const Dataset> dataset, LoaderOptions options,
                                   Device device, Transfer transfer)
    : DevicePrefetcher(make_plan(std::move(dataset), std::move(options), device, transfer), device,
                       transfer) {}

DevicePrefetcher::DevicePrefetcher(Plan p, Device device, Transfer transfer)
    : loader_(std::move(p.dataset), std::move(p.options)), device_(device), transfer_(transfer) {
  if (!device_.is_cuda()) return;
  cuda_ = std::make_unique<Cuda>();
  cuda_->side = cuda::Stream::create(device_.index);
  cuda_->finish = std::move(p.finish);
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
    Batch batch = copy_to(*host, device_, /*non_blocking=*/true);
    if (c.finish) c.finish(batch);
    cuda::Event ready;
    ready.record(c.side);
    c.ahead = Cuda::InFlight{std::move(batch), std::move(*host), std::move(ready)};
  } catch (...) {
    // Rethrown by the next() that would have returned this batch (the loader stays at it, so
    // the next() after that retries it).
    c.error = std::current_exception();
  }
}

std::optional<Batch> DevicePrefetcher::next_on_current_stream() {
  std::optional<Batch> host = loader_.next();
  if (!host) return std::nullopt;
  NoGrad ng;
  // A queued copy's page-locked source is not reused before the copy has run: the copy tells
  // the pinned cache which stream reads it (copy_across_devices).
  return copy_to(*host, device_, /*non_blocking=*/transfer_ == Transfer::Pinned);
}

std::optional<Batch> DevicePrefetcher::next() {
  if (!cuda_) return loader_.next();
  if (transfer_ != Transfer::Prefetch) return next_on_current_stream();
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
  for (const Tensor& t : f.batch.fields)
    cuda::record_stream(t, current);
  c.retire(f);
  fetch_ahead();
  return std::move(f.batch);
}

}  // namespace mantissa::data
