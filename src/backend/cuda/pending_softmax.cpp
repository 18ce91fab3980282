// TEMPORARY (being written in this change): replaced by softmax.cu.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::softmax(const Tensor& x, int dim, bool log, Tensor& out) {
  MT_CHECK(false, "cuda softmax: not implemented yet");
}

void CudaBackend::softmax_backward(const Tensor& grad_y, const Tensor& y, int dim, bool log,
                                   Tensor& grad_x) {
  MT_CHECK(false, "cuda softmax_backward: not implemented yet");
}

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                double label_smoothing, Tensor& loss, Tensor& log_probs) {
  MT_CHECK(false, "cuda cross_entropy: not implemented yet");
}

void CudaBackend::cross_entropy_backward(const Tensor& grad_loss, const Tensor& log_probs,
                                         const Tensor& target, int64_t ignore_index,
                                         double label_smoothing, Tensor& grad_logits) {
  MT_CHECK(false, "cuda cross_entropy_backward: not implemented yet");
}

}  // namespace mantissa::backend::cuda
