// matmul, linear and conv2d: every dtype against float64 through the op harness, with plain-loop
// float64 references written here; argument errors; the emulation contracts (tf32 input
// rounding, f16 as f32 GEMM + one rounding).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "harness/op_harness.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/warning.h"
#include "mantissa/numerics/convert.h"

namespace mantissa {
namespace {

using testing::check_op;
using testing::OpCase;
using testing::random_f64;

// ---- independent float64 references
// --------------------------------------------------------------

// torch.matmul with plain loops: 1-D operands promoted then squeezed, batch dims broadcast.
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  const std::vector<double> A = a.to_vector<double>(), B = b.to_vector<double>();
  std::vector<int64_t> as = a.shape().vec(), bs = b.shape().vec();
  const bool a_vec = as.size() == 1, b_vec = bs.size() == 1;
  if (a_vec) as.insert(as.begin(), 1);
  if (b_vec) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  std::vector<int64_t> ab(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  const size_t nd = std::max(ab.size(), bb.size());
  ab.insert(ab.begin(), nd - ab.size(), 1);
  bb.insert(bb.begin(), nd - bb.size(), 1);
  std::vector<int64_t> batch(nd);
  int64_t nbatch = 1;
  for (size_t i = 0; i < nd; ++i) {
    batch[i] = std::max(ab[i], bb[i]);
    nbatch *= batch[i];
  }
  std::vector<double> out(size_t(nbatch * M * N));
  for (int64_t t = 0; t < nbatch; ++t) {
    // Offsets of batch t in a and b (row-major over their own, possibly size-1, batch dims).
    int64_t rem = t, oa = 0, ob = 0, sa = 1, sb = 1;
    for (size_t i = nd; i-- > 0;) {
      const int64_t idx = rem % batch[i];
      rem /= batch[i];
      oa += (ab[i] == 1 ? 0 : idx) * sa;
      ob += (bb[i] == 1 ? 0 : idx) * sb;
      sa *= ab[i];
      sb *= bb[i];
    }
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          s += A[size_t(oa * M * K + i * K + k)] * B[size_t(ob * K * N + k * N + j)];
        }
        out[size_t(t * M * N + i * N + j)] = s;
      }
    }
  }
  std::vector<int64_t> shape = batch;
  if (!a_vec) shape.push_back(M);
  if (!b_vec) shape.push_back(N);
  return Tensor::from_vector(out, Shape(shape), DType::F64);
}

// x (..., in) @ w(out, in)^T + b(out)
Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const std::vector<double> X = x.to_vector<double>(), W = w.to_vector<double>();
  const std::vector<double> Bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t in = w.size(1), outf = w.size(0), rows = x.numel() / in;
  std::vector<double> y(size_t(rows * outf));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < outf; ++o) {
      double s = b.defined() ? Bv[size_t(o)] : 0.0;
      for (int64_t i = 0; i < in; ++i)
        s += X[size_t(r * in + i)] * W[size_t(o * in + i)];
      y[size_t(r * outf + o)] = s;
    }
  }
  Shape shape = x.shape();
  shape[shape.size() - 1] = outf;
  return Tensor::from_vector(y, shape, DType::F64);
}

struct ConvCfg {
  int64_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1}, groups = 1;
  Conv2dOptions options() const {
    return {{stride[0], stride[1]}, {padding[0], padding[1]}, {dilation[0], dilation[1]}, groups};
  }
};

