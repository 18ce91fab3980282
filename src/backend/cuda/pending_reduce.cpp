// TEMPORARY (being written in this change): replaced by reduce.cu.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include "backend/cuda/cuda_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cuda {

void CudaBackend::reduce(ReduceOp op, const Tensor& x, std::span<const int> dims, Tensor& out,
                         Tensor* indices, int64_t correction) {
  MT_CHECK(false, "cuda reduce: not implemented yet");
}

}  // namespace mantissa::backend::cuda
