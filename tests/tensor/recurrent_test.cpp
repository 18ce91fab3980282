// lstm_pointwise, the fused LSTM step: against a float64 loop (forward), finite differences
// (backward), in every float dtype and on strided inputs (the op harness), with and without a
// previous cell state; and against the same step composed of separate ops. lstm_sequence, a
// layer's whole recurrence as one op: the same checks, and against the steps unrolled.
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

// ---- lstm_sequence ---------------------------------------------------------------------------

// The recurrence from its definition in float64: gx (T, B, 4H), w (4H, H), h0 and c0 (B, H) or
// undefined. Returns y, h_T and c_T flattened into one vector.
Tensor reference_sequence(const Tensor& gx, const Tensor& w, const Tensor& h0, const Tensor& c0) {
  const int64_t steps = gx.size(0), b = gx.size(1), n = gx.size(2) / 4;
  const std::vector<double> z = gx.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> h = h0.defined() ? h0.to_vector<double>() : std::vector<double>(b * n, 0.0);
  std::vector<double> c = c0.defined() ? c0.to_vector<double>() : std::vector<double>(b * n, 0.0);
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  std::vector<double> y;
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<double> hn(size_t(b * n)), cn(size_t(b * n));
    for (int64_t r = 0; r < b; ++r) {
      std::vector<double> g(size_t(4 * n));
      for (int64_t o = 0; o < 4 * n; ++o) {
        double s = z[size_t((t * b + r) * 4 * n + o)];
        for (int64_t k = 0; k < n; ++k)
          s += h[size_t(r * n + k)] * wv[size_t(o * n + k)];
        g[size_t(o)] = s;
      }
      for (int64_t j = 0; j < n; ++j) {
        const double i = sig(g[size_t(j)]), f = sig(g[size_t(n + j)]);
        const double gg = std::tanh(g[size_t(2 * n + j)]), o = sig(g[size_t(3 * n + j)]);
        cn[size_t(r * n + j)] = f * c[size_t(r * n + j)] + i * gg;
        hn[size_t(r * n + j)] = o * std::tanh(cn[size_t(r * n + j)]);
      }
    }
    h = hn;
    c = cn;
    y.insert(y.end(), h.begin(), h.end());
  }
  y.insert(y.end(), h.begin(), h.end());
  y.insert(y.end(), c.begin(), c.end());
  return Tensor::from_vector(y, {int64_t(y.size())}, DType::F64);
}

Tensor flat_sequence(const Tensor& gx, const Tensor& w, const Tensor& h0, const Tensor& c0) {
  const std::vector<Tensor> out = lstm_sequence(gx, w, h0, c0);
  return cat({out[0].reshape({-1}), out[1].reshape({-1}), out[2].reshape({-1})}, 0);
}

TEST(LstmSequence, MatchesFloat64AndFiniteDifferences) {
  // Seven steps of a batch of 3, H = 5: y, h_T and c_T all feed the loss, so every gradient
  // path (through y, through the last state, into h0 and c0) is checked. The state is stored in
  // the dtype at every step, so a half dtype's error compounds over the steps: k 32.
  OpCase with;
  with.name = "lstm_sequence from h0, c0";
  with.inputs = {mul(random_f64({7, 3, 20}, 11), 2.0), mul(random_f64({20, 5}, 12), 0.8),
                 random_f64({3, 5}, 13), random_f64({3, 5}, 14)};
  with.fn = [](const std::vector<Tensor>& in) { return flat_sequence(in[0], in[1], in[2], in[3]); };
  with.reference = [](const std::vector<Tensor>& in) {
    return reference_sequence(in[0], in[1], in[2], in[3]);
  };
  with.k_forward = 32;
  with.k_backward = 64;
  with.fd_samples = 16;
  check_op(with);

  OpCase without;
  without.name = "lstm_sequence from a zero state";
  without.inputs = {mul(random_f64({4, 2, 16}, 15), 2.0), mul(random_f64({16, 4}, 16), 0.8)};
  without.fn = [](const std::vector<Tensor>& in) {
    return flat_sequence(in[0], in[1], Tensor(), Tensor());
  };
  without.reference = [](const std::vector<Tensor>& in) {
    return reference_sequence(in[0], in[1], Tensor(), Tensor());
  };
  without.k_forward = 32;
  without.k_backward = 64;
  check_op(without);
}

