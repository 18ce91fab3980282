// Internal: the CPU backend. Its kernels are spread over the files of this folder by family
// (elementwise.cpp, reduce.cpp, dnnl_matmul.cpp and dnnl_conv.cpp for GEMM and convolution,
// pool.cpp, norm.cpp, softmax in norm.cpp, attention.cpp and attention_x86.cpp, index.cpp,
// optim_kernels.cpp, amp_kernels.cpp).
#pragma once

#include "backend/backend.h"

namespace mantissa::backend::cpu {

// The reference backend: it has every op of the table (checked in backend.cpp), and it is what
// another backend's missing ops fall back to.
class CpuBackend final : public Backend {
 public:
  MT_BACKEND_OVERRIDE_ALL
};

// out (B, M, N) = scale * (a @ b) + bias (matmul's contract; scale 1 is matmul): the scaled
// fp32 sums rounded to fp32, the bias added in fp32, one rounding into out's dtype, all in
// oneDNN's epilogue (block_scaled_gemm's per-tensor product: its scales' product).
void scaled_matmul(CpuBackend& be, const Tensor& a, const Tensor& b, const Tensor* bias,
                   Tensor& out, const MatmulOptions& options, float scale);

// How many multi-tensor kernel calls (sgd_step, adamw_step, multi_tensor_norm,
// multi_tensor_scale) this process has made: tests show that an optimizer step is one call.
int64_t multi_tensor_calls();
// How many unscale_and_check calls this process has made: tests show that the loss scaler's
// unscale is one fused pass over all gradients of an optimizer.
int64_t unscale_calls();

}  // namespace mantissa::backend::cpu
