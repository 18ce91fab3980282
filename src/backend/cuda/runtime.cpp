// The CUDA runtime behind mantissa/core/cuda.h, the per-device backends and cross-device copies.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/device_hooks.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"

namespace mantissa::cuda {

namespace {

constexpr int kMaxDevices = 64;

void check_device(int device) {
  MT_CHECK(is_available(), "no CUDA device: ", cuda_info().status,
           "; run on the cpu device, or on a machine with an NVIDIA GPU and driver");
  MT_CHECK(device >= 0 && device < device_count(), "cuda:", device,
           " does not exist: this machine has ", device_count(), " CUDA device(s)");
}

// The thread's current stream per device; a null handle is the legacy default stream.
thread_local std::array<Stream, kMaxDevices> current_streams;

}  // namespace

bool is_available() {
  return cuda_info().device_count > 0;
}
int device_count() {
  return cuda_info().device_count;
}

void synchronize(int device) {
  check_device(device);
  backend::cuda::DeviceGuard guard(device);
  MT_CUDA_CHECK(cudaDeviceSynchronize());
}

Stream Stream::create(int device, bool high_priority) {
  check_device(device);
  backend::cuda::DeviceGuard guard(device);
  int least = 0, greatest = 0;
  MT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  MT_CUDA_CHECK(
      cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least));
  Stream stream;
  stream.handle_ = s;
  stream.device_ = device;
  stream.owner_ =
      std::shared_ptr<void>(s, [](void* p) { cudaStreamDestroy(static_cast<cudaStream_t>(p)); });
  return stream;
}

Stream Stream::default_stream(int device) {
  check_device(device);
  Stream stream;
  stream.device_ = device;
  return stream;
}

// A null handle is the legacy default stream of the *current* device: make device_ current, or
// cuda:1's default stream would wait for (or report on) cuda:0's.
void Stream::synchronize() const {
  backend::cuda::DeviceGuard guard(device_);
  MT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(handle_)));
}

bool Stream::query() const {
  backend::cuda::DeviceGuard guard(device_);
  const cudaError_t err = cudaStreamQuery(static_cast<cudaStream_t>(handle_));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(err);
  return true;
}

Stream current_stream(int device) {
  MT_CHECK(device >= 0 && device < kMaxDevices, "cuda:", device, " is not a device index");
  Stream s = current_streams[device];
  if (s.handle() == nullptr) {
    check_device(device);
    return Stream::default_stream(device);
  }
  return s;
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  current_streams[stream.device()] = stream;
}
StreamGuard::~StreamGuard() {
  current_streams[previous_.device()] = previous_;
}

Event::Event(bool timing) : timing_(timing) {
  cudaEvent_t e = nullptr;
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ =
      std::shared_ptr<void>(e, [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
}

void Event::record(const Stream& stream) {
  backend::cuda::DeviceGuard guard(stream.device());
  MT_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_.get()),
                                static_cast<cudaStream_t>(stream.handle())));
}

void Event::wait(const Stream& stream) const {
  backend::cuda::DeviceGuard guard(stream.device());
  MT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle()),
                                    static_cast<cudaEvent_t>(handle_.get()), 0));
}

bool Event::query() const {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(handle_.get()));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  MT_CUDA_CHECK(err);
  return true;
}

void Event::synchronize() const {
  MT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_.get())));
}

double Event::elapsed_ms(const Event& end) const {
  MT_CHECK(timing_ && end.timing_, "Event::elapsed_ms needs two events made with timing = true");
  float ms = 0;
  MT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_.get()),
                                     static_cast<cudaEvent_t>(end.handle_.get())));
  return ms;
}

}  // namespace mantissa::cuda

namespace mantissa::backend {

unsigned cuda::max_grid_blocks() {
  static std::array<std::atomic<unsigned>, mantissa::cuda::kMaxDevices> cached{};
  int device = 0;
  MT_CUDA_CHECK(cudaGetDevice(&device));
  unsigned blocks = cached[size_t(device)].load(std::memory_order_relaxed);
  if (blocks == 0) {
    int sms = 0;
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    blocks = unsigned(std::max(sms, 1)) * 32;
    cached[size_t(device)].store(blocks, std::memory_order_relaxed);
  }
  return blocks;
}

std::string_view cuda::CudaBackend::name() const {
  return "cuda";
}

Backend& cuda_backend(int device) {
  mantissa::cuda::check_device(device);
  static std::array<cuda::CudaBackend*, mantissa::cuda::kMaxDevices> backends{};
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  if (backends[device] == nullptr)
    backends[device] = new cuda::CudaBackend(device);  // outlives tensors
  return *backends[device];
}

void copy_across_devices(const Tensor& src, Tensor& dst, bool non_blocking) {
  MT_ASSERT(src.dtype() == dst.dtype() && src.shape() == dst.shape() && src.is_contiguous() &&
                dst.is_contiguous(),
            "copy_across_devices needs two contiguous tensors of one dtype and shape");
  MT_ASSERT(src.device().is_cuda() || dst.device().is_cuda(), "copy_across_devices: no cuda side");
  const size_t bytes = size_t(src.numel()) * dtype_size(src.dtype());
  if (bytes == 0) return;
  const int device = src.device().is_cuda() ? src.device().index : dst.device().index;
  cuda::DeviceGuard guard(device);
  cudaMemcpyKind kind = cudaMemcpyDefault;  // unified addressing tells the directions apart
  const cudaStream_t stream = cuda::stream_for(device);
  MT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), bytes, kind, stream));
  if (!non_blocking) {
    MT_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  // The copy may still be reading or writing pinned host memory when the host frees it: tell
  // the pinned cache that this stream uses the block (PyTorch's pinned allocator does the same).
  const Tensor& host = src.device().is_cpu() ? src : dst;
  if (host.is_pinned()) mantissa::cuda::record_stream(host, mantissa::cuda::current_stream(device));
}

}  // namespace mantissa::backend
