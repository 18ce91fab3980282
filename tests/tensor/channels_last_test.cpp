// Channels-last tensors (MemoryFormat::ChannelsLast): the layout itself, and the ops that keep
// it (elementwise ops, casts, conv2d, batch norm) against the same ops on row-major tensors and
// against float64 references. The channels-last kernels are separate code (oneDNN's nhwc
// convolutions, batch norm over rows of channels), so every result is compared, not assumed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

// Largest |a - b| / (|b| + floor) over the elements.
double max_rel(const Tensor& a, const Tensor& b, double floor = 1.0) {
  const std::vector<double> va = values(a), vb = values(b);
  EXPECT_EQ(va.size(), vb.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(va.size(), vb.size()); ++i)
    worst = std::max(worst, std::abs(va[i] - vb[i]) / (std::abs(vb[i]) + floor));
  return worst;
}

// Whether the gradient that reaches t (before it is accumulated into t.grad()) is channels-last.
std::shared_ptr<bool> watch_grad_layout(const Tensor& t) {
  auto cl = std::make_shared<bool>(false);
  t.register_hook([cl](const Tensor& g) {
    *cl = g.is_contiguous(kCL);
    return Tensor();
  });
  return cl;
}

// A leaf copy of t in t's layout.
Tensor param(const Tensor& t) {
  Tensor p = t.detach().clone();
  if (t.is_contiguous(kCL)) p = p.contiguous(kCL);
  p.set_requires_grad(true);
  return p;
}

