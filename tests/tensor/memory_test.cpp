// The allocator's statistics count every tensor byte: benchmarks report them.
#include <gtest/gtest.h>

#include "mantissa/autograd/checkpoint.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

TEST(Memory, KnownSequenceOfAllocations) {
  const MemoryStats start = memory_stats();
  reset_peak_memory();
  {
    Tensor a = Tensor::empty({1000}, DType::F32);  // 4000 bytes
    EXPECT_EQ(memory_stats().current_bytes - start.current_bytes, 4000);
    EXPECT_EQ(memory_stats().live_allocations - start.live_allocations, 1);
    {
      Tensor b = Tensor::empty({1000}, DType::BF16);  // 2000 bytes
      Tensor view = b.reshape({10, 100}).t();         // a view allocates nothing
      EXPECT_EQ(memory_stats().current_bytes - start.current_bytes, 6000);
    }
    EXPECT_EQ(memory_stats().current_bytes - start.current_bytes, 4000);
    Tensor c = Tensor::empty({250}, DType::F64);  // 2000 bytes
    EXPECT_EQ(memory_stats().peak_bytes - start.current_bytes, 6000);
    EXPECT_EQ(memory_stats().total_allocations - start.total_allocations, 3);
  }
  EXPECT_EQ(memory_stats().current_bytes, start.current_bytes);
  reset_peak_memory();
  EXPECT_EQ(memory_stats().peak_bytes, start.current_bytes);
}

TEST(Memory, EmptyCacheReturnsCachedBlocks) {
  empty_cache();
  const int64_t reserved = memory_stats().reserved_bytes;
  { Tensor big = Tensor::empty({1 << 20}, DType::F32); }  // 4 MiB: cached when freed
  EXPECT_GE(memory_stats().reserved_bytes, reserved + (4 << 20));
  empty_cache();
  EXPECT_EQ(memory_stats().reserved_bytes, reserved);
}

TEST(Memory, PeakOfAnOpIncludesItsTemporaries) {
  const Tensor x = Tensor::ones({1 << 16});  // 256 KiB
  reset_peak_memory();
  const int64_t before = memory_stats().current_bytes;
  {
    Tensor y = add(mul(x, 2.0), 1.0);  // one temporary + one result
    EXPECT_EQ(memory_stats().current_bytes - before, 1 << 18);
  }
  EXPECT_EQ(memory_stats().peak_bytes - before, 2 << 18);
}

// A deep MLP checkpointed in sqrt(depth)-sized segments (the classic choice): only the segment
// boundaries stay alive through the forward pass, and one segment is recomputed at a time.
TEST(Memory, CheckpointingADeepMlpLowersThePeak) {
  static constexpr int kDepth = 16, kSegment = 4, kWidth = 256,
                       kBatch = 2048;  // activations dominate
  std::vector<Tensor> weights, biases;
  for (int i = 0; i < kDepth; ++i) {
    weights.push_back(
        Tensor::normal({kWidth, kWidth}, 0, 0.06, uint64_t(i)).set_requires_grad(true));
    biases.push_back(Tensor::zeros({kWidth}).set_requires_grad(true));
  }
  const Tensor x = Tensor::normal({kBatch, kWidth}, 0, 1, 99);
  auto run = [&](bool use_checkpoint) {
    for (auto& w : weights)
      w.set_grad(Tensor());
    for (auto& b : biases)
      b.set_grad(Tensor());
    reset_peak_memory();
    const int64_t before = memory_stats().current_bytes;
    Tensor h = x;
    for (int s = 0; s < kDepth; s += kSegment) {
      auto segment = [&weights, &biases, s](const Tensor& in) {
        Tensor t = in;
        for (int i = s; i < s + kSegment; ++i) {
          t = gelu(linear(t, weights[size_t(i)], biases[size_t(i)]));
        }
        return t;
      };
      h = use_checkpoint ? autograd::checkpoint(segment, h) : segment(h);
    }
    sum(h).backward();
    return std::pair<int64_t, std::vector<float>>(memory_stats().peak_bytes - before,
                                                  weights[0].grad().to_vector<float>());
  };
  const auto [plain, plain_grad] = run(false);
  const auto [ckpt, ckpt_grad] = run(true);
  std::printf("deep MLP peak: %.2f MiB without checkpointing, %.2f MiB with (%.2fx)\n",
              double(plain) / (1 << 20), double(ckpt) / (1 << 20), double(ckpt) / double(plain));
  EXPECT_LT(double(ckpt), 0.5 * double(plain));
  EXPECT_EQ(plain_grad, ckpt_grad) << "recomputation gives the same gradients";
}

}  // namespace
}  // namespace mantissa
