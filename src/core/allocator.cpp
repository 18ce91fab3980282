#include "mantissa/core/allocator.h"

#include <atomic>
#include <cstdlib>
#include <new>

#include "mantissa/core/device.h"
#include "mantissa/core/error.h"

namespace mantissa {
namespace {

// Counts with atomics (tensors are freed from data-loader threads too); the peak is raised with
// a CAS loop so that it never misses a concurrent maximum.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    const size_t rounded = (bytes + kAllocAlignment - 1) / kAllocAlignment * kAllocAlignment;
    void* p = std::aligned_alloc(kAllocAlignment, rounded == 0 ? kAllocAlignment : rounded);
    MT_CHECK(p != nullptr, "out of host memory: could not allocate ", bytes, " bytes (",
             current_.load(), " bytes already in use); use a smaller batch or model");
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
    std::free(p);
    current_.fetch_sub(int64_t(bytes));
    live_.fetch_sub(1);
  }

  MemoryStats stats() const override {
    MemoryStats s;
    s.current_bytes = current_.load();
    s.peak_bytes = peak_.load();
    s.reserved_bytes = s.current_bytes;  // no cache: what is held is what is reserved
    s.live_allocations = live_.load();
    s.total_allocations = total_.load();
    return s;
  }

  void reset_peak() override { peak_.store(current_.load()); }

 private:
  std::atomic<int64_t> current_{0}, peak_{0}, live_{0}, total_{0};
};

}  // namespace

Allocator& allocator_for(Device d) {
  MT_CHECK(d.is_cpu(), "no allocator for device ", d.str(),
           ": this build has no CUDA backend yet; use the cpu device");
  static CpuAllocator* cpu = new CpuAllocator();  // never destroyed: tensors may outlive main
  return *cpu;
}

MemoryStats memory_stats(Device d) {
  return allocator_for(d).stats();
}
void reset_peak_memory(Device d) {
  allocator_for(d).reset_peak();
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

Device parse_device(const std::string& text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    const long idx = std::strtol(text.c_str() + 5, &end, 10);
    if (end != text.c_str() + 5 && *end == '\0' && idx >= 0) return Device::cuda(int(idx));
  }
  MT_CHECK(false, "unknown device '", text, "'; use cpu, cuda or cuda:N");
  return {};
}

}  // namespace mantissa
