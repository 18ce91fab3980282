// TEMPORARY (being written in this change): replaced by the real kernel.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cpu/cpu_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cpu {

void CpuBackend::attention(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&,
                           const AttentionParams&) {
  MT_CHECK(false, "cpu attention: not implemented yet");
}

}  // namespace mantissa::backend::cpu
namespace mantissa::backend::cpu {
void CpuBackend::attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, const Tensor&, Tensor&, Tensor&, Tensor&,
                                    const AttentionParams&) {
  MT_CHECK(false, "cpu attention_backward: not implemented yet");
}
}  // namespace mantissa::backend::cpu
