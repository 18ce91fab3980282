// The row-sparse (lazy) AdamW of embedding tables (optim/sparse_adamw.h) against the library's
// dense AdamW: rows every batch touches follow it bit for bit (one element formula, the same
// bias corrections), rows no batch touches do not move, and a bf16 table holds the rounding of
// its fp32 master.
#include "mantissa/optim/sparse_adamw.h"

#include "backend/backend.h"

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

TEST(SparseAdamW, TouchedRowsFollowAdamWUntouchedRowsStay) {
  // Batches touch rows 0..3 every step (row 1 twice), never rows 4 and 5.
  const std::vector<int64_t> ids{0, 1, 2, 1, 3};
  mt::Tensor lazy_table = initial_table().set_requires_grad(true);
  mt::Tensor dense_table = initial_table().set_requires_grad(true);
  mt::optim::SparseAdamW lazy({lazy_table}, {});
  lazy.set_precision(true, mt::RoundingMode::NearestEven, 0);
  mt::optim::AdamW dense({dense_table}, {.lr = 0.01, .weight_decay = 0.0});
  for (int step = 0; step < 4; ++step) {
    const mt::Tensor c = weights_for(step);
    // Lazy: the batch's distinct rows as a leaf, the ids renumbered into it.
    auto batch = lazy.gather(mt::Tensor::from_vector(ids, {kB, 1}));
    ASSERT_EQ(batch.rows[0].to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
    EXPECT_EQ(batch.local.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 1, 3}));
    mt::sum(mt::mul(mt::embedding(batch.leaves[0], batch.local.reshape({kB})), c)).backward();
    EXPECT_TRUE(lazy.unscale(batch, 1));
    lazy.step(batch, 0.01);
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
        EXPECT_EQ(l[i], d[i]) << r << "," << j;
        EXPECT_NE(l[i], start[i]);
      } else {
        EXPECT_EQ(l[i], start[i]) << "untouched row " << r;  // and dense's: no gradient, no step
      }
    }
  }
  EXPECT_EQ(lazy.state_nbytes(), 2 * kRows * kDim * 4 + kRows * 8);  // f32 tables: no masters
}

