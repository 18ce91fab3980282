// TEMPORARY (removed when src/backend/cpu/pool.cpp and norm.cpp implement these).
#include "backend/cpu/cpu_backend.h"

namespace mantissa::backend::cpu {

void CpuBackend::max_pool2d(const Tensor&, Tensor&, Tensor&, const Pool2dParams&) { MT_ASSERT(false); }
void CpuBackend::max_pool2d_backward(const Tensor&, const Tensor&, Tensor&) { MT_ASSERT(false); }
void CpuBackend::avg_pool2d(const Tensor&, Tensor&, const Pool2dParams&) { MT_ASSERT(false); }
void CpuBackend::avg_pool2d_backward(const Tensor&, Tensor&, const Pool2dParams&) { MT_ASSERT(false); }
void CpuBackend::adaptive_avg_pool2d(const Tensor&, Tensor&) { MT_ASSERT(false); }
void CpuBackend::adaptive_avg_pool2d_backward(const Tensor&, Tensor&) { MT_ASSERT(false); }
void CpuBackend::batch_norm(const Tensor&, const Tensor*, const Tensor*, Tensor*, Tensor*, bool,
                            double, double, Tensor&, Tensor&, Tensor&) { MT_ASSERT(false); }
void CpuBackend::batch_norm_backward(const Tensor&, const Tensor&, const Tensor*, const Tensor&,
                                     const Tensor&, bool, Tensor*, Tensor*, Tensor*) { MT_ASSERT(false); }
void CpuBackend::layer_norm(const Tensor&, const Tensor*, const Tensor*, double, Tensor&, Tensor&,
                            Tensor&) { MT_ASSERT(false); }
void CpuBackend::layer_norm_backward(const Tensor&, const Tensor&, const Tensor*, const Tensor&,
                                     const Tensor&, Tensor*, Tensor*, Tensor*) { MT_ASSERT(false); }
void CpuBackend::softmax(const Tensor&, int, bool, Tensor&) { MT_ASSERT(false); }
void CpuBackend::softmax_backward(const Tensor&, const Tensor&, int, bool, Tensor&) { MT_ASSERT(false); }
void CpuBackend::cross_entropy(const Tensor&, const Tensor&, int64_t, double, Tensor&, Tensor&) {
  MT_ASSERT(false);
}
void CpuBackend::cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, double,
                                        Tensor&) { MT_ASSERT(false); }

}  // namespace mantissa::backend::cpu
