// Internal, host side of the CUDA backend: error checks, the current stream, scratch memory.
// Included by the backend's .cpp and .cu files (never by code outside src/backend/cuda/).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mantissa/core/cuda.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/tensor.h"

// A failing CUDA runtime call becomes a mantissa::Error naming the call and the CUDA error.
#define MT_CUDA_CHECK(expr)                                                                \
  do {                                                                                     \
    const cudaError_t mt_cuda_err_ = (expr);                                               \
    MT_CHECK(mt_cuda_err_ == cudaSuccess, "CUDA error in ", #expr, ": ",                   \
             cudaGetErrorString(mt_cuda_err_), " (", static_cast<int>(mt_cuda_err_), ")"); \
  } while (0)

// After a kernel launch: a bad configuration surfaces here, not at the next sync.
#define MT_CUDA_CHECK_LAUNCH() MT_CUDA_CHECK(cudaGetLastError())

namespace mantissa::backend::cuda {

// The stream the backend queues work on for `device` (the thread's current stream).
inline cudaStream_t stream_for(int device) {
  return static_cast<cudaStream_t>(mantissa::cuda::current_stream(device).handle());
}
inline cudaStream_t stream_for(const Tensor& t) {
  return stream_for(t.device().index);
}

// Makes `device` the calling thread's CUDA device for the guard's lifetime.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    MT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) MT_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The most blocks a grid-stride launch on the calling thread's current device uses: 32 per
// multiprocessor, the device's own count (read once per device), enough to keep every SM busy.
unsigned max_grid_blocks();

// Uninitialized device scratch from the caching allocator (freed with the returned tensor, its
// block reused by later work on the same stream only: stream order makes that safe).
inline Tensor scratch(int64_t bytes, int device) {
  return Tensor::empty({bytes}, DType::U8, Device::cuda(device));
}

}  // namespace mantissa::backend::cuda
