// Internal: the CUDA backend (one per device). Every kernel is queued on the device's current
// stream (mantissa/core/cuda.h) and never waits for the host, except where a result must come
// back to it (unscale_and_check's return value, only when no found_inf flag is given). Inputs may
// be strided; the files named below hold each family.
#pragma once

#include "backend/backend.h"

namespace mantissa::backend::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  int device() const { return device_; }

  MT_BACKEND_OVERRIDE_ALL

 private:
  int device_;
};

}  // namespace mantissa::backend::cuda
