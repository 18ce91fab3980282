// TEMPORARY (being written in this change): replaced by the real kernel.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cpu/cpu_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cpu {

void CpuBackend::update_scale(Tensor&, const Tensor&, const ScaleUpdate&) {
  MT_CHECK(false, "cpu update_scale: not implemented yet");
}

}  // namespace mantissa::backend::cpu
