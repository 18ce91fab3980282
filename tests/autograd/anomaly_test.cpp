// Anomaly detection (autograd/anomaly.h): the first inf or NaN made by an op, named.
#include "mantissa/autograd/anomaly.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "harness/errors.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/module.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::autograd {
namespace {

using mantissa::testing::error_of;

// Two Linear layers in fp16; the second one's weights are so large that its output overflows.
struct TwoLayers {
  std::shared_ptr<nn::Sequential> model;
  AnomalyNames names;
  TwoLayers() {
    model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
        std::make_shared<nn::Linear>(4, 8, 1), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(8, 2, 2)});
    model->to(DType::F16);
    names.module = [m = model.get()](const void* p) -> std::string {
      for (const auto& [path, mod] : m->named_modules())
        if (mod == p) return path.empty() ? "model" : path;
      return "";
    };
    names.tensor = [m = model.get()](const Tensor& t) -> std::string {
      for (const auto& [name, p] : m->named_parameters())
        if (p.impl() == t.impl()) return "parameter " + name;
      return "";
    };
  }
  Tensor input() const { return Tensor::full({3, 4}, 2.0, DType::F16); }
};

TEST(Anomaly, NamesTheOpAndModuleWhereAForwardOverflowIsMade) {
  TwoLayers t;
  {
    DetectAnomaly on(t.names);
    (*t.model)(t.input());  // finite: nothing to say
  }
  auto* second = dynamic_cast<nn::Linear*>(t.model->named_modules()[3].second);
  ASSERT_NE(second, nullptr);
  {
    NoGrad ng;
    second->weight().fill_(30000.0);
  }
  DetectAnomaly on(t.names);
  const std::string msg = error_of([&] { (*t.model)(t.input()); });
  EXPECT_HAS(msg, "anomaly: linear (forward) in module '2' (Linear) made inf");
  EXPECT_HAS(msg, "its output f16 (3, 2) holds 6 inf and 0 NaN of 6 values");
  EXPECT_HAS(msg, "input 1 f16 (2, 8) |x| from 3e+04 to 3e+04");
}

TEST(Anomaly, ANaNFromOutsideTheGraphIsNamedWhereItIsFirstRead) {
  TwoLayers t;
  auto* first = dynamic_cast<nn::Linear*>(t.model->named_modules()[1].second);
  ASSERT_NE(first, nullptr);
  {
    NoGrad ng;
    first->weight().narrow(0, 0, 1).fill_(std::numeric_limits<double>::quiet_NaN());
  }
  DetectAnomaly on(t.names);
  const std::string msg = error_of([&] { (*t.model)(t.input()); });
  EXPECT_HAS(msg, "anomaly: 'parameter 0.weight' (f16 (8, 4)) holds 0 inf and 4 NaN of 32 values");
  EXPECT_HAS(msg, "read by linear (forward) in module '0' (Linear)");
}

TEST(Anomaly, NamesTheBackwardThatMakesAnInfFromFiniteGradients) {
  // sqrt(0) is 0, its derivative 1 / (2 sqrt(0)) is inf: the classic backward anomaly.
  Tensor x = Tensor::from_vector(std::vector<float>{0.0f, 4.0f}, {2}).set_requires_grad(true);
  DetectAnomaly on;
  const Tensor y = sum(sqrt(x));
  const std::string msg = error_of([&] { y.backward(); });
  EXPECT_HAS(msg, "anomaly: the backward of sqrt");
  EXPECT_HAS(msg, "made inf: the gradient of its input 0 (f32 (2,)) holds 1 inf and 0 NaN of 2");
  EXPECT_HAS(msg, "incoming gradient 0 f32 (2,) |x| from 1 to 1");
}

TEST(Anomaly, AnInfThatComesFromAMaskIsNoAnomaly) {
  // Masked scores hold -inf by design; softmax turns them into zeros.
  Tensor s = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}).set_requires_grad(true);
  const Tensor keep = Tensor::from_vector(std::vector<float>{1, 0, 1, 1}, {2, 2});
  const Tensor neg_inf = Tensor::full({}, -INFINITY);
  DetectAnomaly on;
  const Tensor p = softmax(where(gt(keep, Tensor::full({}, 0.5)), s, neg_inf), 1);
  sum(mul(p, p)).backward();
  EXPECT_TRUE(std::isfinite(s.grad().to_vector<float>()[0]));
}

TEST(Anomaly, OffByDefaultAndOneThreadAtATime) {
  EXPECT_FALSE(anomaly_enabled());
  Tensor x = Tensor::from_vector(std::vector<float>{0.0f}, {1}).set_requires_grad(true);
  sum(sqrt(x)).backward();  // inf gradient, nothing checks it
  EXPECT_TRUE(std::isinf(x.grad().to_vector<float>()[0]));
  {
    DetectAnomaly on;
    EXPECT_TRUE(anomaly_enabled());
    EXPECT_HAS(error_of([] { DetectAnomaly again; }), "already on");
  }
  EXPECT_FALSE(anomaly_enabled());
}

}  // namespace
}  // namespace mantissa::autograd
