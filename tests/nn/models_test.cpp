// The reference models: the registry, published parameter counts, output shapes, determinism from
// the seed, causality of GPT, and a short real training run of the CNN.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::nn {
namespace {

std::vector<double> values(const Tensor& t) {
  return t.contiguous().to_vector<double>();
}

ModelConfig imagenet() {
  return {.num_classes = 1000, .in_channels = 3, .image_size = 224};
}

TEST(Models, RegistryListsEveryModelAndRejectsUnknownNames) {
  const std::vector<std::string> names = model_names();
  for (const char* n :
       {"mlp", "cnn", "resnet", "resnet_small", "resnet18", "resnet50", "vit", "vit_tiny",
        "vit_small", "vit_base", "gpt2", "gpt2_tiny", "lstm", "lstm_classifier"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  }
  try {
    make_model("resnet19");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("resnet19"), std::string::npos) << msg;
    EXPECT_NE(msg.find("resnet18, resnet50"), std::string::npos) << msg;
  }
  EXPECT_THROW(make_model("vit_tiny"), Error) << "28 is no multiple of the patch 16";
  EXPECT_EQ(model_input("gpt2"), ModelInput::Tokens);
  EXPECT_EQ(model_input("lstm_classifier"), ModelInput::Image);
}

TEST(Models, PublishedParameterCounts) {
  EXPECT_EQ(make_model("mlp")->num_parameters(), 235146);
  EXPECT_EQ(make_model("cnn")->num_parameters(), 455114);

  auto r18 = make_model("resnet18", imagenet());
  EXPECT_EQ(r18->num_parameters(), 11689512);
  // torchvision's names.
  const NamedTensors sd = r18->state_dict();
  EXPECT_EQ(sd.front().first, "conv1.weight");
  EXPECT_EQ(sd.back().first, "fc.bias");
  bool has_downsample = false;
  for (const auto& [name, t] : sd)
    has_downsample = has_downsample || name == "layer2.0.downsample.1.running_var";
  EXPECT_TRUE(has_downsample);
  EXPECT_EQ(r18->forward(Tensor::uniform({1, 3, 64, 64}, -1, 1, 1)).shape(), (Shape{1, 1000}));
  r18.reset();

  // Sizing needs no initial values (and GPT-2's 124M normal draws would dominate this file).
  init::NoInit skip;
  EXPECT_EQ(make_model("resnet50", imagenet())->num_parameters(), 25557032);
  EXPECT_EQ(make_model("vit_tiny", imagenet())->num_parameters(), 5717416);
  EXPECT_EQ(make_model("vit_small", imagenet())->num_parameters(), 22050664);
  EXPECT_EQ(make_model("vit_base", imagenet())->num_parameters(), 86567656);

  auto gpt2 = make_model("gpt2");
  EXPECT_EQ(gpt2->num_parameters(), 124439808);
  EXPECT_EQ(gpt2->state_dict().size(), gpt2->named_parameters().size() + 1) << "tied lm_head";
  for (const Tensor& p : gpt2->parameters())
    init::zeros_(p);
  const Tensor tokens = example_input("gpt2", {}, 1, 4);
  EXPECT_EQ(gpt2->forward(tokens).shape(), (Shape{1, 4, 50257}));
}

TEST(Models, NoInitSkipsOnlyRandomValues) {
  Tensor t = Tensor::full({4}, 3.0);
  {
    init::NoInit skip;
    { init::NoInit nested; }
    EXPECT_FALSE(init::random_init_enabled());
    init::normal_(t, 0, 1, 1);
    init::kaiming_uniform_(t.reshape({2, 2}), 1);
    EXPECT_EQ(values(t), std::vector<double>(4, 3.0));
    LayerNorm ln(3);
    EXPECT_EQ(values(ln.weight()), std::vector<double>(3, 1.0)) << "constants still run";
  }
  EXPECT_TRUE(init::random_init_enabled());
  init::normal_(t, 0, 1, 1);
  EXPECT_NE(values(t), std::vector<double>(4, 3.0));
}

// Every model on a small input: the logits' shape, finite values, and gradients reaching every
// parameter. (vit_small and vit_base are vit_tiny's class with other sizes; gpt2 is gpt2_tiny's.)
TEST(Models, ForwardShapesOfEveryModel) {
  struct Case {
    std::string name;
    ModelConfig config;
    Shape expected;
  };
  const ModelConfig small_rgb{.num_classes = 7, .in_channels = 3, .image_size = 32};
  const ModelConfig text{.vocab_size = 50, .max_seq_len = 12};
  const std::vector<Case> cases = {
      {"mlp", {}, {2, 10}},
      {"cnn", {.dropout = 0.3}, {2, 10}},
      {"resnet", {}, {2, 10}},
      {"resnet_small", small_rgb, {2, 7}},
      {"resnet50", {.num_classes = 5, .in_channels = 3, .image_size = 32}, {2, 5}},
      {"vit", {.dropout = 0.1}, {2, 10}},
      {"vit_tiny", small_rgb, {2, 7}},
      {"gpt2_tiny", text, {2, 12, 50}},
      {"lstm", text, {2, 12, 50}},
      {"lstm_classifier", {}, {2, 10}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto model = make_model(c.name, c.config);
    model->train();
    const Tensor x = example_input(c.name, c.config, 2, 12, 1);
    const Tensor y = model->forward(x);
    EXPECT_EQ(y.shape(), c.expected);
    EXPECT_EQ(y.dtype(), DType::F32);
    for (double v : values(y))
      ASSERT_TRUE(std::isfinite(v));
    sum(y).backward();
    for (const auto& [name, p] : model->named_parameters()) {
      EXPECT_TRUE(p.grad().defined()) << name;
    }
    model->eval();
    const Tensor e1 = model->forward(x), e2 = model->forward(x);
    EXPECT_EQ(values(e1), values(e2)) << "eval is deterministic";
  }
  // The LSTM classifier also takes (B, H, W).
  auto lc = make_model("lstm_classifier");
  EXPECT_EQ(lc->forward(Tensor::uniform({3, 28, 28}, 0, 1, 2)).shape(), (Shape{3, 10}));
  EXPECT_THROW(make_model("gpt2_tiny", text)->forward(Tensor::zeros({1, 13}, DType::I64)), Error);
  EXPECT_THROW(make_model("cnn")->forward(Tensor::zeros({1, 3, 28, 28})), Error);
}

// resnet* run channels-last on the CPU by default (ModelConfig::memory_format): the same logits
// and gradients as the row-major network, within f32 rounding (oneDNN's nhwc and blocked
// convolutions may sum in different orders; batch norm's statistics are merged differently).
TEST(Models, ResNetChannelsLastMatchesRowMajor) {
  for (const char* name : {"resnet", "resnet_small", "resnet18"}) {
    SCOPED_TRACE(name);
    ModelConfig cl{.in_channels = 3, .image_size = 32, .seed = 5};
    ModelConfig rm = cl;
    rm.memory_format = MemoryFormat::Contiguous;
    auto a = make_model(name, cl), b = make_model(name, rm);
    a->train();
    b->train();
    const Tensor x = example_input(name, cl, 4, 1, 6);
    const Tensor ya = a->forward(x), yb = b->forward(x);
    const std::vector<double> va = values(ya), vb = values(yb);
    ASSERT_EQ(va.size(), vb.size());
    for (size_t i = 0; i < va.size(); ++i)
      EXPECT_NEAR(va[i], vb[i], 1e-4 * (1 + std::abs(vb[i])));
    sum(mul(ya, ya)).backward();
    sum(mul(yb, yb)).backward();
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      const std::vector<double> ga = values(pa[i].second.grad()), gb = values(pb[i].second.grad());
      double scale = 0;
      for (double v : gb)
        scale = std::max(scale, std::abs(v));
      for (size_t j = 0; j < ga.size(); ++j)
        ASSERT_NEAR(ga[j], gb[j], 1e-3 * scale + 1e-6) << pa[i].first << "[" << j << "]";
    }
  }
}

TEST(Models, SameSeedSameModel) {
  for (const char* name : {"cnn", "vit", "gpt2_tiny", "lstm"}) {
    SCOPED_TRACE(name);
    const NamedTensors a = make_model(name, {.seed = 3})->state_dict();
    const NamedTensors b = make_model(name, {.seed = 3})->state_dict();
    const NamedTensors c = make_model(name, {.seed = 4})->state_dict();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(values(a[i].second), values(b[i].second)) << a[i].first;
    EXPECT_NE(values(a[0].second), values(c[0].second));
  }
}

TEST(Models, GptIsCausal) {
  auto model = make_model("gpt2_tiny", {.vocab_size = 20, .max_seq_len = 8});
  model->eval();
  std::vector<int64_t> ids = {1, 5, 3, 7, 2, 9};
  const Tensor a = model->forward(Tensor::from_vector(ids, {1, 6}));
  ids[4] = 11;
  const Tensor b = model->forward(Tensor::from_vector(ids, {1, 6}));
  EXPECT_EQ(values(a.narrow(1, 0, 4)), values(b.narrow(1, 0, 4)));
  EXPECT_NE(values(a.narrow(1, 4, 2)), values(b.narrow(1, 4, 2)));
}

// Ten classes, each a fixed random image, plus noise: linearly separable, so a few SGD steps of the
// real training loop must bring the loss well down.
TEST(Models, CnnTrainingReducesTheLoss) {
  manual_seed(0);
  auto model = make_model("cnn", {.dropout = 0.1, .seed = 1});
  model->train();
  const int64_t classes = 10, batch = 20;
  const Tensor templates = Tensor::uniform({classes, 1, 28, 28}, -1, 1, 11);
  std::vector<Tensor> params = model->parameters();
  const double lr = 0.05;
  std::vector<double> losses;
  for (int step = 0; step < 30; ++step) {
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < batch; ++i)
      labels.push_back((i * 7 + step * 3) % classes);
    const Tensor y = Tensor::from_vector(labels, {batch});
    const Tensor noise = Tensor::normal({batch, 1, 28, 28}, 0.0, 0.5, uint64_t(100 + step));
    const Tensor x = add(index_select(templates, 0, y), noise);

    for (Tensor& p : params)
      p.set_grad(Tensor());
    const Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    {
      NoGrad ng;
      for (Tensor& p : params)
        p.add_(p.grad(), -lr);
    }
    losses.push_back(loss.item());
  }
  const double first = (losses[0] + losses[1] + losses[2]) / 3;
  const double last = (losses[27] + losses[28] + losses[29]) / 3;
  EXPECT_NEAR(first, std::log(10.0), 0.6) << "starts near chance";
  EXPECT_LT(last, 0.3 * first) << "first " << first << ", last " << last;

  // And it generalises to fresh noise in eval mode.
  model->eval();
  std::vector<int64_t> labels(classes);
  for (int64_t i = 0; i < classes; ++i)
    labels[size_t(i)] = i;
  const Tensor y = Tensor::from_vector(labels, {classes});
  const Tensor x = add(templates, Tensor::normal({classes, 1, 28, 28}, 0.0, 0.5, 999));
  NoGrad ng;
  const Tensor pred = argmax(model->forward(x), 1);
  EXPECT_EQ(sum(eq(pred, y)).item(), double(classes));
}

}  // namespace
}  // namespace mantissa::nn
