// What this build of the CLI is: `mantissa --version` and the first line of `mantissa info`.
#pragma once

#include <string>

namespace mantissa::cli {

// "0.1.0", the project's version (CMakeLists.txt).
const char* version_number();

// `mantissa --version`: the version, git commit, build type and compiler; the CPU features
// detected now; whether CUDA, cuDNN, NCCL and MPI were built in, and the GPUs found now.
std::string version_text();

}  // namespace mantissa::cli
