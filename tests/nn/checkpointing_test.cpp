// Activation checkpointing of transformer blocks and LSTM layers: the loss and every parameter's
// gradient bit-identical with and without (dropout on, so the masks must be replayed), in fp32
// and under bf16 autocast, and less memory.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::nn {
namespace {

struct StepRun {
  std::vector<float> loss;
  std::vector<std::pair<std::string, std::vector<float>>> grads;
  int64_t peak = 0;  // bytes above the start of the step
};

// One training step's loss and gradients of `name` built with `mode`, the default generator at
// the same state before the forward (dropout draws from it).
StepRun step(const std::string& name, const ModelConfig& base, ActivationCheckpointing mode,
             std::optional<DType> autocast, int64_t batch, int64_t t) {
  ModelConfig c = base;
  c.activation_checkpointing = mode;
  auto model = make_model(name, c);
  model->train();
  const Tensor x = example_input(name, c, batch, t + 1, 3);
  const Tensor inputs = x.narrow(1, 0, t), targets = x.narrow(1, 1, t).contiguous();
  manual_seed(123);
  const int64_t before = memory_stats().current_bytes;
  reset_peak_memory();
  Tensor loss;
  {
    std::optional<amp::Autocast> ac;
    if (autocast) ac.emplace(DeviceType::CPU, *autocast);
    const Tensor logits = (*model)(inputs);
    loss = cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  }
  loss.backward();
  StepRun r;
  r.peak = memory_stats().peak_bytes - before;
  r.loss = loss.to(DType::F32).to_vector<float>();
  for (const auto& [n, p] : model->named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << n;
    r.grads.emplace_back(n, p.grad().to(DType::F32).contiguous().to_vector<float>());
  }
  return r;
}

void expect_identical(const StepRun& off, const StepRun& on) {
  EXPECT_EQ(off.loss, on.loss);
  ASSERT_EQ(off.grads.size(), on.grads.size());
  for (size_t i = 0; i < off.grads.size(); ++i) {
    EXPECT_EQ(off.grads[i].first, on.grads[i].first);
    EXPECT_TRUE(off.grads[i].second == on.grads[i].second) << off.grads[i].first;
  }
}

TEST(ActivationCheckpointing, BitIdenticalGradientsWithDropout) {
  const ModelConfig text{.vocab_size = 96, .max_seq_len = 32, .dropout = 0.1, .seed = 2};
  for (const char* name : {"gpt2_tiny", "lstm"}) {
    for (const std::optional<DType> ac : {std::optional<DType>(), std::optional(DType::BF16)}) {
      SCOPED_TRACE(std::string(name) + (ac ? " bf16 autocast" : " fp32"));
      const StepRun off = step(name, text, ActivationCheckpointing::Off, ac, 3, 31);
      const StepRun on = step(name, text, ActivationCheckpointing::PerBlock, ac, 3, 31);
      expect_identical(off, on);
    }
  }
}

TEST(ActivationCheckpointing, VitBlocksToo) {
  const ModelConfig c{.dropout = 0.1, .seed = 4};
  auto run = [&](ActivationCheckpointing mode) {
    ModelConfig m = c;
    m.activation_checkpointing = mode;
    auto model = make_model("vit", m);
    const Tensor x = example_input("vit", m, 4);
    const Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4});
    manual_seed(9);
    cross_entropy((*model)(x), y).backward();
    std::vector<std::vector<float>> g;
    for (const Tensor& p : model->parameters())
      g.push_back(p.grad().contiguous().to_vector<float>());
    return g;
  };
  EXPECT_TRUE(run(ActivationCheckpointing::Off) == run(ActivationCheckpointing::PerBlock));
}

// The blocks' activations dominate a small-vocabulary GPT: only their inputs are kept.
TEST(ActivationCheckpointing, LowersPeakMemory) {
  const ModelConfig c{.vocab_size = 64, .max_seq_len = 128, .seed = 2};
  const StepRun off = step("gpt2_tiny", c, ActivationCheckpointing::Off, {}, 4, 127);
  const StepRun on = step("gpt2_tiny", c, ActivationCheckpointing::PerBlock, {}, 4, 127);
  std::printf("gpt2_tiny B=4 T=127: peak %.1f MiB without, %.1f MiB with checkpointing\n",
              double(off.peak) / (1 << 20), double(on.peak) / (1 << 20));
  EXPECT_LT(double(on.peak), 0.6 * double(off.peak));
  expect_identical(off, on);
}

TEST(ActivationCheckpointing, SetOnModelsWithBlocksOnly) {
  auto gpt = make_model("gpt2_tiny");
  EXPECT_EQ(set_activation_checkpointing(*gpt, ActivationCheckpointing::PerBlock), 4);
  EXPECT_EQ(set_activation_checkpointing(*make_model("lstm"), ActivationCheckpointing::Off), 1);
  EXPECT_EQ(set_activation_checkpointing(*make_model("cnn"), ActivationCheckpointing::PerBlock), 0);
  EXPECT_THROW(make_model("cnn", {.activation_checkpointing = ActivationCheckpointing::PerBlock}),
               Error);
  // Without a graph (NoGrad, inference) there is nothing to recompute: the same forward.
  gpt->eval();
  const Tensor x = example_input("gpt2_tiny", {}, 2, 16, 5);
  NoGrad ng;
  const std::vector<float> with = (*gpt)(x).to_vector<float>();
  set_activation_checkpointing(*gpt, ActivationCheckpointing::Off);
  EXPECT_EQ((*gpt)(x).to_vector<float>(), with);
}

}  // namespace
}  // namespace mantissa::nn