Tensor ref_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const ConvCfg& c) {
  const std::vector<double> X = x.to_vector<double>(), W = w.to_vector<double>();
  const std::vector<double> Bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), Wd = x.size(3);
  const int64_t O = w.size(0), Cg = w.size(1), KH = w.size(2), KW = w.size(3);
  const int64_t OH = (H + 2 * c.padding[0] - c.dilation[0] * (KH - 1) - 1) / c.stride[0] + 1;
  const int64_t OW = (Wd + 2 * c.padding[1] - c.dilation[1] * (KW - 1) - 1) / c.stride[1] + 1;
  const int64_t Og = O / c.groups;
  std::vector<double> y(size_t(N * O * OH * OW));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < O; ++o) {
      const int64_t g = o / Og;
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = b.defined() ? Bv[size_t(o)] : 0.0;
          for (int64_t ci = 0; ci < Cg; ++ci) {
            for (int64_t kh = 0; kh < KH; ++kh) {
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t ih = oh * c.stride[0] - c.padding[0] + kh * c.dilation[0];
                const int64_t iw = ow * c.stride[1] - c.padding[1] + kw * c.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= Wd) continue;
                s += X[size_t(((n * C + g * Cg + ci) * H + ih) * Wd + iw)] *
                     W[size_t(((o * Cg + ci) * KH + kh) * KW + kw)];
              }
            }
          }
          y[size_t(((n * O + o) * OH + oh) * OW + ow)] = s;
        }
      }
    }
  }
  return Tensor::from_vector(y, {N, O, OH, OW}, DType::F64);
}

// ---- matmul
// --------------------------------------------------------------------------------------

OpCase matmul_case(const std::string& name, const Shape& sa, const Shape& sb, uint64_t seed) {
  OpCase c;
  c.name = name;
  c.inputs = {random_f64(sa, seed), random_f64(sb, seed + 1)};
  c.fn = [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); };
  c.reference = [](const std::vector<Tensor>& in) { return ref_matmul(in[0], in[1]); };
  return c;
}

TEST(Matmul, TwoD) {
  check_op(matmul_case("(5, 7) @ (7, 3)", {5, 7}, {7, 3}, 1));
}

TEST(Matmul, BatchedWithBroadcastBatchDims) {
  check_op(matmul_case("(2, 1, 4, 5) @ (3, 5, 6)", {2, 1, 4, 5}, {3, 5, 6}, 3));
  check_op(matmul_case("(4, 5) @ (2, 5, 3)", {4, 5}, {2, 5, 3}, 5));
  check_op(matmul_case("(2, 3, 4, 5) @ (5, 6)", {2, 3, 4, 5}, {5, 6}, 7));
  check_op(matmul_case("(1, 4, 5) @ (3, 5, 2)", {1, 4, 5}, {3, 5, 2}, 9));
}

TEST(Matmul, OneDimensionalOperands) {
  check_op(matmul_case("dot (6) . (6)", {6}, {6}, 11));
  check_op(matmul_case("(6) @ (6, 4)", {6}, {6, 4}, 13));
  check_op(matmul_case("(3, 6) @ (6)", {3, 6}, {6}, 15));
  check_op(matmul_case("(2, 3, 6) @ (6)", {2, 3, 6}, {6}, 17));
  check_op(matmul_case("(6) @ (2, 6, 4)", {6}, {2, 6, 4}, 19));
}

TEST(Matmul, TransposedAndNonContiguousViews) {
  // a^T @ b^T straight from transposed views (no copy in the kernel's fast path).
  OpCase t;
  t.name = "a^T @ b^T";
  t.inputs = {random_f64({7, 5}, 21), random_f64({3, 7}, 22)};
  t.fn = [](const std::vector<Tensor>& in) { return matmul(in[0].t(), in[1].t()); };
  t.reference = [](const std::vector<Tensor>& in) {
    return ref_matmul(in[0].t().contiguous(), in[1].t().contiguous());
  };
  check_op(t);
  // Every other column: neither row- nor column-major, so the kernel must copy.
  OpCase s;
  s.name = "column-strided";
  s.inputs = {random_f64({4, 10}, 23), random_f64({2, 5, 3}, 24)};
  s.fn = [](const std::vector<Tensor>& in) { return matmul(in[0].slice(1, 0, 10, 2), in[1]); };
  s.reference = [](const std::vector<Tensor>& in) {
    return ref_matmul(in[0].slice(1, 0, 10, 2).contiguous(), in[1]);
  };
  check_op(s);
  // A batch that broadcasts through stride 0 (expand) and a permuted batch.
  OpCase e;
  e.name = "expanded and permuted batches";
  e.inputs = {random_f64({4, 5}, 25), random_f64({5, 3, 2}, 26)};
  e.fn = [](const std::vector<Tensor>& in) {
    return matmul(in[0].expand({3, 4, 5}), in[1].permute({1, 0, 2}));
  };
  e.reference = [](const std::vector<Tensor>& in) {
    return ref_matmul(in[0].expand({3, 4, 5}).contiguous(), in[1].permute({1, 0, 2}).contiguous());
  };
  check_op(e);
}

