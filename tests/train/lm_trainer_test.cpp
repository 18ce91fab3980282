// Language models through the Trainer: gpt2_tiny and the LSTM LM learn a synthetic token stream
// (validation loss and perplexity), gradient accumulation equals the big batch (fp32, and fp16 O2
// with the scaler: the same skipped steps and final scale), the decay groups leave biases, norms
// and embeddings alone, the run resumes bitwise, and a user's mistakes are named.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "harness/temp_dir.h"
#include "mantissa/core/error.h"
#include "mantissa/data/tokens.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

namespace fs = std::filesystem;

class LmTrainerTest : public testing::TempDirTest {
 protected:
  // A small run: gpt2_tiny over a seeded successor-table stream of 64 tokens, windows of 16.
  static TrainConfig small(const std::string& model = "gpt2_tiny") {
    TrainConfig c;
    c.model = model;
    c.set("data", "synthetic-text");
    c.synthetic_size = 40000;
    c.vocab_size = 64;
    c.seq_len = 16;
    c.batch_size = 16;
    c.eval_batch_size = 32;
    c.eval_batches = 4;
    c.set("optimizer", "adamw");
    c.lr = 3e-3;
    c.weight_decay = 0.1;
    c.warmup_steps = 5;
    c.epochs = 1;
    c.max_steps = 20;
    c.seed = 3;
    c.threads = 2;
    c.workers = 0;
    c.progress = false;
    return c;
  }
  // small() on the token shards at `path`: synthetic-text's size is not an option of theirs, and
  // their vocabulary is the shards'.
  static TrainConfig on_text(TrainConfig c, const std::string& path) {
    c.set("data", "text");
    c.synthetic_size = TrainConfig{}.synthetic_size;
    c.vocab_size = 0;
    c.data_path = path;
    return c;
  }
};

double rel(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

TEST_F(LmTrainerTest, GptAndLstmLearnTheStream) {
  for (const std::string model : {"gpt2_tiny", "lstm"}) {
    SCOPED_TRACE(model);
    TrainConfig c = small(model);
    c.max_steps = 60;
    Trainer t(c);
    ASSERT_TRUE(t.language_model());
    const EvalResult before = t.evaluate();
    // An untrained model is near uniform over the 64 tokens.
    EXPECT_NEAR(before.loss, std::log(64.0), 0.5);
    const TrainResult r = t.fit();
    EXPECT_EQ(r.steps, 60);
    // The validation stream: the last 5% of 40000 tokens, 2000, holds (2000 - 17) / 16 + 1 = 124
    // non-overlapping windows of 16 (+1): fewer than eval_batches * eval_batch_size = 128.
    EXPECT_EQ(r.test.samples, 124 * 16);
    EXPECT_LT(r.test.loss, before.loss - 1.0) << "the successor table is learnable";
    EXPECT_NEAR(r.test.perplexity(), std::exp(r.test.loss), 1e-9);
    EXPECT_EQ(t.step_losses().size(), 60u);
  }
}

// --grad-accum 4 --batch-size 16 sees exactly the examples of --batch-size 64 and sums the losses
// over all 4 micro-batches before dividing once: the same steps as the big batch, to fp32
// rounding (the sums add in another order).
TEST_F(LmTrainerTest, GradientAccumulationEqualsTheBigBatch) {
  TrainConfig big = small();
  big.batch_size = 64;
  TrainConfig acc = small();
  acc.batch_size = 16;
  acc.grad_accum = 4;
  Trainer a(big), b(acc);
  a.fit();
  b.fit();
  ASSERT_EQ(a.step_losses().size(), 20u);
  ASSERT_EQ(b.step_losses().size(), 20u);
  for (size_t i = 0; i < 20; ++i)
    EXPECT_LT(rel(b.step_losses()[i], a.step_losses()[i]), 1e-5) << "step " << i;
  // The weights, tensor by tensor, in relative L2. One slice is left out: the key third of each
  // attention's qkv bias. Its true gradient is exactly zero (adding b to every key adds q.b to
  // every score of a row, which softmax ignores), so what it gets is rounding noise, and AdamW's
  // m / sqrt(v) turns noise of either sign into a full +-lr step: the two runs' noise differs.
  const NamedTensors wa = a.model().state_dict(), wb = b.model().state_dict();
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    const std::string& name = wa[i].first;
    std::vector<double> x = wa[i].second.to_vector<double>();
    std::vector<double> y = wb[i].second.to_vector<double>();
    if (name.ends_with("attn.qkv.bias")) {
      const size_t c = x.size() / 3;
      x.erase(x.begin() + long(c), x.begin() + long(2 * c));
      y.erase(y.begin() + long(c), y.begin() + long(2 * c));
    }
    double err = 0, norm = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      err += (x[k] - y[k]) * (x[k] - y[k]);
      norm += x[k] * x[k];
    }
    EXPECT_LE(std::sqrt(err), 1e-5 * std::sqrt(norm)) << name;
  }
  EXPECT_EQ(a.evaluate().samples, b.evaluate().samples);
}

