// Internal: what the fp8 and FP4 Linear ops share (autocast/fp8.cpp): their operands' checks,
// the output dtype linear() would have, and the bias gradient.
#pragma once

#include <string_view>

#include "mantissa/tensor/tensor.h"

namespace mantissa::amp {

// x (..., in), weight (out, in), bias (out) or undefined: f32/bf16/f16 on one device; else a
// mantissa::Error naming `op`.
void check_linear_operands(std::string_view op, const Tensor& x, const Tensor& w, const Tensor& b);
// linear()'s output dtype under the current autocast state.
DType linear_output_dtype(const Tensor& x, const Tensor& w, const Tensor& b);
// The bias gradient of a (M, out) output gradient: fp32 column sums rounded once into b_dtype.
Tensor linear_bias_grad(const Tensor& g2, DType b_dtype);

}  // namespace mantissa::amp
