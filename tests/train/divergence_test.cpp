// The divergence guard (src/train/divergence.h) and what the Trainer does with it
// (TrainConfig::on_divergence): stop, skip, rollback.
#include "train/divergence.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/nn/layers.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/optim/schedule.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/checkpoint.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

using mantissa::testing::error_of;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

StepOutcome step(int64_t n, float loss, bool skipped = false) {
  StepOutcome s;
  s.step = n;
  s.loss = loss;
  s.skipped = skipped;
  return s;
}

TEST(DivergenceGuard, AStepAppliedWithANonFiniteLossHasDiverged) {
  DivergenceGuard g(5);
  EXPECT_EQ(g.observe(step(1, 2.3f), false, false), "");
  const std::string why = g.observe(step(2, kNaN), false, false);
  EXPECT_HAS(why, "step 2");
  EXPECT_HAS(why, "NaN");
  EXPECT_HAS(why, "applied");
  DivergenceGuard h(5);
  EXPECT_HAS(h.observe(step(7, kInf), true, false), "inf");
}

TEST(DivergenceGuard, CountsOnlySkipsThatCannotHelp) {
  DivergenceGuard g(3);
  // A dynamic scale above its minimum backs off: as many skips as it takes.
  for (int64_t s = 1; s <= 50; ++s)
    EXPECT_EQ(g.observe(step(s, kNaN, true), true, false), "") << s;
  // At its minimum they count; a clean step starts the count again.
  EXPECT_EQ(g.observe(step(51, kNaN, true), true, true), "");
  EXPECT_EQ(g.observe(step(52, 1.0f, true), true, true), "");
  EXPECT_EQ(g.observe(step(53, 1.0f), true, true), "");
  EXPECT_EQ(g.observe(step(54, kNaN, true), true, true), "");
  EXPECT_EQ(g.observe(step(55, kNaN, true), true, true), "");
  const std::string why = g.observe(step(56, kNaN, true), true, true);
  EXPECT_HAS(why, "steps 54 to 56");
  EXPECT_HAS(why, "3 steps in a row");
  EXPECT_HAS(why, "minimum");
  // Without a dynamic scale (a static one, or --on-divergence skip's check) every skip counts.
  DivergenceGuard h(2);
  EXPECT_EQ(h.observe(step(1, 5.0f, true), false, false), "");
  const std::string stuck = h.observe(step(2, 5.0f, true), false, false);
  EXPECT_HAS(stuck, "steps 1 to 2");
  EXPECT_EQ(stuck.find("minimum"), std::string::npos) << stuck;
  // reset() forgets the count (after a rollback).
  DivergenceGuard r(2);
  EXPECT_EQ(r.observe(step(1, 5.0f, true), false, false), "");
  r.reset();
  EXPECT_EQ(r.observe(step(2, 5.0f, true), false, false), "");
  EXPECT_THROW(DivergenceGuard(0), Error);
}

// ---- the Trainer ------------------------------------------------------------------------------

class DivergenceTrainer : public testing::TempDirTest {
 protected:
  // 512 synthetic images in batches of 64: 8 steps an epoch; a checkpoint at each epoch's end.
  TrainConfig small(const std::string& on_divergence) {
    TrainConfig c;
    c.model = "mlp";
    c.set("data", "synthetic");
    c.synthetic_size = 512;
    c.batch_size = 64;
    c.eval_batch_size = 128;
    c.epochs = 3;
    c.lr = 0.05;
    c.seed = 3;
    c.threads = 1;
    c.workers = 1;
    c.progress = false;
    c.set("on-divergence", on_divergence);
    c.divergence_patience = 3;
    c.checkpoint_path = file("run.safetensors");
    return c;
  }
  // One weight of the first layer becomes NaN: every later loss is NaN, every gradient too.
  static void poison(Trainer& t) {
    Tensor w = t.model().parameters().front();
    w.narrow(0, 0, 1).fill_(double(kNaN));  // a view: the parameter's first row
  }
  static std::vector<std::vector<uint32_t>> bits_of(Trainer& t) {
    std::vector<std::vector<uint32_t>> out;
    for (const Tensor& p : t.model().parameters()) {
      std::vector<uint32_t> b;
      for (float v : p.to(DType::F32).to_vector<float>())
        b.push_back(std::bit_cast<uint32_t>(v));
      out.push_back(b);
    }
    return out;
  }
  static std::string file_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
};

