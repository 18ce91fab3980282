// `mantissa --version`. The build's facts come from mantissa_build_info.h, which
// cmake/build_info.cmake writes at build time; the machine's are detected at run time.
#include <fmt/core.h>

#include "build_info.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/device_info.h"
#include "mantissa_build_info.h"

namespace mantissa::cli {

const char* version_number() {
  return build::kVersion;
}

std::string version_text() {
  std::string s = fmt::format("mantissa {} (git {}, {} build, {})\n", build::kVersion,
                              build::kGitHash, build::kBuildType, build::kCompiler);
  const std::string hw = detect_cpu_features().describe(), used = cpu_features().describe();
  s += fmt::format("cpu features: {}\n", hw);
  if (used != hw) s += fmt::format("cpu features used (MANTISSA_ISA): {}\n", used);
  s += fmt::format("cuda:  {}\n", build::kCuda);
  s += fmt::format("cudnn: {}\n", build::kCudnn);
  s += fmt::format("nccl:  {}\n", build::kNccl);
  s += fmt::format("mpi:   {}\n", build::kMpi);
  const CudaInfo& cuda = cuda_info();
  s += fmt::format("gpus:  {} ({})", cuda.device_count, cuda.status);
  for (const std::string& d : cuda.devices)
    s += "\n  " + d;
  return s;
}

}  // namespace mantissa::cli
