// Elementwise ops through the per-op harness: every dtype against float64, gradients against
// finite differences, broadcast and strided inputs; each with an independent reference.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/op_harness.h"

namespace mantissa {
namespace {

using testing::check_op;
using testing::OpCase;
using testing::random_f64;

// Applies f to every element, in plain double: the independent reference.
Tensor map_f64(const Tensor& x, double (*f)(double)) {
  std::vector<double> v = x.to_vector<double>();
  for (double& e : v)
    e = f(e);
  return Tensor::from_vector(v, x.shape(), DType::F64);
}

// Values kept away from an op's kinks (0 for relu/abs) so finite differences are meaningful.
Tensor away_from_zero(const Shape& s, uint64_t seed) {
  std::vector<double> v = random_f64(s, seed, 0.1, 2.0).to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i)
    v[i] *= (i % 3 == 0) ? -1.0 : 1.0;
  return Tensor::from_vector(v, s, DType::F64);
}

struct UnaryCase {
  const char* name;
  Tensor (*op)(const Tensor&);
  double (*ref)(double);
  double lo, hi;
};

double relu_ref(double x) {
  return x > 0 ? x : 0;
}
double gelu_ref(double x) {
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double silu_ref(double x) {
  return x / (1 + std::exp(-x));
}
double sigmoid_ref(double x) {
  return 1 / (1 + std::exp(-x));
}
double rsqrt_ref(double x) {
  return 1 / std::sqrt(x);
}
double neg_ref(double x) {
  return -x;
}
double square_ref(double x) {
  return x * x;
}
double recip_ref(double x) {
  return 1 / x;
}
Tensor gelu_tanh_op(const Tensor& x) {
  return gelu(x, GeluApproximation::Tanh);
}
Tensor gelu_op(const Tensor& x) {
  return gelu(x);
}
Tensor leaky_relu_op(const Tensor& x) {
  return leaky_relu(x, 0.2);
}
double leaky_relu_ref(double x) {
  return x > 0 ? x : 0.2 * x;
}

class Unary : public ::testing::TestWithParam<UnaryCase> {};

TEST_P(Unary, MatchesReferenceAndFiniteDifferences) {
  const UnaryCase u = GetParam();
  const Tensor x = u.lo < 0 && (std::string(u.name) == "relu" || std::string(u.name) == "abs" ||
                                std::string(u.name) == "leaky_relu")
                       ? away_from_zero({5, 7}, 11)
                       : random_f64({5, 7}, 11, u.lo, u.hi);
  OpCase c;
  c.name = u.name;
  c.inputs = {x};
  c.fn = [op = u.op](const std::vector<Tensor>& in) { return op(in[0]); };
  c.reference = [ref = u.ref](const std::vector<Tensor>& in) { return map_f64(in[0], ref); };
  check_op(c);
}

INSTANTIATE_TEST_SUITE_P(
    Ops, Unary,
    ::testing::Values(UnaryCase{"neg", neg, neg_ref, -2, 2},
                      UnaryCase{"exp", exp, [](double x) { return std::exp(x); }, -2, 2},
                      UnaryCase{"log", log, [](double x) { return std::log(x); }, 0.2, 3},
                      UnaryCase{"sqrt", sqrt, [](double x) { return std::sqrt(x); }, 0.2, 3},
                      UnaryCase{"rsqrt", rsqrt, rsqrt_ref, 0.2, 3},
                      UnaryCase{"abs", abs, [](double x) { return std::fabs(x); }, -2, 2},
                      UnaryCase{"square", square, square_ref, -2, 2},
                      UnaryCase{"reciprocal", reciprocal, recip_ref, 0.3, 3},
                      UnaryCase{"relu", relu, relu_ref, -2, 2},
                      UnaryCase{"leaky_relu", leaky_relu_op, leaky_relu_ref, -2, 2},
                      UnaryCase{"gelu", gelu_op, gelu_ref, -3, 3},
                      UnaryCase{"gelu_tanh", gelu_tanh_op, gelu_tanh_ref, -3, 3},
                      UnaryCase{"silu", silu, silu_ref, -3, 3},
                      UnaryCase{"sigmoid", sigmoid, sigmoid_ref, -3, 3},
                      UnaryCase{"tanh", tanh, [](double x) { return std::tanh(x); }, -2, 2}),
    [](const auto& p) { return std::string(p.param.name); });

TEST(Elementwise, PowClampAndScalarOps) {
  OpCase p;
  p.name = "pow 2.5";
  p.inputs = {random_f64({4, 6}, 3, 0.2, 2.0)};
  p.fn = [](const std::vector<Tensor>& in) { return pow(in[0], 2.5); };
  p.reference = [](const std::vector<Tensor>& in) {
    return map_f64(in[0], [](double x) { return std::pow(x, 2.5); });
  };
  check_op(p);

  OpCase cl;
  cl.name = "clamp";
  cl.inputs = {random_f64({4, 6}, 5, -2, 2)};
  cl.fn = [](const std::vector<Tensor>& in) { return clamp(in[0], -0.5, 0.75); };
  cl.reference = [](const std::vector<Tensor>& in) {
    return map_f64(in[0], [](double x) { return std::min(std::max(x, -0.5), 0.75); });
  };
  check_op(cl);

  OpCase s;
  s.name = "scalar arithmetic";
  s.inputs = {random_f64({3, 5}, 9)};
  s.fn = [](const std::vector<Tensor>& in) { return rsub(mul(add(in[0], 0.5), 3.0) / 2.0, 1.0); };
  s.reference = [](const std::vector<Tensor>& in) {
    return map_f64(in[0], [](double x) { return 1.0 - (x + 0.5) * 3.0 / 2.0; });
  };
  check_op(s);
}

// Binary ops with broadcasting: (4, 1, 6) op (5, 1) -> (4, 5, 6).
Tensor broadcast_ref(const Tensor& a, const Tensor& b, double (*f)(double, double)) {
  const Shape out = broadcast_shapes(a.shape(), b.shape());
  const Tensor ae = a.expand(out).contiguous(), be = b.expand(out).contiguous();
  std::vector<double> va = ae.to_vector<double>(), vb = be.to_vector<double>(), r(va.size());
  for (size_t i = 0; i < r.size(); ++i)
    r[i] = f(va[i], vb[i]);
  return Tensor::from_vector(r, out, DType::F64);
}

struct BinaryCase {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
  double (*ref)(double, double);
};

class Binary : public ::testing::TestWithParam<BinaryCase> {};

TEST_P(Binary, BroadcastsAndDifferentiates) {
  const BinaryCase b = GetParam();
  OpCase c;
  c.name = b.name;
  c.inputs = {random_f64({4, 1, 6}, 21, 0.5, 2.0), random_f64({5, 1}, 22, 0.5, 2.5)};
  c.fn = [op = b.op](const std::vector<Tensor>& in) { return op(in[0], in[1]); };
  c.reference = [ref = b.ref](const std::vector<Tensor>& in) {
    return broadcast_ref(in[0], in[1], ref);
  };
  check_op(c);
}

INSTANTIATE_TEST_SUITE_P(
    Ops, Binary,
    ::testing::Values(
        BinaryCase{"add", add, [](double a, double b) { return a + b; }},
        BinaryCase{"sub", sub, [](double a, double b) { return a - b; }},
        BinaryCase{"mul", mul, [](double a, double b) { return a * b; }},
        BinaryCase{"div", div, [](double a, double b) { return a / b; }},
        BinaryCase{"pow", pow, [](double a, double b) { return std::pow(a, b); }},
        BinaryCase{"maximum", maximum, [](double a, double b) { return std::max(a, b); }},
        BinaryCase{"minimum", minimum, [](double a, double b) { return std::min(a, b); }}),
    [](const auto& p) { return std::string(p.param.name); });

TEST(Elementwise, WhereAndComparisons) {
  const Tensor a = Tensor::from_vector(std::vector<double>{1, 5, 3, 7}, {4});
  const Tensor b = Tensor::from_vector(std::vector<double>{2, 5, 1, 9}, {4});
  EXPECT_EQ(gt(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 0, 1, 0}));
  EXPECT_EQ(eq(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_EQ(le(a, b).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 1, 0, 1}));
  EXPECT_EQ(gt(a, b).dtype(), DType::Bool);

  OpCase w;
  w.name = "where";
  const Tensor cond = gt(random_f64({3, 4}, 1), Tensor::scalar(0.0, DType::F64));
  w.inputs = {random_f64({3, 4}, 2), random_f64({4}, 3)};
  w.fn = [cond](const std::vector<Tensor>& in) { return where(cond, in[0], in[1]); };
  w.reference = [cond](const std::vector<Tensor>& in) {
    const std::vector<uint8_t> c = cond.to_vector<uint8_t>();
    const std::vector<double> x = in[0].to_vector<double>();
    const std::vector<double> y = in[1].expand({3, 4}).contiguous().to_vector<double>();
    std::vector<double> r(c.size());
    for (size_t i = 0; i < r.size(); ++i)
      r[i] = c[i] ? x[i] : y[i];
    return Tensor::from_vector(r, {3, 4}, DType::F64);
  };
  check_op(w);
}

TEST(Elementwise, PromotionRules) {
  EXPECT_EQ(promote_types(DType::BF16, DType::F32), DType::F32);
  EXPECT_EQ(promote_types(DType::BF16, DType::F16), DType::F32);
  EXPECT_EQ(promote_types(DType::F16, DType::F64), DType::F64);
  EXPECT_EQ(promote_types(DType::I64, DType::BF16), DType::BF16);
  EXPECT_EQ(promote_types(DType::I32, DType::I64), DType::I64);
  const Tensor h = Tensor::ones({2}, DType::BF16), f = Tensor::ones({2}, DType::F32);
  EXPECT_EQ(add(h, f).dtype(), DType::F32);
  EXPECT_EQ(mul(h, 3.0).dtype(), DType::BF16) << "a scalar never widens a tensor";
  const Tensor i = Tensor::arange(4);
  EXPECT_EQ(add(i, i).dtype(), DType::I64);
  EXPECT_EQ(add(i, i).to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(div(i, Tensor::full({4}, 2, DType::I64)).dtype(), DType::F32);
  EXPECT_EQ(exp(i).dtype(), DType::F32);
}

TEST(Elementwise, HalfResultsAreRoundedOnceToNearestEven) {
  // 1 + 2^-8 is not a bf16; adding exactly gives the tie, which rounds to even (1.0).
  const Tensor one = Tensor::ones({16}, DType::BF16);
  const Tensor tiny = Tensor::full({16}, std::ldexp(1.0, -8), DType::BF16);
  for (float v : add(one, tiny).to_vector<float>())
    EXPECT_EQ(v, 1.0f);
  const Tensor three = Tensor::full({16}, std::ldexp(3.0, -8), DType::BF16);
  for (float v : add(one, three).to_vector<float>())
    EXPECT_EQ(v, 1.0f + std::ldexp(1.0f, -6));
  // Large tensors take the threaded path; results are the same.
  const Tensor big = Tensor::normal({300000}, 0, 1, 5, DType::BF16);
  const std::vector<float> got = mul(big, big).to_vector<float>();
  const std::vector<float> x = big.to_vector<float>();
  for (size_t i = 0; i < x.size(); i += 997) {
    EXPECT_EQ(got[i], float(bfloat16(x[i] * x[i])));
  }
}

}  // namespace
}  // namespace mantissa
