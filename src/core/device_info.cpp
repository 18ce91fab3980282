#include "mantissa/core/device_info.h"

namespace mantissa {

#ifdef MANTISSA_HAS_CUDA
namespace detail {
CudaInfo query_cuda();  // src/backend/cuda/runtime_info.cu
}
#endif

const CudaInfo& cuda_info() {
  static const CudaInfo info = [] {
#ifdef MANTISSA_HAS_CUDA
    return detail::query_cuda();
#else
    CudaInfo none;
    none.status = "built without the CUDA backend (configure with -DMANTISSA_CUDA=ON)";
    return none;
#endif
  }();
  return info;
}

}  // namespace mantissa
