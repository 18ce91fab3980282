#include "harness/op_harness.h"

#include <algorithm>
#include <sstream>

namespace mantissa::testing {

double eps_of(DType d) {
  switch (d) {
    case DType::F64:
      return 0x1p-52;
    case DType::F32:
      return 0x1p-23;
    case DType::F16:
      return 0x1p-10;
    case DType::BF16:
      return 0x1p-7;
    case DType::FP8_E4M3:
      return 0x1p-3;
    case DType::FP8_E5M2:
      return 0x1p-2;
    default:
      return 0;
  }
}

double store_as(DType dt, double x) {
  switch (dt) {
    case DType::F64:
      return x;
    case DType::F32:
      return double(float(x));
    case DType::BF16:
      return double(float(bfloat16(float(x))));
    case DType::F16:
      return double(float(half(float(x))));
    default:
      ADD_FAILURE() << "no reference for " << dtype_name(dt);
      return x;
  }
}

Tensor random_f64(const Shape& shape, uint64_t seed, double lo, double hi) {
  return Tensor::uniform(shape, lo, hi, seed, DType::F64);
}

Tensor strided_copy(const Tensor& t) {
  NoGrad ng;
  if (t.dim() >= 2) {
    Shape swapped = t.shape();
    std::swap(swapped[t.dim() - 1], swapped[t.dim() - 2]);
    Tensor buf = Tensor::empty(swapped, t.dtype(), t.device());
    Tensor view = buf.transpose(-1, -2);
    view.copy_(t);
    return view.detach();
  }
  Shape doubled = t.shape();
  if (t.dim() == 0) return t.clone().detach();
  doubled[0] *= 2;
  Tensor buf = Tensor::zeros(doubled, t.dtype(), t.device());
  Tensor view = buf.slice(0, 0, doubled[0], 2);
  view.copy_(t);
  return view.detach();
}

::testing::AssertionResult all_close(const Tensor& got_t, const Tensor& ref_t, double eps, double k,
                                     const std::string& what) {
  if (got_t.shape() != ref_t.shape()) {
    return ::testing::AssertionFailure()
           << what << ": shape " << got_t.shape().str() << " vs " << ref_t.shape().str();
  }
  const std::vector<double> got = got_t.to_vector<double>(), ref = ref_t.to_vector<double>();
  double scale = 0;
  for (double r : ref)
    scale += std::isfinite(r) ? std::fabs(r) : 0.0;
  scale = ref.empty() ? 1.0 : std::max(scale / double(ref.size()), 1e-30);
  size_t worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i]) && std::isnan(got[i])) continue;
    if (std::isinf(ref[i]) && got[i] == ref[i]) continue;
    const double tol = k * eps * (std::fabs(ref[i]) + scale);
    const double ratio = std::fabs(got[i] - ref[i]) / tol;
    if (!(ratio <= worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (worst_ratio <= 1.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": element " << worst << " is " << got[worst] << ", reference " << ref[worst]
         << " (error " << std::fabs(got[worst] - ref[worst]) << " = " << worst_ratio
         << "x the tolerance " << k << " * eps * (|ref| + " << scale << "))";
}

namespace {

std::vector<Tensor> to_dtype(const std::vector<Tensor>& xs, DType d) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) {
    out.push_back(x.defined() && x.is_floating_point() ? x.to(d).detach() : x);
  }
  return out;
}

std::vector<bool> grad_mask(const OpCase& c) {
  std::vector<bool> m = c.grad;
  m.resize(c.inputs.size(), true);
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].defined() || !c.inputs[i].is_floating_point()) m[i] = false;
  }
  return m;
}

// sum(fn(inputs) * w): the scalar whose gradient the harness checks.
double weighted_loss(const OpCase& c, const std::vector<Tensor>& inputs, const Tensor& w) {
  NoGrad ng;
  return sum(mul(c.fn(inputs).to(DType::F64), w)).item();
}

// Analytic gradients of sum(fn(inputs) * w) in the inputs' dtype.
std::vector<Tensor> analytic_grads(const OpCase& c, const std::vector<Tensor>& inputs,
                                   const Tensor& w, const std::vector<bool>& mask) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor t = inputs[i].defined() ? inputs[i].detach() : Tensor();
    if (mask[i]) t.set_requires_grad(true);
    leaves.push_back(t);
  }
  Tensor out = c.fn(leaves);
  out.backward(w.to(out.dtype()));
  std::vector<Tensor> grads;
  for (size_t i = 0; i < leaves.size(); ++i)
    grads.push_back(mask[i] ? leaves[i].grad() : Tensor());
  return grads;
}

}  // namespace

