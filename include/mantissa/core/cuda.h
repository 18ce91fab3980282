// The CUDA runtime as Mantissa exposes it: availability, streams, events and the stream a
// tensor's memory is used on. Every function exists in every build; without the CUDA backend or
// without a GPU, is_available() is false and the others throw a mantissa::Error that says so.
//
// Streams follow PyTorch's model: each device has a *current stream* (the default stream until a
// StreamGuard sets another) and every kernel and copy of the CUDA backend is queued on it. Work
// on a side stream (the device prefetcher's copies) is ordered against the main stream with
// events, and its tensors are handed to the caching allocator with record_stream(), so that their
// memory is not reused before that stream is done with them.
#pragma once

#include <cstdint>
#include <memory>

#include "mantissa/core/device.h"

namespace mantissa {
class Tensor;
}

namespace mantissa::cuda {

// The backend was compiled and the driver reports at least one GPU.
bool is_available();
int device_count();
// Waits until every stream of the device is idle.
void synchronize(int device = 0);

class Stream {
 public:
  // A new non-blocking stream on `device` (ordered against the default stream only by events).
  static Stream create(int device = 0, bool high_priority = false);
  static Stream default_stream(int device = 0);

  int device() const { return device_; }
  void* handle() const { return handle_; }  // the cudaStream_t
  void synchronize() const;
  bool query() const;  // true when all its work is done
  friend bool operator==(const Stream& a, const Stream& b) { return a.handle_ == b.handle_; }

 private:
  std::shared_ptr<void> owner_;  // destroys a created stream with its last copy
  void* handle_ = nullptr;       // null = the legacy default stream
  int device_ = 0;
};

Stream current_stream(int device = 0);
// Makes `stream` the current stream of its device for this thread until the guard is destroyed.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

class Event {
 public:
  // timing = false makes a lighter event for ordering only.
  explicit Event(bool timing = false);
  void record(const Stream& stream);
  void record() { record(current_stream()); }
  // Work queued on `stream` after this call waits for the recorded work (no host wait).
  void wait(const Stream& stream) const;
  bool query() const;  // recorded work done (true for an event never recorded)
  void synchronize() const;
  // Milliseconds between this (recorded earlier) and `end`; both need timing = true.
  double elapsed_ms(const Event& end) const;
  void* handle() const { return handle_.get(); }

 private:
  std::shared_ptr<void> handle_;  // the cudaEvent_t
  bool timing_ = false;
};

// Tells the caching allocator that `stream` uses `t`'s memory: when t's storage is freed, its
// block is reused only after the work queued on `stream` so far is done.
void record_stream(const Tensor& t, const Stream& stream);

}  // namespace mantissa::cuda
