// TEMPORARY (being written in this change): replaced by multi_tensor.cu.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::sgd_step(std::span<Tensor> params, std::span<const Tensor> grads,
                           std::span<Tensor> momentum_bufs, std::span<const int64_t> steps,
                           const SgdStep& hyper) {
  MT_CHECK(false, "cuda sgd_step: not implemented yet");
}

void CudaBackend::adamw_step(std::span<Tensor> params, std::span<const Tensor> grads,
                             std::span<Tensor> exp_avgs, std::span<Tensor> exp_avg_sqs,
                             std::span<const int64_t> steps, const AdamWStep& hyper) {
  MT_CHECK(false, "cuda adamw_step: not implemented yet");
}

void CudaBackend::multi_tensor_norm(std::span<const Tensor> tensors, double norm_type,
                                    Tensor& out) {
  MT_CHECK(false, "cuda multi_tensor_norm: not implemented yet");
}

void CudaBackend::multi_tensor_scale(std::span<Tensor> tensors, double factor) {
  MT_CHECK(false, "cuda multi_tensor_scale: not implemented yet");
}

bool CudaBackend::unscale_and_check(std::span<Tensor> grads, double inv_scale, Tensor* found_inf) {
  MT_CHECK(false, "cuda unscale_and_check: not implemented yet");
  return false;
}

void CudaBackend::update_scale(Tensor& state, const Tensor& found_inf, const ScaleUpdate& rule) {
  MT_CHECK(false, "cuda update_scale: not implemented yet");
}

}  // namespace mantissa::backend::cuda
