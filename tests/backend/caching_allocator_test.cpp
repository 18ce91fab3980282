// The caching policy of the CUDA allocators, run on the CPU against a fake source of memory and
// events whose completion the tests decide.
#include "backend/caching_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "mantissa/core/error.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend {
namespace {

constexpr size_t KiB = 1024, MiB = KiB * 1024;

class FakeSource final : public BlockSource {
 public:
  struct Event {
    bool recorded = false;
    bool done = true;
    StreamId stream;
  };

  int64_t capacity = INT64_MAX;  // bytes the fake device has
  int64_t held = 0;
  int raw_allocations = 0, raw_frees = 0, failed_allocations = 0, waits = 0;
  int events_created = 0, events_destroyed = 0;
  std::vector<size_t> raw_sizes;
  std::map<void*, size_t> live;
  std::vector<std::unique_ptr<Event>> events;
  StreamId stream;

  ~FakeSource() override {
    for (auto& [p, n] : live)
      std::free(p);
  }

  void* allocate_raw(size_t bytes) override {
    if (held + int64_t(bytes) > capacity) {
      ++failed_allocations;
      return nullptr;
    }
    void* p = std::aligned_alloc(64, bytes);
    live[p] = bytes;
    held += int64_t(bytes);
    ++raw_allocations;
    raw_sizes.push_back(bytes);
    return p;
  }
  void free_raw(void* p) noexcept override {
    auto it = live.find(p);
    if (it == live.end()) std::abort();  // the policy freed something twice
    held -= int64_t(it->second);
    live.erase(it);
    std::free(p);
    ++raw_frees;
  }
  StreamId current_stream() override { return stream; }
  void* create_event(int) override {
    ++events_created;
    events.push_back(std::make_unique<Event>());
    return events.back().get();
  }
  void destroy_event(void*) noexcept override { ++events_destroyed; }
  void record_event(void* e, StreamId s) override {
    auto* ev = static_cast<Event*>(e);
    ev->recorded = true;
    ev->done = false;
    ev->stream = s;
  }
  bool event_done(void* e) override { return static_cast<Event*>(e)->done; }
  void wait_event(void* e) override {
    ++waits;
    static_cast<Event*>(e)->done = true;
  }
  std::string memory_info() override { return "the fake device has " + std::to_string(capacity); }

