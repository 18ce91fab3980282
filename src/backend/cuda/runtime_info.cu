// Asks the CUDA runtime which GPUs there are. A machine without a driver or a GPU is normal
// (CI has none): it yields zero devices and a status saying why, never an error.
#include <cuda_runtime.h>

#include <cstdio>

#include "mantissa/core/device_info.h"

namespace mantissa::detail {

CudaInfo query_cuda() {
  CudaInfo info;
  info.compiled = true;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.status = std::string("no usable GPU: ") + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error
    return info;
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char buf[384];
  std::snprintf(buf, sizeof buf, "driver %d.%d, runtime %d.%d", driver / 1000, driver % 1000 / 10,
                runtime / 1000, runtime % 1000 / 10);
  info.status = buf;
  info.device_count = count;
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, d) != cudaSuccess) continue;
    std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
                  double(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
    info.devices.emplace_back(buf);
  }
  return info;
}

}  // namespace mantissa::detail