TEST(Matmul, LargerThanOneBlock) {
  // Past the f64 kernel's 64 x 256 x 256 blocking and oneDNN's small-matrix paths.
  OpCase c = matmul_case("(70, 300) @ (300, 260)", {70, 300}, {300, 260}, 27);
  c.fd_samples = 6;
  // 300-term fp32 sums: the rounding error grows like sqrt(K) eps, past the default 4-8 eps.
  c.k_forward = c.k_backward = 32;
  check_op(c, {DType::F64, DType::F32, DType::BF16});
}

TEST(Matmul, FourKibibyteLeadingDimensionsAreCopiedPadded) {
  // A transposed a whose 1024 f32 columns are 4 KiB apart and a row-major b with rows of 1024:
  // the layouts the CPU kernel copies into a longer leading dimension first (4K aliasing), here
  // both in one batched product. Backward reads them in the other layouts.
  OpCase c;
  c.name = "a^T @ b with 4 KiB leading dimensions";
  c.inputs = {random_f64({2, 40, 1024}, 31), random_f64({2, 40, 1024}, 32)};
  c.fn = [](const std::vector<Tensor>& in) { return matmul(in[0].transpose(1, 2), in[1]); };
  c.reference = [](const std::vector<Tensor>& in) {
    return ref_matmul(in[0].transpose(1, 2).contiguous(), in[1]);
  };
  c.fd_samples = 4;
  // fp32 sums of 40 terms forward and 1024 in backward: rounding grows like sqrt(K) eps.
  c.k_forward = 8;
  c.k_backward = 32;
  check_op(c, {DType::F64, DType::F32, DType::BF16});
}

TEST(Matmul, MixedDtypesPromoteAndGradientsKeepTheirDtype) {
  Tensor a = random_f64({3, 4}, 31).to(DType::F32).set_requires_grad(true);
  Tensor b = random_f64({4, 2}, 32).to(DType::BF16).set_requires_grad(true);
  Tensor y = matmul(a, b);
  EXPECT_EQ(y.dtype(), DType::F32);
  sum(y).backward();
  EXPECT_EQ(a.grad().dtype(), DType::F32);
  EXPECT_EQ(b.grad().dtype(), DType::BF16);
}

// ---- linear
// --------------------------------------------------------------------------------------

TEST(Linear, WithAndWithoutBias) {
  OpCase c;
  c.name = "linear with bias";
  c.inputs = {random_f64({2, 3, 5}, 41), random_f64({4, 5}, 42), random_f64({4}, 43)};
  c.fn = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  c.reference = [](const std::vector<Tensor>& in) { return ref_linear(in[0], in[1], in[2]); };
  check_op(c);

  OpCase n;
  n.name = "linear without bias";
  n.inputs = {random_f64({6, 5}, 44), random_f64({3, 5}, 45)};
  n.fn = [](const std::vector<Tensor>& in) { return linear(in[0], in[1]); };
  n.reference = [](const std::vector<Tensor>& in) { return ref_linear(in[0], in[1], Tensor()); };
  check_op(n);

  OpCase v;
  v.name = "linear of a 1-D input";
  v.inputs = {random_f64({5}, 46), random_f64({3, 5}, 47), random_f64({3}, 48)};
  v.fn = [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); };
  v.reference = [](const std::vector<Tensor>& in) { return ref_linear(in[0], in[1], in[2]); };
  check_op(v);
}