// The op against the steps unrolled with separate ops (what the LSTM ran before: a GEMM per
// step, an add, lstm_pointwise), in f32 over 20 steps and more than one dW GEMM block. The
// forward computes the same sums in the same order: the same bits. The gradients sum dW_hh in
// another order (blocks of steps in one GEMM, not a sum of per-step GEMMs): a few ulp of the
// gradient's scale.
TEST(LstmSequence, AgreesWithTheStepsUnrolled) {
  const int64_t steps = 20, b = 6, n = 16;
  auto leaf = [](Tensor t) {
    t.set_requires_grad(true);
    return t;
  };
  const Tensor gx = leaf(mul(random_f64({steps, b, 4 * n}, 21), 2.0).to(DType::F32));
  const Tensor w = leaf(mul(random_f64({4 * n, n}, 22), 0.5).to(DType::F32));
  const Tensor h0 = leaf(random_f64({b, n}, 23).to(DType::F32));
  const Tensor c0 = leaf(random_f64({b, n}, 24).to(DType::F32));
  const std::vector<Tensor> fused = lstm_sequence(gx, w, h0, c0);
  Tensor h = h0, c = c0;
  std::vector<Tensor> ys;
  for (int64_t t = 0; t < steps; ++t) {
    const std::vector<Tensor> hc = lstm_pointwise(add(gx.select(0, t), linear(h, w)), c);
    h = hc[0];
    c = hc[1];
    ys.push_back(h);
  }
  const Tensor y = stack(ys, 0);
  EXPECT_EQ(fused[0].to_vector<float>(), y.to_vector<float>());
  EXPECT_EQ(fused[1].to_vector<float>(), h.to_vector<float>());
  EXPECT_EQ(fused[2].to_vector<float>(), c.to_vector<float>());

  const Tensor wy = random_f64({steps, b, n}, 25).to(DType::F32);
  const Tensor ws = random_f64({b, n}, 26).to(DType::F32);
  auto grads = [&](const Tensor& yy, const Tensor& hh, const Tensor& cc) {
    const Tensor loss = add(add(sum(mul(yy, wy)), sum(mul(hh, ws))), sum(mul(cc, ws)));
    return autograd::grad({loss}, {}, {gx, w, h0, c0});
  };
  const std::vector<Tensor> gf = grads(fused[0], fused[1], fused[2]);
  const std::vector<Tensor> gu = grads(y, h, c);
  const char* names[] = {"d gates_x", "d w_hh", "d h0", "d c0"};
  for (size_t i = 0; i < 4; ++i)
    EXPECT_TRUE(testing::all_close(gf[i], gu[i], 0x1p-24, 16, names[i]));
}

// Without grad the op keeps one step's activations and two cell states, not all of them: the
// same outputs, and no graph.
TEST(LstmSequence, WithoutGradTheSameOutputs) {
  Tensor gx = mul(random_f64({9, 4, 32}, 31), 2.0).to(DType::F32);
  const Tensor w = random_f64({32, 8}, 32).to(DType::F32);
  const std::vector<Tensor> plain = lstm_sequence(gx, w);
  gx.set_requires_grad(true);
  const std::vector<Tensor> graphed = lstm_sequence(gx, w);
  EXPECT_TRUE(graphed[0].requires_grad());
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(plain[i].requires_grad());
    EXPECT_EQ(plain[i].to_vector<float>(), graphed[i].to_vector<float>()) << i;
  }
}

// y's gradient may arrive as a transposed view (a batch-first caller's transpose): the kernel
// reads its rows in place, and the gradients equal those of a contiguous copy.
TEST(LstmSequence, ATransposedOutputGradientIsReadInPlace) {
  Tensor gx = mul(random_f64({6, 5, 12}, 41), 2.0).to(DType::F32);
  gx.set_requires_grad(true);
  const Tensor w = random_f64({12, 3}, 42).to(DType::F32);
  const Tensor wb = random_f64({5, 6, 3}, 43).to(DType::F32);  // batch-first weights
  const Tensor y = lstm_sequence(gx, w)[0];
  const Tensor via_view = autograd::grad({sum(mul(y.transpose(0, 1), wb))}, {}, {gx}, true)[0];
  const Tensor via_copy =
      autograd::grad({sum(mul(y, wb.transpose(0, 1).contiguous()))}, {}, {gx})[0];
  EXPECT_EQ(via_view.to_vector<float>(), via_copy.to_vector<float>());
}

TEST(LstmSequence, MistakesAreNamed) {
  const Tensor w = Tensor::zeros({8, 2});
  EXPECT_THROW(lstm_sequence(Tensor::zeros({3, 8}), w), Error);     // not (T, B, 4H)
  EXPECT_THROW(lstm_sequence(Tensor::zeros({0, 2, 8}), w), Error);  // no steps
  EXPECT_THROW(lstm_sequence(Tensor::zeros({3, 2, 8}), Tensor::zeros({8, 3})), Error);     // w
  EXPECT_THROW(lstm_sequence(Tensor::zeros({3, 2, 8}), w, Tensor::zeros({3, 2})), Error);  // h0
  EXPECT_THROW(lstm_sequence(Tensor::zeros({3, 2, 8}), w, Tensor(), Tensor::zeros({2, 3})),
               Error);  // c0
}

TEST(LstmPointwise, MistakesAreNamed) {
  EXPECT_THROW(lstm_pointwise(Tensor::zeros({2, 7}), Tensor()), Error);
  EXPECT_THROW(lstm_pointwise(Tensor::zeros({2, 8}), Tensor::zeros({2, 3})), Error);
}

}  // namespace
}  // namespace mantissa