  // The work queued on `s` so far has finished.
  void complete(StreamId s) {
    for (auto& e : events) {
      if (e->recorded && e->stream == s) e->done = true;
    }
  }
  int unfinished_events() const {
    return int(std::count_if(events.begin(), events.end(),
                             [](const auto& e) { return e->recorded && !e->done; }));
  }
};

const StreamId kMain{reinterpret_cast<const void*>(0x10), 0};
const StreamId kSide{reinterpret_cast<const void*>(0x20), 0};

CachingAllocator::Options named(std::string name = "fake:0") {
  CachingAllocator::Options o;
  o.name = std::move(name);
  return o;
}

struct Fixture : ::testing::Test {
  FakeSource source;
  CachingAllocator alloc{source, named()};
  Fixture() { source.stream = kMain; }
};

TEST(CachingAllocatorSizes, SmallRequestsRoundTo512AndLargeOnesToEightClassesPerPowerOfTwo) {
  EXPECT_EQ(CachingAllocator::block_size(0), 512u);
  EXPECT_EQ(CachingAllocator::block_size(1), 512u);
  EXPECT_EQ(CachingAllocator::block_size(512), 512u);
  EXPECT_EQ(CachingAllocator::block_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::block_size(100 * KiB + 1), 100 * KiB + 512);
  EXPECT_EQ(CachingAllocator::block_size(MiB - 1), MiB);
  EXPECT_EQ(CachingAllocator::block_size(MiB), MiB);
  EXPECT_EQ(CachingAllocator::block_size(MiB + 1), MiB + 128 * KiB);
  EXPECT_EQ(CachingAllocator::block_size(3 * MiB), 3 * MiB);
  EXPECT_EQ(CachingAllocator::block_size(3 * MiB + 1), 3 * MiB + 256 * KiB);
  EXPECT_EQ(CachingAllocator::block_size(100 * MiB), 104 * MiB);  // 64 MiB + 5 * 8 MiB
  // Never more than 1/8 of slack above 1 MiB, and always a multiple of 512.
  for (size_t n = MiB; n < 64 * MiB; n = n * 9 / 8 + 4097) {
    const size_t b = CachingAllocator::block_size(n);
    EXPECT_GE(b, n);
    EXPECT_LE(b - n, n / 8) << n;
    EXPECT_EQ(b % 512, 0u);
  }
}

TEST_F(Fixture, RawAllocationsAreTheRoundedBlockSizes) {
  void* a = alloc.allocate(1000);
  void* b = alloc.allocate(3 * MiB + 1);
  EXPECT_EQ(source.raw_sizes, (std::vector<size_t>{1024, 3 * MiB + 256 * KiB}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kAllocAlignment, 0u);
  alloc.deallocate(a, 1000);
  alloc.deallocate(b, 3 * MiB + 1);
}

TEST_F(Fixture, ASecondIdenticalStepMakesNoRawAllocation) {
  const std::vector<size_t> sizes{4 * KiB, 1000, 2 * MiB, 2 * MiB, 300 * KiB, 1000};
  auto step = [&](size_t jitter) {
    std::vector<void*> ptrs;
    for (size_t s : sizes)
      ptrs.push_back(alloc.allocate(s - jitter));  // activations
    void* grad = alloc.allocate(2 * MiB);
    alloc.deallocate(grad, 2 * MiB);
    for (size_t i = ptrs.size(); i-- > 0;)
      alloc.deallocate(ptrs[i], sizes[i] - jitter);
  };
  step(0);
  const int raw = source.raw_allocations;
  EXPECT_EQ(raw, 7);  // the gradient is allocated while every activation is live
  step(0);
  step(8);  // slightly smaller sizes land in the same classes
  EXPECT_EQ(source.raw_allocations, raw);
  EXPECT_EQ(alloc.cache_stats().hits, 14);
  EXPECT_EQ(source.raw_frees, 0);
}

TEST_F(Fixture, FreedBlocksAreReusedOnlyOnTheirOwnStream) {
  void* a = alloc.allocate(8 * KiB);
  alloc.deallocate(a, 8 * KiB);
  source.stream = kSide;
  void* b = alloc.allocate(8 * KiB);
  EXPECT_NE(b, a);  // a belongs to the main stream's pool
  EXPECT_EQ(source.raw_allocations, 2);
  alloc.deallocate(b, 8 * KiB);
  void* c = alloc.allocate(8 * KiB);
  EXPECT_EQ(c, b);
  alloc.deallocate(c, 8 * KiB);
  source.stream = kMain;
  void* d = alloc.allocate(8 * KiB);
  EXPECT_EQ(d, a);
  alloc.deallocate(d, 8 * KiB);
  EXPECT_EQ(source.raw_allocations, 2);
  EXPECT_EQ(source.events_created, 0);  // same-stream reuse needs no event
}

TEST_F(Fixture, ABlockUsedOnAnotherStreamWaitsForThatStreamsEvent) {
  void* a = alloc.allocate(64 * KiB);
  alloc.record_stream(a, kMain);  // its own stream: nothing to wait for
  alloc.record_stream(a, kSide);
  alloc.record_stream(a, kSide);  // once is enough
  alloc.deallocate(a, 64 * KiB);
  ASSERT_EQ(source.events_created, 1);
  EXPECT_EQ(source.events[0]->stream, kSide);
  EXPECT_EQ(alloc.cache_stats().pending_blocks, 1);
  EXPECT_EQ(alloc.cache_stats().pending_bytes, int64_t(64 * KiB));
  EXPECT_EQ(alloc.cache_stats().cached_bytes, 0);

  void* b = alloc.allocate(64 * KiB);  // the side stream may still use a
  EXPECT_NE(b, a);
  alloc.deallocate(b, 64 * KiB);
  void* c = alloc.allocate(64 * KiB);
  EXPECT_EQ(c, b);
  alloc.deallocate(c, 64 * KiB);

  source.complete(kSide);
  void* d = alloc.allocate(64 * KiB);
  void* e = alloc.allocate(64 * KiB);
  EXPECT_TRUE((d == a && e == b) || (d == b && e == a));  // both blocks are free again
  EXPECT_EQ(source.raw_allocations, 2);
  EXPECT_EQ(alloc.cache_stats().pending_blocks, 0);
  alloc.deallocate(d, 64 * KiB);
  alloc.deallocate(e, 64 * KiB);

  // The event is recycled for the next such free; record_stream lasts one allocation only.
  void* f = alloc.allocate(64 * KiB);
  alloc.record_stream(f, kSide);
  alloc.deallocate(f, 64 * KiB);
  EXPECT_EQ(source.events_created, 1);
  EXPECT_EQ(source.unfinished_events(), 1);
  source.complete(kSide);
  void* g = alloc.allocate(64 * KiB);
  alloc.deallocate(g, 64 * KiB);
  EXPECT_EQ(source.unfinished_events(), 0);
  EXPECT_EQ(alloc.cache_stats().pending_blocks, 0);
}

TEST_F(Fixture, ABlockUsedOnTheMainStreamByASideStreamAllocationReturnsToTheSidePool) {
  source.stream = kSide;
  void* a = alloc.allocate(4 * KiB);
  alloc.record_stream(a, kMain);
  alloc.deallocate(a, 4 * KiB);
  source.complete(kMain);
  void* b = alloc.allocate(4 * KiB);
  EXPECT_EQ(b, a);
  alloc.deallocate(b, 4 * KiB);
}

TEST_F(Fixture, StatisticsCountRequestedBytesAndReservedCountsBlocks) {
  void* a = alloc.allocate(1000);     // block 1024
  void* b = alloc.allocate(2 * MiB);  // block 2 MiB
  MemoryStats s = alloc.stats();
  EXPECT_EQ(s.current_bytes, int64_t(1000 + 2 * MiB));
  EXPECT_EQ(s.peak_bytes, int64_t(1000 + 2 * MiB));
  EXPECT_EQ(s.reserved_bytes, int64_t(1024 + 2 * MiB));
  EXPECT_EQ(s.live_allocations, 2);
  EXPECT_EQ(s.total_allocations, 2);

  alloc.deallocate(b, 2 * MiB);
  void* c = alloc.allocate(600);  // block 1024, new
  s = alloc.stats();
  EXPECT_EQ(s.current_bytes, 1600);
  EXPECT_EQ(s.peak_bytes, int64_t(1000 + 2 * MiB));
  EXPECT_EQ(s.reserved_bytes, int64_t(2048 + 2 * MiB));  // b is cached, still reserved
  EXPECT_EQ(s.live_allocations, 2);
  EXPECT_EQ(s.total_allocations, 3);
  EXPECT_EQ(alloc.cache_stats().cached_bytes, int64_t(2 * MiB));

  alloc.reset_peak();
  EXPECT_EQ(alloc.stats().peak_bytes, 1600);
  void* d = alloc.allocate(2 * MiB - 100);  // from the cache
  EXPECT_EQ(alloc.stats().peak_bytes, int64_t(1600 + 2 * MiB - 100));
  EXPECT_EQ(alloc.cache_stats().hits, 1);
  alloc.deallocate(a, 1000);
  alloc.deallocate(c, 600);
  alloc.deallocate(d, 2 * MiB - 100);
  s = alloc.stats();
  EXPECT_EQ(s.current_bytes, 0);
  EXPECT_EQ(s.peak_bytes, int64_t(1600 + 2 * MiB - 100));
  EXPECT_EQ(s.live_allocations, 0);
  EXPECT_EQ(s.total_allocations, 4);
  EXPECT_EQ(s.reserved_bytes, int64_t(2048 + 2 * MiB));
  EXPECT_EQ(source.held, s.reserved_bytes);

  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes, 0);
  EXPECT_EQ(alloc.stats().current_bytes, 0);
  EXPECT_EQ(source.held, 0);
  EXPECT_EQ(source.raw_frees, 3);
}

TEST_F(Fixture, EmptyCacheReturnsIdleBlocksButKeepsThoseWaitingForEvents) {
  void* idle = alloc.allocate(MiB);
  void* used = alloc.allocate(MiB);
  void* pending = alloc.allocate(2 * MiB);
  alloc.record_stream(pending, kSide);
  alloc.deallocate(idle, MiB);
  alloc.deallocate(pending, 2 * MiB);
  alloc.empty_cache();
  EXPECT_EQ(source.raw_frees, 1);
  EXPECT_EQ(source.live.count(idle), 0u);
  EXPECT_EQ(source.live.count(pending), 1u);
  EXPECT_EQ(alloc.stats().reserved_bytes, int64_t(3 * MiB));
  EXPECT_EQ(source.waits, 0);  // empty_cache never blocks on a stream

  source.complete(kSide);
  alloc.empty_cache();
  EXPECT_EQ(source.live.count(pending), 0u);
  EXPECT_EQ(alloc.stats().reserved_bytes, int64_t(MiB));
  alloc.deallocate(used, MiB);
  alloc.empty_cache();
  EXPECT_EQ(source.held, 0);
  EXPECT_EQ(alloc.stats().reserved_bytes, 0);
}

TEST_F(Fixture, OutOfMemoryGivesTheCacheBackAndRetries) {
  source.capacity = 4 * MiB;
  void* a = alloc.allocate(MiB);
  void* b = alloc.allocate(MiB);
  alloc.record_stream(b, kSide);
  alloc.deallocate(a, MiB);
  alloc.deallocate(b, MiB);           // waits for the side stream
  void* c = alloc.allocate(3 * MiB);  // only 2 MiB left at the source
  EXPECT_EQ(source.failed_allocations, 1);
  EXPECT_EQ(source.waits, 1);  // the pending block's event was waited for, then freed
  EXPECT_EQ(source.raw_frees, 2);
  EXPECT_EQ(alloc.cache_stats().oom_retries, 1);
  EXPECT_EQ(alloc.stats().reserved_bytes, int64_t(3 * MiB));
  EXPECT_EQ(alloc.stats().current_bytes, int64_t(3 * MiB));
  alloc.deallocate(c, 3 * MiB);
}

TEST_F(Fixture, OutOfMemoryAfterTheRetrySaysHowMuchAndWhatToDo) {
  source.capacity = 4 * MiB;
  void* a = alloc.allocate(3 * MiB - 100);
  void* cached = alloc.allocate(512);
  alloc.deallocate(cached, 512);
  try {
    alloc.allocate(2 * MiB);
    FAIL() << "allocating past the capacity must throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory on fake:0"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(2 * MiB) + " bytes (2.00 MiB)"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(3 * MiB - 100) + " bytes"), std::string::npos) << m;  // in use
    EXPECT_NE(m.find("by 1 tensors"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(3 * MiB) + " bytes (3.00 MiB) reserved"), std::string::npos)
        << m;  // the cached 512 bytes were given back before the retry
    EXPECT_NE(m.find("the fake device has"), std::string::npos) << m;
    EXPECT_NE(m.find("smaller batch"), std::string::npos) << m;
  }
  EXPECT_EQ(source.failed_allocations, 2);
  EXPECT_EQ(source.live.count(cached), 0u);
  // Nothing changed for the allocations that were made.
  EXPECT_EQ(alloc.stats().live_allocations, 1);
  EXPECT_EQ(alloc.stats().current_bytes, int64_t(3 * MiB - 100));
  alloc.deallocate(a, 3 * MiB - 100);
  void* again = alloc.allocate(MiB);  // and it still works
  alloc.deallocate(again, MiB);
}