// ---- conv2d
// --------------------------------------------------------------------------------------

OpCase conv_case(const std::string& name, const Shape& xs, const Shape& ws, bool bias,
                 const ConvCfg& cfg, uint64_t seed) {
  OpCase c;
  c.name = name;
  c.inputs = {random_f64(xs, seed), random_f64(ws, seed + 1),
              bias ? random_f64({ws[0]}, seed + 2) : Tensor()};
  c.fn = [cfg](const std::vector<Tensor>& in) {
    return conv2d(in[0], in[1], in[2], cfg.options());
  };
  c.reference = [cfg](const std::vector<Tensor>& in) {
    return ref_conv2d(in[0], in[1], in[2], cfg);
  };
  return c;
}

TEST(Conv2d, PlainWithBias) {
  check_op(conv_case("3x3, bias", {2, 3, 6, 5}, {4, 3, 3, 3}, true, ConvCfg{}, 51));
}

TEST(Conv2d, StridePaddingDilationGroups) {
  ConvCfg s2;
  s2.stride[0] = s2.stride[1] = 2;
  s2.padding[0] = s2.padding[1] = 1;
  check_op(conv_case("stride 2, padding 1", {2, 3, 7, 8}, {4, 3, 3, 3}, true, s2, 53));

  ConvCfg d2;
  d2.dilation[0] = d2.dilation[1] = 2;
  d2.padding[0] = 1;
  check_op(
      conv_case("dilation 2, padding (1, 0), no bias", {1, 2, 8, 9}, {3, 2, 3, 2}, false, d2, 55));

  ConvCfg g2;
  g2.groups = 2;
  g2.padding[1] = 1;
  check_op(conv_case("groups 2, bias", {2, 4, 5, 5}, {6, 2, 3, 3}, true, g2, 57));
  check_op(conv_case("groups 2, no bias", {2, 4, 5, 5}, {6, 2, 3, 3}, false, g2, 59));

  ConvCfg all;
  all.stride[0] = 2;
  all.padding[0] = all.padding[1] = 1;
  all.dilation[1] = 2;
  all.groups = 2;
  check_op(conv_case("everything", {2, 4, 9, 8}, {4, 2, 3, 3}, true, all, 61));
}

// The backend's layout choices: below 8 input channels the weight gradient runs channels-last
// (one channel: the image is its own nhwc layout, no copy), and from 8 channels on both
// gradients read one shared channel-blocked copy of grad_out.
TEST(Conv2d, ChannelsLastWeightGradientAndSharedGradOutCopy) {
  check_op(conv_case("one input channel", {3, 1, 7, 6}, {8, 1, 3, 3}, true, ConvCfg{}, 71));
  ConvCfg pad;
  pad.padding[0] = pad.padding[1] = 1;
  OpCase wide = conv_case("16 channels, padding 1", {2, 16, 5, 6}, {16, 16, 3, 3}, true, pad, 73);
  // fp32 sums of 144 terms (forward, grad_x): rounding grows like sqrt(K) eps.
  wide.k_forward = wide.k_backward = 16;
  check_op(wide);
  check_op(conv_case("8 -> 24 channels, no bias", {2, 8, 4, 4}, {24, 8, 1, 1}, false, pad, 75));
}

TEST(Conv2d, UnbatchedInputAndScalarOptions) {
  OpCase c;
  c.name = "(C, H, W) input, stride=2 given once";
  c.inputs = {random_f64({3, 6, 6}, 63), random_f64({2, 3, 2, 2}, 64), random_f64({2}, 65)};
  c.fn = [](const std::vector<Tensor>& in) {
    return conv2d(in[0], in[1], in[2], {.stride = {2}, .padding = {1}});
  };
  c.reference = [](const std::vector<Tensor>& in) {
    ConvCfg cfg;
    cfg.stride[0] = cfg.stride[1] = 2;
    cfg.padding[0] = cfg.padding[1] = 1;
    const Tensor x = in[0].reshape({1, 3, 6, 6});
    const Tensor y = ref_conv2d(x, in[1], in[2], cfg);
    return y.reshape({y.size(1), y.size(2), y.size(3)});
  };
  check_op(c);
}

