// FP4 training's op (autocast/fp4.h): fp4_gemm against float64 sums of the same quantized
// values; fp4_linear's three GEMMs against float64 products of what each GEMM is defined to
// quantize (fprop 1x16 activations and 16x16 weights, dgrad the gradient with stochastic
// rounding and the forward's weight transposed, wgrad both inputs along the batch after the
// RHT); its gradients near the exact ones; its seeded stochastic rounding drawing a new stream
// per quantization, resumable; and the layer selection of selective high precision.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "harness/op_harness.h"
#include "mantissa/amp/amp.h"
#include "mantissa/amp/precision.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/layers.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {
namespace {

Tensor f64(const Tensor& t) {
  return t.to(DType::F64);
}

// What an Fp4Tensor stands for, in f64 (values exact, times the tensor scale).
Tensor dequantized(const Fp4Tensor& q) {
  return mul(f64(q.values), Tensor::full({1}, q.scale_inv.item(), DType::F64));
}

// max |got - want| / max |want|.
double rel_err(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = f64(got).to_vector<double>(), w = f64(want).to_vector<double>();
  double e = 0, m = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    e = std::max(e, std::abs(g[i] - w[i]));
    m = std::max(m, std::abs(w[i]));
  }
  return e / m;
}

TEST(Fp4Gemm, IsTheFp32SumOfTheQuantizedValuesTimesBothScales) {
  for (const Fp4Recipe r : {Fp4Recipe::NVFP4, Fp4Recipe::MXFP4}) {
    const Tensor a = testing::random_f64({24, 96}, 1, -5, 5).to(DType::BF16);
    const Tensor b = testing::random_f64({40, 96}, 2, -0.1, 0.1).to(DType::F32);
    const Fp4Tensor qa = fp4_quantize(a, {.recipe = r}), qb = fp4_quantize(b, {.recipe = r});
    const Tensor bias = testing::random_f64({40}, 3, -1, 1).to(DType::F32);
    const Tensor got = fp4_gemm(qa, qb, bias, DType::F32);
    const Tensor want = add(matmul(dequantized(qa), dequantized(qb).t()), f64(bias));
    EXPECT_LT(rel_err(got, want), 96 * 6e-8) << name_of(r);
    // Near the unquantized product: fp4 keeps about one bit, so within a few tens of percent.
    EXPECT_LT(rel_err(got, add(matmul(f64(a), f64(b).t()), f64(bias))), 0.5) << name_of(r);
  }
}

// fp4_linear's GEMMs, each against its definition.
TEST(Fp4Linear, EachGemmMultipliesWhatTheRecipeQuantizes) {
  const Tensor x = testing::random_f64({32, 48}, 4, -2, 2).to(DType::F32).set_requires_grad(true);
  const Tensor w =
      testing::random_f64({64, 48}, 5, -0.3, 0.3).to(DType::F32).set_requires_grad(true);
  const Tensor g = testing::random_f64({32, 64}, 6, -1, 1).to(DType::F32);
  for (const bool rht : {false, true}) {
    SCOPED_TRACE(rht ? "rht" : "no rht");
    Fp8LinearState st;
    st.sr_seed = 99;
    const Fp4Options o{
        .recipe = Fp4Recipe::NVFP4, .rht = rht, .two_d = true, .sr = true, .seed = 7};
    Tensor y = fp4_linear(x, w, Tensor(), st, o);
    const Fp4Tensor qx = fp4_quantize(x, {}), qw = fp4_quantize(w, {.two_d = true});
    EXPECT_LT(rel_err(y, matmul(dequantized(qx), dequantized(qw).t())), 48 * 6e-8);
    EXPECT_EQ(st[Fp8Role::Weight].quantizations, 1);
    y.backward(g);
    EXPECT_EQ(st.sr_draws, 2);  // dgrad's and wgrad's gradient quantizations
    // dgrad: the gradient along `out`, stream 0; the forward's weight, transposed.
    const Fp4Tensor qg = fp4_quantize(g, {.stochastic = true, .seed = 99, .offset = 0});
    EXPECT_LT(rel_err(x.grad(), matmul(dequantized(qg), dequantized(qw))), 64 * 6e-8);
    // wgrad: g^T and x^T along the batch, transformed, stream 1 for the gradient.
    Tensor gt = g.t().contiguous(), xt = x.detach().t().contiguous();
    if (rht) {
      gt = hadamard16(gt, fp4_rht_signs(7));
      xt = hadamard16(xt, fp4_rht_signs(7));
    }
    const Fp4Tensor qgt = fp4_quantize(gt, {.stochastic = true, .seed = 99, .offset = 1});
    const Fp4Tensor qxt = fp4_quantize(xt, {});
    EXPECT_LT(rel_err(w.grad(), matmul(dequantized(qgt), dequantized(qxt).t())), 32 * 6e-8);
    // Both near the exact gradients.
    EXPECT_LT(rel_err(x.grad(), matmul(f64(g), f64(w))), 0.5);
    EXPECT_LT(rel_err(w.grad(), matmul(f64(g).t(), f64(x))), 0.5);
    x.set_grad(Tensor());
    w.set_grad(Tensor());
  }
}

