// Opt levels: what amp::initialize does to the model, the optimizer and the scaler for each
// level and dtype (O2 keeps batch norm fp32, O3 casts everything, bf16 never scales), the forward
// pass of each level, fp16 gradients unscaled into fp32, fault injection in O2, misuse errors,
// and short training runs of every level against fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "mantissa/amp/amp.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/data/images.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {
namespace {

std::shared_ptr<nn::Module> small_cnn(uint64_t seed = 1) {
  nn::ModelConfig c;
  c.seed = seed;
  return nn::make_model("cnn", c);
}

std::unique_ptr<optim::SGD> sgd_for(nn::Module& m, double lr = 0.05) {
  optim::SGDOptions o;
  o.lr = lr;
  o.momentum = 0.9;
  return std::make_unique<optim::SGD>(m.parameters(), o);
}

// Every parameter and buffer dtype, by name.
std::map<std::string, DType> dtypes(const nn::Module& m) {
  std::map<std::string, DType> out;
  for (const auto& [name, t] : m.state_dict())
    out[name] = t.dtype();
  return out;
}

// Whether `name` belongs to a batch norm of model `m`.
bool in_batch_norm(nn::Module& m, const std::string& name) {
  for (const auto& [path, mod] : m.named_modules()) {
    if (!nn::is_batch_norm(*mod)) continue;
    if (name.rfind(path + ".", 0) == 0) return true;
  }
  return false;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.nbytes())) == 0;
}

// A batch of 8 random 28x28 images and the labels 0..7.
Tensor images8() {
  return Tensor::normal({8, 1, 28, 28}, 0, 1, 5, DType::F32);
}
Tensor labels8() {
  return Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
}

struct Case {
  OptLevel level;
  DType dtype;
};

class OptLevels : public ::testing::TestWithParam<Case> {};

TEST_P(OptLevels, ModelOptimizerAndScalerAreSetUpAsApexDefinesTheLevel) {
  const auto [level, half] = GetParam();
  auto model = small_cnn();
  NamedTensors before;
  for (const auto& [n, t] : model->state_dict())
    before.emplace_back(n, t.clone());
  auto opt = sgd_for(*model);
  Amp amp = initialize(*model, *opt, level, half);
  const AmpProperties& p = amp.properties();
  EXPECT_EQ(p.level, level);
  const bool cast = level == OptLevel::O2 || level == OptLevel::O3;
  EXPECT_EQ(p.autocast, level == OptLevel::O1);
  EXPECT_EQ(p.cast_model, cast);
  EXPECT_EQ(p.master_weights, level == OptLevel::O2);
  EXPECT_EQ(opt->master_weights(), level == OptLevel::O2);
  EXPECT_EQ(p.keep_batchnorm_fp32, level == OptLevel::O2);
  const bool scaled = half == DType::F16 && (level == OptLevel::O1 || level == OptLevel::O2);
  EXPECT_EQ(amp.scaler().options().mode, scaled ? ScaleMode::Dynamic : ScaleMode::Disabled);
  EXPECT_EQ(amp.scaler().get_scale(), scaled ? 65536.0 : 1.0);

  bool saw_bn = false, saw_other = false;
  for (const auto& [name, dt] : dtypes(*model)) {
    if (dt == DType::I64) continue;  // num_batches_tracked
    const bool bn = in_batch_norm(*model, name);
    saw_bn = saw_bn || bn;
    saw_other = saw_other || !bn;
    const DType expected = !cast || (bn && level == OptLevel::O2) ? DType::F32 : half;
    EXPECT_EQ(dt, expected) << name << " at " << name_of(level);
  }
  EXPECT_TRUE(saw_bn && saw_other);

  // O2's masters hold the fp32 values the model had before the cast.
  if (level == OptLevel::O2) {
    const std::vector<Tensor> params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      SCOPED_TRACE(i);
      ASSERT_TRUE(opt->master(i).defined());
    }
    size_t i = 0;
    for (const auto& [name, t] : model->named_parameters()) {
      const auto it = std::find_if(before.begin(), before.end(),
                                   [&](const auto& e) { return e.first == name; });
      ASSERT_NE(it, before.end());
      EXPECT_TRUE(same_bits(opt->master(i), it->second)) << name;
      ++i;
    }
  }

  // The forward pass: O2/O3 take fp32 inputs and give fp32 outputs; O1 lowers the GEMMs.
  const Tensor x = Tensor::normal({4, 1, 28, 28}, 0, 1, 5, DType::F32);
  const Tensor y = amp.forward(*model, x);
  EXPECT_EQ(y.dtype(), level == OptLevel::O1 ? half : DType::F32);
  EXPECT_EQ(y.shape(), Shape({4, 10}));
}

INSTANTIATE_TEST_SUITE_P(
    Levels, OptLevels,
    ::testing::Values(Case{OptLevel::O0, DType::F16}, Case{OptLevel::O1, DType::F16},
                      Case{OptLevel::O2, DType::F16}, Case{OptLevel::O3, DType::F16},
                      Case{OptLevel::O1, DType::BF16}, Case{OptLevel::O2, DType::BF16},
                      Case{OptLevel::O3, DType::BF16}),
    [](const auto& param_info) {
      return std::string(name_of(param_info.param.level)) +
             std::string(
                 param_info.param.level == OptLevel::O0 ? "" : dtype_name(param_info.param.dtype));
    });