TEST(Conv2d, BiasGradientAloneAndWeightGradientAlone) {
  // The backend computes the bias gradient by itself when no weight gradient is asked for.
  OpCase c = conv_case("bias and x only", {2, 3, 5, 5}, {4, 3, 3, 3}, true, ConvCfg{}, 67);
  c.grad = {true, false, true};
  check_op(c);
  OpCase w = conv_case("weight only", {2, 3, 5, 5}, {4, 3, 3, 3}, true, ConvCfg{}, 69);
  w.grad = {false, true, false};
  check_op(w);
}

// ---- errors
// --------------------------------------------------------------------------------------

// The message of the mantissa::Error that f throws ("" if none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(LinalgErrors, MessagesNameTheShapes) {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 5});
  std::string m = error_of([&] { matmul(a, b); });
  EXPECT_NE(m.find("inner dimensions differ"), std::string::npos) << m;
  EXPECT_NE(m.find("(2, 3)"), std::string::npos) << m;
  EXPECT_NE(m.find("(4, 5)"), std::string::npos) << m;

  m = error_of([] { matmul(Tensor::zeros({2, 3, 4}), Tensor::zeros({5, 4, 6})); });
  EXPECT_NE(m.find("batch dimensions"), std::string::npos) << m;
  EXPECT_NE(m.find("(2, 3, 4)"), std::string::npos) << m;
  EXPECT_NE(m.find("(5, 4, 6)"), std::string::npos) << m;

  m = error_of([] { matmul(Tensor::zeros({}), Tensor::zeros({3})); });
  EXPECT_NE(m.find("at least one dimension"), std::string::npos) << m;

  m = error_of([] {
    matmul(Tensor::zeros({2, 3}, DType::I64), Tensor::zeros({3, 2}, DType::I64));
  });
  EXPECT_NE(m.find("floating"), std::string::npos) << m;

  m = error_of([] { linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 5})); });
  EXPECT_NE(m.find("(2, 3)"), std::string::npos) << m;
  EXPECT_NE(m.find("(4, 5)"), std::string::npos) << m;

  m = error_of([] { linear(Tensor::zeros({2, 5}), Tensor::zeros({4, 5}), Tensor::zeros({3})); });
  EXPECT_NE(m.find("bias (3,)"), std::string::npos) << m;

  m = error_of([] { conv2d(Tensor::zeros({1, 3, 8, 8}), Tensor::zeros({4, 2, 3, 3})); });
  EXPECT_NE(m.find("(1, 3, 8, 8)"), std::string::npos) << m;
  EXPECT_NE(m.find("(4, 2, 3, 3)"), std::string::npos) << m;

  m = error_of([] {
    conv2d(Tensor::zeros({1, 3, 8, 8}), Tensor::zeros({4, 1, 3, 3}), Tensor(), {.groups = 2});
  });
  EXPECT_NE(m.find("groups=2"), std::string::npos) << m;

  m = error_of([] { conv2d(Tensor::zeros({1, 1, 2, 2}), Tensor::zeros({1, 1, 3, 3})); });
  EXPECT_NE(m.find("smaller than the dilated kernel"), std::string::npos) << m;

  m = error_of([] { conv2d(Tensor::zeros({3, 8}), Tensor::zeros({4, 3, 3, 3})); });
  EXPECT_NE(m.find("(N, C, H, W)"), std::string::npos) << m;
}

// ---- emulation contracts
// -------------------------------------------------------------------------

std::vector<uint32_t> bits_of(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
  return out;
}