TEST(ChannelsLast, LayoutAndValues) {
  const Tensor x = Tensor::uniform({2, 3, 4, 5}, -1, 1, 1);
  const Tensor cl = x.contiguous(kCL);
  EXPECT_EQ(cl.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_TRUE(cl.is_contiguous(kCL));
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_TRUE(cl.is_dense());
  EXPECT_FALSE(x.is_contiguous(kCL));
  EXPECT_EQ(values(cl), values(x));
  EXPECT_TRUE(cl.contiguous(kCL).is_same(cl));  // already channels-last: no copy
  EXPECT_TRUE(cl.contiguous().is_contiguous());
  EXPECT_EQ(values(cl.contiguous()), values(x));

  // One channel: row-major and channels-last hold the same bytes; only stride(1) tells them
  // apart, and it is what marks the tensor channels-last.
  const Tensor grey = Tensor::uniform({2, 1, 3, 3}, -1, 1, 2);
  EXPECT_FALSE(grey.is_contiguous(kCL));
  const Tensor grey_cl = grey.contiguous(kCL);
  EXPECT_TRUE(grey_cl.is_contiguous(kCL));
  EXPECT_TRUE(grey_cl.is_contiguous());
  EXPECT_EQ(values(grey_cl), values(grey));
  // The mark survives a cast (autocast's first cast of an image batch).
  EXPECT_TRUE(grey_cl.to(DType::BF16).is_contiguous(kCL));

  EXPECT_THROW(Tensor::uniform({2, 3}, 0, 1, 3).contiguous(kCL), Error);
}

TEST(ChannelsLast, EmptyStridedRefusesStridesThatAreNotDense) {
  EXPECT_NO_THROW(Tensor::empty_strided({2, 3}, {1, 2}));
  try {
    Tensor::empty_strided({2, 3}, {1, 1});  // overlapping
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not dense"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor::empty_strided({2, 3}, {6, 1}), Error);  // gaps
  EXPECT_THROW(Tensor::empty_strided({2, 3}, {3}), Error);     // rank
}

TEST(ChannelsLast, ElementwiseOpsAndCastsKeepTheLayout) {
  const Tensor x = Tensor::uniform({2, 4, 3, 5}, -1, 1, 4);
  const Tensor y = Tensor::uniform({2, 4, 3, 5}, -1, 1, 5);
  const Tensor bias = Tensor::uniform({1, 4, 1, 1}, -1, 1, 6);
  const Tensor xc = x.contiguous(kCL), yc = y.contiguous(kCL);

  const Tensor r = relu(xc);
  EXPECT_TRUE(r.is_contiguous(kCL));
  EXPECT_EQ(values(r), values(relu(x)));
  const Tensor s = add(xc, yc);
  EXPECT_TRUE(s.is_contiguous(kCL));
  EXPECT_EQ(values(s), values(add(x, y)));
  const Tensor sb = add(xc, bias);  // a broadcast per-channel operand
  EXPECT_TRUE(sb.is_contiguous(kCL));
  EXPECT_EQ(values(sb), values(add(x, bias)));
  EXPECT_TRUE(add(bias, xc).is_contiguous(kCL));
  // Mixed layouts: the first full-shape input's, and the same values.
  EXPECT_TRUE(mul(xc, y).is_contiguous(kCL));
  EXPECT_TRUE(mul(x, yc).is_contiguous());
  EXPECT_EQ(values(mul(x, yc)), values(mul(x, y)));
  // Other dense orders give row-major results.
  EXPECT_TRUE(exp(Tensor::uniform({3, 4}, 0, 1, 7).t()).is_contiguous());
  const Tensor h = xc.to(DType::BF16);
  EXPECT_TRUE(h.is_contiguous(kCL));
  EXPECT_EQ(values(h), values(x.to(DType::BF16)));

  // Gradients flow through the layout change and the kept layout.
  const Tensor a = param(x), b = param(x);
  sum(mul(relu(a.contiguous(kCL)), yc)).backward();
  sum(mul(relu(b), y)).backward();
  EXPECT_EQ(values(a.grad()), values(b.grad()));
}

struct ConvCase {
  Shape x, w;
  Conv2dOptions options;
};

// conv2d on a channels-last input: a channels-last output and input gradient, equal to the
// row-major op's within the dtype's rounding (oneDNN's nhwc and blocked kernels may sum in a
// different order), and the f32 result within f32 rounding of a float64 reference.
TEST(ChannelsLast, Conv2dMatchesTheRowMajorOp) {
  const ConvCase cases[] = {
      {{4, 16, 9, 9}, {16, 16, 3, 3}, {.padding = {1}}},
      {{4, 16, 9, 9}, {32, 16, 3, 3}, {.stride = {2}, .padding = {1}}},
      {{4, 16, 8, 8}, {32, 16, 1, 1}, {.stride = {2}}},
      {{3, 1, 7, 7}, {16, 1, 3, 3}, {.padding = {1}}},  // a grey image's first layer
      {{2, 6, 7, 7}, {4, 3, 3, 3}, {.groups = 2}},
      {{2, 5, 6, 6}, {7, 5, 3, 3}, {.padding = {1}}},  // channels no vector width divides
  };
  for (DType dt : {DType::F32, DType::BF16}) {
    for (const ConvCase& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " x " + c.x.str() + " w " + c.w.str());
      const Tensor x0 = Tensor::uniform(c.x, -1, 1, 7).to(dt);
      const Tensor w0 = Tensor::uniform(c.w, -0.5, 0.5, 8).to(dt);
      const Tensor b0 = Tensor::uniform({c.w[0]}, -0.5, 0.5, 9).to(dt);
      const Tensor xr = param(x0), wr = param(w0), br = param(b0);
      const Tensor xc = param(x0.contiguous(kCL)), wc = param(w0), bc = param(b0);
      const auto grad_cl = watch_grad_layout(xc);
      const Tensor yr = conv2d(xr, wr, br, c.options);
      const Tensor yc = conv2d(xc, wc, bc, c.options);
      EXPECT_TRUE(yc.is_contiguous(kCL));
      const Tensor probe = Tensor::uniform(yr.shape(), -1, 1, 10).to(dt);
      sum(mul(yr, probe)).backward();
      sum(mul(yc, probe)).backward();
      EXPECT_TRUE(*grad_cl);
      const double tol = dt == DType::F32 ? 1e-5 : 1.0 / 128;  // 2^-7: two bf16 roundings
      EXPECT_LT(max_rel(yc, yr), tol);
      EXPECT_LT(max_rel(xc.grad(), xr.grad()), tol);
      EXPECT_LT(max_rel(wc.grad(), wr.grad()), tol);
      EXPECT_LT(max_rel(bc.grad(), br.grad()), tol);
      if (dt == DType::F32) {
        const Tensor y64 =
            conv2d(x0.to(DType::F64), w0.to(DType::F64), b0.to(DType::F64), c.options);
        EXPECT_LT(max_rel(yc, y64), 1e-5);
      }
    }
  }
}

// Batch norm in float64 over an (N, C, H, W) tensor, biased variance: the reference.
Tensor batch_norm_f64(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
  std::vector<double> out(xv.size());
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < s; ++j)
        mean += xv[size_t((i * c + ch) * s + j)];
    }
    mean /= double(n * s);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < s; ++j)
        var += std::pow(xv[size_t((i * c + ch) * s + j)] - mean, 2);
    }
    var /= double(n * s);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < s; ++j) {
        const size_t k = size_t((i * c + ch) * s + j);
        out[k] = (xv[k] - mean) / std::sqrt(var + eps) * wv[size_t(ch)] + bv[size_t(ch)];
      }
    }
  }
  return Tensor::from_vector(out, x.shape(), DType::F64);
}

