// binary_cross_entropy and binary_cross_entropy_with_logits against float64 references (plain
// loops), forward and gradients (finite differences) in every dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "harness/op_harness.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using testing::check_op;
using testing::OpCase;
using testing::random_f64;

// Elementwise loss from (input, target) values, then the reduction, in float64.
template <typename F>
Tensor loss_ref(const Tensor& input, const Tensor& target, Reduction r, F f) {
  const std::vector<double> x = input.contiguous().to_vector<double>();
  const std::vector<double> y = target.contiguous().to_vector<double>();
  std::vector<double> l(x.size());
  double total = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    l[i] = f(x[i], y[i]);
    total += l[i];
  }
  switch (r) {
    case Reduction::None:
      return Tensor::from_vector(l, input.shape(), DType::F64);
    case Reduction::Sum:
      return Tensor::from_vector(std::vector<double>{total}, {}, DType::F64);
    case Reduction::Mean:
      break;
  }
  return Tensor::from_vector(std::vector<double>{total / double(x.size())}, {}, DType::F64);
}

double bce(double p, double y) {
  return -(y * std::max(std::log(p), -100.0) + (1 - y) * std::max(std::log(1 - p), -100.0));
}

double bce_logits(double x, double y) {
  const double p = 1 / (1 + std::exp(-x));
  return -(y * std::log(p) + (1 - y) * std::log(1 - p));
}

const char* reduction_name(Reduction r) {
  return r == Reduction::Mean ? "mean" : r == Reduction::Sum ? "sum" : "none";
}

TEST(NnBinaryCrossEntropy, MatchesTheFloat64ReferenceForEachReduction) {
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    OpCase c;
    c.name = std::string("binary_cross_entropy ") + reduction_name(r);
    // Probabilities away from 0 and 1 (where the finite differences of log blow up); soft targets.
    c.inputs = {random_f64({3, 5}, 1, 0.05, 0.95), random_f64({3, 5}, 2, 0.0, 1.0)};
    // The loss is F32 for half inputs; the harness compares in the inputs' dtype.
    c.fn = [r](const std::vector<Tensor>& in) {
      return binary_cross_entropy(in[0], in[1], r).to(in[0].dtype());
    };
    c.reference = [r](const std::vector<Tensor>& in) { return loss_ref(in[0], in[1], r, bce); };
    check_op(c);
  }
}

TEST(NnBinaryCrossEntropy, WithLogitsMatchesTheFloat64ReferenceForEachReduction) {
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    OpCase c;
    c.name = std::string("binary_cross_entropy_with_logits ") + reduction_name(r);
    c.inputs = {random_f64({4, 3}, 3, -4.0, 4.0), random_f64({4, 3}, 4, 0.0, 1.0)};
    c.fn = [r](const std::vector<Tensor>& in) {
      return binary_cross_entropy_with_logits(in[0], in[1], r).to(in[0].dtype());
    };
    c.reference = [r](const std::vector<Tensor>& in) {
      return loss_ref(in[0], in[1], r, bce_logits);
    };
    check_op(c);
  }
}

TEST(NnBinaryCrossEntropy, EdgesDtypesAndErrors) {
  // p = 0 and 1 give the clamped, finite loss 100 where the target disagrees, 0 where it agrees.
  const Tensor p = Tensor::from_vector(std::vector<double>{0, 1, 0, 1}, {4});
  const Tensor y = Tensor::from_vector(std::vector<double>{1, 0, 0, 1}, {4});
  EXPECT_EQ(binary_cross_entropy(p, y, Reduction::None).to_vector<double>(),
            (std::vector<double>{100, 100, 0, 0}));
  // Large logits stay finite (the log-sum-exp form).
  const Tensor x = Tensor::from_vector(std::vector<double>{-200, 200}, {2});
  const Tensor t = Tensor::from_vector(std::vector<double>{1, 1}, {2});
  const std::vector<double> l =
      binary_cross_entropy_with_logits(x, t, Reduction::None).to_vector<double>();
  EXPECT_DOUBLE_EQ(l[0], 200.0);
  EXPECT_DOUBLE_EQ(l[1], 0.0);
  // Half inputs give an F32 loss, f64 an F64 one; gradients come back in the input's dtype.
  Tensor h = Tensor::uniform({3}, 0.2, 0.8, 1, DType::BF16).set_requires_grad(true);
  const Tensor hy = Tensor::uniform({3}, 0, 1, 2, DType::BF16);
  const Tensor loss = binary_cross_entropy(h, hy);
  EXPECT_EQ(loss.dtype(), DType::F32);
  loss.backward();
  EXPECT_EQ(h.grad().dtype(), DType::BF16);
  EXPECT_EQ(binary_cross_entropy_with_logits(h.detach().to(DType::F64), hy).dtype(), DType::F64);
  EXPECT_THROW(binary_cross_entropy(Tensor::ones({3}), Tensor::ones({4})), Error);
  EXPECT_THROW(binary_cross_entropy_with_logits(Tensor::ones({3}), Tensor::arange(3)), Error);
}

}  // namespace
}  // namespace mantissa
