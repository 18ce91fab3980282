// Row-sparse ("lazy") AdamW for embedding tables: TensorFlow's LazyAdam, PyTorch's SparseAdam
// with a step count per row (docs/optim.md, "Row-sparse AdamW").
//
// A batch of B examples touches at most B rows of each table; dense AdamW reads and writes every
// row's weight, gradient and two moments each step (a DCN's 26 tables of 10,000 x 16: 4.2M
// elements, 15 times the rest of the model). Here each step
//   1. gather(): the distinct ids of each field in the batch, a compact leaf (U, dim) of those
//      rows (U <= B) and the batch's ids renumbered into it; the model runs on the leaves
//      (nn::functional_call), so backward makes (U, dim) gradients, not (rows, dim) ones;
//   2. unscale(): the leaves' gradients times a loss scaler's inverse scale, in fp32, checked
//      for inf/NaN (the scaler's skip);
//   3. step(): the backend's sparse_adamw_step on those rows alone: AdamW's element update
//      (the dense step's formula and bias corrections) at each row's own count t, which
//      advances only when a batch touches the row. Untouched rows keep weight and moments
//      (dense AdamW would still move them by their decaying momentum).
// Tables stored narrower than f32 (O2, O3, bf16-pure) keep an fp32 master here unless masters
// are off (bf16-pure); updates are stored as the dense optimizer stores them (to nearest even,
// truncated or stochastically at the row's count). Tables on any device (a backend without the
// kernel runs it through the CPU fallback).
#pragma once

#include <cstdint>
#include <vector>

#include "mantissa/numerics/format.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::optim {

struct SparseAdamWOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0;  // decoupled, on the rows a step updates
};

class SparseAdamW {
 public:
  // `tables` (rows, dim), while still in f32 (before amp::initialize casts them): the masters
  // start from these values.
  SparseAdamW(std::vector<Tensor> tables, SparseAdamWOptions options);

  // After amp::initialize: drops the masters of tables stored in f32 (and of all of them when
  // `masters` is false) and sets how updates are stored into narrow tables.
  void set_precision(bool masters, RoundingMode rounding, uint64_t seed);

  struct Batch {
    std::vector<Tensor> rows;    // per table: I64 (U) the distinct ids, in first-seen order
    std::vector<Tensor> leaves;  // per table: (U, dim) copies of those rows, leaves
    Tensor local;                // I64 (B, tables): the ids renumbered into the leaves
    std::vector<Tensor> grads;   // per table, after unscale(): the leaves' gradients to apply
  };
  // The batch's rows; `categorical` is I64 (B, tables) (read on the host: a GPU batch's ids are
  // copied back, B x tables integers). The batch's tensors are on the tables' device.
  Batch gather(const Tensor& categorical) const;
  // The leaves' gradients times inv_scale (in fp32 unless inv_scale is 1) into batch.grads;
  // whether every one is finite (a leaf without a gradient is left out).
  bool unscale(Batch& batch, double inv_scale) const;
  // One AdamW update of the batch's rows (those with gradients) at learning rate `lr`.
  void step(const Batch& batch, double lr);

  // The state a checkpoint holds: per table i, "tables.i.exp_avg", ".exp_avg_sq", ".steps" and
  // ".master" (when it keeps one); load_state_dict takes exactly those back.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);

  // Bytes of state: moments, masters, step counts.
  int64_t state_nbytes() const;
  const std::vector<Tensor>& tables() const { return tables_; }

 private:
  std::vector<Tensor> tables_;
  SparseAdamWOptions options_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // the state dtype, (rows, dim)
  std::vector<Tensor> steps_;                 // I64 (rows): each row's updates
  std::vector<Tensor> masters_;               // F32 (rows, dim) or undefined
  RoundingMode rounding_ = RoundingMode::NearestEven;
  uint64_t seed_ = 0;
};

}  // namespace mantissa::optim