TEST(Bf16Pure, Bf16WeightsNoMastersStochasticRoundingBatchNormFp32) {
  auto model = small_cnn();
  auto opt = sgd_for(*model);
  Amp amp = initialize(*model, *opt, OptLevel::O3, DType::BF16, bf16_pure_options(7));
  EXPECT_FALSE(opt->master_weights());
  EXPECT_EQ(opt->store_rounding(), RoundingMode::Stochastic);
  EXPECT_EQ(amp.scaler().options().mode, ScaleMode::Disabled);
  for (const auto& [name, dt] : dtypes(*model)) {
    if (dt == DType::I64) continue;
    EXPECT_EQ(dt, in_batch_norm(*model, name) ? DType::F32 : DType::BF16) << name;
  }
  EXPECT_NE(amp.describe().find("stochastic"), std::string::npos) << amp.describe();
}

TEST(AmpErrors, MisuseIsRefusedWithAMessage) {
  auto expect_error = [](auto&& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
    }
  };
  {
    auto model = small_cnn();
    auto opt = sgd_for(*model);
    AmpOptions o;
    o.keep_batchnorm_fp32 = true;
    expect_error([&] { initialize(*model, *opt, OptLevel::O1, DType::F16, o); },
                 "keep_batchnorm_fp32");
    AmpOptions r;
    r.rounding = RoundingMode::Stochastic;
    expect_error([&] { initialize(*model, *opt, OptLevel::O1, DType::BF16, r); }, "fp32");
    expect_error([&] { initialize(*model, *opt, OptLevel::O2, DType::F32); }, "f16 or bf16");
    expect_error([&] { initialize(*model, *opt, OptLevel::O2, DType::FP8_E4M3); }, "f16 or bf16");
    AmpOptions bad_scale;
    bad_scale.loss_scale = -1;
    expect_error([&] { initialize(*model, *opt, OptLevel::O2, DType::F16, bad_scale); },
                 "loss scale");
  }
  {
    auto model = small_cnn();
    auto opt = sgd_for(*model);
    model->to(DType::BF16);
    expect_error([&] { initialize(*model, *opt, OptLevel::O2, DType::F16); }, "fp32 model");
  }
  EXPECT_EQ(find_word<OptLevel>("O2"), OptLevel::O2);
  EXPECT_FALSE(find_word<OptLevel>("o4").has_value());
}

// fp16 O2: the half parameters' gradients are f16; unscale_ replaces them by f32 ones, so a
// gradient below fp16's smallest subnormal (2^-24) survives the division by the scale.
TEST(AmpGradients, Fp16GradientsAreUnscaledIntoFp32) {
  auto model = small_cnn();
  auto opt = sgd_for(*model);
  Amp amp = initialize(*model, *opt, OptLevel::O2, DType::F16);
  const Tensor x = images8();
  const Tensor target = labels8();
  const Tensor loss = cross_entropy(amp.forward(*model, x), target);
  EXPECT_EQ(loss.dtype(), DType::F32);
  amp.scaler().scale(loss).backward();
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), p.dtype()) << name;  // gradients flow in the forward dtype
  }
  // Plant a value that is representable only after the unscale is done in fp32.
  const Tensor w = model->parameters()[0];
  {
    NoGrad ng;
    Tensor g = w.grad();
    g.flatten().narrow(0, 0, 1).fill_(0x1p-14);  // 2^-14 / 2^16 = 2^-30 < 2^-24
  }
  amp.scaler().unscale_(*opt);
  for (const auto& [name, p] : model->named_parameters())
    EXPECT_EQ(p.grad().dtype(), DType::F32) << name;
  EXPECT_EQ(w.grad().flatten().narrow(0, 0, 1).item(), 0x1p-30);
  EXPECT_FALSE(amp.scaler().step(*opt).skipped());
  amp.scaler().update();
}

// An inf in one half gradient at O2: the step is skipped, parameters, masters and momentum are
// bit-identical, the scale backs off, and the next step trains.
TEST(AmpGradients, OverflowAtO2SkipsTheStepBitIdentically) {
  auto model = small_cnn();
  auto opt = sgd_for(*model);
  Amp amp = initialize(*model, *opt, OptLevel::O2, DType::F16);
  const Tensor x = images8();
  const Tensor target = labels8();
  auto step = [&](bool poison) {
    opt->zero_grad();
    amp.scaler().scale(cross_entropy(amp.forward(*model, x), target)).backward();
    if (poison) {
      NoGrad ng;
      model->parameters()[2].grad().flatten().narrow(0, 3, 1).fill_(
          std::numeric_limits<double>::infinity());
    }
    const bool skipped = amp.scaler().step(*opt).skipped();
    amp.scaler().update();
    return skipped;
  };
  EXPECT_FALSE(step(false));
  const NamedTensors params_before = [&] {
    NamedTensors out;
    for (const auto& [n, t] : model->named_parameters())
      out.emplace_back(n, t.clone());
    return out;
  }();
  const NamedTensors opt_before = opt->state_dict();
  const double scale = amp.scaler().get_scale();
  EXPECT_TRUE(step(true));
  // (Batch norm's running statistics do move: the forward pass ran, as in PyTorch.)
  const NamedTensors params_after = model->named_parameters();
  for (size_t i = 0; i < params_before.size(); ++i) {
    EXPECT_TRUE(same_bits(params_before[i].second, params_after[i].second))
        << params_before[i].first;
  }
  const NamedTensors opt_after = opt->state_dict();
  ASSERT_EQ(opt_before.size(), opt_after.size());
  for (size_t i = 0; i < opt_before.size(); ++i)
    EXPECT_TRUE(same_bits(opt_before[i].second, opt_after[i].second)) << opt_before[i].first;
  EXPECT_EQ(amp.scaler().get_scale(), scale / 2);
  EXPECT_FALSE(step(false));
}