// Batch norm on channels-last inputs: the output, the input gradient and the running statistics
// against the row-major op and a float64 reference, for channel counts that fill whole vectors
// (16, 32) and that do not (3, 20), a large mean (the statistics have no cancellation), and
// enough pixels for several blocks (more than one partial per channel).
TEST(ChannelsLast, BatchNormMatchesTheRowMajorOpAndFloat64) {
  struct Case {
    Shape x;
    double mean;
  };
  for (const Case& c : {Case{{8, 16, 12, 12}, 0}, Case{{4, 32, 5, 5}, 0}, Case{{3, 3, 9, 9}, 0},
                        Case{{2, 20, 33, 31}, 0}, Case{{4, 16, 10, 10}, 1e4}}) {
    for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
      if (c.mean != 0 && dt == DType::BF16) continue;  // bf16 holds no unit steps at 1e4
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + c.x.str() + " mean " +
                   std::to_string(c.mean));
      const int64_t ch = c.x[1];
      const Tensor x0 = add(Tensor::normal(c.x, 0, 1, 11), c.mean).to(dt);
      const Tensor w0 = Tensor::uniform({ch}, 0.5, 1.5, 12), b0 = Tensor::uniform({ch}, -1, 1, 13);
      const Tensor xr = param(x0), wr = param(w0), br = param(b0);
      const Tensor xc = param(x0.contiguous(kCL)), wc = param(w0), bc = param(b0);
      Tensor rm_r = Tensor::zeros({ch}), rv_r = Tensor::ones({ch});
      Tensor rm_c = Tensor::zeros({ch}), rv_c = Tensor::ones({ch});
      const auto grad_cl = watch_grad_layout(xc);
      const Tensor yr = batch_norm(xr, wr, br, rm_r, rv_r, true);
      const Tensor yc = batch_norm(xc, wc, bc, rm_c, rv_c, true);
      EXPECT_TRUE(yc.is_contiguous(kCL));
      const Tensor probe = Tensor::uniform(c.x, -1, 1, 14).to(dt);
      sum(mul(yr, probe)).backward();
      sum(mul(yc, probe)).backward();
      EXPECT_TRUE(*grad_cl);

      // Two roundings into the storage dtype, and the compute type's error in x - mean: its
      // epsilon times the mean, in units of the (unit) standard deviation.
      const double eps = dt == DType::F64 ? 0x1p-52 : 0x1p-23;
      const double tol = (dt == DType::BF16  ? 1.0 / 64
                          : dt == DType::F32 ? 1e-4
                                             : 1e-10) +
                         4 * eps * c.mean;
      EXPECT_LT(max_rel(yc, yr), tol);
      EXPECT_LT(max_rel(xc.grad(), xr.grad()), tol);
      EXPECT_LT(max_rel(wc.grad(), wr.grad()), tol);
      EXPECT_LT(max_rel(bc.grad(), br.grad()), tol);
      EXPECT_LT(max_rel(rm_c, rm_r, c.mean + 1), 1e-6);
      EXPECT_LT(max_rel(rv_c, rv_r), 1e-4);
      const Tensor ref =
          batch_norm_f64(x0.to(DType::F64), w0.to(DType::F64), b0.to(DType::F64), 1e-5);
      EXPECT_LT(max_rel(yc, ref), tol);

      // Evaluation mode reads the running statistics.
      const Tensor er = batch_norm(x0, w0, b0, rm_r, rv_r, false);
      const Tensor ec = batch_norm(x0.contiguous(kCL), w0, b0, rm_c, rv_c, false);
      EXPECT_TRUE(ec.is_contiguous(kCL));
      EXPECT_LT(max_rel(ec, er), tol);
    }
  }
}