TEST(SparseAdamW, Bf16TableHoldsItsMastersRoundingAndSkipsNonFinite) {
  mt::Tensor table = initial_table().set_requires_grad(true);
  mt::optim::SparseAdamW lazy({table}, {});
  {
    mt::NoGrad ng;
    table.set_data(table.to(mt::DType::BF16));  // what amp::initialize does at O2
  }
  lazy.set_precision(true, mt::RoundingMode::NearestEven, 0);
  const std::vector<int64_t> ids{5, 5, 0, 2, 2};
  auto batch = lazy.gather(mt::Tensor::from_vector(ids, {kB, 1}));
  mt::sum(mt::mul(mt::embedding(batch.leaves[0], batch.local.reshape({kB})), weights_for(0)))
      .backward();
  // A batch whose loss overflowed (an fp16 scale too high) has an inf gradient: unscale() says so,
  // whatever the factor; the good batch's unscaled gradients are fp32 (its leaves are bf16).
  {
    auto bad = lazy.gather(mt::Tensor::from_vector(ids, {kB, 1}));
    std::vector<float> c(kB * kDim, 1.f);
    c[4] = std::numeric_limits<float>::infinity();
    mt::sum(mt::mul(mt::embedding(bad.leaves[0], bad.local.reshape({kB})),
                    mt::Tensor::from_vector(c, {kB, kDim})))
        .backward();
    EXPECT_FALSE(lazy.unscale(bad, 1));
    EXPECT_FALSE(lazy.unscale(bad, 0.5));
  }
  EXPECT_TRUE(lazy.unscale(batch, 0.5));
  EXPECT_EQ(batch.grads[0].dtype(), mt::DType::F32);
  EXPECT_EQ(batch.grads[0].to_vector<float>()[0],
            0.5f * batch.leaves[0].grad().to(mt::DType::F32).to_vector<float>()[0]);
  EXPECT_TRUE(lazy.unscale(batch, 1));
  lazy.step(batch, 0.01);
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

// The backend row itself: a call that lists every row (in any order) is adamw_step's, bit for
// bit, with bf16 tables, fp32 masters and stochastic rounding (the bits are drawn at the row's
// count and its elements' places in the table); a call the loss scaler's flag skips changes
// nothing, the row counts included.
TEST(SparseAdamW, EveryRowListedIsTheDenseStepBitForBit) {
  namespace be = mt::backend;
  constexpr int64_t kR = 8, kD = 5;
  std::vector<float> init(kR * kD);
  for (size_t i = 0; i < init.size(); ++i)
    init[i] = 0.3f * std::sin(0.7f * float(i));
  const mt::Tensor master0 = mt::Tensor::from_vector(init, {kR, kD});
  mt::Tensor dense_w = master0.to(mt::DType::BF16), sparse_w = dense_w.clone();
  mt::Tensor dense_master = master0.clone(), sparse_master = master0.clone();
  mt::Tensor dm = mt::Tensor::zeros({kR, kD}), dv = mt::Tensor::zeros({kR, kD});
  mt::Tensor sm = mt::Tensor::zeros({kR, kD}), sv = mt::Tensor::zeros({kR, kD});
  mt::Tensor counts = mt::Tensor::zeros({3}, mt::DType::I64);  // the row of id 2
  mt::Tensor row_steps = mt::Tensor::zeros({kR}, mt::DType::I64);
  const std::vector<int64_t> order{3, 0, 7, 1, 6, 2, 5, 4};
  const std::vector<uint64_t> ids{2};
  be::Backend& cpu = be::backend_for(mt::Device::cpu());
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(kR * kD), gs(kR * kD);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = std::cos(0.37f * float(i) + float(step));
    for (int64_t u = 0; u < kR; ++u)
      for (int64_t j = 0; j < kD; ++j)
        gs[size_t(u * kD + j)] = g[size_t(order[size_t(u)] * kD + j)];
    be::AdamWStep h{.lr = 0.01, .weight_decay = 0.1, .options = {}};
    h.options.ids = ids;
    h.options.store_rounding = mt::RoundingMode::Stochastic;
    h.options.seed = 11;
    std::vector<mt::Tensor> dp{dense_w}, dms{dense_master}, dmv{dm}, dvv{dv};
    std::vector<mt::Tensor> dg{mt::Tensor::from_vector(g, {kR, kD})};
    h.options.masters = dms;
    h.options.step_counts = &counts;
    cpu.adamw_step(dp, dg, dmv, dvv, h);
    std::vector<mt::Tensor> sp{sparse_w}, sms{sparse_master}, smv{sm}, svv{sv}, st{row_steps};
    std::vector<mt::Tensor> rows{mt::Tensor::from_vector(order, {kR})};
    std::vector<mt::Tensor> sg{mt::Tensor::from_vector(gs, {kR, kD})};
    h.options.masters = sms;
    h.options.step_counts = nullptr;
    cpu.sparse_adamw_step(sp, rows, sg, smv, svv, st, h);
  }
  auto bits = [](const mt::Tensor& t) { return t.to(mt::DType::F32).to_vector<float>(); };
  EXPECT_EQ(bits(sparse_w), bits(dense_w));
  EXPECT_EQ(bits(sparse_master), bits(dense_master));
  EXPECT_EQ(bits(sm), bits(dm));
  EXPECT_EQ(bits(sv), bits(dv));
  EXPECT_EQ(row_steps.to_vector<int64_t>(), std::vector<int64_t>(kR, 3));
  EXPECT_NE(bits(sparse_w), bits(master0.to(mt::DType::BF16))) << "the steps moved the table";

  // Skipped: nothing moves.
  const std::vector<float> before = bits(sparse_w);
  mt::Tensor flag = mt::Tensor::from_vector(std::vector<float>{1.f}, {1});
  be::AdamWStep h{.lr = 0.01, .options = {}};
  h.options.ids = ids;
  h.options.found_inf = &flag;
  std::vector<mt::Tensor> sp{sparse_w}, smv{sm}, svv{sv}, st{row_steps};
  std::vector<mt::Tensor> rows{mt::Tensor::from_vector(std::vector<int64_t>{1}, {1})};
  std::vector<mt::Tensor> sg{mt::Tensor::ones({1, kD})};
  std::vector<mt::Tensor> sms{sparse_master};
  h.options.masters = sms;
  cpu.sparse_adamw_step(sp, rows, sg, smv, svv, st, h);
  EXPECT_EQ(bits(sparse_w), before);
  EXPECT_EQ(row_steps.to_vector<int64_t>(), std::vector<int64_t>(kR, 3));
}