// Every level trains a small cnn on synthetic images as well as fp32 does (same data, same
// initial weights, 30 SGD steps): the mean loss of the last 10 within a margin of fp32's.
// A module of several inputs and outputs through the opt levels: each floating input cast to the
// level's dtype (O2/O3), each output back to fp32, integer inputs untouched.
TEST(AmpForward, ListsOfInputsAndOutputs) {
  auto lstm = std::make_shared<nn::LSTM>(3, 4, 1, 5);
  auto reference = std::make_shared<nn::LSTM>(3, 4, 1, 5);
  optim::SGD opt(lstm->parameters(), {.lr = 0.1});
  const Amp amp = initialize(*lstm, opt, OptLevel::O2, DType::BF16);
  const Tensor x = Tensor::uniform({2, 6, 3}, -1, 1, 8);
  const Tensor h0 = Tensor::uniform({1, 2, 4}, -1, 1, 9), c0 = Tensor::zeros({1, 2, 4});
  NoGrad ng;
  const nn::TensorList out = amp.forward(*lstm, {x, h0, c0});
  ASSERT_EQ(out.size(), 3u);
  reference->to(DType::BF16);
  const nn::TensorList ref =
      reference->forward_list({x.to(DType::BF16), h0.to(DType::BF16), c0.to(DType::BF16)});
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].dtype(), DType::F32) << "output " << i;
    EXPECT_EQ(out[i].to_vector<float>(), ref[i].to(DType::F32).to_vector<float>()) << i;
  }
}

TEST(AmpTraining, EveryLevelTrainsLikeFp32) {
  const data::ImageDataset ds = data::synthetic_images(512, 1, 28, 10, 3);
  auto train = [&](OptLevel level, DType half, const AmpOptions& options) {
    auto model = small_cnn(4);
    auto opt = sgd_for(*model, 0.002);
    Amp amp = initialize(*model, *opt, level, half, options);
    double last = 0;
    for (int step = 0; step < 30; ++step) {
      const int64_t start = (step * 64) % 512;
      const Tensor x = ds.images().narrow(0, start, 64).to(DType::F32);
      const Tensor y = ds.labels().narrow(0, start, 64);
      opt->zero_grad();
      const Tensor loss = cross_entropy(amp.forward(*model, x), y);
      amp.scaler().scale(loss).backward();
      amp.scaler().step(*opt);
      amp.scaler().update();
      if (step >= 20) last += loss.item() / 10;
    }
    return last;
  };
  const double fp32 = train(OptLevel::O0, DType::F32, {});
  EXPECT_LT(fp32, 1.0);  // it learns
  struct Run {
    const char* name;
    OptLevel level;
    DType dtype;
    AmpOptions options;
  };
  AmpOptions sr;
  sr.rounding = RoundingMode::Stochastic;
  const std::vector<Run> runs = {{"fp16 O1", OptLevel::O1, DType::F16, {}},
                                 {"bf16 O1", OptLevel::O1, DType::BF16, {}},
                                 {"fp16 O2", OptLevel::O2, DType::F16, {}},
                                 {"bf16 O2", OptLevel::O2, DType::BF16, {}},
                                 {"bf16 O2 stochastic", OptLevel::O2, DType::BF16, sr},
                                 {"bf16-pure", OptLevel::O3, DType::BF16, bf16_pure_options(1)}};
  for (const Run& r : runs) {
    const double loss = train(r.level, r.dtype, r.options);
    std::printf("%-20s final loss %.4f (fp32 %.4f)\n", r.name, loss, fp32);
    EXPECT_NEAR(loss, fp32, 0.005 + 0.02 * fp32) << r.name << " (fp32 " << fp32 << ")";
  }
  // The contrast that shows the margin means something: bf16 weights rounded to nearest without
  // a master lose the small updates of this learning rate and fall behind.
  const double o3 = train(OptLevel::O3, DType::BF16, {});
  std::printf("%-20s final loss %.4f (fp32 %.4f)\n", "bf16 O3 nearest", o3, fp32);
  EXPECT_GT(o3, fp32 + 0.005 + 0.02 * fp32);
}

}  // namespace
}  // namespace mantissa::amp
