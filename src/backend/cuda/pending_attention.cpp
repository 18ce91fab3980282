// TEMPORARY (being written in this change): replaced by attention.cu.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                            Tensor& lse, const AttentionParams& p) {
  MT_CHECK(false, "cuda attention: not implemented yet");
}

void CudaBackend::attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse,
                                     Tensor& grad_q, Tensor& grad_k, Tensor& grad_v,
                                     const AttentionParams& p) {
  MT_CHECK(false, "cuda attention_backward: not implemented yet");
}

}  // namespace mantissa::backend::cuda
