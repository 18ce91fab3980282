// TEMPORARY (being written in this change): replaced by conv.cpp.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                         const Conv2dParams& p, const MatmulOptions& options) {
  MT_CHECK(false, "cuda conv2d: not implemented yet");
}

void CudaBackend::conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& w,
                                  Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias,
                                  const Conv2dParams& p, const MatmulOptions& options) {
  MT_CHECK(false, "cuda conv2d_backward: not implemented yet");
}

}  // namespace mantissa::backend::cuda
