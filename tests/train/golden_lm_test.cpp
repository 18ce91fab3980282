// gpt2_tiny and the LSTM language model against PyTorch: ten AdamW steps from Mantissa's own
// initial weights on fixed token batches (tests/data/golden/lm_<model>.safetensors, made by
// tools/reference/make_lm_golden.py with torch), with the Trainer's parameter groups (no decay on
// biases, norms and embeddings). fp32: every step's loss to 1e-5 relative, the final weights to
// 1e-5 relative over the model (each tensor: 2e-5, see below). bf16 autocast: the losses to
// bf16's precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "mantissa/autocast/autocast.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/trainer.h"

namespace mantissa {
namespace {

double norm_of(const Tensor& t) {
  double s = 0;
  for (double v : t.contiguous().to_vector<double>())
    s += v * v;
  return std::sqrt(s);
}

double rel(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

struct Golden {
  SafetensorsFile file;
  int64_t meta(const std::string& key) const { return std::stoll(file.metadata.at(key)); }
  double real(const std::string& key) const { return std::stod(file.metadata.at(key)); }
};

class GoldenLm : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    // One append at a time: g++ 12 at -O1 warns falsely on `string + "..." + ...` (-Warray-bounds).
    std::string path = MANTISSA_GOLDEN_DIR "/lm_";
    path += GetParam();
    path += ".safetensors";
    g_.file = load_safetensors(path);
    nn::ModelConfig c;
    c.seed = uint64_t(g_.meta("seed"));
    c.vocab_size = g_.meta("vocab_size");
    c.max_seq_len = g_.meta("context");
    model_ = nn::make_model(GetParam(), c);
    // Both sides start from these weights: a changed initialisation needs new golden files.
    for (const auto& [name, t] : model_->state_dict()) {
      ASSERT_LT(rel(norm_of(t), g_.file.at("init_norm." + name).item()), 1e-12)
          << name << ": the model's initial weights are not the ones the golden file was made "
          << "from; regenerate it (tools/reference/make_lm_golden.py)";
    }
  }

  // Ten steps on the file's batches; the loss of each.
  std::vector<double> train(DType autocast) {
    optim::AdamW opt(train::decay_groups(*model_, g_.real("weight_decay")),
                     {.lr = g_.real("lr"),
                      .beta1 = g_.real("beta1"),
                      .beta2 = g_.real("beta2"),
                      .eps = g_.real("eps"),
                      .weight_decay = g_.real("weight_decay")});
    const Tensor& xs = g_.file.at("batch_x");
    const Tensor& ys = g_.file.at("batch_y");
    std::vector<double> losses;
    for (int64_t s = 0; s < xs.size(0); ++s) {
      opt.zero_grad();
      Tensor logits;
      {
        amp::Autocast ac(DeviceType::CPU, DType::BF16, /*enabled=*/autocast == DType::BF16);
        logits = (*model_)(xs.select(0, s));
      }
      const Tensor loss = cross_entropy(logits.to(DType::F32).reshape({-1, logits.size(-1)}),
                                        ys.select(0, s).reshape({-1}));
      loss.backward();
      opt.step();
      losses.push_back(loss.item());
    }
    return losses;
  }

  Golden g_;
  std::shared_ptr<nn::Module> model_;
};

TEST_P(GoldenLm, Fp32StepsAndFinalWeightsMatchPyTorch) {
  const std::vector<double> mine = train(DType::F32);
  const std::vector<double> ref = g_.file.at("losses_fp32").to_vector<double>();
  ASSERT_EQ(mine.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_LT(rel(mine[i], ref[i]), 1e-5) << "step " << i << ": " << mine[i] << " vs " << ref[i];
  // The final weights: every tensor's L2 norm, and 64 of its elements at evenly spaced
  // positions, in relative L2 per tensor and over all tensors together. AdamW's m / sqrt(v)
  // amplifies the gradients' last-bit differences (the two sides sum in other orders, and compute
  // GELU and softmax with other roundings) in parameters whose gradients are small against their
  // spread: the worst tensor is the last block's norm1.bias (1.5e-5 measured), the model as a
  // whole agrees to a few 1e-7.
  double all_err = 0, all_norm = 0, worst = 0;
  for (const auto& [name, t] : model_->state_dict()) {
    EXPECT_LT(rel(norm_of(t), g_.file.at("final_norm." + name).item()), 1e-5) << name;
    const std::vector<int64_t> at = g_.file.at("final_index." + name).to_vector<int64_t>();
    const std::vector<double> want = g_.file.at("final_sample." + name).to_vector<double>();
    const std::vector<double> have = t.contiguous().to_vector<double>();
    // The key third of an attention's qkv bias has a zero true gradient (softmax ignores a
    // constant added to a row's scores): what it gets is rounding noise, which AdamW turns into
    // +-lr steps of either sign on either side.
    const bool key_bias = name.ends_with("attn.qkv.bias");
    const int64_t c = t.numel() / 3;
    double err = 0, norm = 0;
    for (size_t k = 0; k < at.size(); ++k) {
      if (key_bias && at[k] >= c && at[k] < 2 * c) continue;
      err += (have[size_t(at[k])] - want[k]) * (have[size_t(at[k])] - want[k]);
      norm += want[k] * want[k];
    }
    EXPECT_LE(std::sqrt(err), 2e-5 * std::sqrt(norm)) << name;
    worst = std::max(worst, std::sqrt(err / std::max(norm, 1e-300)));
    all_err += err;
    all_norm += norm;
  }
  EXPECT_LE(std::sqrt(all_err), 1e-5 * std::sqrt(all_norm));
  std::printf("final weights vs PyTorch: %.3g relative L2 over all tensors, %.3g the worst one\n",
              std::sqrt(all_err / all_norm), worst);
}

// Under bf16 autocast both run their GEMMs on bf16-rounded inputs with fp32 accumulation; which
// ops each keeps in fp32 differs a little (their autocast tables), so the losses agree to bf16's
// precision, not bit for bit.
TEST_P(GoldenLm, Bf16AutocastLossesMatchPyTorchToBf16Precision) {
  const std::vector<double> mine = train(DType::BF16);
  const std::vector<double> ref = g_.file.at("losses_bf16").to_vector<double>();
  ASSERT_EQ(mine.size(), ref.size());
  const double bf16_eps = 0x1p-7;
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_LT(rel(mine[i], ref[i]), bf16_eps)
        << "step " << i << ": " << mine[i] << " vs " << ref[i];
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenLm, testing::Values("gpt2_tiny", "lstm"),
                         [](const auto& p) { return std::string(p.param); });

}  // namespace
}  // namespace mantissa
