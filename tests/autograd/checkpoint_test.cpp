#include <gtest/gtest.h>

#include <cmath>

#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/checkpoint.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

// A segment with a parameter captured inside, and dropout (random numbers must be replayed).
struct Block {
  Tensor w;
  Tensor operator()(const Tensor& x) const { return dropout(tanh(mul(x, w)), 0.2); }
};

TEST(Checkpoint, SameGradientsAsWithout) {
  auto run = [](bool use_checkpoint) {
    manual_seed(11);
    Tensor x = Tensor::normal({64}, 0, 1, 1).set_requires_grad(true);
    Tensor w1 = Tensor::normal({64}, 0, 1, 2).set_requires_grad(true);
    Tensor w2 = Tensor::normal({64}, 0, 1, 3).set_requires_grad(true);
    const Block b1{w1}, b2{w2};
    Tensor h = use_checkpoint ? autograd::checkpoint(b1, x) : b1(x);
    h = use_checkpoint ? autograd::checkpoint(b2, h) : b2(h);
    sum(mul(h, h)).backward();
    return std::vector<std::vector<float>>{h.to_vector<float>(), x.grad().to_vector<float>(),
                                           w1.grad().to_vector<float>(),
                                           w2.grad().to_vector<float>()};
  };
  const auto plain = run(false), ckpt = run(true);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_EQ(plain[i], ckpt[i]) << "tensor " << i;
}

// The recomputation runs in backward, after the autocast region has ended: it must run in the
// region's dtypes again (a GEMM in bf16, not fp32) for the gradients to be the forward's.
TEST(Checkpoint, ReplaysTheAutocastStateOfTheForward) {
  auto run = [](bool use_checkpoint) {
    Tensor x = Tensor::normal({16, 32}, 0, 1, 1).set_requires_grad(true);
    Tensor w = Tensor::normal({32, 32}, 0, 0.2, 2).set_requires_grad(true);
    auto seg = [w](const Tensor& in) { return tanh(linear(in, w)); };
    Tensor h;
    {
      amp::Autocast ac(DeviceType::CPU, DType::BF16);
      h = use_checkpoint ? autograd::checkpoint(seg, x) : seg(x);
    }
    EXPECT_EQ(h.dtype(), DType::BF16);
    sum(mul(h, h)).backward();
    return std::vector<std::vector<float>>{x.grad().to_vector<float>(),
                                           w.grad().to_vector<float>()};
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(Checkpoint, InputsWithoutGradStillReachParameters) {
  Tensor x = Tensor::normal({8}, 0, 1, 1);  // data: no grad
  Tensor w = Tensor::normal({8}, 0, 1, 2).set_requires_grad(true);
  Tensor y = autograd::checkpoint([w](const Tensor& in) { return mul(exp(in), w); }, x);
  EXPECT_TRUE(y.requires_grad());
  sum(y).backward();
  const auto g = w.grad().to_vector<float>(), xs = x.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_FLOAT_EQ(g[i], std::exp(xs[i]));
}

TEST(Checkpoint, LowersPeakMemoryOfADeepChain) {
  // 24 elementwise layers of 1M floats: without checkpointing every activation is kept.
  constexpr int kLayers = 24;
  auto run = [](bool use_checkpoint) {
    Tensor x = Tensor::normal({1 << 18}, 0, 1, 5).set_requires_grad(true);
    reset_peak_memory();
    const int64_t before = memory_stats().current_bytes;
    Tensor h = x;
    for (int i = 0; i < kLayers; i += 4) {
      auto seg = [](const Tensor& in) {
        Tensor t = in;
        for (int k = 0; k < 4; ++k)
          t = tanh(mul(t, 1.01));
        return t;
      };
      h = use_checkpoint ? autograd::checkpoint(seg, h) : seg(h);
    }
    sum(h).backward();
    return std::pair<int64_t, std::vector<float>>(memory_stats().peak_bytes - before,
                                                  x.grad().to_vector<float>());
  };
  const auto [plain_peak, plain_grad] = run(false);
  const auto [ckpt_peak, ckpt_grad] = run(true);
  std::printf("peak above start: %.1f MiB without, %.1f MiB with checkpointing\n",
              double(plain_peak) / (1 << 20), double(ckpt_peak) / (1 << 20));
  EXPECT_LT(double(ckpt_peak), 0.6 * double(plain_peak));
  EXPECT_EQ(plain_grad, ckpt_grad);
}

}  // namespace
}  // namespace mantissa
