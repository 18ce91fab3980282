// conv_transpose2d: every dtype against a plain-loop float64 reference through the op harness
// (forward, finite-difference gradients of x, weight and bias, strided inputs), the adjoint
// identity with conv2d, argument errors, and the f16 contract.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/op_harness.h"

namespace mantissa {
namespace {

using testing::check_op;
using testing::OpCase;
using testing::random_f64;

struct TConvCfg {
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, output_padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1}, groups = 1;
  ConvTranspose2dOptions options() const {
    return {{stride[0], stride[1]},
            {padding[0], padding[1]},
            {output_padding[0], output_padding[1]},
            groups,
            {dilation[0], dilation[1]}};
  }
};

// The definition, written as a scatter: input pixel (ih, iw) of channel ci adds
// x * w[ci, co, kh, kw] to output (ih * s - p + kh * d, iw * s - p + kw * d).
Tensor ref_conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& b, const TConvCfg& c) {
  const std::vector<double> X = x.to_vector<double>(), W = w.to_vector<double>();
  const std::vector<double> Bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), Wd = x.size(3);
  const int64_t Og = w.size(1), KH = w.size(2), KW = w.size(3), Cg = C / c.groups;
  const int64_t O = Og * c.groups;
  const int64_t OH =
      (H - 1) * c.stride[0] - 2 * c.padding[0] + c.dilation[0] * (KH - 1) + c.output_padding[0] + 1;
  const int64_t OW = (Wd - 1) * c.stride[1] - 2 * c.padding[1] + c.dilation[1] * (KW - 1) +
                     c.output_padding[1] + 1;
  std::vector<double> y(size_t(N * O * OH * OW), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < O; ++o) {
      for (int64_t i = 0; i < OH * OW; ++i)
        y[size_t((n * O + o) * OH * OW + i)] = b.defined() ? Bv[size_t(o)] : 0.0;
    }
    for (int64_t ci = 0; ci < C; ++ci) {
      const int64_t g = ci / Cg;
      for (int64_t ih = 0; ih < H; ++ih) {
        for (int64_t iw = 0; iw < Wd; ++iw) {
          const double xv = X[size_t(((n * C + ci) * H + ih) * Wd + iw)];
          for (int64_t og = 0; og < Og; ++og) {
            const int64_t o = g * Og + og;
            for (int64_t kh = 0; kh < KH; ++kh) {
              const int64_t oh = ih * c.stride[0] - c.padding[0] + kh * c.dilation[0];
              if (oh < 0 || oh >= OH) continue;
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ow = iw * c.stride[1] - c.padding[1] + kw * c.dilation[1];
                if (ow < 0 || ow >= OW) continue;
                y[size_t(((n * O + o) * OH + oh) * OW + ow)] +=
                    xv * W[size_t(((ci * Og + og) * KH + kh) * KW + kw)];
              }
            }
          }
        }
      }
    }
  }
  return Tensor::from_vector(y, {N, O, OH, OW}, DType::F64);
}

OpCase tconv_case(const std::string& name, const Shape& xs, const Shape& ws, bool bias,
                  const TConvCfg& cfg, uint64_t seed) {
  OpCase c;
  c.name = name;
  c.inputs = {random_f64(xs, seed), random_f64(ws, seed + 1),
              bias ? random_f64({ws[1] * cfg.groups}, seed + 2) : Tensor()};
  c.fn = [cfg](const std::vector<Tensor>& in) {
    return conv_transpose2d(in[0], in[1], in[2], cfg.options());
  };
  c.reference = [cfg](const std::vector<Tensor>& in) {
    return ref_conv_transpose2d(in[0], in[1], in[2], cfg);
  };
  return c;
}

TEST(ConvTranspose2d, PlainWithBias) {
  check_op(tconv_case("3x3, bias", {2, 3, 5, 4}, {3, 4, 3, 3}, true, TConvCfg{}, 151));
}

TEST(ConvTranspose2d, DcganUpsampling) {
  // The DC-GAN generator's layer: k4 s2 p1 doubles the size (7 -> 14).
  TConvCfg up;
  up.stride[0] = up.stride[1] = 2;
  up.padding[0] = up.padding[1] = 1;
  check_op(tconv_case("k4 s2 p1", {2, 4, 7, 7}, {4, 3, 4, 4}, true, up, 153));
}

TEST(ConvTranspose2d, OutputPaddingDilationGroups) {
  TConvCfg op;
  op.stride[0] = 2;
  op.stride[1] = 3;
  op.padding[0] = 1;
  op.output_padding[0] = 1;
  op.output_padding[1] = 2;
  check_op(tconv_case("stride (2, 3), output_padding (1, 2)", {2, 3, 4, 5}, {3, 2, 3, 2}, true, op,
                      155));

  TConvCfg d2;
  d2.dilation[0] = d2.dilation[1] = 2;
  d2.padding[1] = 1;
  check_op(tconv_case("dilation 2, no bias", {1, 2, 5, 6}, {2, 3, 3, 2}, false, d2, 157));

  TConvCfg g2;
  g2.groups = 2;
  g2.stride[0] = g2.stride[1] = 2;
  check_op(tconv_case("groups 2, stride 2, bias", {2, 4, 4, 3}, {4, 3, 3, 3}, true, g2, 159));

  TConvCfg all;
  all.stride[0] = all.stride[1] = 2;
  all.padding[0] = all.padding[1] = 1;
  all.output_padding[1] = 1;
  all.dilation[0] = 2;
  all.groups = 2;
  check_op(tconv_case("everything", {2, 4, 5, 4}, {4, 2, 3, 3}, true, all, 161));
}

