// TEMPORARY (being written in this change): replaced by pool.cu.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::max_pool2d(const Tensor& x, Tensor& out, Tensor& indices, const Pool2dParams& p) {
  MT_CHECK(false, "cuda max_pool2d: not implemented yet");
}

void CudaBackend::max_pool2d_backward(const Tensor& grad_out, const Tensor& indices,
                                      Tensor& grad_x) {
  MT_CHECK(false, "cuda max_pool2d_backward: not implemented yet");
}

void CudaBackend::avg_pool2d(const Tensor& x, Tensor& out, const Pool2dParams& p) {
  MT_CHECK(false, "cuda avg_pool2d: not implemented yet");
}

void CudaBackend::avg_pool2d_backward(const Tensor& grad_out, Tensor& grad_x,
                                      const Pool2dParams& p) {
  MT_CHECK(false, "cuda avg_pool2d_backward: not implemented yet");
}

void CudaBackend::adaptive_avg_pool2d(const Tensor& x, Tensor& out) {
  MT_CHECK(false, "cuda adaptive_avg_pool2d: not implemented yet");
}

void CudaBackend::adaptive_avg_pool2d_backward(const Tensor& grad_out, Tensor& grad_x) {
  MT_CHECK(false, "cuda adaptive_avg_pool2d_backward: not implemented yet");
}

}  // namespace mantissa::backend::cuda