// Under fp16 O2 with dynamic loss scaling the accumulated step overflows exactly when the big
// one does: the same skipped steps, the same final scale.
TEST_F(LmTrainerTest, AccumulationUnderFp16KeepsTheScalersTrajectory) {
  TrainConfig big = small();
  big.set("precision", "fp16");
  big.set("opt-level", "O2");
  big.init_scale = 1u << 30;  // too high: the first steps overflow and back off
  TrainConfig acc = big;
  acc.batch_size = 4;
  acc.grad_accum = 4;
  Trainer a(big), b(acc);
  const TrainResult ra = a.fit(), rb = b.fit();
  EXPECT_GT(ra.skipped_steps, 0) << "65536 overflows at first: the test needs skipped steps";
  EXPECT_EQ(rb.skipped_steps, ra.skipped_steps);
  EXPECT_EQ(rb.loss_scale, ra.loss_scale);
  for (size_t i = 0; i < a.step_losses().size(); ++i)
    EXPECT_LT(rel(b.step_losses()[i], a.step_losses()[i]), 2e-3) << "step " << i;
}

// Token models decay weights only: biases, norm weights and the (tied) embedding are in a group
// without weight decay, as the usual transformer recipe; --decay all puts everything in one.
TEST_F(LmTrainerTest, NoDecayOnBiasesNormsAndEmbeddings) {
  Trainer t(small());
  const optim::Optimizer& opt = t.optimizer();
  ASSERT_EQ(opt.num_groups(), 2u);
  EXPECT_EQ(opt.group_name(1), "no_decay");
  std::vector<const TensorImpl*> no_decay;
  for (const Tensor& p : opt.group_params(1))
    no_decay.push_back(p.impl());
  auto exempt = [&](const std::string& name) {
    for (const auto& [n, p] : t.model().named_parameters()) {
      if (n == name) return std::find(no_decay.begin(), no_decay.end(), p.impl()) != no_decay.end();
    }
    ADD_FAILURE() << "no parameter " << name;
    return false;
  };
  EXPECT_TRUE(exempt("wte.weight"));
  EXPECT_TRUE(exempt("wpe.weight"));
  EXPECT_TRUE(exempt("blocks.0.norm1.weight"));
  EXPECT_TRUE(exempt("blocks.0.attn.qkv.bias"));
  EXPECT_FALSE(exempt("blocks.0.attn.qkv.weight"));
  EXPECT_FALSE(exempt("blocks.3.mlp.fc2.weight"));
  TrainConfig all = small();
  all.set("decay", "all");
  EXPECT_EQ(Trainer(all).optimizer().num_groups(), 1u);
}

