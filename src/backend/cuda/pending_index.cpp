// TEMPORARY (being written in this change): replaced by index.cu.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::index_select(const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  MT_CHECK(false, "cuda index_select: not implemented yet");
}

void CudaBackend::index_add(Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out) {
  MT_CHECK(false, "cuda index_add: not implemented yet");
}

void CudaBackend::gather(const Tensor& x, int dim, const Tensor& index, Tensor& out) {
  MT_CHECK(false, "cuda gather: not implemented yet");
}

void CudaBackend::scatter_add(Tensor& grad_x, int dim, const Tensor& index,
                              const Tensor& grad_out) {
  MT_CHECK(false, "cuda scatter_add: not implemented yet");
}

}  // namespace mantissa::backend::cuda
