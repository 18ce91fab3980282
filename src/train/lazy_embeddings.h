// Internal: row-sparse ("lazy") AdamW for a recommender's embedding tables (TrainConfig::
// embedding_update, docs/training.md "Recommenders").
//
// A batch of B examples touches at most B rows of each table; dense AdamW reads and writes every
// row's weight, gradient and two moments each step (26 tables of 10,000 x 16: 4.2M elements, 15
// times the rest of DCN). Here each step
//   1. gather(): the distinct ids of each field in the batch, a compact leaf (U, dim) of those
//      rows (U <= B) and the batch's ids renumbered into it; the model runs on the leaves
//      (nn::functional_call), so backward makes (U, dim) gradients, not (rows, dim) ones;
//   2. finite(): the unscaled gradients are checked for inf/NaN (a loss scaler's skip);
//   3. step(): AdamW on those rows alone. A row's moments and its step count t (bias
//      corrections 1 - beta^t per row) advance only when a batch touches it: TensorFlow's
//      LazyAdam, PyTorch's SparseAdam, with per-row counts. Untouched rows keep weight and
//      moments; dense AdamW would still move them by their decaying momentum.
// Weight decay: none (embeddings do not decay, as train::decay_groups). Tables stored narrower
// than f32 (O2, O3, bf16-pure) keep an fp32 master here unless `masters` is off (bf16-pure);
// the update is rounded into the table to nearest even or stochastically (Philox bits at the
// row's update count, as optim::Optimizer's stochastic stores).
//
// Host code: the tables must be in host memory (the CPU device).
#pragma once

#include <cstdint>
#include <vector>

#include "mantissa/numerics/format.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::train {

struct LazyAdamOptions {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

class LazyEmbeddingAdam {
 public:
  // `tables` (rows, dim), while still in f32 (before amp::initialize casts them): the masters
  // start from these values.
  LazyEmbeddingAdam(std::vector<Tensor> tables, LazyAdamOptions options);

  // After amp::initialize: drops the masters of tables stored in f32 (and of all of them when
  // `masters` is false) and sets how updates are stored into narrow tables.
  void set_precision(bool masters, RoundingMode rounding, uint64_t seed);

  struct Batch {
    std::vector<std::vector<int64_t>> rows;  // per table: the distinct ids, in first-seen order
    std::vector<Tensor> leaves;              // per table: (U, dim) copies of those rows, leaves
    Tensor local;                            // I64 (B, tables): ids renumbered into the leaves
  };
  // The batch's rows; `categorical` is I64 (B, tables) in host memory.
  Batch gather(const Tensor& categorical);
  // Whether every leaf gradient times inv_scale is finite (a leaf without a gradient counts as 0).
  bool finite(const Batch& batch, float inv_scale) const;
  // One AdamW update of the batch's rows at learning rate `lr`, gradients times inv_scale.
  void step(const Batch& batch, double lr, float inv_scale);

  // The state a checkpoint holds: per table i, "tables.i.exp_avg", ".exp_avg_sq", ".steps" and
  // ".master" (when it keeps one); load_state_dict takes exactly those back.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state);

  // Bytes of state: moments, masters, step counts.
  int64_t state_nbytes() const;
  const std::vector<Tensor>& tables() const { return tables_; }

 private:
  std::vector<Tensor> tables_;
  LazyAdamOptions options_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;  // F32 (rows, dim)
  std::vector<Tensor> steps_;                 // I64 (rows): each row's updates
  std::vector<Tensor> masters_;               // F32 (rows, dim) or undefined
  std::vector<std::vector<int32_t>> slot_;    // per table: id -> index in the batch, or -1
  RoundingMode rounding_ = RoundingMode::NearestEven;
  uint64_t seed_ = 0;
};

}  // namespace mantissa::train