// --checkpoint-activations recomputes each block in backward: the same losses and weights, bit for
// bit (dropout on, so the recomputation must replay the masks), in fp32, bf16 and fp8 (whose
// layers must recompute in fp8, with the scales of the first pass).
TEST_F(LmTrainerTest, ActivationCheckpointingChangesNoBit) {
  for (const std::string precision : {"fp32", "bf16", "fp8"}) {
    SCOPED_TRACE(precision);
    TrainConfig plain = small();
    plain.set("precision", precision);
    plain.dropout = 0.1;
    plain.max_steps = 6;
    TrainConfig recompute = plain;
    recompute.checkpoint_activations = true;
    // One after the other: a Trainer seeds the default generator when it is built, and the
    // dropout masks are drawn from it.
    Trainer a(plain);
    a.fit();
    Trainer b(recompute);
    b.fit();
    EXPECT_EQ(a.step_losses(), b.step_losses());
    const NamedTensors wa = a.model().state_dict(), wb = b.model().state_dict();
    for (size_t i = 0; i < wa.size(); ++i) {
      EXPECT_EQ(wa[i].second.to_vector<double>(), wb[i].second.to_vector<double>()) << wa[i].first;
    }
  }
  TrainConfig cnn = small("cnn");
  cnn.set("data", "synthetic");
  cnn.checkpoint_activations = true;
  EXPECT_THROW(Trainer{cnn}, Error) << "a model without blocks refuses it";
}

TEST_F(LmTrainerTest, ResumeWithAccumulationIsBitwise) {
  TrainConfig c = small();
  c.grad_accum = 2;
  c.batch_size = 8;
  c.max_steps = 0;
  c.epochs = 2;
  c.synthetic_size = 6000;
  Trainer straight(c);
  straight.fit();
  const int64_t per_epoch = straight.batches_per_epoch();
  ASSERT_GT(per_epoch, 2);

  TrainConfig first = c;
  first.checkpoint_path = file("lm.safetensors");
  Trainer a(first);
  a.fit(/*max_epochs=*/1);
  TrainConfig resumed = c;
  resumed.resume_path = first.checkpoint_path;
  Trainer b(resumed);
  b.fit();
  ASSERT_EQ(int64_t(b.step_losses().size()), per_epoch);
  for (int64_t i = 0; i < per_epoch; ++i) {
    EXPECT_EQ(b.step_losses()[size_t(i)], straight.step_losses()[size_t(per_epoch + i)])
        << "step " << per_epoch + i;
  }
}

TEST_F(LmTrainerTest, TextDataFromShardsOnDisk) {
  // A directory as `mantissa tokenize --out` writes it: train.bin and val.bin.
  const data::TokenDataset stream = data::synthetic_tokens(30000, 50, 9);
  const auto [train, val] = data::split_tokens(stream, 0.1);
  fs::create_directories(file("corpus"));
  data::write_token_shard(file("corpus/train.bin"), train.tokens, train.vocab_size);
  data::write_token_shard(file("corpus/val.bin"), val.tokens, train.vocab_size);
  TrainConfig c = on_text(small(), file("corpus"));
  c.max_steps = 5;
  Trainer t(c);
  const TrainResult r = t.fit();
  EXPECT_EQ(r.steps, 5);
  EXPECT_GT(r.test.samples, 0);
}

TEST_F(LmTrainerTest, MistakesAreNamed) {
  auto message = [](TrainConfig c) {
    try {
      Trainer t(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainConfig images = small();
  images.set("data", "fashion-mnist");
  EXPECT_NE(message(images).find("trains on tokens (--data text or synthetic-text), not --data "
                                 "fashion-mnist"),
            std::string::npos)
      << message(images);
  TrainConfig cnn = small("cnn");
  EXPECT_NE(message(cnn).find("trains on images"), std::string::npos);
  TrainConfig no_path = on_text(small(), "");
  EXPECT_NE(message(no_path).find("--data text needs --data-path"), std::string::npos);
  TrainConfig missing = on_text(small(), file("nowhere"));
  EXPECT_NE(message(missing).find("does not exist"), std::string::npos);
  TrainConfig long_window = small();
  long_window.synthetic_size = 300;
  long_window.seq_len = 64;
  EXPECT_NE(message(long_window).find("is longer than"), std::string::npos);
  TrainConfig accum = small();
  accum.grad_accum = 0;
  EXPECT_NE(message(accum).find("--grad-accum must be positive, got 0"), std::string::npos);
}

}  // namespace
}  // namespace mantissa::train
