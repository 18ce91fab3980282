// TEMPORARY (removed when src/backend/cpu/dnnl.cpp implements these).
#include "backend/cpu/cpu_backend.h"

namespace mantissa::backend::cpu {

void CpuBackend::matmul(const Tensor&, const Tensor&, const Tensor*, Tensor&, const MatmulOptions&) {
  MT_ASSERT(false, "matmul not implemented yet");
}
void CpuBackend::conv2d(const Tensor&, const Tensor&, const Tensor*, Tensor&, const Conv2dParams&,
                        const MatmulOptions&) {
  MT_ASSERT(false, "conv2d not implemented yet");
}
void CpuBackend::conv2d_backward(const Tensor&, const Tensor&, const Tensor&, Tensor*, Tensor*,
                                 Tensor*, const Conv2dParams&, const MatmulOptions&) {
  MT_ASSERT(false, "conv2d_backward not implemented yet");
}

}  // namespace mantissa::backend::cpu
