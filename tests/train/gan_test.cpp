// train_gan (train/gan.h): a few DC-GAN steps on the synthetic images in fp32, bf16 and fp16,
// with the records a run writes and the quality metrics at the end. Bounded in time: small
// batches, a handful of steps, a 512-image data set (the feature network trains 4 steps).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/temp_dir.h"
#include "mantissa/nn/models.h"
#include "mantissa/train/gan.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

TrainConfig small_gan(const std::string& precision) {
  TrainConfig c;
  c.model = "dcgan";
  c.data = "synthetic";
  c.synthetic_size = 512;
  c.batch_size = 32;
  c.max_steps = 6;
  c.log_every = 2;
  c.precision = precision;
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
  c.opt_level = "O2";
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
  TrainConfig c = small_gan("fp8");
  EXPECT_THROW(train_gan(c), Error);
  c = small_gan("fp32");
  c.checkpoint_path = "x.safetensors";
  EXPECT_THROW(train_gan(c), Error);
  TrainConfig t;
  t.model = "dcgan_generator";
  t.data = "synthetic";
  try {
    Trainer trainer(t);
    ADD_FAILURE() << "the Trainer built a GAN half";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train_gan"), std::string::npos) << e.what();
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
