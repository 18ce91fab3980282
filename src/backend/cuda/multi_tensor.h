// Internal: the CUDA backend's entry points beyond the Backend interface, for the loss scaler's
// device path (src/amp/grad_scaler.cpp). Plain C++: included by .cpp files of a CUDA build.
#pragma once

#include <span>

#include "mantissa/tensor/tensor.h"

namespace mantissa::backend::cuda {

// Backend::unscale_and_check with the factor taken from the device: inv_scale = 1 / state[0]
// (the F64 scaler state of Backend::update_scale) rounded to fp32, computed by the kernel, so
// the host never waits for the scale. Sets found_inf (one F32 element, same device) to 1 when a
// gradient holds inf/NaN; no host read.
void unscale_and_check_by_state(std::span<Tensor> grads, const Tensor& state, Tensor& found_inf);

}  // namespace mantissa::backend::cuda
