// The Trainer's --device: parsing and refusals everywhere; on a GPU, agreement with the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cuda_test_util.h"
#include "harness/temp_dir.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/error.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

TrainConfig small(const std::string& device) {
  TrainConfig c;
  c.model = "cnn";
  c.set("data", "synthetic");
  c.synthetic_size = 512;
  c.batch_size = 64;
  c.eval_batch_size = 128;
  c.epochs = 2;
  c.lr = 0.05;
  c.seed = 3;
  c.threads = 2;
  c.workers = 2;
  c.progress = false;
  c.device = device;
  return c;
}

TEST(TrainDeviceTest, DeviceIsParsedAndStored) {
  for (const char* ok : {"cpu", "cuda", "cuda:0", "cuda:3"}) {
    TrainConfig c;
    c.device = ok;
    EXPECT_NO_THROW(c.validate()) << ok;
    EXPECT_EQ(TrainConfig::from_json(c.to_json()).device, ok);
  }
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""}) {
    TrainConfig c;
    c.device = bad;
    try {
      c.validate();
      ADD_FAILURE() << "'" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("--device"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find("cuda:N"), std::string::npos) << e.message();
    }
  }
  EXPECT_EQ(TrainConfig{}.device, "cpu");
  // Configurations written before the field existed still load (on the CPU).
  EXPECT_EQ(TrainConfig::from_json(R"({"model":"mlp"})").device, "cpu");
  EXPECT_EQ(require_device("cpu"), Device::cpu());
}

TEST(TrainDeviceTest, CudaWithoutAGpuIsRefusedInOneLine) {
  if (cuda::is_available()) GTEST_SKIP() << "this machine has a GPU";
  for (const char* device : {"cuda", "cuda:1"}) {
    try {
      Trainer t(small(device));
      ADD_FAILURE() << "a Trainer on " << device << " without a GPU";
    } catch (const Error& e) {
      const std::string m = e.message();
      EXPECT_EQ(m.rfind("no CUDA device: ", 0), 0u) << m;
      EXPECT_NE(m.find("; run with --device cpu"), std::string::npos) << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      EXPECT_FALSE(e.internal());
    }
  }
}

TEST(TrainDeviceTest, CpuSummaryNamesTheDevice) {
  TrainConfig c = small("cpu");
  c.max_steps = 3;
  Trainer t(c);
  EXPECT_EQ(t.device(), Device::cpu());
  const TrainResult r = t.fit();
  EXPECT_EQ(t.step_losses().size(), 3u);
  const auto j = nlohmann::json::parse(t.summary_json(r));
  EXPECT_EQ(j.at("device"), "cpu");
}

// ---- on a GPU ----------------------------------------------------------------------------------

class TrainCudaTest : public testing::TempDirTest {};

TEST_F(TrainCudaTest, ShortCnnRunAgreesWithTheCpu) {
  MT_REQUIRE_CUDA();
  TrainConfig c = small("cpu");
  c.max_steps = 12;
  Trainer cpu(c);
  const TrainResult rc = cpu.fit();
  c.device = "cuda";
  Trainer gpu(c);
  EXPECT_EQ(gpu.device(), Device::cuda(0));
  for (const Tensor& p : gpu.model().parameters())
    EXPECT_TRUE(p.device().is_cuda());
  const TrainResult rg = gpu.fit();
  ASSERT_EQ(gpu.step_losses().size(), cpu.step_losses().size());
  for (size_t i = 0; i < cpu.step_losses().size(); ++i) {
    const double want = cpu.step_losses()[i], got = gpu.step_losses()[i];
    // Same data, weights and order; only the kernels' summation orders differ.
    EXPECT_NEAR(got, want, 2e-3 + 1e-2 * std::abs(want)) << "step " << i + 1;
  }
  EXPECT_NEAR(rg.test.accuracy, rc.test.accuracy, 0.02);
  EXPECT_NEAR(rg.test.loss, rc.test.loss, 0.02 + 0.02 * rc.test.loss);
  EXPECT_EQ(nlohmann::json::parse(gpu.summary_json(rg)).at("device"), "cuda:0");
  EXPECT_GT(rg.peak_memory_bytes, 0) << "the device's peak";
}

TEST_F(TrainCudaTest, MetricsReadTheLossEveryLogInterval) {
  MT_REQUIRE_CUDA();
  TrainConfig c = small("cuda");
  c.log_every = 4;
  c.metrics_path = file("metrics.jsonl");
  Trainer t(c);
  const TrainResult r = t.fit();
  ASSERT_EQ(int64_t(t.step_losses().size()), r.steps);
  std::ifstream in(c.metrics_path);
  std::string line;
  int train = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("kind") != "train") continue;
    ++train;
    const int64_t step = j.at("step");
    EXPECT_EQ(step % 4, 0);
    EXPECT_EQ(j.at("loss").get<double>(), double(t.step_losses()[size_t(step - 1)]));
  }
  EXPECT_EQ(train, int(r.steps / 4));
  for (const float l : t.step_losses())
    EXPECT_TRUE(std::isfinite(l));
}

TEST_F(TrainCudaTest, CheckpointsMoveBetweenDevices) {
  MT_REQUIRE_CUDA();
  for (const char* precision : {"fp32", "fp16"}) {
    SCOPED_TRACE(precision);
    TrainConfig c = small("cuda");
    c.set("precision", precision);
    c.checkpoint_path = file(std::string(precision) + ".safetensors");
    Trainer gpu(c);
    const TrainResult first = gpu.fit(1);
    // Written from host copies; evaluated on the CPU and on the GPU.
    const EvalResult on_cpu = evaluate_checkpoint(c.checkpoint_path, {.device = "cpu"});
    const EvalResult on_gpu = evaluate_checkpoint(c.checkpoint_path, {.device = "cuda"});
    EXPECT_NEAR(on_cpu.accuracy, first.test.accuracy, 0.01);
    EXPECT_NEAR(on_gpu.accuracy, first.test.accuracy, 0.01);
    // Resumed on the GPU: the optimizer state and the scaler load onto the device.
    TrainConfig resumed = c;
    resumed.resume_path = c.checkpoint_path;
    resumed.checkpoint_path.clear();
    Trainer again(resumed);
    EXPECT_EQ(again.state().step, first.steps);
    const TrainResult rest = again.fit();
    EXPECT_EQ(rest.steps, 2 * first.steps);
    const TrainResult rest_gpu = gpu.fit();
    EXPECT_NEAR(rest.test.accuracy, rest_gpu.test.accuracy, 0.02);
  }
}

TEST_F(TrainCudaTest, Bf16RunsOnTheDevice) {
  MT_REQUIRE_CUDA();
  TrainConfig c = small("cuda");
  c.set("precision", "bf16");
  Trainer t(c);
  const TrainResult r = t.fit();
  EXPECT_GT(r.test.accuracy, 0.5) << "the synthetic classes are learnable";
}

}  // namespace
}  // namespace mantissa::train
