// Internal: what the device-independent layers need from the CUDA backend. Defined in
// src/backend/cuda/ when the backend is built, and by src/backend/no_cuda.cpp (errors that say
// the build has no CUDA) otherwise.
#pragma once

#include "backend/backend.h"
#include "mantissa/core/allocator.h"

namespace mantissa::backend {

Backend& cuda_backend(int device);
// Page-locked host memory (cudaHostAlloc), cached like the device allocator's blocks; its
// tensors are CPU tensors that the GPU can copy from asynchronously.
Allocator& pinned_allocator();
// dst = src across devices (one is CUDA): same dtype, shape, both contiguous. non_blocking
// queues the copy on the current stream and returns; it is asynchronous for the host only
// when the host side is pinned (cudaMemcpyAsync from pageable memory is staged by the driver).
void copy_across_devices(const Tensor& src, Tensor& dst, bool non_blocking);

}  // namespace mantissa::backend
