// TEMPORARY (being written in this change): replaced by the real kernel.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cpu/cpu_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cpu {

void CpuBackend::copy_rounded(const Tensor&, Tensor&, const RoundingOptions&) {
  MT_CHECK(false, "cpu copy_rounded: not implemented yet");
}

}  // namespace mantissa::backend::cpu
