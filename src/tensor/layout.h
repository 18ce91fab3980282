// How ops keep a channels-last input's layout: the output is allocated with the input's strides,
// and the backend is handed every operand permuted into that storage order, where the output is
// row-major. Backends thus see only row-major outputs.
#pragma once

#include <vector>

#include "mantissa/tensor/tensor.h"

namespace mantissa::layout {

// An uninitialized tensor of t's shape: channels-last (t's strides) when t is, else row-major.
Tensor empty_like(const Tensor& t, DType dtype);

// An uninitialized 4-D (N, C, H, W) tensor with channels-last strides.
Tensor empty_channels_last(const Shape& shape, DType dtype, Device device);

// The dim order (outermost first) that makes t row-major: t.permute(order).is_contiguous().
// Empty when t already is row-major, or is not dense.
std::vector<int64_t> storage_order(const Tensor& t);

// t, given `order.size()` dims by leading 1s where it has fewer (broadcasting's alignment), and
// permuted by order: a view, without autograd; t itself when order is empty.
Tensor ordered(const Tensor& t, const std::vector<int64_t>& order);

}  // namespace mantissa::layout