TEST(MatmulEmulation, Tf32InputRoundingIsTheF32GemmOfRoundedInputs) {
  backend::Backend& be = backend::cpu_backend();
  const Tensor a = Tensor::normal({2, 33, 40}, 0, 1, 71);
  const Tensor b = Tensor::normal({2, 40, 17}, 0, 1, 72);
  Tensor got = Tensor::empty({2, 33, 17});
  be.matmul(a, b, nullptr, got, {.input_rounding = Format::TF32});

  Tensor ar = a.clone(), br = b.clone();
  round_in_place(Format::TF32, ar.data<float>(), size_t(ar.numel()));
  round_in_place(Format::TF32, br.data<float>(), size_t(br.numel()));
  Tensor want = Tensor::empty({2, 33, 17}), plain = Tensor::empty({2, 33, 17});
  be.matmul(ar, br, nullptr, want, {});
  be.matmul(a, b, nullptr, plain, {});
  EXPECT_EQ(bits_of(got), bits_of(want));
  EXPECT_NE(bits_of(got), bits_of(plain)) << "tf32 rounding changed nothing";
  // The caller's inputs are untouched.
  Tensor again = Tensor::empty({2, 33, 17});
  be.matmul(a, b, nullptr, again, {});
  EXPECT_EQ(bits_of(again), bits_of(plain));
}

TEST(MatmulEmulation, F16GemmIsTheF32GemmRoundedOnce) {
  // Values exactly representable in f16; 64-term sums round visibly in f16.
  const Tensor a = Tensor::normal({3, 20, 64}, 0, 1, 81).to(DType::F16);
  const Tensor b = Tensor::normal({64, 24}, 0, 1, 82).to(DType::F16);
  const Tensor bias = Tensor::normal({24}, 0, 1, 83).to(DType::F16);
  const Tensor got = matmul(a, b);
  ASSERT_EQ(got.dtype(), DType::F16);
  const Tensor want = matmul(a.to(DType::F32), b.to(DType::F32)).to(DType::F16);
  EXPECT_EQ(bits_of(got), bits_of(want));

  const Tensor gl = linear(a, b.t(), bias);
  const Tensor wl = linear(a.to(DType::F32), b.t().to(DType::F32), bias.to(DType::F32));
  EXPECT_EQ(bits_of(gl), bits_of(wl.to(DType::F16)));

  // fp8 follows the same contract.
  const Tensor a8 = a.to(DType::FP8_E4M3), b8 = b.to(DType::FP8_E4M3);
  const Tensor g8 = matmul(a8, b8);
  ASSERT_EQ(g8.dtype(), DType::FP8_E4M3);
  EXPECT_EQ(bits_of(g8), bits_of(matmul(a8.to(DType::F32), b8.to(DType::F32)).to(DType::FP8_E4M3)));
}

TEST(Conv2dEmulation, F16ConvIsTheF32ConvRoundedOnce) {
  const Tensor x = Tensor::normal({2, 8, 9, 9}, 0, 1, 91).to(DType::F16);
  const Tensor w = Tensor::normal({16, 8, 3, 3}, 0, 1, 92).to(DType::F16);
  const Tensor b = Tensor::normal({16}, 0, 1, 93).to(DType::F16);
  const Conv2dOptions o{.stride = {2, 2}, .padding = {1, 1}};
  const Tensor got = conv2d(x, w, b, o);
  ASSERT_EQ(got.dtype(), DType::F16);
  const Tensor want =
      conv2d(x.to(DType::F32), w.to(DType::F32), b.to(DType::F32), o).to(DType::F16);
  EXPECT_EQ(bits_of(got), bits_of(want));
}

