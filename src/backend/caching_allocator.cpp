#include "backend/caching_allocator.h"

#include <algorithm>
#include <cstdio>

#include "core/bytes_text.h"
#include "mantissa/core/error.h"

namespace mantissa::backend {
namespace {

// Far beyond any device; keeps the rounding below from overflowing.
constexpr size_t kMaxRequest = size_t(1) << 60;

}  // namespace

size_t CachingAllocator::block_size(size_t bytes) {
  MT_ASSERT(bytes <= kMaxRequest, "block_size(", bytes, ") out of range");
  const size_t r = (std::max<size_t>(bytes, 1) + kSmallStep - 1) / kSmallStep * kSmallStep;
  if (r < kLargeFrom) return r;
  const int top = 63 - __builtin_clzll(r);  // r in [2^top, 2^(top+1))
  const size_t step = size_t(1) << (top - 3);
  static_assert(kClassesPerPow2 == 8, "the step above is 2^top / 8");
  return (r + step - 1) / step * step;
}

CachingAllocator::CachingAllocator(BlockSource& source, Options options)
    : source_(source), options_(std::move(options)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  try {
    wait_pending();
    process_events();
  } catch (...) {
    // a broken device: give back what can be given back below
  }
  for (Pending& p : pending_) {
    for (auto& [device, event] : p.events)
      source_.destroy_event(event);
    free_block(p.ptr);
  }
  pending_.clear();
  release_free_blocks();
  for (auto& [device, events] : idle_events_) {
    for (void* e : events)
      source_.destroy_event(e);
  }
}

void* CachingAllocator::allocate(size_t bytes) {
  MT_CHECK(bytes <= kMaxRequest, "cannot allocate ", bytes, " bytes on ", options_.name,
           ": the size is beyond any device (a negative size cast to unsigned?)");
  const size_t size = block_size(bytes);
  std::lock_guard lock(mutex_);
  if (!pending_.empty()) process_events();
  const StreamId stream = source_.current_stream();
  void* p = take_cached(stream, size);
  if (p != nullptr) {
    ++cache_.hits;
  } else {
    p = allocate_raw(size, bytes);
  }
  Block& b = blocks_.at(p);
  b.stream = stream;
  b.requested = bytes;
  b.in_use = true;
  b.used_on.clear();
  stats_.current_bytes += int64_t(bytes);
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  ++stats_.live_allocations;
  ++stats_.total_allocations;
  return p;
}

void* CachingAllocator::take_cached(StreamId stream, size_t size) {
  auto lists = free_.find(stream);
  if (lists == free_.end()) return nullptr;
  auto it = lists->second.find(size);
  if (it == lists->second.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  cache_.cached_bytes -= int64_t(size);
  return p;
}

void* CachingAllocator::allocate_raw(size_t size, size_t requested) {
  void* p = source_.allocate_raw(size);
  if (p == nullptr) {
    // The cache may hold what is missing: give back every block that is idle, waiting for the
    // streams that still use freed blocks, and try once more.
    ++cache_.oom_retries;
    wait_pending();
    process_events();
    release_free_blocks();
    p = source_.allocate_raw(size);
  }
  if (p == nullptr) {
    const std::string info = source_.memory_info();
    MT_CHECK(false, "out of memory on ", options_.name, ": tried to allocate ",
             with_unit(int64_t(requested)), " (a block of ", size, " bytes) with ",
             with_unit(stats_.current_bytes), " in use by ", stats_.live_allocations,
             " tensors and ", with_unit(stats_.reserved_bytes),
             " reserved after the cache was given back", info.empty() ? "" : "; ", info, ". ",
             options_.oom_advice);
  }
  try {
    blocks_.emplace(p, Block{size, 0, StreamId{}, false, {}});
  } catch (...) {
    source_.free_raw(p);
    throw;
  }
  stats_.reserved_bytes += int64_t(size);
  ++cache_.raw_allocations;
  return p;
}

void CachingAllocator::deallocate(void* p, size_t /*bytes*/) noexcept {
  if (p == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(p);
  MT_ASSERT(it != blocks_.end() && it->second.in_use, options_.name,
            " allocator: freeing a pointer it did not hand out, or freeing it twice");
  Block& b = it->second;
  b.in_use = false;
  stats_.current_bytes -= int64_t(b.requested);
  --stats_.live_allocations;
  if (b.used_on.empty()) {
    to_free_list(p, b);
    return;
  }
  // Other streams may still be reading or writing the block: it becomes reusable once the work
  // they have queued so far is done.
  Pending pending{p, {}};
  try {
    pending.events.reserve(b.used_on.size());
    for (const StreamId& s : b.used_on) {
      pending.events.emplace_back(s.device, get_event(s.device));
      source_.record_event(pending.events.back().second, s);
    }
    pending_.push_back(std::move(pending));
    cache_.pending_bytes += int64_t(b.size);
    ++cache_.pending_blocks;
  } catch (...) {
    // No way to know when the streams are done: hand the block back to the source, whose free
    // (cudaFree, cudaFreeHost) waits for the device's work.
    for (auto& [device, event] : pending.events)
      source_.destroy_event(event);
    free_block(p);
  }
}

void CachingAllocator::record_stream(void* p, StreamId stream) {
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(p);
  MT_CHECK(it != blocks_.end() && it->second.in_use, "record_stream: this memory was not allocated",
           " by the ", options_.name,
           " allocator or was already freed; pass a tensor that owns its storage");
  Block& b = it->second;
  if (stream == b.stream) return;  // its own stream orders every reuse already
  if (std::find(b.used_on.begin(), b.used_on.end(), stream) == b.used_on.end())
    b.used_on.push_back(stream);
}

bool CachingAllocator::owns(void* p) const {
  std::lock_guard lock(mutex_);
  return blocks_.count(p) != 0;
}

void CachingAllocator::process_events() {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    const bool done = std::all_of(p.events.begin(), p.events.end(),
                                  [&](const auto& e) { return source_.event_done(e.second); });
    if (!done) {
      ++i;
      continue;
    }
    for (auto& [device, event] : p.events)
      put_event(device, event);
    Block& b = blocks_.at(p.ptr);
    cache_.pending_bytes -= int64_t(b.size);
    --cache_.pending_blocks;
    to_free_list(p.ptr, b);
    if (i + 1 != pending_.size()) pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

void CachingAllocator::wait_pending() {
  for (const Pending& p : pending_) {
    for (const auto& [device, event] : p.events)
      source_.wait_event(event);
  }
}

void CachingAllocator::release_free_blocks() {
  for (auto& [stream, lists] : free_) {
    for (auto& [size, ptrs] : lists) {
      for (void* p : ptrs)
        free_block(p);
    }
  }
  free_.clear();
  cache_.cached_bytes = 0;
}

void CachingAllocator::to_free_list(void* p, Block& b) noexcept {
  if (cache_.cached_bytes + int64_t(b.size) <= options_.cache_limit) {
    try {
      free_[b.stream][b.size].push_back(p);
      cache_.cached_bytes += int64_t(b.size);
      return;
    } catch (...) {
      // no room to remember it: give it back below
    }
  }
  free_block(p);
}

void CachingAllocator::free_block(void* p) noexcept {
  auto it = blocks_.find(p);
  MT_ASSERT(it != blocks_.end(), "free_block of an unknown block");
  source_.free_raw(p);
  stats_.reserved_bytes -= int64_t(it->second.size);
  ++cache_.raw_frees;
  blocks_.erase(it);
}

void* CachingAllocator::get_event(int device) {
  auto it = idle_events_.find(device);
  if (it != idle_events_.end() && !it->second.empty()) {
    void* e = it->second.back();
    it->second.pop_back();
    return e;
  }
  return source_.create_event(device);
}

void CachingAllocator::put_event(int device, void* event) noexcept {
  try {
    idle_events_[device].push_back(event);
  } catch (...) {
    source_.destroy_event(event);
  }
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

CacheStats CachingAllocator::cache_stats() const {
  std::lock_guard lock(mutex_);
  return cache_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  process_events();
  release_free_blocks();
}

}  // namespace mantissa::backend