// Max pooling keeps the layout, with the row-major kernel's values, first-maximum ties (the
// gradient goes to one position), NaN propagation and padded windows.
TEST(ChannelsLast, MaxPoolMatchesTheRowMajorOp) {
  struct Case {
    Pool2dOptions options;
    int64_t c;
  };
  for (const Case& k : {Case{{.kernel_size = {2}, .stride = {2}}, 32},
                        Case{{.kernel_size = {3}, .stride = {2}, .padding = {1}}, 16},
                        Case{{.kernel_size = {3}, .stride = {1}}, 5}}) {
    for (DType dt : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " c " + std::to_string(k.c));
      // Values on a coarse grid: ties inside windows.
      const Shape shape{3, k.c, 9, 8};
      std::vector<double> v = values(Tensor::uniform(shape, -1, 1, 17));
      for (double& e : v)
        e = std::round(e * 4) / 4;
      v[5] = std::nan("");
      const Tensor x0 = Tensor::from_vector(v, shape).to(dt);
      const Tensor xr = param(x0), xc = param(x0.contiguous(kCL));
      const auto grad_cl = watch_grad_layout(xc);
      const Tensor yr = max_pool2d(xr, k.options), yc = max_pool2d(xc, k.options);
      EXPECT_TRUE(yc.is_contiguous(kCL));
      const std::vector<double> a = values(yc), b = values(yr);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(b[i])) {
          EXPECT_TRUE(std::isnan(a[i])) << i;
        } else {
          EXPECT_EQ(a[i], b[i]) << i;
        }
      }
      const Tensor probe = Tensor::uniform(yr.shape(), -1, 1, 18).to(dt);
      sum(mul(yr, probe)).backward();
      sum(mul(yc, probe)).backward();
      EXPECT_TRUE(*grad_cl);
      EXPECT_EQ(values(xc.grad()), values(xr.grad()));
    }
  }
}

// A gradient that arrives row-major for a channels-last input (a pooling layer's, say) is
// converted, not misread.
TEST(ChannelsLast, BatchNormBackwardTakesAGradientInTheOtherLayout) {
  const Tensor x0 = Tensor::normal({4, 16, 6, 6}, 0, 1, 15);
  const Tensor probe = Tensor::uniform(x0.shape(), -1, 1, 16);
  const Tensor xr = param(x0), xc = param(x0.contiguous(kCL));
  const Tensor w = Tensor::ones({16}), b = Tensor::zeros({16});
  // mean over a row-major copy: its gradient comes back row-major.
  sum(mul(batch_norm(xr, w, b, Tensor(), Tensor(), true), probe)).backward();
  sum(mul(batch_norm(xc, w, b, Tensor(), Tensor(), true).contiguous(), probe)).backward();
  EXPECT_LT(max_rel(xc.grad(), xr.grad()), 1e-5);
}

}  // namespace
}  // namespace mantissa