// Below AVX-512 oneDNN 2.6 has no bf16 convolution (it refused to build one: an internal error
// on an AVX2 machine) and only a reference bf16 matmul: bf16 runs there as f16 does, the f32
// kernel on the exactly widened inputs, each result rounded once. CTest runs this under
// MANTISSA_ISA=avx2 too (tensor_linalg_avx2), so an AVX-512 machine checks that path as well.
TEST(Bf16Emulation, BelowAvx512ConvAndGemmAreTheF32OnesRoundedOnce) {
  if (cpu_features().avx512_core()) {
    GTEST_SKIP() << "oneDNN runs bf16 natively here; CTest's tensor_linalg_avx2 runs this test "
                    "with MANTISSA_ISA=avx2";
  }
  // f(inputs) and the inputs' gradients of sum(f * g), all inputs and g bf16-valued; the
  // gradient reaching f's output is g itself (exact in both dtypes).
  using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
  auto run = [](const Fn& f, const std::vector<Shape>& shapes, DType dt) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < shapes.size(); ++i) {
      in.push_back(
          Tensor::normal(shapes[i], 0, 1, 94 + i).to(DType::BF16).to(dt).set_requires_grad(true));
    }
    const Tensor y = f(in);
    const Tensor g = Tensor::normal(y.shape(), 0, 1, 99).to(DType::BF16).to(dt);
    sum(mul(y, g)).backward();
    std::vector<Tensor> out{y};
    for (const Tensor& t : in)
      out.push_back(t.grad());
    return out;
  };
  auto check = [&](const char* what, const Fn& f, const std::vector<Shape>& shapes) {
    SCOPED_TRACE(what);
    const std::vector<Tensor> got = run(f, shapes, DType::BF16), f32 = run(f, shapes, DType::F32);
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(i == 0 ? std::string("output") : "gradient of input " + std::to_string(i - 1));
      ASSERT_EQ(got[i].dtype(), DType::BF16);
      EXPECT_EQ(bits_of(got[i].to(DType::F32)), bits_of(f32[i].to(DType::BF16).to(DType::F32)));
    }
  };
  check("conv2d",
        [](const std::vector<Tensor>& in) {
          return conv2d(in[0], in[1], in[2], Conv2dOptions{.stride = {2, 2}, .padding = {1, 1}});
        },
        {{2, 8, 9, 9}, {16, 8, 3, 3}, {16}});
  check("linear", [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
        {{50, 48}, {40, 48}, {40}});
  check("batched matmul", [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
        {{3, 20, 64}, {3, 64, 24}});
  EXPECT_GE(warning_count("bf16:emulated:cpu"), 1) << "the user is told once that bf16 is emulated";
}

}  // namespace
}  // namespace mantissa

namespace mantissa {
namespace {

// set_matmul_precision("high") is TF32: the f32 GEMM/convolution of tf32-rounded inputs.
TEST(MatmulPrecisionTest, HighRoundsF32InputsToTf32) {
  const Tensor a = Tensor::normal({33, 70}, 0, 1, 11), b = Tensor::normal({70, 19}, 0, 1, 12);
  auto tf32 = [](const Tensor& t) {
    std::vector<float> v = t.to_vector<float>();
    round_in_place(Format::TF32, v.data(), v.size());
    return Tensor::from_vector(v, t.shape());
  };
  const Tensor exact = matmul(a, b);
  const Tensor emulated = matmul(tf32(a), tf32(b));
  set_matmul_precision("high");
  EXPECT_EQ(get_matmul_precision(), MatmulPrecision::High);
  const Tensor high = matmul(a, b);
  const Tensor x = Tensor::normal({2, 3, 9, 9}, 0, 1, 13),
               w = Tensor::normal({4, 3, 3, 3}, 0, 1, 14);
  const Tensor conv_high = conv2d(x, w);
  set_matmul_precision("highest");
  EXPECT_EQ(high.to_vector<float>(), emulated.to_vector<float>());
  EXPECT_NE(high.to_vector<float>(), exact.to_vector<float>()) << "tf32 must change some values";
  EXPECT_EQ(conv_high.to_vector<float>(), conv2d(tf32(x), tf32(w)).to_vector<float>());
  EXPECT_EQ(matmul(a, b).to_vector<float>(), exact.to_vector<float>()) << "highest is fp32 again";
  EXPECT_THROW(set_matmul_precision("medium"), Error);
}

}  // namespace
}  // namespace mantissa
