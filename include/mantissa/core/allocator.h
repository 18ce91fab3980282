// Device memory with statistics. Every tensor byte comes from a device's Allocator, so the
// figures here are what benchmarks report as current and peak memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mantissa/core/device.h"

namespace mantissa {

struct MemoryStats {
  int64_t current_bytes = 0;      // bytes held by live allocations (as requested)
  int64_t peak_bytes = 0;         // the most current_bytes has been since the last reset_peak
  int64_t reserved_bytes = 0;     // bytes taken from the system: live blocks plus the cache
  int64_t live_allocations = 0;   // allocations not yet freed
  int64_t total_allocations = 0;  // allocations ever made
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Never returns null: throws mantissa::Error when the memory cannot be had. 64-byte aligned.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached free blocks to the system (current bytes are unaffected).
  virtual void empty_cache() = 0;
};

inline constexpr size_t kAllocAlignment = 64;

Allocator& allocator_for(Device d);
MemoryStats memory_stats(Device d = Device::cpu());
void reset_peak_memory(Device d = Device::cpu());
void empty_cache(Device d = Device::cpu());

}  // namespace mantissa
