// The lazy (row-sparse) AdamW of the recommender's tables against the library's dense AdamW:
// rows every batch touches follow it exactly, rows no batch touches do not move, and a bf16
// table holds the rounding of its fp32 master.
#include "train/lazy_embeddings.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/numerics/round.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mt = mantissa;

namespace {

constexpr int64_t kRows = 6, kDim = 3, kB = 5;

mt::Tensor initial_table() {
  std::vector<float> v(kRows * kDim);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = 0.1f * std::sin(float(i) + 0.5f);
  return mt::Tensor::from_vector(v, {kRows, kDim});
}

// The loss of a batch: sum(embedding(table, ids) * c), c varying with the step.
mt::Tensor weights_for(int step) {
  std::vector<float> c(kB * kDim);
  for (size_t i = 0; i < c.size(); ++i)
    c[i] = std::cos(0.3f * float(i) + float(step));
  return mt::Tensor::from_vector(c, {kB, kDim});
}

}  // namespace

TEST(LazyEmbeddingAdam, TouchedRowsFollowAdamWUntouchedRowsStay) {
  // Batches touch rows 0..3 every step (row 1 twice), never rows 4 and 5.
  const std::vector<int64_t> ids{0, 1, 2, 1, 3};
  mt::Tensor lazy_table = initial_table().set_requires_grad(true);
  mt::Tensor dense_table = initial_table().set_requires_grad(true);
  mt::train::LazyEmbeddingAdam lazy({lazy_table}, {});
  lazy.set_precision(true, mt::RoundingMode::NearestEven, 0);
  mt::optim::AdamW dense({dense_table}, {.lr = 0.01, .weight_decay = 0.0});
  for (int step = 0; step < 4; ++step) {
    const mt::Tensor c = weights_for(step);
    // Lazy: the batch's distinct rows as a leaf, the ids renumbered into it.
    auto batch = lazy.gather(mt::Tensor::from_vector(ids, {kB, 1}));
    ASSERT_EQ(batch.rows[0], (std::vector<int64_t>{0, 1, 2, 3}));
    EXPECT_EQ(batch.local.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 1, 3}));
    mt::sum(mt::mul(mt::embedding(batch.leaves[0], batch.local.reshape({kB})), c)).backward();
    EXPECT_TRUE(lazy.finite(batch, 1.f));
    lazy.step(batch, 0.01, 1.f);
    // Dense: the library's AdamW over the whole table.
    dense.zero_grad();
    mt::sum(mt::mul(mt::embedding(dense_table, mt::Tensor::from_vector(ids, {kB})), c)).backward();
    dense.step();
  }
  const std::vector<float> l = lazy_table.to_vector<float>(), d = dense_table.to_vector<float>();
  const std::vector<float> start = initial_table().to_vector<float>();
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kDim; ++j) {
      const size_t i = size_t(r * kDim + j);
      if (r < 4) {
        EXPECT_NEAR(l[i], d[i], 4 * std::numeric_limits<float>::epsilon()) << r << "," << j;
        EXPECT_NE(l[i], start[i]);
      } else {
        EXPECT_EQ(l[i], start[i]) << "untouched row " << r;  // and dense's: no gradient, no step
      }
    }
  }
  EXPECT_EQ(lazy.state_nbytes(), 2 * kRows * kDim * 4 + kRows * 8);  // f32 tables: no masters
}

TEST(LazyEmbeddingAdam, Bf16TableHoldsItsMastersRoundingAndSkipsNonFinite) {
  mt::Tensor table = initial_table().set_requires_grad(true);
  mt::train::LazyEmbeddingAdam lazy({table}, {});
  {
    mt::NoGrad ng;
    table.set_data(table.to(mt::DType::BF16));  // what amp::initialize does at O2
  }
  lazy.set_precision(true, mt::RoundingMode::NearestEven, 0);
  const std::vector<int64_t> ids{5, 5, 0, 2, 2};
  auto batch = lazy.gather(mt::Tensor::from_vector(ids, {kB, 1}));
  mt::sum(mt::mul(mt::embedding(batch.leaves[0], batch.local.reshape({kB})), weights_for(0)))
      .backward();
  // A gradient times a huge inverse scale overflows: finite() says so.
  EXPECT_FALSE(lazy.finite(batch, 3e38f));
  EXPECT_TRUE(lazy.finite(batch, 1.f));
  lazy.step(batch, 0.01, 1.f);
  EXPECT_EQ(table.dtype(), mt::DType::BF16);
  const std::vector<float> now = table.to(mt::DType::F32).to_vector<float>();
  const std::vector<float> start = initial_table().to_vector<float>();
  // Rows 0, 2 and 5 moved by about lr (Adam's first step is lr * sign(g)), rows 1, 3, 4 stayed
  // at their bf16 rounding.
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kDim; ++j) {
      const size_t i = size_t(r * kDim + j);
      const float rounded = mt::round_to(mt::Format::BF16, start[i]);
      if (r == 0 || r == 2 || r == 5) {
        EXPECT_NEAR(std::fabs(now[i] - start[i]), 0.01f, 0.002f) << r << "," << j;
      } else {
        EXPECT_EQ(now[i], rounded) << r << "," << j;
      }
    }
  }
  // The master (fp32) is kept: 2 moments + master + step counts.
  EXPECT_EQ(lazy.state_nbytes(), 3 * kRows * kDim * 4 + kRows * 8);
}
