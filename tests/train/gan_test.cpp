// train_gan (train/gan.h): a few DC-GAN steps on the synthetic images in fp32, bf16 and fp16,
// with the records a run writes and the quality metrics at the end. Bounded in time: small
// batches, a handful of steps, a 512-image data set (the feature network trains 4 steps).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/nn/models.h"
#include "mantissa/train/gan.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

// The DC-GAN's own defaults (Adam at 2e-4, beta1 0.5, ...), then a small run.
TrainConfig small_gan(const std::string& precision) {
  TrainConfig c = defaults_for("dcgan");
  c.set("data", "synthetic");
  c.synthetic_size = 512;
  c.batch_size = 32;
  c.max_steps = 6;
  c.log_every = 2;
  c.set("precision", precision);
  c.seed = 3;
  // Two OpenMP threads on a loaded CI machine wait for each other (docs/training.md).
  c.threads = 1;
  c.workers = 0;
  return c;
}

struct RunRecords {
  GanResult result;
  std::vector<nlohmann::json> records;
};

RunRecords run(const TrainConfig& c) {
  RunRecords r;
  r.result = train_gan(
      c, [&](const std::string& text) { r.records.push_back(nlohmann::json::parse(text)); });
  return r;
}

void check_run(const RunRecords& r, const TrainConfig& c) {
  ASSERT_GE(r.records.size(), 5u);
  EXPECT_EQ(r.records.front()["kind"], "config");
  EXPECT_EQ(r.records.front()["config"]["lr"], 2e-4) << "the DC-GAN default";
  EXPECT_EQ(r.records.front()["config"]["beta1"], 0.5);
  EXPECT_EQ(r.records.back()["kind"], "summary");
  std::vector<double> loss_d;
  int evals = 0;
  for (const auto& j : r.records) {
    if (j["kind"] == "train") {
      loss_d.push_back(j["loss_d"]);
      EXPECT_DOUBLE_EQ(j["loss"].get<double>(),
                       j["loss_d"].get<double>() + j["loss_g"].get<double>());
      EXPECT_TRUE(j.contains("loss_scale") && j.contains("skipped_steps"));
    }
    if (j["kind"] == "eval") ++evals;
  }
  ASSERT_EQ(loss_d.size(), size_t(c.max_steps / c.log_every));
  EXPECT_NE(loss_d.front(), loss_d.back()) << "the discriminator's loss does not move";
  for (double l : loss_d)
    EXPECT_TRUE(std::isfinite(l));
  EXPECT_EQ(evals, 1);
  EXPECT_EQ(r.result.steps, c.max_steps);
  EXPECT_TRUE(std::isfinite(r.result.frechet_distance));
  EXPECT_GE(r.result.frechet_distance, 0.0);
  EXPECT_GE(r.result.ms_ssim, 0.0);
  EXPECT_LE(r.result.ms_ssim, 1.0);
  EXPECT_TRUE(std::isfinite(r.result.final_loss_d) && std::isfinite(r.result.final_loss_g));
  EXPECT_GT(r.result.peak_memory_bytes, 0);
}

TEST(Gan, TrainsInFp32) {
  const TrainConfig c = small_gan("fp32");
  check_run(run(c), c);
}

class GanFiles : public mantissa::testing::TempDirTest {};

TEST_F(GanFiles, TrainsInBf16AndTheFeatureNetworkIsCached) {
  TrainConfig c = small_gan("bf16");
  c.set("opt-level", "O2");
  c.metrics_path = file("metrics.jsonl");
  const RunRecords first = run(c);
  check_run(first, c);
  EXPECT_NE(first.records.back()["feature_network"].get<std::string>().find("saved"),
            std::string::npos);
  const RunRecords second = run(c);
  EXPECT_NE(second.records.back()["feature_network"].get<std::string>().find("loaded"),
            std::string::npos);
  EXPECT_EQ(first.result.frechet_distance, second.result.frechet_distance)
      << "the same seed and the same cached feature network give the same distance";
}