TEST(ConvTranspose2d, UnbatchedInputAndScalarOptions) {
  OpCase c;
  c.name = "(C, H, W) input, stride=2 given once";
  c.inputs = {random_f64({3, 4, 4}, 163), random_f64({3, 2, 3, 3}, 164), random_f64({2}, 165)};
  c.fn = [](const std::vector<Tensor>& in) {
    return conv_transpose2d(in[0], in[1], in[2], {.stride = {2}, .padding = {1}});
  };
  c.reference = [](const std::vector<Tensor>& in) {
    TConvCfg cfg;
    cfg.stride[0] = cfg.stride[1] = 2;
    cfg.padding[0] = cfg.padding[1] = 1;
    const Tensor y = ref_conv_transpose2d(in[0].reshape({1, 3, 4, 4}), in[1], in[2], cfg);
    return y.reshape({y.size(1), y.size(2), y.size(3)});
  };
  check_op(c);
}

TEST(ConvTranspose2d, EachGradientAlone) {
  TConvCfg s2;
  s2.stride[0] = s2.stride[1] = 2;
  for (const std::vector<bool>& grad : std::vector<std::vector<bool>>{
           {true, false, false}, {false, true, false}, {false, false, true}}) {
    OpCase c = tconv_case("one gradient", {2, 3, 4, 4}, {3, 2, 3, 3}, true, s2, 167);
    c.grad = grad;
    check_op(c, {DType::F64, DType::F32});
  }
}

// <conv_transpose2d(x, w), y> == <x, conv2d(y, w)>: the two ops are adjoint.
TEST(ConvTranspose2d, IsTheAdjointOfConv2d) {
  const Tensor x = Tensor::normal({2, 5, 6, 7}, 0, 1, 171, DType::F64);
  const Tensor w = Tensor::normal({5, 3, 4, 4}, 0, 1, 172, DType::F64);
  const ConvTranspose2dOptions t{.stride = {2}, .padding = {1}};
  const Tensor y = conv_transpose2d(x, w, Tensor(), t);
  ASSERT_EQ(y.shape(), Shape({2, 3, 12, 14}));
  const Tensor r = Tensor::normal(y.shape(), 0, 1, 173, DType::F64);
  const double lhs = sum(mul(y, r)).item<double>();
  const double rhs =
      sum(mul(x, conv2d(r, w, Tensor(), {.stride = {2}, .padding = {1}}))).item<double>();
  EXPECT_NEAR(lhs, rhs, 1e-10 * std::abs(lhs) + 1e-10);
}

std::vector<uint32_t> bits_of(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

TEST(ConvTranspose2dEmulation, F16WithoutBiasIsTheF32OpRoundedOnce) {
  const Tensor x = Tensor::normal({2, 8, 5, 5}, 0, 1, 181).to(DType::F16);
  const Tensor w = Tensor::normal({8, 6, 4, 4}, 0, 1, 182).to(DType::F16);
  const ConvTranspose2dOptions o{.stride = {2, 2}, .padding = {1, 1}};
  const Tensor got = conv_transpose2d(x, w, Tensor(), o);
  ASSERT_EQ(got.dtype(), DType::F16);
  const Tensor want = conv_transpose2d(x.to(DType::F32), w.to(DType::F32), Tensor(), o);
  EXPECT_EQ(bits_of(got), bits_of(want.to(DType::F16)));
}

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(ConvTranspose2dErrors, MessagesNameTheProblem) {
  std::string m = error_of([] {
    conv_transpose2d(Tensor::zeros({1, 3, 4, 4}), Tensor::zeros({4, 2, 3, 3}));
  });
  EXPECT_NE(m.find("(1, 3, 4, 4)"), std::string::npos) << m;
  EXPECT_NE(m.find("(4, 2, 3, 3)"), std::string::npos) << m;

  m = error_of([] {
    conv_transpose2d(Tensor::zeros({1, 2, 4, 4}), Tensor::zeros({2, 2, 3, 3}), Tensor(),
                     {.stride = {2}, .output_padding = {2}});
  });
  EXPECT_NE(m.find("smaller than the stride"), std::string::npos) << m;

  m = error_of([] {
    conv_transpose2d(Tensor::zeros({1, 3, 4, 4}), Tensor::zeros({3, 2, 3, 3}), Tensor(),
                     {.groups = 2});
  });
  EXPECT_NE(m.find("groups=2"), std::string::npos) << m;

  m = error_of([] {
    conv_transpose2d(Tensor::zeros({1, 2, 1, 1}), Tensor::zeros({2, 2, 1, 1}), Tensor(),
                     {.padding = {1}});
  });
  EXPECT_NE(m.find("empty output"), std::string::npos) << m;

  m = error_of([] {
    conv_transpose2d(Tensor::zeros({1, 2, 3, 3}), Tensor::zeros({2, 2, 3, 3}), Tensor::zeros({3}));
  });
  EXPECT_NE(m.find("bias (3,)"), std::string::npos) << m;

  m = error_of([] { conv_transpose2d(Tensor::zeros({3, 8}), Tensor::zeros({3, 3, 3, 3})); });
  EXPECT_NE(m.find("(N, C, H, W)"), std::string::npos) << m;
}

}  // namespace
}  // namespace mantissa