// Stochastic rounding makes the gradient unbiased: averaged over many draws (each backward its
// own stream), dW approaches the product of the unrounded scaled values, closer than any one.
TEST(Fp4Linear, StochasticRoundingAveragesToTheUnroundedGradient) {
  const Tensor x = testing::random_f64({16, 32}, 8, -1, 1).to(DType::F32);
  const Tensor w = testing::random_f64({16, 32}, 9, -1, 1).to(DType::F32).set_requires_grad(true);
  const Tensor g = testing::random_f64({16, 16}, 10, -1, 1).to(DType::F32);
  Fp8LinearState st;
  // Rounded-up MX scales: nothing saturates, so the rounding alone decides the mean.
  const Fp4Options o{.recipe = Fp4Recipe::MXFP4,
                     .rht = false,
                     .two_d = false,
                     .sr = true,
                     .mx_scale = MxScale::Ceil};
  Tensor mean = Tensor::zeros({16, 32}, DType::F64);
  const int n = 200;
  double first = 0;
  // The exact wgrad of the gradient against x's quantization (RNE, the same every time).
  const Fp4Quantization rne{.recipe = Fp4Recipe::MXFP4, .mx_scale = MxScale::Ceil};
  const Tensor want = matmul(f64(g).t(), dequantized(fp4_quantize(x.t().contiguous(), rne)).t());
  for (int i = 0; i < n; ++i) {
    fp4_linear(x, w, Tensor(), st, o).backward(g);
    if (i == 0) first = rel_err(w.grad(), want);
    mean = add(mean, f64(w.grad()));
    w.set_grad(Tensor());
  }
  mean = mul(mean, Tensor::full({1}, 1.0 / n, DType::F64));
  EXPECT_EQ(st.sr_draws, n);  // x takes no gradient: wgrad's quantization alone
  EXPECT_LT(rel_err(mean, want), first / 4);
}

// The run's state: a checkpoint keeps each layer's draws, so a resumed run draws on.
TEST(Fp4Context, CheckpointsTheDrawsAndRefusesACheckpointWithout) {
  Fp8Options o;
  o.fp4 = Fp4Options{};
  Fp8Context ctx(o);
  auto a = ctx.add_layer("fc1");
  auto b = ctx.add_layer("fc2");
  EXPECT_NE(a->sr_seed, b->sr_seed);
  a->sr_draws = 12;
  const auto state = ctx.state_dict();
  ASSERT_EQ(state.count("fp8.fc1.sr_draws"), 1u);
  Fp8Context other(o);
  auto a2 = other.add_layer("fc1");
  other.add_layer("fc2");
  other.load_state_dict(state);
  EXPECT_EQ(a2->sr_draws, 12);
  EXPECT_EQ(a2->sr_seed, a->sr_seed);
  Fp8Context third(o);
  third.add_layer("fc1");
  EXPECT_THROW(third.load_state_dict({}), Error);
}

// Selective high precision: of the candidate Linear layers (inner: all but the first and the
// last), the last share stays bf16.
TEST(Fp4Recipe, KeepsTheLastLayersInBf16) {
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 12; ++i)
    model->push_back(std::make_shared<nn::Linear>(8, 8, uint64_t(i)));
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  Recipe r;
  r.precision = Precision::FP4;
  Amp amp = initialize(*model, opt, r);
  // 10 candidates, ceil(0.15 * 10) = 2 kept: layers 1..8 in FP4.
  ASSERT_NE(amp.fp8(), nullptr);
  EXPECT_EQ(amp.fp8()->layers().size(), 8u);
  EXPECT_EQ(amp.fp8()->layers().back()->name, "8");
  auto model2 = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 12; ++i)
    model2->push_back(std::make_shared<nn::Linear>(8, 8, uint64_t(i)));
  optim::SGD opt2(model2->parameters(), {.lr = 0.1});
  r.fp4_high_precision_layers = 0;
  r.fp4_layers = Fp8Layers::All;
  EXPECT_EQ(initialize(*model2, opt2, r).fp8()->layers().size(), 12u);
  EXPECT_NE(amp.describe().find("fp4 nvfp4 (rht on, 2d on, sr on) in 8 Linear layers"),
            std::string::npos)
      << amp.describe();
}

}  // namespace
}  // namespace mantissa::amp
