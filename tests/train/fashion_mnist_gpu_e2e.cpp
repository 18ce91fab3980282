// End to end on a GPU: `mantissa train`'s default run (cnn, Fashion-MNIST, 5 epochs) in fp32 and
// bf16 reaches the CPU's test accuracy: the mean of three GPU seeds within 0.5 percentage points
// of the CPU's run. One seed against one was too tight: on an H200 the seeds' own spread was
// 0.7 pp (fp32 seeds 1-3: 92.22, 91.54, 92.00 %; bf16: 91.91, 91.83, 92.03 %), and bf16 seed 0
// gave 91.58 % against the CPU's 92.14 %. Minutes of work (the CPU run included): a program of
// its own under the CTest label gpu_e2e, outside the default suite; it skips itself without a GPU
// or without the dataset.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "backend/cuda_test_util.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

TrainConfig fashion_mnist(const std::string& precision, const std::string& device) {
  TrainConfig c;  // the defaults of `mantissa train`
  c.set("precision", precision);
  c.device = device;
  c.workers = 4;
  c.progress = false;
  return c;
}

class FashionMnistGpuE2E : public testing::TestWithParam<const char*> {};

TEST_P(FashionMnistGpuE2E, ReachesTheCpuAccuracy) {
  MT_REQUIRE_CUDA();
  if (!std::filesystem::exists(std::filesystem::path(kDefaultFashionMnistDir) /
                               "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "no Fashion-MNIST in " << kDefaultFashionMnistDir;
  }
  const std::string precision = GetParam();
  const TrainResult cpu = Trainer(fashion_mnist(precision, "cpu")).fit();
  double mean = 0;
  for (uint64_t seed = 0; seed < 3; ++seed) {
    TrainConfig c = fashion_mnist(precision, "cuda");
    c.seed = seed;
    const TrainResult gpu = Trainer(c).fit();
    std::printf("%s: test accuracy cpu (seed 0) %.2f%% (%.1f s), cuda seed %d %.2f%% (%.1f s)\n",
                precision.c_str(), 100 * cpu.test.accuracy, cpu.train_seconds, int(seed),
                100 * gpu.test.accuracy, gpu.train_seconds);
    mean += gpu.test.accuracy / 3;
  }
  EXPECT_GE(mean, cpu.test.accuracy - 0.005);
  EXPECT_GT(cpu.test.accuracy, 0.88) << "the reference run itself learned";
}

INSTANTIATE_TEST_SUITE_P(Precisions, FashionMnistGpuE2E, testing::Values("fp32", "bf16"),
                         [](const auto& p) { return std::string(p.param); });

}  // namespace
}  // namespace mantissa::train