TEST(CachingAllocatorLimits, ACacheLimitSendsFreesPastItToTheSource) {
  FakeSource source;
  CachingAllocator::Options o = named();
  o.cache_limit = int64_t(MiB);
  CachingAllocator alloc(source, o);
  void* a = alloc.allocate(MiB);
  void* b = alloc.allocate(MiB);
  alloc.deallocate(a, MiB);
  alloc.deallocate(b, MiB);
  EXPECT_EQ(source.raw_frees, 1);
  EXPECT_EQ(alloc.cache_stats().cached_bytes, int64_t(MiB));
  EXPECT_EQ(alloc.stats().reserved_bytes, int64_t(MiB));
  EXPECT_THROW(alloc.allocate(size_t(1) << 62), Error);  // a size no device has, said so
}

TEST_F(Fixture, RecordStreamOfMemoryItDidNotAllocateIsAnError) {
  int x = 0;
  EXPECT_THROW(alloc.record_stream(&x, kSide), Error);
  void* a = alloc.allocate(100);
  EXPECT_TRUE(alloc.owns(a));
  alloc.deallocate(a, 100);
  EXPECT_THROW(alloc.record_stream(a, kSide), Error);  // freed already
}

TEST(CachingAllocatorThreads, ConcurrentAllocationsKeepExactStatistics) {
  FakeSource source;
  CachingAllocator alloc(source, named());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&alloc, t] {
      std::vector<std::pair<void*, size_t>> held;
      for (int i = 0; i < 2000; ++i) {
        const size_t n = size_t(512 * (1 + (i * 7 + t) % 13));
        held.emplace_back(alloc.allocate(n), n);
        if (held.size() > 8) {
          alloc.deallocate(held.front().first, held.front().second);
          held.erase(held.begin());
        }
      }
      for (auto& [p, n] : held)
        alloc.deallocate(p, n);
    });
  }
  for (auto& th : threads)
    th.join();
  const MemoryStats s = alloc.stats();
  EXPECT_EQ(s.current_bytes, 0);
  EXPECT_EQ(s.live_allocations, 0);
  EXPECT_EQ(s.total_allocations, 8000);
  EXPECT_EQ(s.reserved_bytes, source.held);
  EXPECT_LE(source.raw_allocations, 4 * 13 * 9);  // reuse, not one block per allocation
}

TEST(CachingAllocatorStorage, StorageFreesThroughTheAllocatorThatMadeIt) {
  FakeSource source;
  CachingAllocator alloc(source, named());
  {
    Storage s(3000, Device::cpu(), alloc);
    EXPECT_EQ(s.allocator, &alloc);
    EXPECT_TRUE(alloc.owns(s.data));
    EXPECT_EQ(alloc.stats().current_bytes, 3000);
  }
  EXPECT_EQ(alloc.stats().current_bytes, 0);
  EXPECT_EQ(alloc.stats().live_allocations, 0);
  Storage plain(16, Device::cpu());
  EXPECT_EQ(plain.allocator, &allocator_for(Device::cpu()));
  EXPECT_FALSE(Tensor::ones({3}).is_pinned());
}

}  // namespace
}  // namespace mantissa::backend
