// A build without the CUDA backend: mantissa/core/cuda.h and the device hooks answer that there
// is no CUDA, in words that say how to get it.
#ifndef MANTISSA_HAS_CUDA

#include "backend/device_hooks.h"
#include "core/cuda_allocator.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/error.h"

namespace mantissa {
namespace {

[[noreturn]] void no_cuda(const char* what) {
  MT_CHECK(false, what,
           ": this build has no CUDA backend; rebuild with nvcc installed and "
           "-DMANTISSA_CUDA=AUTO (or ON), or use the cpu device");
  throw 0;  // unreachable
}

}  // namespace

Allocator& detail::cuda_allocator(int) {
  no_cuda("the cuda device");
}

namespace cuda {

bool is_available() {
  return false;
}
int device_count() {
  return 0;
}
void synchronize(int) {
  no_cuda("cuda::synchronize");
}
Stream Stream::create(int, bool) {
  no_cuda("cuda::Stream::create");
}
Stream Stream::default_stream(int) {
  no_cuda("cuda::Stream::default_stream");
}
void Stream::synchronize() const {
  no_cuda("cuda::Stream::synchronize");
}
bool Stream::query() const {
  no_cuda("cuda::Stream::query");
}
Stream current_stream(int) {
  no_cuda("cuda::current_stream");
}
StreamGuard::StreamGuard(const Stream&) {
  no_cuda("cuda::StreamGuard");
}
StreamGuard::~StreamGuard() = default;
Event::Event(bool) {
  no_cuda("cuda::Event");
}
void Event::record(const Stream&) {
  no_cuda("cuda::Event::record");
}
void Event::wait(const Stream&) const {
  no_cuda("cuda::Event::wait");
}
bool Event::query() const {
  no_cuda("cuda::Event::query");
}
void Event::synchronize() const {
  no_cuda("cuda::Event::synchronize");
}
double Event::elapsed_ms(const Event&) const {
  no_cuda("cuda::Event::elapsed_ms");
}
void record_stream(const Tensor&, const Stream&) {
  no_cuda("cuda::record_stream");
}

}  // namespace cuda

namespace backend {

Backend& cuda_backend(int) {
  no_cuda("the cuda device");
}
Allocator& pinned_allocator() {
  no_cuda("pinned host memory");
}
void copy_across_devices(const Tensor&, Tensor&, bool) {
  no_cuda("a copy to or from the cuda device");
}

}  // namespace backend
}  // namespace mantissa

#endif  // MANTISSA_HAS_CUDA
