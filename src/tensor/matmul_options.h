// Internal to src/tensor: the backend GEMM options that follow set_matmul_precision, for every op
// that calls the backend's matmul or convolutions directly.
#pragma once

#include "backend/backend.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::detail {

// set_matmul_precision("high"): f32 GEMM/convolution inputs go through the tf32 grid.
inline backend::MatmulOptions matmul_options() {
  backend::MatmulOptions o;
  if (get_matmul_precision() == MatmulPrecision::High) o.input_rounding = Format::TF32;
  return o;
}

}  // namespace mantissa::detail
