// The CUDA memory behind Device::cuda(n) and pinned host tensors: the caching policy of
// backend/caching_allocator.h over cudaMalloc and cudaHostAlloc, and record_stream().
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "backend/caching_allocator.h"
#include "backend/cuda/cuda_common.h"
#include "backend/device_hooks.h"
#include "core/cuda_allocator.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"

namespace mantissa {
namespace backend {
namespace {

constexpr int kMaxDevices = 64;
constexpr int kHostDevice = -1;  // the pinned allocator's one 'stream': the host's program order

void check_gpu(const char* what) {
  MT_CHECK(mantissa::cuda::is_available(), what,
           " needs a CUDA GPU, and there is none: ", cuda_info().status,
           "; run on the cpu device, or on a machine with an NVIDIA GPU");
}

// Sets the device for a call that must not throw (a free), and restores the previous one.
class QuietDeviceGuard {
 public:
  explicit QuietDeviceGuard(int device) noexcept {
    if (device < 0 || cudaGetDevice(&previous_) != cudaSuccess) return;
    if (previous_ != device && cudaSetDevice(device) == cudaSuccess) changed_ = true;
  }
  ~QuietDeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  QuietDeviceGuard(const QuietDeviceGuard&) = delete;
  QuietDeviceGuard& operator=(const QuietDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// Events and streams are the same for device and pinned memory; the two differ in where the
// bytes come from and which stream a new block belongs to.
class CudaEventSource : public BlockSource {
 public:
  void* create_event(int device) override {
    cuda::DeviceGuard guard(device);
    cudaEvent_t e = nullptr;
    // Ordering only: an event without timing is cheaper to record and to query.
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void destroy_event(void* event) noexcept override {
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void record_event(void* event, StreamId stream) override {
    cuda::DeviceGuard guard(stream.device);
    MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event),
                                  static_cast<cudaStream_t>(const_cast<void*>(stream.handle))));
  }
  bool event_done(void* event) override {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: keep it from surfacing at the next check
      return false;
    }
    MT_CUDA_CHECK(err);
    return true;
  }
  void wait_event(void* event) override {
    MT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
};

class DeviceSource final : public CudaEventSource {
 public:
  explicit DeviceSource(int device) : device_(device) {}

  void* allocate_raw(size_t bytes) override {
    cuda::DeviceGuard guard(device_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // the caller retries or reports it; later checks must not see it
      return nullptr;
    }
    MT_CUDA_CHECK(err);
    return p;
  }
  // cudaFree waits for the device's queued work, so a cached block whose last use is still
  // queued on its stream is safe to give back.
  void free_raw(void* p) noexcept override {
    QuietDeviceGuard guard(device_);
    cudaFree(p);
  }
  StreamId current_stream() override {
    return StreamId{mantissa::cuda::current_stream(device_).handle(), device_};
  }
  std::string memory_info() override {
    cuda::DeviceGuard guard(device_);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return {};
    }
    return "the GPU has " + std::to_string(free >> 20) + " MiB free of " +
           std::to_string(total >> 20) + " MiB (other processes may hold the rest)";
  }

 private:
  int device_;
};

class PinnedSource final : public CudaEventSource {
 public:
  void* allocate_raw(size_t bytes) override {
    void* p = nullptr;
    // Portable: every device's copies see it as pinned, whichever device is current now.
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    MT_CUDA_CHECK(err);
    return p;
  }
  void free_raw(void* p) noexcept override { cudaFreeHost(p); }
  // The host uses its blocks in program order, so one pool serves every thread; streams that
  // copy from or to a block are made known with record_stream.
  StreamId current_stream() override { return StreamId{nullptr, kHostDevice}; }
};

int64_t cache_limit_from_env() {
  const char* env = std::getenv("MANTISSA_CUDA_CACHE_MB");
  if (env == nullptr || *env == '\0') return INT64_MAX;
  char* end = nullptr;
  const long long mb = std::strtoll(env, &end, 10);
  MT_CHECK(end != env && *end == '\0' && mb >= 0, "MANTISSA_CUDA_CACHE_MB='", env,
           "' is not a number of MiB; set it to the idle device memory to keep cached "
           "(0 turns the cache off) or unset it");
  return int64_t(mb) << 20;
}

const char* const kDeviceAdvice =
    "Use a smaller batch (mantissa train --batch-size), recompute activations in backward "
    "(--checkpoint-activations), keep the weights in half precision (--opt-level O2) or a smaller "
    "model, free tensors that are no longer needed, or, when other processes share the GPU, call "
    "mantissa::empty_cache(Device::cuda()) in them or set MANTISSA_CUDA_CACHE_MB to cap the idle "
    "memory each process keeps cached";

CachingAllocator& device_allocator(int device) {
  check_gpu("the cuda device");
  MT_CHECK(device < kMaxDevices, "cuda:", device, " is beyond the ", kMaxDevices,
           " devices Mantissa supports");
  MT_CHECK(device >= 0 && device < mantissa::cuda::device_count(), "cuda:", device,
           " does not exist: this machine has ", mantissa::cuda::device_count(), " CUDA device(s)");
  // Looked up on every allocation: a lock-free read once made.
  static std::array<std::atomic<CachingAllocator*>, kMaxDevices> allocators{};
  if (CachingAllocator* made = allocators[device].load(std::memory_order_acquire)) return *made;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (allocators[device].load(std::memory_order_relaxed) == nullptr) {
    CachingAllocator::Options options;
    options.name = "cuda:" + std::to_string(device);
    options.cache_limit = cache_limit_from_env();
    options.oom_advice = kDeviceAdvice;
    // Never destroyed: tensors may outlive main, and freeing after the CUDA runtime has shut
    // down would fail.
    allocators[device].store(new CachingAllocator(*new DeviceSource(device), std::move(options)),
                             std::memory_order_release);
  }
  return *allocators[device].load(std::memory_order_relaxed);
}

CachingAllocator& host_allocator() {
  check_gpu("pinned (page-locked) host memory");
  static CachingAllocator* pinned = [] {
    CachingAllocator::Options options;
    options.name = "pinned host memory";
    options.oom_advice =
        "Pin fewer or smaller buffers (fewer loader workers or a smaller batch), or leave "
        "pinning off";
    return new CachingAllocator(*new PinnedSource(), std::move(options));  // never destroyed
  }();
  return *pinned;
}

}  // namespace

Allocator& pinned_allocator() {
  return host_allocator();
}

}  // namespace backend

Allocator& detail::cuda_allocator(int device) {
  return backend::device_allocator(device);
}

namespace cuda {

void record_stream(const Tensor& t, const Stream& stream) {
  MT_CHECK(t.defined(), "record_stream: the tensor is undefined");
  const backend::StreamId id{stream.handle(), stream.device()};
  void* data = t.storage()->data;
  if (t.device().is_cuda()) {
    MT_CHECK(stream.device() == t.device().index,
             "record_stream: the stream is on cuda:", stream.device(), " but the tensor on ",
             t.device().str(), "; only streams of the tensor's own device can use its memory");
    backend::device_allocator(t.device().index).record_stream(data, id);
    return;
  }
  // A copy from or to pageable memory is done when it returns; pinned memory is read and written
  // by the GPU after the host has moved on, so its block must wait for the stream like a device's.
  MT_CHECK(t.is_pinned(),
           "record_stream: the tensor is in pageable host memory; only cuda "
           "tensors and pinned host tensors (pin_memory()) are used by streams asynchronously");
  backend::host_allocator().record_stream(data, id);
}

}  // namespace cuda
}  // namespace mantissa
