// End to end on a GPU: `mantissa train`'s default run (cnn, Fashion-MNIST, 5 epochs) in fp32 and
// bf16 reaches the CPU's test accuracy of the same run within 0.3 percentage points. Minutes of
// work (the CPU runs included): a program of its own under the CTest label gpu_e2e, outside the
// default suite; it skips itself without a GPU or without the dataset.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "backend/cuda_test_util.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {
namespace {

TrainConfig fashion_mnist(const std::string& precision, const std::string& device) {
  TrainConfig c;  // the defaults of `mantissa train`
  c.precision = precision;
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
  const TrainResult gpu = Trainer(fashion_mnist(precision, "cuda")).fit();
  std::printf("%s: test accuracy cpu %.2f%% (%.1f s), cuda %.2f%% (%.1f s)\n", precision.c_str(),
              100 * cpu.test.accuracy, cpu.train_seconds, 100 * gpu.test.accuracy,
              gpu.train_seconds);
  EXPECT_GE(gpu.test.accuracy, cpu.test.accuracy - 0.003);
  EXPECT_GT(cpu.test.accuracy, 0.88) << "the reference run itself learned";
}

INSTANTIATE_TEST_SUITE_P(Precisions, FashionMnistGpuE2E, testing::Values("fp32", "bf16"));

}  // namespace
}  // namespace mantissa::train