// --fd-feature-steps: the feature network trains that many steps, is cached under its own name
// (a study's quick network never stands in for a full one), and the records say which it is.
TEST_F(GanFiles, FeatureStepsTrainTheirOwnCachedNetwork) {
  TrainConfig c = small_gan("fp32");
  c.max_steps = 2;
  c.log_every = 1;
  c.metrics_path = file("metrics.jsonl");
  c.fd_feature_steps = 2;  // the 512 synthetic images are 4 steps of 128
  const RunRecords quick = run(c);
  EXPECT_NE(quick.records.front()["feature_network"].get<std::string>().find("2 steps"),
            std::string::npos)
      << quick.records.front()["feature_network"];
  EXPECT_NE(quick.records.back()["feature_network"].get<std::string>().find("saved"),
            std::string::npos);
  const std::string steps2 = file("fd_cnn_synthetic_512_steps2.safetensors");
  const std::string epoch = file("fd_cnn_synthetic_512.safetensors");
  EXPECT_TRUE(std::filesystem::exists(steps2));
  EXPECT_FALSE(std::filesystem::exists(epoch));

  c.fd_feature_steps = 0;
  const RunRecords full = run(c);
  EXPECT_NE(full.records.front()["feature_network"].get<std::string>().find("1 epoch"),
            std::string::npos);
  EXPECT_NE(full.records.back()["feature_network"].get<std::string>().find("saved"),
            std::string::npos)
      << "the 1-epoch network is trained, not the 2-step one loaded";
  EXPECT_NE(full.result.frechet_distance, quick.result.frechet_distance)
      << "two feature networks, two feature spaces";

  // A cache file that is not the network asked for is refused with what to do.
  std::filesystem::copy_file(steps2, epoch, std::filesystem::copy_options::overwrite_existing);
  try {
    run(c);
    ADD_FAILURE() << "a 2-step feature network was used as the 1-epoch one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("delete it"), std::string::npos) << e.what();
  }
}

TEST(Gan, Fp16HasADynamicLossScale) {
  TrainConfig c = small_gan("fp16");
  c.init_scale = 1024;
  const RunRecords r = run(c);
  check_run(r, c);
  EXPECT_GT(r.result.loss_scale, 1.0);
  EXPECT_LE(r.result.loss_scale, 2048.0);
}

TEST(Gan, RefusesWhatItDoesNotRun) {
  // fp8 (its Linear-layer recipe), gradient accumulation and data parallelism are not the GAN's:
  // each is refused by name before anything trains.
  TrainConfig c = small_gan("fp8");
  EXPECT_HAS(testing::error_of([&] { train_gan(c); }), "--precision fp8");
  c = small_gan("fp32");
  c.grad_accum = 2;
  EXPECT_HAS(testing::error_of([&] { train_gan(c); }), "--grad-accum 2: the GAN");
  c = small_gan("fp32");
  c.underflow_every = 1;
  c.set("precision", "fp16");
  EXPECT_HAS(testing::error_of([&] { train_gan(c); }), "--underflow-every 1: the GAN");
  c = small_gan("fp32");
  c.set("data", "text");
  c.data_path = "somewhere";
  EXPECT_HAS(testing::error_of([&] { train_gan(c); }), "trains on images");
  TrainConfig t;
  t.model = "dcgan_generator";
  t.set("data", "synthetic");
  EXPECT_HAS(testing::error_of([&] { Trainer trainer(t); }),
             "half of the DC-GAN; train the pair with --model dcgan");
  t.model = "cnn";
  EXPECT_HAS(testing::error_of([&] { train_gan(t); }), "model 'cnn' is not one");
}

