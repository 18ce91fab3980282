// Gradient clipping by the global norm, as torch.nn.utils.clip_grad_norm_: one fused pass over
// all gradients computes the norm (fp32 accumulation per chunk, f64 for f64 gradients, partial
// sums combined in f64 in a fixed order: the result does not depend on the thread count), and a
// second fused pass scales them by min(1, max_norm / (norm + 1e-6)), computed where the
// gradients live. Neither waits for a GPU: the norm comes back as a tensor on the gradients'
// device, as PyTorch's does; `.item()` reads it on the host (a wait there).
#pragma once

#include <functional>
#include <vector>

#include "mantissa/tensor/tensor.h"

namespace mantissa::optim {

// Sharded gradients (ZeRO-1 and 2: each rank of a data-parallel run holds the gradients of its
// own parameters only): `combine` makes a rank's partial norm global. It gets a one-element F64
// tensor on the gradients' device holding this rank's sum of |g|^p (its max |g| for p = inf,
// `max` true), and must leave there the sum (the maximum) over the ranks, NaN kept, the same on
// every rank; every rank calls it once, with or without gradients. Unset: the gradients are
// all there are.
using NormCombiner = std::function<void(Tensor& partial, bool max)>;

// The norm_type-norm of all gradients of `params` together, as if concatenated:
// (sum |g|^p)^(1/p) for p > 0, max |g| for p = inf. One F64 element on the gradients' device.
// Parameters without a gradient are skipped; none at all gives 0 (on the first parameter's
// device). NaN in any gradient gives NaN.
Tensor grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0,
                 const NormCombiner& combine = {});

// Computes the total norm as grad_norm() and multiplies every gradient in place by
// min(1, max_norm / (norm + 1e-6)) (rounded once into the gradient's dtype; a factor of 1 leaves
// them untouched). Returns the total norm before clipping, as grad_norm(). As PyTorch
// (error_if_nonfinite = false), a NaN or inf norm scales the gradients by NaN or 0: pair it with
// a finiteness check (the loss scaler's).
Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      const NormCombiner& combine = {});

// The same over the gradient tensors themselves (Optimizer::gradients(): ZeRO-2's shards
// among them); `device` holds the result when there are none.
Tensor gradients_norm(const std::vector<Tensor>& grads, double norm_type = 2.0,
                      const NormCombiner& combine = {}, Device device = Device::cpu());
Tensor clip_gradients(const std::vector<Tensor>& grads, double max_norm, double norm_type = 2.0,
                      const NormCombiner& combine = {}, Device device = Device::cpu());

}  // namespace mantissa::optim
