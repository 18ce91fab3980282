// Internal: GEMMs of the CUDA backend beyond Backend::matmul, for fused ops of the op layer.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/backend.h"

namespace mantissa::backend::cuda {

// A row-major (R, C) matrix with element strides (stride_r, stride_c) as the column-major matrix
// cuBLASLt reads for its transpose (C x R after op), which is how blas.cpp computes a row-major
// product (out^T = b^T @ a^T): either the memory as stored (rows x cols with leading dimension
// ld) as-is, or transposed by op.
struct LtOperand {
  bool transpose = false;
  int64_t rows = 0, cols = 0, ld = 0;
};

// False when neither dim has a unit stride (the caller then copies). Strides of size-1 dims do
// not matter and are normalized first, so that a vector always has one of the two layouts.
inline bool lt_operand(int64_t R, int64_t C, int64_t stride_r, int64_t stride_c, LtOperand& o) {
  if (R == 1) stride_r = stride_c == 1 ? C : 1;
  if (C == 1) stride_c = stride_r == 1 ? R : 1;
  if (stride_c == 1 && stride_r >= std::max<int64_t>(C, 1)) {  // t^T is column-major as stored
    o = {false, C, R, stride_r};
    return true;
  }
  if (stride_r == 1 && stride_c >= std::max<int64_t>(R, 1)) {  // stored t, transposed by op
    o = {true, R, C, stride_c};
    return true;
  }
  return false;
}

// out(1, M, N) = gelu_tanh(a(1, M, K) @ b(1, K, N) + bias(N)) in one cuBLASLt call (the GELU of
// cuBLASLt's epilogue is the tanh approximation, UnaryOp::GeluTanh). When pre_gelu is given (a
// contiguous (1, M, N) tensor of out's dtype) it receives a @ b + bias, the input the GELU
// backward needs. a and b may be any strided views, all of one dtype among f32, f16 and bf16;
// `options` as for Backend::matmul. Returns false, having written nothing, when cuBLASLt has no
// kernel for this epilogue here (other dtypes, N not a multiple of 8 with pre_gelu, no algorithm
// found): the caller then runs matmul and the GELU separately.
bool matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
                      Tensor* pre_gelu, const MatmulOptions& options);

// The native FP4 GEMM (CudaBackend::fp4_gemm; compute capability 10.0+ and a toolkit with FP4
// types, CUDA 12.8+): whether (M, N, K) on `device` can run it, and the cuBLASLt call on packed
// codes (a (M, K / 2), b (N, K / 2) bytes) and swizzled block scales (fp4_math.h's layout), alpha
// and beta read from the device (alpha_beta: F32 (2)). False, with nothing queued, where cuBLASLt
// has no algorithm.
bool fp4_gemm_qualifies(int64_t M, int64_t N, int64_t K, int device);
bool native_fp4_gemm(const Tensor& a_packed, const Tensor& a_scales, const Tensor& b_packed,
                     const Tensor& b_scales, const Tensor& alpha_beta, Fp4ScaleRule rule,
                     Tensor& out, int device);

}  // namespace mantissa::backend::cuda
