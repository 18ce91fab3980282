// `mantissa info`: what this build and machine offer — the facts a benchmark note starts with.
#include <fmt/core.h>

#include "build_info.h"
#include "commands.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/device_info.h"

namespace mantissa::cli {

Command add_info_command(CLI::App& app) {
  app.add_subcommand("info", "Show the CPU features and GPUs Mantissa detects");
  return [] {
    const CpuFeatures hw = detect_cpu_features();
    const CpuFeatures& used = cpu_features();
    fmt::print("mantissa {}\n", version_number());
    fmt::print("cpu features: {}\n", hw.describe());
    if (used.describe() != hw.describe())
      fmt::print("cpu features used (MANTISSA_ISA): {}\n", used.describe());
    const CudaInfo& cuda = cuda_info();
    fmt::print("cuda backend: {}\n", cuda.compiled ? "compiled" : "not compiled");
    fmt::print("cuda devices: {} ({})\n", cuda.device_count, cuda.status);
    for (size_t i = 0; i < cuda.devices.size(); ++i)
      fmt::print("  cuda:{} {}\n", i, cuda.devices[i]);
    return 0;
  };
}

}  // namespace mantissa::cli