void check_op(const OpCase& c, const std::vector<DType>& dtypes) {
  SCOPED_TRACE(c.name);
  const std::vector<bool> mask = grad_mask(c);
  const std::vector<Tensor> x64 = to_dtype(c.inputs, DType::F64);
  Tensor out64;
  {
    NoGrad ng;
    out64 = c.fn(x64);
  }
  ASSERT_EQ(out64.dtype(), DType::F64) << "an f64 op must compute in f64";
  if (c.reference) {
    EXPECT_TRUE(all_close(out64, c.reference(x64), 0x1p-52, 64, "f64 vs independent reference"));
  }
  const Tensor w = random_f64(out64.shape(), 4242, -1.0, 1.0);

  // Gradients in f64 against central finite differences.
  const std::vector<Tensor> g64 = analytic_grads(c, x64, w, mask);
  for (size_t i = 0; i < x64.size(); ++i) {
    if (!mask[i]) continue;
    ASSERT_TRUE(g64[i].defined()) << "no gradient reached input " << i;
    ASSERT_EQ(g64[i].shape(), x64[i].shape());
    const int64_t n = x64[i].numel();
    const std::vector<double> analytic = g64[i].to_vector<double>();
    std::vector<double> base = x64[i].contiguous().to_vector<double>();
    const int64_t samples = std::min<int64_t>(n, c.fd_samples);
    double gscale = 0;
    for (double a : analytic)
      gscale = std::max(gscale, std::fabs(a));
    for (int64_t s = 0; s < samples; ++s) {
      const int64_t j = n <= c.fd_samples ? s : (s * 7919) % n;
      const double h = 1e-6 * std::max(1.0, std::fabs(base[size_t(j)]));
      auto loss_at = [&](double v) {
        std::vector<double> pert = base;
        pert[size_t(j)] = v;
        std::vector<Tensor> xs = x64;
        xs[i] = Tensor::from_vector(pert, x64[i].shape(), DType::F64);
        return weighted_loss(c, xs, w);
      };
      const double fd = (loss_at(base[size_t(j)] + h) - loss_at(base[size_t(j)] - h)) / (2 * h);
      const double tol = 1e-6 * (std::fabs(fd) + gscale + 1e-12);
      EXPECT_NEAR(analytic[size_t(j)], fd, tol)
          << "d loss / d input" << i << "[" << j << "]: analytic vs finite difference";
    }
  }

  for (DType d : dtypes) {
    SCOPED_TRACE(std::string("dtype ") + std::string(dtype_name(d)));
    const std::vector<Tensor> xd = to_dtype(c.inputs, d);
    const std::vector<Tensor> ref_in = to_dtype(xd, DType::F64);  // the rounded values, in f64
    Tensor got, ref;
    {
      NoGrad ng;
      got = c.fn(xd);
      ref = c.fn(ref_in);
    }
    EXPECT_EQ(got.dtype(), d) << "the op must return its input dtype";
    EXPECT_TRUE(all_close(got, ref, eps_of(d), c.k_forward, "forward"));

    if (c.check_strided) {
      std::vector<Tensor> xs;
      for (const Tensor& x : xd)
        xs.push_back(x.defined() ? strided_copy(x) : x);
      Tensor got_strided;
      {
        NoGrad ng;
        got_strided = c.fn(xs);
      }
      EXPECT_TRUE(all_close(got_strided, got, eps_of(d), c.k_forward, "strided inputs"));
    }

    if (d == DType::F64) continue;
    const std::vector<Tensor> gd = analytic_grads(c, xd, w.to(d).to(DType::F64), mask);
    const std::vector<Tensor> gref = analytic_grads(c, ref_in, w.to(d).to(DType::F64), mask);
    for (size_t i = 0; i < xd.size(); ++i) {
      if (!mask[i]) continue;
      ASSERT_TRUE(gd[i].defined()) << "no gradient reached input " << i;
      EXPECT_EQ(gd[i].dtype(), d) << "gradients come back in the input's dtype";
      EXPECT_TRUE(all_close(gd[i], gref[i], eps_of(d), c.k_backward,
                            "gradient of input " + std::to_string(i)));
    }
  }
}

}  // namespace mantissa::testing
