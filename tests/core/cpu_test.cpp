#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "mantissa/core/cpu.h"
#include "mantissa/core/device_info.h"

namespace mantissa {
namespace {

// What /proc/cpuinfo says, as a second opinion on our cpuid decoding (Linux only).
std::string cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) return line + " ";
  }
  return "";
}

TEST(Cpu, DetectionAgreesWithTheKernel) {
  const std::string flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo here";
  const CpuFeatures f = detect_cpu_features();
  auto has = [&](const char* name) {
    return flags.find(std::string(" ") + name + " ") != std::string::npos;
  };
  EXPECT_EQ(f.avx2, has("avx2"));
  EXPECT_EQ(f.f16c, has("f16c"));
  EXPECT_EQ(f.avx512f, has("avx512f"));
  EXPECT_EQ(f.avx512bw, has("avx512bw"));
  EXPECT_EQ(f.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(f.avx512_fp16, has("avx512_fp16"));
  EXPECT_FALSE(f.describe().empty());
}

TEST(Cuda, InfoIsAlwaysAvailable) {
  const CudaInfo& info = cuda_info();
  EXPECT_FALSE(info.status.empty());
  EXPECT_EQ(info.devices.size(), size_t(info.device_count));
  if (info.device_count == 0) {
    std::printf("no GPU here: %s\n", info.status.c_str());
  }
}

}  // namespace
}  // namespace mantissa
