// TEMPORARY (being written in this change): replaced by norm.cu.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::batch_norm(const Tensor& x, const Tensor* weight, const Tensor* bias,
                             Tensor* running_mean, Tensor* running_var, bool training,
                             double momentum, double eps, Tensor& out, Tensor& save_mean,
                             Tensor& save_rstd) {
  MT_CHECK(false, "cuda batch_norm: not implemented yet");
}

void CudaBackend::batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor* weight,
                                      const Tensor& save_mean, const Tensor& save_rstd,
                                      bool training, Tensor* grad_x, Tensor* grad_weight,
                                      Tensor* grad_bias) {
  MT_CHECK(false, "cuda batch_norm_backward: not implemented yet");
}

void CudaBackend::layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, double eps,
                             Tensor& out, Tensor& mean, Tensor& rstd) {
  MT_CHECK(false, "cuda layer_norm: not implemented yet");
}

void CudaBackend::layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor* weight,
                                      const Tensor& mean, const Tensor& rstd, Tensor* grad_x,
                                      Tensor* grad_weight, Tensor* grad_bias) {
  MT_CHECK(false, "cuda layer_norm_backward: not implemented yet");
}

}  // namespace mantissa::backend::cuda
