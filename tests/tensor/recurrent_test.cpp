// lstm_pointwise, the fused LSTM step: against a float64 loop (forward), finite differences
// (backward), in every float dtype and on strided inputs (the op harness), with and without a
// previous cell state; and against the same step composed of separate ops.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "harness/op_harness.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using testing::check_op;
using testing::OpCase;
using testing::random_f64;

// {h, c_next} side by side as one (B, 2H) tensor.
Tensor step_of(const Tensor& gates, const Tensor& c) {
  const std::vector<Tensor> hc = lstm_pointwise(gates, c);
  return cat({hc[0], hc[1]}, 1);
}

Tensor reference_step(const Tensor& gates, const Tensor& c) {
  const int64_t b = gates.size(0), n = gates.size(1) / 4;
  const std::vector<double> z = gates.to_vector<double>();
  const std::vector<double> cp = c.defined() ? c.to_vector<double>() : std::vector<double>();
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  std::vector<double> out(size_t(b * 2 * n));
  for (int64_t r = 0; r < b; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const double* zr = z.data() + r * 4 * n;
      const double i = sig(zr[j]), f = sig(zr[n + j]), g = std::tanh(zr[2 * n + j]);
      const double o = sig(zr[3 * n + j]);
      const double cn = (c.defined() ? f * cp[size_t(r * n + j)] : 0.0) + i * g;
      out[size_t(r * 2 * n + j)] = o * std::tanh(cn);
      out[size_t(r * 2 * n + n + j)] = cn;
    }
  }
  return Tensor::from_vector(out, {b, 2 * n}, DType::F64);
}

TEST(LstmPointwise, MatchesFloat64AndFiniteDifferences) {
  OpCase with;
  with.name = "lstm_pointwise with a cell state";
  with.inputs = {mul(random_f64({3, 20}, 1), 2.0), random_f64({3, 5}, 2)};
  with.fn = [](const std::vector<Tensor>& in) { return step_of(in[0], in[1]); };
  with.reference = [](const std::vector<Tensor>& in) { return reference_step(in[0], in[1]); };
  check_op(with);

  OpCase without;
  without.name = "lstm_pointwise from a zero state";
  without.inputs = {mul(random_f64({4, 12}, 3), 2.0)};
  without.fn = [](const std::vector<Tensor>& in) { return step_of(in[0], Tensor()); };
  without.reference = [](const std::vector<Tensor>& in) { return reference_step(in[0], Tensor()); };
  check_op(without);
}

// The fused step and the same math as separate ops (what the LSTM ran before) agree in f32 to a
// few ulp, gradients included.
TEST(LstmPointwise, AgreesWithTheComposedOps) {
  Tensor gates = mul(random_f64({16, 64}, 4), 3.0).to(DType::F32);
  Tensor c = random_f64({16, 16}, 5).to(DType::F32);
  gates.set_requires_grad(true);
  c.set_requires_grad(true);
  const std::vector<Tensor> fused = lstm_pointwise(gates, c);
  const std::vector<Tensor> g = chunk(gates, 4, 1);
  const Tensor c_next = add(mul(sigmoid(g[1]), c), mul(sigmoid(g[0]), tanh(g[2])));
  const Tensor h = mul(sigmoid(g[3]), tanh(c_next));
  const Tensor w = random_f64({16, 16}, 6).to(DType::F32);
  auto grads = [&](const Tensor& hh, const Tensor& cc) {
    return autograd::grad({sum(mul(hh, w)), sum(mul(cc, w))}, {}, {gates, c}, true);
  };
  const std::vector<Tensor> gf = grads(fused[0], fused[1]), gc = grads(h, c_next);
  EXPECT_TRUE(testing::all_close(fused[0], h, 0x1p-24, 8, "h"));
  EXPECT_TRUE(testing::all_close(fused[1], c_next, 0x1p-24, 8, "c"));
  EXPECT_TRUE(testing::all_close(gf[0], gc[0], 0x1p-24, 16, "d gates"));
  EXPECT_TRUE(testing::all_close(gf[1], gc[1], 0x1p-24, 16, "d c"));
}

// Half-precision gates with an f32 cell state (autocast's bf16 GEMM feeding an fp32 state) are
// read without a conversion pass: the results are the same bits as converting the gates to f32
// first, and their gradient is the f32 gradient rounded to the gates' dtype.
TEST(LstmPointwise, HalfGatesWithAnF32StateMatchTheConvertedPath) {
  for (const DType half : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(half));
    Tensor gates = mul(random_f64({8, 48}, 7), 3.0).to(half);
    Tensor c = random_f64({8, 12}, 8).to(DType::F32);
    Tensor gates32 = gates.to(DType::F32);
    Tensor c32 = c.clone();
    for (Tensor* t : {&gates, &c, &gates32, &c32})
      t->set_requires_grad(true);
    const std::vector<Tensor> mixed = lstm_pointwise(gates, c);
    const std::vector<Tensor> wide = lstm_pointwise(gates32, c32);
    EXPECT_EQ(mixed[0].dtype(), DType::F32);
    EXPECT_EQ(mixed[0].to_vector<float>(), wide[0].to_vector<float>());
    EXPECT_EQ(mixed[1].to_vector<float>(), wide[1].to_vector<float>());
    const Tensor w = random_f64({8, 12}, 9).to(DType::F32);
    const std::vector<Tensor> gm =
        autograd::grad({sum(mul(mixed[0], w)), sum(mul(mixed[1], w))}, {}, {gates, c});
    const std::vector<Tensor> gw =
        autograd::grad({sum(mul(wide[0], w)), sum(mul(wide[1], w))}, {}, {gates32, c32});
    EXPECT_EQ(gm[0].dtype(), half);
    EXPECT_EQ(gm[0].to_vector<float>(), gw[0].to(half).to_vector<float>());
    EXPECT_EQ(gm[1].to_vector<float>(), gw[1].to_vector<float>());
  }
}

TEST(LstmPointwise, MistakesAreNamed) {
  EXPECT_THROW(lstm_pointwise(Tensor::zeros({2, 7}), Tensor()), Error);
  EXPECT_THROW(lstm_pointwise(Tensor::zeros({2, 8}), Tensor::zeros({2, 3})), Error);
}

}  // namespace
}  // namespace mantissa
