// DCN: the cross layer against a float64 reference and finite differences, the model's
// parameters, names and forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/tensor/ops.h"

namespace mt = mantissa;

namespace {

constexpr int64_t kB = 3, kD = 5;

std::vector<double> values(int64_t n, double scale, double shift) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = scale * std::sin(0.7 * double(i) + shift);
  return v;
}

// x0 * (xl . w) + b + xl in double, row by row.
std::vector<double> cross_reference(const std::vector<double>& x0, const std::vector<double>& xl,
                                    const std::vector<double>& w, const std::vector<double>& b) {
  std::vector<double> out(x0.size());
  for (int64_t r = 0; r < kB; ++r) {
    double s = 0;
    for (int64_t j = 0; j < kD; ++j)
      s += xl[size_t(r * kD + j)] * w[size_t(j)];
    for (int64_t j = 0; j < kD; ++j)
      out[size_t(r * kD + j)] = x0[size_t(r * kD + j)] * s + b[size_t(j)] + xl[size_t(r * kD + j)];
  }
  return out;
}

}  // namespace

TEST(CrossLayer, ForwardMatchesFloat64Reference) {
  mt::nn::CrossLayer layer(kD, 1);
  const std::vector<double> x0 = values(kB * kD, 1.0, 0.1), xl = values(kB * kD, 0.8, 1.3);
  const std::vector<float> wf = layer.weight().to_vector<float>();
  const std::vector<double> w(wf.begin(), wf.end());
  {
    mt::NoGrad ng;
    mt::Tensor(layer.bias()).copy_(mt::Tensor::from_vector(values(kD, 0.3, 2.0), {kD}));
  }
  const std::vector<float> bf = layer.bias().to_vector<float>();
  const std::vector<double> b(bf.begin(), bf.end());
  // fp32 inputs that are exactly the double values rounded: compare with fp32's epsilon.
  std::vector<float> x0f(x0.begin(), x0.end()), xlf(xl.begin(), xl.end());
  const std::vector<double> x0r(x0f.begin(), x0f.end()), xlr(xlf.begin(), xlf.end());
  const mt::Tensor out =
      layer({mt::Tensor::from_vector(x0f, {kB, kD}), mt::Tensor::from_vector(xlf, {kB, kD})})[0];
  const std::vector<double> ref = cross_reference(x0r, xlr, w, b);
  const std::vector<float> got = out.to_vector<float>();
  const double eps = std::numeric_limits<float>::epsilon();
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(got[i], ref[i], 16 * eps * (1 + std::fabs(ref[i]))) << i;
}

TEST(CrossLayer, BackwardMatchesFiniteDifferences) {
  // In float64: the gradients of sum(out * c) for x0, xl, weight and bias against central
  // differences of the reference.
  mt::nn::CrossLayer layer(kD, 2);
  layer.to(mt::DType::F64);
  std::vector<double> x0 = values(kB * kD, 1.0, 0.4), xl = values(kB * kD, 0.9, 2.1);
  const std::vector<double> c = values(kB * kD, 1.0, 0.9);
  std::vector<double> w = layer.weight().to_vector<double>();
  std::vector<double> b = values(kD, 0.2, 1.0);
  {
    mt::NoGrad ng;
    mt::Tensor(layer.bias()).copy_(mt::Tensor::from_vector(b, {kD}));
  }
  mt::Tensor tx0 = mt::Tensor::from_vector(x0, {kB, kD});
  mt::Tensor txl = mt::Tensor::from_vector(xl, {kB, kD});
  tx0.set_requires_grad(true);
  txl.set_requires_grad(true);
  const mt::Tensor out = layer({tx0, txl})[0];
  ASSERT_EQ(out.dtype(), mt::DType::F64);
  mt::sum(mt::mul(out, mt::Tensor::from_vector(c, {kB, kD}))).backward();

  auto objective = [&] {
    const std::vector<double> o = cross_reference(x0, xl, w, b);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i)
      s += o[i] * c[i];
    return s;
  };
  const double h = 1e-6;
  auto check = [&](std::vector<double>& v, const mt::Tensor& grad, const char* what) {
    ASSERT_TRUE(grad.defined()) << what;
    const std::vector<double> g = grad.to_vector<double>();
    ASSERT_EQ(g.size(), v.size()) << what;
    for (size_t i = 0; i < v.size(); ++i) {
      const double keep = v[i];
      v[i] = keep + h;
      const double up = objective();
      v[i] = keep - h;
      const double down = objective();
      v[i] = keep;
      EXPECT_NEAR(g[i], (up - down) / (2 * h), 1e-7 * (1 + std::fabs(g[i]))) << what << " " << i;
    }
  };
  check(x0, tx0.grad(), "x0");
  check(xl, txl.grad(), "xl");
  check(w, layer.weight().grad(), "weight");
  check(b, layer.bias().grad(), "bias");
}

TEST(CrossLayer, RefusesMismatchedInputs) {
  mt::nn::CrossLayer layer(4, 0);
  EXPECT_HAS(mt::testing::error_of([&] {
               layer({mt::Tensor::zeros({2, 4}, mt::DType::F32)});
             }),
             "takes {x0, xl}");
  EXPECT_HAS(mt::testing::error_of([&] {
               layer({mt::Tensor::zeros({2, 4}, mt::DType::F32),
                      mt::Tensor::zeros({2, 3}, mt::DType::F32)});
             }),
             "must both be (B, 4)");
}

TEST(Dcn, ParametersNamesAndForward) {
  const auto model = mt::nn::make_model("dcn", {.seed = 3});
  EXPECT_EQ(mt::nn::model_input("dcn"), mt::nn::ModelInput::Clicks);
  // 26 x 10,000 x 16 table rows; x0 = 13 + 416 = 429; cross 3 x 858; deep 429*256+256 +
  // 256*128+128; head 557 + 1.
  EXPECT_EQ(model->num_parameters(), 4306108);
  std::vector<std::string> names;
  for (const auto& [name, t] : model->named_parameters())
    names.push_back(name);
  EXPECT_EQ(names.front(), "embeddings.0.weight");
  EXPECT_NE(std::find(names.begin(), names.end(), "embeddings.25.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "cross.2.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "deep.2.bias"), names.end());
  EXPECT_EQ(names.back(), "head.bias");

  mt::nn::ModelConfig small;
  small.dense_features = 4;
  small.table_sizes = {10, 20, 30};
  small.embedding_dim = 8;
  small.seed = 1;
  const auto m = mt::nn::make_model("dcn", small);
  const mt::nn::TensorList in = mt::nn::example_inputs("dcn", small, 6);
  const mt::Tensor logits = (*m)(in)[0];
  EXPECT_EQ(logits.shape(), mt::Shape({6}));
  EXPECT_EQ(logits.dtype(), mt::DType::F32);
  // The same seed, the same model and logits.
  const auto again = mt::nn::make_model("dcn", small);
  EXPECT_EQ((*again)(in)[0].to_vector<float>(), logits.to_vector<float>());
  EXPECT_HAS(mt::testing::error_of([&] { (*m)(in[0]); }), "dcn takes {dense");
  EXPECT_HAS(mt::testing::error_of([&] { mt::nn::example_input("dcn", small, 2); }),
             "example_inputs");
}