// Each option the GAN takes is the one that runs, an explicit default included: SGD with
// momentum and a step schedule instead of the DC-GAN's constant Adam, in both networks.
TEST(Gan, HonoursTheOptimizerAndScheduleItIsGiven) {
  TrainConfig c = small_gan("fp32");
  c.set("optimizer", "sgd");
  c.lr = 0.05;  // TrainConfig's own default: given here, so it is what runs
  c.momentum = 0.5;
  c.set("schedule", "step");
  c.step_size = 2;
  c.gamma = 0.5;
  c.log_every = 1;
  const RunRecords r = run(c);
  EXPECT_EQ(r.records.front()["config"]["optimizer"], "sgd");
  EXPECT_EQ(r.records.front()["config"]["lr"], 0.05);
  std::vector<double> lrs;
  for (const auto& j : r.records)
    if (j["kind"] == "train") lrs.push_back(j["lr"]);
  ASSERT_EQ(lrs.size(), 6u);
  // Steps 1-2 at 0.05, 3-4 at 0.025, 5-6 at 0.0125 (the lr of step s is recorded after it).
  EXPECT_DOUBLE_EQ(lrs[0], 0.05);
  EXPECT_DOUBLE_EQ(lrs[2], 0.025);
  EXPECT_DOUBLE_EQ(lrs[5], 0.0125);
}

// Both networks, their optimizers and scalers are in the checkpoint: a GAN stopped after its
// first epoch and resumed takes the straight run's steps bit for bit.
class GanResume : public mantissa::testing::TempDirTest {};

TEST_F(GanResume, ResumesTheSecondEpochBitwise) {
  for (const char* precision : {"fp32", "fp16"}) {
    SCOPED_TRACE(precision);
    TrainConfig c = small_gan(precision);
    c.synthetic_size = 256;  // 8 steps of 32 an epoch
    c.max_steps = 0;
    c.epochs = 2;
    c.fd_feature_steps = 2;
    Trainer straight(c);
    straight.set_quiet(true);
    straight.fit();
    const std::vector<float> all = straight.step_losses();
    ASSERT_EQ(all.size(), 16u);

    TrainConfig first = c;
    first.checkpoint_path = file(std::string(precision) + ".safetensors");
    Trainer a(first);
    a.set_quiet(true);
    a.fit(/*max_epochs=*/1);
    TrainConfig resumed = c;
    resumed.resume_path = first.checkpoint_path;
    Trainer b(resumed);
    b.set_quiet(true);
    b.fit();
    const std::vector<float>& second = b.step_losses();
    ASSERT_EQ(second.size(), 8u);
    for (size_t i = 0; i < 8; ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(second[i]), std::bit_cast<uint32_t>(all[8 + i]))
          << "step " << 9 + i;
    const auto wa = straight.model().state_dict(), wb = b.model().state_dict();
    ASSERT_EQ(wa.size(), wb.size());
    for (size_t i = 0; i < wa.size(); ++i)
      EXPECT_EQ(wa[i].second.to_vector<double>(), wb[i].second.to_vector<double>()) << wa[i].first;
    const Checkpoint ckpt = load_checkpoint(first.checkpoint_path);
    bool discriminator = false;
    for (const auto& [name, t] : ckpt.model)
      discriminator |= name.starts_with("discriminator.");
    EXPECT_TRUE(discriminator) << "the discriminator's weights are in the checkpoint";
  }
}

TEST(Gan, ModelsHaveTheDcganShapes) {
  auto g = nn::make_model("dcgan_generator");
  auto d = nn::make_model("dcgan_discriminator");
  EXPECT_EQ(g->num_parameters(), 546177);
  EXPECT_EQ(d->num_parameters(), 138689);
  EXPECT_EQ(nn::model_input("dcgan_generator"), nn::ModelInput::Latent);
  const Tensor z = nn::example_input("dcgan_generator", {}, 4);
  ASSERT_EQ(z.shape(), Shape({4, nn::kDcganLatentDim}));
  const Tensor x = (*g)(z);
  ASSERT_EQ(x.shape(), Shape({4, 1, 28, 28}));
  for (float v : x.to_vector<float>())
    ASSERT_LT(std::fabs(v), 1.0f);
  EXPECT_EQ((*d)(x).shape(), Shape({4, 1}));
}

}  // namespace
}  // namespace mantissa::train
