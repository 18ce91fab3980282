// The device runtime as every build exposes it (mantissa/core/cuda.h).
#include <gtest/gtest.h>

#include "backend/cuda_test_util.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

TEST(CudaRuntime, WithoutAGpuEveryEntryPointSaysSo) {
  if (cuda::is_available()) GTEST_SKIP() << "this machine has a GPU";
  EXPECT_EQ(cuda::device_count(), 0);
  // A user asking for the cuda device gets an error naming the reason, never a crash.
  try {
    Tensor::zeros({2, 3}, DType::F32, Device::cuda());
    FAIL() << "allocating on cuda without a GPU must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor::ones({2}).to(Device::cuda()), Error);
  EXPECT_THROW(cuda::Stream::create(), Error);
  EXPECT_THROW(cuda::current_stream(), Error);
}

TEST(CudaRuntime, RoundTripThroughTheDevice) {
  MT_REQUIRE_CUDA();
  const Tensor x = Tensor::from_vector(std::vector<float>{1, -2, 3.5f, 0.25f}, {2, 2});
  const Tensor d = x.to(Device::cuda());
  EXPECT_TRUE(d.device().is_cuda());
  EXPECT_EQ(d.to(Device::cpu()).to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(d.to_vector<float>(), x.to_vector<float>());  // to_vector reads through the host
}

TEST(CudaRuntime, StreamsAndEventsOrderWork) {
  MT_REQUIRE_CUDA();
  cuda::Stream side = cuda::Stream::create();
  cuda::Event start(true), end(true);
  start.record(side);
  Tensor d;
  {
    cuda::StreamGuard guard(side);
    EXPECT_EQ(cuda::current_stream(), side);
    d = Tensor::ones({1 << 20}, DType::F32, Device::cuda());
  }
  end.record(side);
  end.wait(cuda::current_stream());
  end.synchronize();
  EXPECT_TRUE(end.query());
  EXPECT_GE(start.elapsed_ms(end), 0.0);
  EXPECT_FALSE(cuda::current_stream() == side);
  cuda::record_stream(d, side);
  EXPECT_EQ(sum(d).item(), double(1 << 20));
}

}  // namespace
}  // namespace mantissa
