// Gradient checkpointing: trade compute for memory. The segment runs without recording its
// graph (its activations are freed at once); backward runs it again, with the same random
// numbers, to get the gradients.
#pragma once

#include <functional>
#include <vector>

#include "mantissa/tensor/tensor.h"

namespace mantissa::autograd {

using Segment = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Returns fn(inputs). Parameters used inside fn (tensors it captures) get their gradients in
// backward as usual. fn must be deterministic given the default generator's state; the
// recomputation runs with the generator and the autocast state (every device type's region:
// enabled, dtype) that fn first ran with, so dropout masks and autocast dtypes are the same and
// the gradients bit-identical to those without checkpointing.
std::vector<Tensor> checkpoint(const Segment& fn, const std::vector<Tensor>& inputs);

// One input, one output.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

}  // namespace mantissa::autograd
