// Internal: the one validation of the multi-tensor calls' arguments (backend.h), shared by every
// backend so that they accept and refuse the same calls. The optim and amp layers guarantee
// these invariants; a failure is a Mantissa bug (MT_ASSERT), except a store rounding mode the
// kernels do not offer, which a user can ask for (MT_CHECK).
#pragma once

#include <initializer_list>
#include <span>

#include "backend/backend.h"

namespace mantissa::backend {

// Tensors a plain multi-tensor pass takes (norm, scale, unscale): floating, contiguous, on
// `device`.
void check_plain_tensors(const char* kernel, Device device, std::span<const Tensor> tensors);

// A one-element F32 found-inf flag, contiguous, on `device`.
void check_found_inf(const char* kernel, Device device, const Tensor& flag);

// The loss scaler's state: 4 F64 elements, contiguous, on `device` (Backend::update_scale).
void check_scale_state(const char* kernel, Device device, const Tensor& state);

// An optimizer step: one gradient, one id and one tensor of each state per parameter; state
// dtypes as optimizer_state_dtype; masters (F32, the parameter's shape) only for parameters
// stored narrower than f32; the step counts an I64 vector on `device` with a row for every id;
// the flag as check_found_inf.
void check_step_call(const char* kernel, Device device, std::span<const Tensor> params,
                     std::span<const Tensor> grads, std::initializer_list<std::span<Tensor>> states,
                     const MultiTensorOptions& options);

// Whether an optimizer step's state is all in the compute type (optimizer_state_dtype) and its
// parameters have no Kahan compensation: what a backend without the state formats' kernels
// runs itself (the others go to the CPU fallback).
bool plain_step_state(std::span<const Tensor> params,
                      std::initializer_list<std::span<Tensor>> states,
                      const MultiTensorOptions& options);

// Backend::sparse_adamw_step: per table (contiguous (rows, dim) floats on `device`) its distinct
// row ids (I64, U, each in [0, rows)), its rows' gradients (U, dim), its two moments (the state
// dtype, the table's shape), its row counts (I64, rows), an id and a master entry as
// check_step_call's. Reads the ids (host memory on the CPU; a device backend checks their
// shapes only).
void check_sparse_step_call(const char* kernel, Device device, std::span<const Tensor> tables,
                            std::span<const Tensor> rows, std::span<const Tensor> grads,
                            std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                            std::span<const Tensor> row_steps, const MultiTensorOptions& options);

}  // namespace mantissa::backend