TEST_F(DivergenceTrainer, StopStopsAtTheFirstNonFiniteLossAndWritesNothing) {
  Trainer t(small("stop"));
  ASSERT_EQ(t.fit(1).steps, 8);
  const std::string saved = file_bytes(file("run.safetensors"));
  poison(t);
  const TrainResult r = t.fit();
  EXPECT_HAS(r.diverged, "step 9: the loss is NaN");
  EXPECT_EQ(r.steps, 9);
  EXPECT_TRUE(r.epochs.empty()) << "a diverged epoch is neither evaluated nor reported";
  EXPECT_EQ(r.last_good_checkpoint, file("run.safetensors"));
  EXPECT_EQ(r.last_good_step, 8);
  EXPECT_EQ(file_bytes(file("run.safetensors")), saved) << "the last good checkpoint was kept";
}

TEST_F(DivergenceTrainer, RollbackReloadsTheLastCheckpointHalvesTheLearningRateAndGoesOn) {
  Trainer t(small("rollback"));
  ASSERT_EQ(t.fit(1).steps, 8);
  const double lr_before = t.optimizer().lr();
  poison(t);
  const TrainResult r = t.fit();
  EXPECT_EQ(r.diverged, "");
  EXPECT_EQ(r.rollbacks, 1);
  EXPECT_EQ(r.steps, 24) << "the rolled-back step is taken again, the run ends as planned";
  EXPECT_EQ(t.state().lr_scale, 0.5);
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_TRUE(std::isfinite(r.test.loss));
  EXPECT_GT(r.test.accuracy, 0.3);
  for (const auto& layer : bits_of(t))
    for (uint32_t b : layer)
      ASSERT_TRUE(std::isfinite(std::bit_cast<float>(b)));
  // The last step's rate: the cosine schedule's, halved.
  const optim::LRSchedule cosine = optim::LRSchedule::cosine(0.05, 0, 24);
  EXPECT_EQ(t.optimizer().lr(), cosine.lr_at(23) * 0.5);
  EXPECT_LT(t.optimizer().lr(), lr_before);
  // The factor is part of the state: a checkpoint keeps it, so a resumed run keeps it too.
  EXPECT_EQ(load_checkpoint(file("run.safetensors")).state.lr_scale, 0.5);
}

TEST_F(DivergenceTrainer, RollbackWithoutACheckpointYetStopsAndSaysSo) {
  TrainConfig c = small("rollback");
  Trainer t(c);
  poison(t);
  const TrainResult r = t.fit();
  EXPECT_HAS(r.diverged, "step 1");
  EXPECT_HAS(r.diverged, "no checkpoint had been written yet");
  EXPECT_EQ(r.last_good_checkpoint, "");
}

TEST_F(DivergenceTrainer, SkipAppliesNoStepWithNonFiniteGradientsAndStopsAfterThePatience) {
  Trainer t(small("skip"));
  ASSERT_EQ(t.fit(1).steps, 8);
  poison(t);
  const auto before = bits_of(t);
  const int64_t steps_before = t.optimizer().step_count();
  const TrainResult r = t.fit();
  EXPECT_HAS(r.diverged, "steps 9 to 11: 3 steps in a row skipped for inf/NaN gradients");
  EXPECT_EQ(r.steps, 11);
  EXPECT_EQ(r.skipped_steps, 3);
  EXPECT_EQ(t.optimizer().step_count(), steps_before) << "no skipped step was applied";
  EXPECT_EQ(bits_of(t), before) << "the weights are as they were, the one NaN included";
}

