#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend {

Backend& cpu_backend() {
  static cpu::CpuBackend* backend = new cpu::CpuBackend();  // outlives every tensor
  return *backend;
}

Backend& backend_for(Device device) {
  MT_CHECK(device.is_cpu(), "no backend for device ", device.str(),
           ": this build runs on the cpu only so far");
  return cpu_backend();
}

}  // namespace mantissa::backend
