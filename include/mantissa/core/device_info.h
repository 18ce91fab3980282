// What accelerators this build and this machine offer. Tests that need a GPU ask here and skip
// themselves, with the reason, when there is none.
#pragma once

#include <string>
#include <vector>

namespace mantissa {

struct CudaInfo {
  bool compiled = false;  // the library was built with the CUDA backend
  int device_count = 0;   // GPUs the driver reports (0 when there is no driver or no GPU)
  std::string status;     // why there are none, in words, or the driver/runtime versions
  std::vector<std::string> devices;  // "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)"
};

const CudaInfo& cuda_info();

}  // namespace mantissa
