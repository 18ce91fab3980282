// Internal: the caching policy behind the CUDA device and pinned host allocators, written against
// an abstract source of raw memory and events so that it is compiled (and unit-tested) in every
// build, with or without a GPU.
//
// Raw allocations (cudaMalloc, cudaHostAlloc) are slow and synchronize the device, so freed blocks
// are kept and reused: a training step allocates the same sizes every step, and after the first
// step no raw allocation is made. A block remembers the stream it was allocated on and is reused
// only by allocations on that stream, where stream order makes the reuse safe without waiting.
// When its memory was also used on other streams (record_stream), the free records an event on
// each of them and the block waits, off the free lists, until the events have completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mantissa/core/allocator.h"

namespace mantissa::backend {

// A stream as the policy sees it: an opaque handle (the cudaStream_t, null for the legacy default
// stream) and the device it belongs to (events must be made on the stream's device).
struct StreamId {
  const void* handle = nullptr;
  int device = 0;
  friend bool operator==(const StreamId&, const StreamId&) = default;
  friend auto operator<=>(const StreamId&, const StreamId&) = default;
};

// Where a CachingAllocator gets raw memory, the current stream and events.
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  // Null when the memory is not there (out of memory); other failures throw mantissa::Error.
  virtual void* allocate_raw(size_t bytes) = 0;
  virtual void free_raw(void* p) noexcept = 0;
  // The stream that a block allocated now will be used on.
  virtual StreamId current_stream() = 0;
  virtual void* create_event(int device) = 0;
  virtual void destroy_event(void* event) noexcept = 0;
  // Marks the point, in `stream`'s queue, after everything queued on it so far.
  virtual void record_event(void* event, StreamId stream) = 0;
  virtual bool event_done(void* event) = 0;
  virtual void wait_event(void* event) = 0;  // blocks the host until the event is done
  // Extra words for the out-of-memory message (e.g. the GPU's free and total memory).
  virtual std::string memory_info() { return {}; }
};

// Counters beyond MemoryStats, for tests and for tuning.
struct CacheStats {
  int64_t hits = 0;  // allocations served from the cache
  int64_t raw_allocations = 0;
  int64_t raw_frees = 0;
  int64_t cached_bytes = 0;   // idle blocks on the free lists
  int64_t pending_bytes = 0;  // freed blocks waiting for other streams' events
  int64_t pending_blocks = 0;
  int64_t oom_retries = 0;  // raw allocations that failed and were retried after freeing the cache
};

class CachingAllocator final : public Allocator {
 public:
  struct Options {
    std::string name = "device";  // for messages: "cuda:0", "pinned host memory"
    // Idle bytes kept on the free lists at most; a free that would exceed it goes to the source.
    int64_t cache_limit = INT64_MAX;
    // The end of the out-of-memory message: what the user can do.
    std::string oom_advice =
        "use a smaller batch or model, or free tensors that are no longer needed";
  };

  // Requests below this are rounded up to a multiple of kSmallStep; larger ones to one of
  // kClassesPerPow2 sizes per power of two (at most 12.5% slack), so that sizes that differ a
  // little (a last, smaller batch; a growing sequence) share blocks.
  static constexpr size_t kSmallStep = 512;
  static constexpr size_t kLargeFrom = size_t(1) << 20;
  static constexpr int kClassesPerPow2 = 8;
  static size_t block_size(size_t bytes);

  CachingAllocator(BlockSource& source, Options options);
  // Gives the cache back to the source; blocks still allocated stay with their owners.
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  MemoryStats stats() const override;
  void reset_peak() override;
  // Returns every idle cached block to the source (blocks waiting for events stay).
  void empty_cache() override;

  // The block holding `p` (a pointer allocate returned) is used on `stream` too: when freed, it
  // is reused only after the work queued on `stream` until the free is done.
  void record_stream(void* p, StreamId stream);
  bool owns(void* p) const;
  CacheStats cache_stats() const;

 private:
  struct Block {
    size_t size = 0;       // bytes taken from the source
    size_t requested = 0;  // bytes asked for (what the statistics count)
    StreamId stream;       // allocated on; reused only there
    bool in_use = false;
    std::vector<StreamId> used_on;  // other streams (record_stream), while in use
  };
  struct Pending {
    void* ptr = nullptr;
    std::vector<std::pair<int, void*>> events;  // (device, event)
  };
  using FreeList = std::map<size_t, std::vector<void*>>;  // block size -> blocks

  void* take_cached(StreamId stream, size_t size);
  void* allocate_raw(size_t size, size_t requested);
  void process_events();
  void release_free_blocks();
  void wait_pending();
  void to_free_list(void* p, Block& b) noexcept;
  void free_block(void* p) noexcept;
  void* get_event(int device);
  void put_event(int device, void* event) noexcept;

  BlockSource& source_;
  Options options_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;  // every block taken from the source
  std::map<StreamId, FreeList> free_;
  std::vector<Pending> pending_;
  std::map<int, std::vector<void*>> idle_events_;  // recycled per device
  MemoryStats stats_;
  CacheStats cache_;
};

}  // namespace mantissa::backend
