#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/device_hooks.h"
#include "mantissa/core/error.h"

namespace mantissa::backend {

Backend& cpu_backend() {
  static cpu::CpuBackend* backend = new cpu::CpuBackend();  // outlives every tensor
  return *backend;
}

Backend& backend_for(Device device) {
  if (device.is_cuda()) return cuda_backend(device.index);
  return cpu_backend();
}

}  // namespace mantissa::backend
