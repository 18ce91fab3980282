// TEMPORARY (being written in this change): replaced by blas.cpp.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::matmul(const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out,
                         const MatmulOptions& options) {
  MT_CHECK(false, "cuda matmul: not implemented yet");
}

}  // namespace mantissa::backend::cuda
