#include <gtest/gtest.h>

#include <cmath>

#include "mantissa/autograd/engine.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

Tensor leaf(std::vector<double> v, Shape s, DType d = DType::F32) {
  return Tensor::from_vector(v, s, d).set_requires_grad(true);
}

TEST(Autograd, DiamondGraphAccumulatesBothPaths) {
  Tensor x = leaf({2.0}, {1});
  Tensor a = mul(x, 3.0);
  Tensor b = exp(x);
  Tensor y = mul(a, b);  // 3x e^x -> d/dx = 3e^x + 3x e^x
  y.backward();
  EXPECT_NEAR(x.grad().item(), 3 * std::exp(2.0) * 3.0, 1e-4);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor w = leaf({1, 2}, {2});
  sum(mul(w, 2.0)).backward();
  sum(mul(w, 3.0)).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{5, 5}));
  w.set_grad(Tensor());
  EXPECT_FALSE(w.grad().defined());
}

TEST(Autograd, RetainGraphAllowsASecondBackward) {
  Tensor w = leaf({1, 2}, {2});
  Tensor loss = sum(mul(w, w));
  loss.backward(Tensor(), /*retain_graph=*/true);
  loss.backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{4, 8}));
}

TEST(Autograd, NoGradDetachAndLeaves) {
  Tensor w = leaf({1}, {1});
  {
    NoGrad ng;
    EXPECT_FALSE(mul(w, 2.0).requires_grad());
    EXPECT_FALSE(autograd::grad_enabled());
    {
      autograd::EnableGrad eg;
      EXPECT_TRUE(mul(w, 2.0).requires_grad());
    }
  }
  EXPECT_TRUE(autograd::grad_enabled());
  const Tensor y = mul(w, 2.0);
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(w.is_leaf());
  EXPECT_FALSE(y.detach().requires_grad());
  EXPECT_TRUE(y.detach().shares_storage(y));
  EXPECT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "mulBackward");
}

TEST(Autograd, HooksSeeAndReplaceGradients) {
  Tensor w = leaf({1, 1}, {2});
  Tensor h = mul(w, 3.0);
  std::vector<float> seen;
  h.register_hook([&](const Tensor& g) {
    seen = g.to_vector<float>();
    return mul(g, 10.0);  // replaces the gradient flowing on
  });
  int leaf_calls = 0;
  const int id = w.register_hook([&](const Tensor&) {
    ++leaf_calls;
    return Tensor();  // keep as is
  });
  sum(mul(h, 2.0)).backward();
  EXPECT_EQ(seen, (std::vector<float>{2, 2}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{60, 60}));
  EXPECT_EQ(leaf_calls, 1);
  w.remove_hook(id);
  sum(w).backward();
  EXPECT_EQ(leaf_calls, 1);
}

TEST(Autograd, RetainGradOnNonLeaf) {
  Tensor w = leaf({1, 2}, {2});
  Tensor h = mul(w, w);
  h.retain_grad();
  sum(mul(h, 3.0)).backward();
  EXPECT_EQ(h.grad().to_vector<float>(), (std::vector<float>{3, 3}));
}

TEST(Autograd, BackwardRunsInTheForwardDtype) {
  Tensor w = leaf({0.5, 1.5}, {2}, DType::BF16);
  Tensor h = mul(w, w);  // bf16
  EXPECT_EQ(h.dtype(), DType::BF16);
  std::vector<DType> seen;
  h.register_hook([&](const Tensor& g) {
    seen.push_back(g.dtype());
    return Tensor();
  });
  Tensor loss = sum(cast(h, DType::F32));  // the loss in fp32
  loss.backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], DType::BF16) << "the gradient of a bf16 op arrives in bf16";
  EXPECT_EQ(w.grad().dtype(), DType::BF16);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1, 3}));
}

TEST(Autograd, GradOfSelectedInputs) {
  Tensor a = leaf({1, 2}, {2}), b = leaf({3, 4}, {2});
  Tensor out = sum(mul(a, b));
  const auto g = autograd::grad({out}, {}, {a});
  EXPECT_EQ(g[0].to_vector<float>(), (std::vector<float>{3, 4}));
  EXPECT_FALSE(a.grad().defined()) << "grad() does not touch .grad";
}

TEST(Autograd, PostHooksOnNodes) {
  Tensor w = leaf({1, 2}, {2});
  Tensor y = mul(w, 2.0);
  int calls = 0;
  y.grad_fn()->register_post_hook(
      [&](const std::vector<Tensor>& in, const std::vector<Tensor>& out) {
        ++calls;
        EXPECT_EQ(in.size(), 1u);
        EXPECT_EQ(out.size(), 1u);
      });
  sum(y).backward();
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace mantissa
