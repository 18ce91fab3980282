// The CUDA device and pinned host allocators as tensors use them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda_test_util.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa {
namespace {

TEST(CudaAllocator, WithoutAGpuPinMemorySaysWhy) {
  if (cuda::is_available()) GTEST_SKIP() << "this machine has a GPU";
  const Tensor x = Tensor::ones({4});
  EXPECT_FALSE(x.is_pinned());
  try {
    x.pin_memory();
    FAIL() << "pin_memory without a GPU must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  EXPECT_THROW(memory_stats(Device::cuda()), Error);
  EXPECT_THROW(empty_cache(Device::cuda()), Error);
}

TEST(CudaAllocator, MemoryStatsFollowDeviceTensors) {
  MT_REQUIRE_CUDA();
  const MemoryStats before = memory_stats(Device::cuda());
  {
    const Tensor t = Tensor::empty({1000}, DType::F32, Device::cuda());
    const MemoryStats during = memory_stats(Device::cuda());
    EXPECT_EQ(during.current_bytes, before.current_bytes + 4000);
    EXPECT_EQ(during.live_allocations, before.live_allocations + 1);
    EXPECT_EQ(during.total_allocations, before.total_allocations + 1);
    EXPECT_GE(during.peak_bytes, during.current_bytes);
    EXPECT_GE(during.reserved_bytes, during.current_bytes);
    reset_peak_memory(Device::cuda());
    EXPECT_EQ(memory_stats(Device::cuda()).peak_bytes, during.current_bytes);
  }
  const MemoryStats after = memory_stats(Device::cuda());
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_EQ(after.live_allocations, before.live_allocations);
  EXPECT_EQ(memory_stats().current_bytes, memory_stats(Device::cpu()).current_bytes);
}

TEST(CudaAllocator, ASecondStepReusesTheFirstStepsBlocks) {
  MT_REQUIRE_CUDA();
  auto step = [] {
    std::vector<void*> ptrs;
    Tensor a = Tensor::empty({1 << 20}, DType::F32, Device::cuda());
    Tensor b = Tensor::empty({3000}, DType::BF16, Device::cuda());
    ptrs.push_back(a.data_ptr());
    ptrs.push_back(b.data_ptr());
    return ptrs;
  };
  const std::vector<void*> first = step();
  const int64_t reserved = memory_stats(Device::cuda()).reserved_bytes;
  EXPECT_EQ(step(), first);
  EXPECT_EQ(memory_stats(Device::cuda()).reserved_bytes, reserved);
}

TEST(CudaAllocator, EmptyCacheGivesIdleBlocksBack) {
  MT_REQUIRE_CUDA();
  cuda::synchronize();
  { const Tensor big = Tensor::empty({64 << 20}, DType::U8, Device::cuda()); }
  const int64_t cached = memory_stats(Device::cuda()).reserved_bytes;
  empty_cache(Device::cuda());
  EXPECT_LE(memory_stats(Device::cuda()).reserved_bytes, cached - (int64_t(64) << 20));
}

TEST(CudaAllocator, ABlockRecordedOnASideStreamIsReusedOnceThatStreamIsDone) {
  MT_REQUIRE_CUDA();
  cuda::Stream side = cuda::Stream::create();
  void* first = nullptr;
  {
    Tensor t = Tensor::zeros({12345}, DType::F32, Device::cuda());
    first = t.data_ptr();
    cuda::record_stream(t, side);
  }
  side.synchronize();  // the event recorded at the free is done now
  const Tensor again = Tensor::empty({12345}, DType::F32, Device::cuda());
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_THROW(cuda::record_stream(Tensor::ones({2}), side), Error);  // pageable host memory
}

TEST(CudaAllocator, OutOfMemorySaysHowMuchWasAsked) {
  MT_REQUIRE_CUDA();
  try {
    Tensor::empty({int64_t(1) << 42}, DType::U8, Device::cuda());  // 4 TiB
    FAIL() << "a 4 TiB allocation must fail";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(int64_t(1) << 42)), std::string::npos) << m;
    EXPECT_NE(m.find("MANTISSA_CUDA_CACHE_MB"), std::string::npos) << m;
  }
  const Tensor ok = Tensor::ones({4}, DType::F32, Device::cuda());  // the device still works
  EXPECT_EQ(ok.to_vector<float>(), std::vector<float>(4, 1.0f));
}

TEST(CudaAllocator, PinnedMemoryCopiesBothWaysWithoutBlocking) {
  MT_REQUIRE_CUDA();
  const Tensor x = Tensor::arange(24, DType::F32).reshape({4, 6});
  const Tensor p = x.pin_memory();
  EXPECT_TRUE(p.is_pinned());
  EXPECT_FALSE(x.is_pinned());
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_TRUE(p.pin_memory().is_same(p));
  EXPECT_EQ(p.to_vector<float>(), x.to_vector<float>());

  const Tensor xt = x.t();  // not contiguous: pinned as a contiguous copy
  const Tensor pt = xt.pin_memory();
  EXPECT_TRUE(pt.is_contiguous());
  EXPECT_EQ(pt.to_vector<float>(), xt.to_vector<float>());

  const Tensor d = p.to(Device::cuda(), /*non_blocking=*/true);
  Tensor back = Tensor::empty({4, 6}, DType::F32).pin_memory();
  const Tensor host = d.to(Device::cpu(), /*non_blocking=*/true);
  cuda::synchronize();
  EXPECT_EQ(host.to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(d.to_vector<float>(), x.to_vector<float>());
  cuda::record_stream(back, cuda::current_stream());  // pinned tensors can be recorded

  const Tensor ones = Tensor::ones({1000});
  const int64_t cpu_before = memory_stats(Device::cpu()).current_bytes;
  {
    const Tensor q = ones.pin_memory();  // from the pinned allocator, not the cpu one
    EXPECT_EQ(memory_stats(Device::cpu()).current_bytes, cpu_before);
  }
  EXPECT_THROW(d.pin_memory(), Error);  // only cpu tensors
}

}  // namespace
}  // namespace mantissa
