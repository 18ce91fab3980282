#include "mantissa/core/allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/bytes_text.h"
#include "core/cuda_allocator.h"
#include "mantissa/core/device.h"
#include "mantissa/core/error.h"

namespace mantissa {
namespace {

// Large blocks are cached and reused: a training step allocates the same sizes every step, and
// handing them back to the OS each time costs a page fault per 4 KiB on the next use (measured:
// ~15% of an MLP step). Sizes from 64 KiB up are rounded to one of 8 classes per power of two
// (at most 12.5% slack) and kept per class; smaller blocks go straight to malloc, which recycles
// them well. The statistics count requested bytes of live allocations (what tensors hold);
// reserved_bytes adds the slack and the cache.
// What helps, in the training CLI's terms (the library's users have the same levers).
constexpr const char* kHostAdvice =
    "Use a smaller batch (mantissa train --batch-size), recompute activations in backward "
    "(--checkpoint-activations), keep the weights in half precision (--opt-level O2), or a "
    "smaller model";

class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kCacheFrom = size_t(64) << 10;

  static size_t block_size(size_t bytes) {
    const size_t r =
        (std::max<size_t>(bytes, 1) + kAllocAlignment - 1) / kAllocAlignment * kAllocAlignment;
    if (r < kCacheFrom) return r;
    const int top = 63 - __builtin_clzll(r);  // r in [2^top, 2^(top+1))
    const size_t step = size_t(1) << (top - 3);
    return (r + step - 1) / step * step;
  }

  void* allocate(size_t bytes) override {
    const size_t block = block_size(bytes);
    void* p = nullptr;
    if (block >= kCacheFrom) {
      std::lock_guard lock(mutex_);
      auto it = cache_.find(block);
      if (it != cache_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= int64_t(block);
      }
    }
    if (p == nullptr) {
      p = std::aligned_alloc(kAllocAlignment, block);
      if (p == nullptr && block >= kCacheFrom) {
        empty_cache();  // give the cache back and try once more
        p = std::aligned_alloc(kAllocAlignment, block);
      }
      MT_CHECK(p != nullptr, "out of host memory: could not allocate ", with_unit(int64_t(bytes)),
               " for a tensor, with ", with_unit(current_.load()), " in use (peak ",
               with_unit(peak_.load()), "). ", kHostAdvice);
      held_ += int64_t(block);
    }
    const int64_t now = current_.fetch_add(int64_t(bytes)) + int64_t(bytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    live_.fetch_add(1);
    total_.fetch_add(1);
    return p;
  }

  void deallocate(void* p, size_t bytes) noexcept override {
    if (p == nullptr) return;
    const size_t block = block_size(bytes);
    current_.fetch_sub(int64_t(bytes));
    live_.fetch_sub(1);
    if (block >= kCacheFrom) {
      std::lock_guard lock(mutex_);
      if (cached_bytes_ + int64_t(block) <= cache_limit_) {
        try {
          cache_[block].push_back(p);
          cached_bytes_ += int64_t(block);
          return;
        } catch (...) {
          // no room to remember it: free it below
        }
      }
    }
    std::free(p);
    held_ -= int64_t(block);
  }

  MemoryStats stats() const override {
    MemoryStats s;
    s.current_bytes = current_.load();
    s.peak_bytes = peak_.load();
    s.reserved_bytes = held_.load();
    s.live_allocations = live_.load();
    s.total_allocations = total_.load();
    return s;
  }

  void reset_peak() override { peak_.store(current_.load()); }

  void empty_cache() override {
    std::lock_guard lock(mutex_);
    for (auto& [block, blocks] : cache_) {
      for (void* p : blocks) {
        std::free(p);
        held_ -= int64_t(block);
      }
    }
    cache_.clear();
    cached_bytes_ = 0;
  }

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, live_{0}, total_{0}, held_{0};
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> cache_;
  int64_t cached_bytes_ = 0;
  int64_t cache_limit_ = cache_limit_from_env();

  static int64_t cache_limit_from_env() {
    const char* env = std::getenv("MANTISSA_CPU_CACHE_MB");
    const long long mb = env ? std::atoll(env) : 4096;
    return int64_t(std::max(0LL, mb)) << 20;
  }
};

}  // namespace

Allocator& allocator_for(Device d) {
  if (d.is_cuda()) return detail::cuda_allocator(d.index);
  static CpuAllocator* cpu = new CpuAllocator();  // never destroyed: tensors may outlive main
  return *cpu;
}

MemoryStats memory_stats(Device d) {
  return allocator_for(d).stats();
}
void reset_peak_memory(Device d) {
  allocator_for(d).reset_peak();
}
void empty_cache(Device d) {
  allocator_for(d).empty_cache();
}

}  // namespace mantissa