TEST_F(DivergenceTrainer, Fp16StopsOnceTheLossScaleIsStuckAtItsMinimum) {
  TrainConfig c = small("stop");
  c.set("precision", "fp16");
  c.init_scale = 4;  // backs off 4 -> 2 -> 1, the minimum: then the patience counts
  c.metrics_path = file("metrics.jsonl");
  Trainer t(c);
  ASSERT_EQ(t.fit(1).steps, 8);
  poison(t);
  const TrainResult r = t.fit();
  EXPECT_HAS(r.diverged,
             "3 steps in a row skipped for inf/NaN gradients with the loss scale at "
             "its minimum");
  // Step 9 backs off to 2, step 10 to 1 (counted: the scale is at its minimum), 11 and 12.
  EXPECT_HAS(r.diverged, "steps 10 to 12");
  EXPECT_EQ(r.steps, 12);
  EXPECT_EQ(r.loss_scale, 1.0);
  // Each skipped step's record names the parameters whose gradients overflowed, and the scale.
  std::ifstream in(c.metrics_path);
  std::vector<nlohmann::json> skips;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["kind"] == "skipped_step") skips.push_back(j);
  }
  ASSERT_EQ(skips.size(), 4u);
  EXPECT_EQ(skips[0]["step"], 9);
  EXPECT_EQ(skips[0]["loss_scale"], 4.0);
  EXPECT_EQ(skips[3]["loss_scale"], 1.0);
  // The NaN in the first Linear's weight reaches the weight gradients of the layers after it
  // through their inputs; ReLU's backward passes no NaN to the layers before (nor to 4.bias).
  const std::vector<std::string> names = skips[0]["nonfinite_gradients"];
  EXPECT_EQ(names, (std::vector<std::string>{"4.weight", "7.weight", "7.bias"}));
}

// --detect-anomaly on a planted overflow: fp16 weights without loss scaling, one MLP's second
// Linear given weights so large that its output overflows fp16. The report names that layer.
TEST_F(DivergenceTrainer, DetectAnomalyNamesTheLayerAPlantedFp16OverflowComesFrom) {
  TrainConfig c = small("stop");
  c.model = "gpt2_tiny";
  c.set("data", "synthetic-text");
  c.synthetic_size = 4096;
  c.seq_len = 32;
  c.batch_size = 8;
  c.epochs = 2;
  c.set("precision", "fp16");
  c.set("opt-level", "O2");
  c.set("loss-scale", "1");
  c.detect_anomaly = true;
  c.checkpoint_path.clear();
  Trainer t(c);
  EXPECT_GT(t.fit(1).steps, 0) << "a healthy epoch has nothing to report";
  nn::Linear* fc2 = nullptr;
  for (const auto& [path, m] : t.model().named_modules())
    if (path == "blocks.1.mlp.fc2") fc2 = dynamic_cast<nn::Linear*>(m);
  ASSERT_NE(fc2, nullptr);
  {
    NoGrad ng;
    fc2->weight().fill_(20000.0);
  }
  const std::string msg = error_of([&] { t.fit(); });
  const int64_t step = t.state().step + 1;
  EXPECT_HAS(msg, "anomaly at step " + std::to_string(step) +
                      ": linear (forward) in module 'blocks.1.mlp.fc2' (Linear) made inf");
  EXPECT_HAS(msg, "input 1 f16 (128, 512) |x| from 2e+04 to 2e+04");
}

TEST_F(DivergenceTrainer, BadSettingsAreRefusedBeforeTraining) {
  // A word of no vocabulary is refused where it is set, naming the words there are.
  EXPECT_HAS(error_of([&] { small("sometimes"); }),
             "unknown --on-divergence 'sometimes'; use stop: ");
  TrainConfig c = small("rollback");
  c.checkpoint_path.clear();
  EXPECT_HAS(error_of([&] { c.validate(); }),
             "--on-divergence rollback reloads the last "
             "checkpoint written: give --checkpoint FILE");
  c = small("stop");
  c.divergence_patience = 0;
  EXPECT_HAS(error_of([&] { c.validate(); }), "--divergence-patience must be positive, got 0");
}

}  // namespace
}  // namespace mantissa::train
