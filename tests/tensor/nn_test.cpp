// Pooling, normalization, softmax, cross-entropy and attention: every op against an independent
// float64 reference written here with plain loops (through the per-op harness: all dtypes,
// strided inputs, gradients by finite differences), plus running statistics, mixed dtypes,
// thread-count invariance and the error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "harness/op_harness.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using testing::check_op;
using testing::OpCase;
using testing::random_f64;

std::vector<double> values(const Tensor& t) {
  return t.contiguous().to_vector<double>();
}

Tensor f64(const std::vector<double>& v, const Shape& shape) {
  return Tensor::from_vector(v, shape, DType::F64);
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

OpCase op_case(std::string name, std::vector<Tensor> inputs, Fn fn, Fn reference,
               double k_forward = 4, double k_backward = 8) {
  OpCase c;
  c.name = std::move(name);
  c.inputs = std::move(inputs);
  c.fn = std::move(fn);
  c.reference = std::move(reference);
  c.k_forward = k_forward;
  c.k_backward = k_backward;
  return c;
}

Pool2dOptions pool_opts(std::vector<int64_t> kernel, std::vector<int64_t> stride = {},
                        std::vector<int64_t> padding = {0, 0}, bool count_include_pad = true) {
  Pool2dOptions o;
  o.kernel_size = std::move(kernel);
  o.stride = std::move(stride);
  o.padding = std::move(padding);
  o.count_include_pad = count_include_pad;
  return o;
}

CrossEntropyOptions ce_opts(int64_t ignore_index = -100, double label_smoothing = 0,
                            Reduction reduction = Reduction::Mean) {
  CrossEntropyOptions o;
  o.ignore_index = ignore_index;
  o.label_smoothing = label_smoothing;
  o.reduction = reduction;
  return o;
}

// Calls f and expects a mantissa::Error whose message contains `needle`.
template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected a mantissa::Error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// ---- pooling references ----------------------------------------------------------------------

enum class PoolKind { Max, AvgIncludePad, AvgExcludePad };

// x (N, C, H, W) in f64, straight from the definition: the window of output (i, j) covers rows
// i*s - p .. i*s - p + k - 1 of the zero-padded input.
Tensor pool_ref(const Tensor& x, PoolKind kind, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                int64_t ph, int64_t pw) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t oh = (h + 2 * ph - kh) / sh + 1, ow = (w + 2 * pw - kw) / sw + 1;
  const std::vector<double> xv = values(x);
  std::vector<double> out;
  for (int64_t plane = 0; plane < n * c; ++plane) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double best = -INFINITY, total = 0;
        int64_t inside = 0, inside_padded = 0;
        for (int64_t a = 0; a < kh; ++a) {
          for (int64_t b = 0; b < kw; ++b) {
            const int64_t r = i * sh - ph + a, q = j * sw - pw + b;
            if (r >= -ph && r < h + ph && q >= -pw && q < w + pw) ++inside_padded;
            if (r < 0 || r >= h || q < 0 || q >= w) continue;
            const double v = xv[size_t((plane * h + r) * w + q)];
            best = std::max(best, v);
            total += v;
            ++inside;
          }
        }
        switch (kind) {
          case PoolKind::Max:
            out.push_back(best);
            break;
          case PoolKind::AvgIncludePad:
            out.push_back(total / double(inside_padded));
            break;
          case PoolKind::AvgExcludePad:
            out.push_back(total / double(inside));
            break;
        }
      }
    }
  }
  return f64(out, {n, c, oh, ow});
}

Tensor adaptive_ref(const Tensor& x, int64_t oh, int64_t ow) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  const std::vector<double> xv = values(x);
  std::vector<double> out;
  for (int64_t plane = 0; plane < n * c; ++plane) {
    for (int64_t i = 0; i < oh; ++i) {
      const auto r0 = int64_t(std::floor(double(i * h) / double(oh)));
      const auto r1 = int64_t(std::ceil(double((i + 1) * h) / double(oh)));
      for (int64_t j = 0; j < ow; ++j) {
        const auto q0 = int64_t(std::floor(double(j * w) / double(ow)));
        const auto q1 = int64_t(std::ceil(double((j + 1) * w) / double(ow)));
        double total = 0;
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t q = q0; q < q1; ++q)
            total += xv[size_t((plane * h + r) * w + q)];
        }
        out.push_back(total / double((r1 - r0) * (q1 - q0)));
      }
    }
  }
  return f64(out, {n, c, oh, ow});
}

TEST(NnPool, MaxPool2dWithPaddingAndStride) {
  check_op(op_case(
      "max_pool2d k3 s2 p1", {random_f64({2, 3, 7, 6}, 1)},
      [](const std::vector<Tensor>& in) { return max_pool2d(in[0], pool_opts({3}, {2}, {1})); },
      [](const std::vector<Tensor>& in) {
        return pool_ref(in[0], PoolKind::Max, 3, 3, 2, 2, 1, 1);
      }));
  check_op(op_case(
      "max_pool2d k(2,3) s(1,2) p(1,0)", {random_f64({2, 5, 7}, 2)},  // unbatched (C, H, W)
      [](const std::vector<Tensor>& in) {
        return max_pool2d(in[0], pool_opts({2, 3}, {1, 2}, {1, 0}));
      },
      [](const std::vector<Tensor>& in) {
        return pool_ref(in[0].unsqueeze(0), PoolKind::Max, 2, 3, 1, 2, 1, 0).squeeze(0);
      }));
}

TEST(NnPool, MaxPool2dPicksTheFirstMaximumAndPropagatesNaN) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 5, 5, 2, NAN, 0, 3, 4, 1}, {1, 1, 3, 3});
  Tensor out = max_pool2d(x, pool_opts({2}, {1}));
  const std::vector<double> v = values(out);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1]) && std::isnan(v[2]) && std::isnan(v[3]));
  // Ties: the gradient goes to one element (the first maximum), as PyTorch.
  Tensor y = Tensor::from_vector(std::vector<double>{7, 7, 1, 7}, {1, 1, 2, 2});
  y.set_requires_grad(true);
  sum(max_pool2d(y, pool_opts({2}))).backward();
  EXPECT_EQ(values(y.grad()), (std::vector<double>{1, 0, 0, 0}));
}

// The 2 x 2, stride-2 windows have their own vector kernel for f32 and the half types (AVX2): it
// agrees with the plain loop (f64) on values and on which element each window picks (the
// gradient), with ties everywhere and NaNs, for rows of outputs that fill no whole vector, one
// and several, and input widths and heights that leave a last column or row out.
TEST(NnPool, MaxPool2dTwoByTwoKernelAgreesWithThePlainLoop) {
  const Shape shapes[] = {{2, 3, 2, 4},   {1, 2, 5, 14}, {2, 2, 28, 15},
                          {1, 3, 28, 28}, {1, 1, 6, 30}, {2, 1, 9, 34}};
  uint64_t seed = 40;
  for (const Shape& s : shapes) {
    // Small integers: ties in most windows, exact in every dtype; a NaN now and then.
    std::vector<double> v = values(random_f64(s, seed++, 0, 4));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = i % 37 == 5 ? NAN : std::floor(v[i]);
    const Tensor x = Tensor::from_vector(v, s);
    auto run = [&](DType d) {
      Tensor xd = x.to(d).detach().set_requires_grad(true);
      Tensor out = max_pool2d(xd, pool_opts({2}, {2}));
      sum(out).backward();
      return std::vector<Tensor>{out, xd.grad()};
    };
    const std::vector<Tensor> want = run(DType::F64);
    for (const DType d : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(s.str() + " " + std::string(dtype_name(d)));
      const std::vector<Tensor> got = run(d);
      const std::vector<double> a = values(got[0]), b = values(want[0]);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))
            << "output " << i << ": " << a[i] << " against " << b[i];
      }
      EXPECT_EQ(values(got[1]), values(want[1])) << "the elements the windows picked";
    }
  }
}

TEST(NnPool, AvgPool2dCountIncludePadAndExcludePad) {
  for (bool include : {true, false}) {
    check_op(op_case(
        include ? "avg_pool2d include pad" : "avg_pool2d exclude pad",
        {random_f64({2, 3, 7, 8}, 3)},
        [include](const std::vector<Tensor>& in) {
          return avg_pool2d(in[0], pool_opts({3, 2}, {2, 3}, {1, 1}, include));
        },
        [include](const std::vector<Tensor>& in) {
          return pool_ref(in[0], include ? PoolKind::AvgIncludePad : PoolKind::AvgExcludePad, 3, 2,
                          2, 3, 1, 1);
        }));
  }
  // Windows that run past the padding at the bottom/right edge (H + 2p - k not a multiple of
  // the stride) keep PyTorch's divisor.
  check_op(op_case(
      "avg_pool2d k4 s3 p2", {random_f64({1, 2, 6, 6}, 4)},
      [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], pool_opts({4}, {3}, {2})); },
      [](const std::vector<Tensor>& in) {
        return pool_ref(in[0], PoolKind::AvgIncludePad, 4, 4, 3, 3, 2, 2);
      }));
}

TEST(NnPool, AdaptiveAvgPool2d) {
  struct Case {
    Shape in;
    int64_t oh, ow;
  };
  for (const Case& c :
       {Case{{2, 3, 7, 5}, 3, 2}, Case{{1, 2, 3, 3}, 5, 4}, Case{{2, 2, 6, 4}, 1, 1}}) {
    check_op(op_case(
        "adaptive_avg_pool2d " + c.in.str() + " -> (" + std::to_string(c.oh) + ", " +
            std::to_string(c.ow) + ")",
        {random_f64(c.in, 5)},
        [c](const std::vector<Tensor>& in) {
          return adaptive_avg_pool2d(in[0], {c.oh, c.ow});
        },
        [c](const std::vector<Tensor>& in) { return adaptive_ref(in[0], c.oh, c.ow); }));
  }
}

// ---- normalization references ----------------------------------------------------------------

// Batch norm in f64: per channel over N and the spatial dims, biased variance.
Tensor batch_norm_ref(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm,
                      const Tensor& rv, bool training, double eps) {
  const int64_t n = x.size(0), c = x.size(1), s = x.numel() / (n * c);
  const std::vector<double> xv = values(x);
  std::vector<double> out(xv.size());
  for (int64_t ch = 0; ch < c; ++ch) {
    double mean = 0, var = 0;
    if (training) {
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < s; ++j)
          mean += xv[size_t((i * c + ch) * s + j)];
      }
      mean /= double(n * s);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < s; ++j) {
          const double d = xv[size_t((i * c + ch) * s + j)] - mean;
          var += d * d;
        }
      }
      var /= double(n * s);
    } else {
      mean = values(rm)[size_t(ch)];
      var = values(rv)[size_t(ch)];
    }
    const double wc = w.defined() ? values(w)[size_t(ch)] : 1.0;
    const double bc = b.defined() ? values(b)[size_t(ch)] : 0.0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < s; ++j) {
        const size_t k = size_t((i * c + ch) * s + j);
        out[k] = (xv[k] - mean) / std::sqrt(var + eps) * wc + bc;
      }
    }
  }
  return f64(out, x.shape());
}

TEST(NnNorm, BatchNormTraining) {
  for (const Shape& shape : {Shape{4, 3, 5}, Shape{2, 3, 4, 3}, Shape{6, 4}}) {
    const int64_t c = shape[1];
    check_op(op_case(
        "batch_norm train " + shape.str(),
        {random_f64(shape, 10, -2, 3), random_f64({c}, 11, 0.5, 1.5), random_f64({c}, 12)},
        [](const std::vector<Tensor>& in) {
          return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true);
        },
        [](const std::vector<Tensor>& in) {
          return batch_norm_ref(in[0], in[1], in[2], Tensor(), Tensor(), true, 1e-5);
        }));
  }
  check_op(op_case(
      "batch_norm train, no affine", {random_f64({3, 2, 4}, 13)},
      [](const std::vector<Tensor>& in) {
        return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true, 0.1, 1e-3);
      },
      [](const std::vector<Tensor>& in) {
        return batch_norm_ref(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true, 1e-3);
      }));
}

TEST(NnNorm, BatchNormEval) {
  OpCase c = op_case(
      "batch_norm eval",
      {random_f64({4, 3, 2, 3}, 20, -2, 2), random_f64({3}, 21, 0.5, 1.5), random_f64({3}, 22),
       random_f64({3}, 23), random_f64({3}, 24, 0.5, 2.0)},
      [](const std::vector<Tensor>& in) {
        return batch_norm(in[0], in[1], in[2], in[3], in[4], false);
      },
      [](const std::vector<Tensor>& in) {
        return batch_norm_ref(in[0], in[1], in[2], in[3], in[4], false, 1e-5);
      });
  c.grad = {true, true, true, false, false};  // no gradient for running statistics
  check_op(c);
}

TEST(NnNorm, BatchNormUpdatesRunningStatsWithTheUnbiasedVariance) {
  // (N=2, C=2, S=2). Channel 0: 1 2 3 4 (mean 2.5, biased var 1.25, unbiased 5/3).
  // Channel 1: 0 0 4 8 (mean 3, biased var 11, unbiased 44/3).
  const Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 0, 0, 3, 4, 4, 8}, {2, 2, 2});
  Tensor rm = Tensor::from_vector(std::vector<double>{0.5, -1}, {2});
  Tensor rv = Tensor::from_vector(std::vector<double>{2, 3}, {2});
  const uint32_t version = rm.version();
  const Tensor y = batch_norm(x, Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5);
  EXPECT_GT(rm.version(), version) << "an in-place update must bump the version";
  const std::vector<double> m = values(rm), v = values(rv);
  EXPECT_NEAR(m[0], 0.9 * 0.5 + 0.1 * 2.5, 1e-6);
  EXPECT_NEAR(m[1], 0.9 * -1 + 0.1 * 3, 1e-6);
  EXPECT_NEAR(v[0], 0.9 * 2 + 0.1 * (5.0 / 3), 1e-6);
  EXPECT_NEAR(v[1], 0.9 * 3 + 0.1 * (44.0 / 3), 1e-6);
  // The batch is normalized with the biased variance.
  EXPECT_NEAR(values(y)[0], (1 - 2.5) / std::sqrt(1.25 + 1e-5), 1e-6);
  EXPECT_NEAR(values(y)[6], (4 - 3) / std::sqrt(11 + 1e-5), 1e-6);

  // Eval uses the running statistics, and leaves them alone.
  const Tensor ye = batch_norm(x, Tensor(), Tensor(), rm, rv, false, 0.1, 1e-5);
  EXPECT_NEAR(values(ye)[0], (1 - m[0]) / std::sqrt(v[0] + 1e-5), 1e-6);
  EXPECT_EQ(values(rm), m);

  // Without running stats, training works and updates nothing.
  EXPECT_NO_THROW(batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true));
}

TEST(NnNorm, BatchNormHalfInputWithFp32Parameters) {
  // Apex O2: a bf16 activation normalized with fp32 weight, bias and running statistics.
  const Tensor x32 = Tensor::uniform({4, 3, 5}, -2, 2, 30);
  const Tensor x = x32.to(DType::BF16);
  Tensor w = Tensor::uniform({3}, 0.5, 1.5, 31).set_requires_grad(true);
  Tensor b = Tensor::uniform({3}, -1, 1, 32).set_requires_grad(true);
  Tensor rm = Tensor::zeros({3}), rv = Tensor::ones({3});
  Tensor xl = x.detach().set_requires_grad(true);
  Tensor y = batch_norm(xl, w, b, rm, rv, true);
  EXPECT_EQ(y.dtype(), DType::BF16);
  EXPECT_EQ(rm.dtype(), DType::F32);
  sum(mul(y, y)).backward();
  EXPECT_EQ(xl.grad().dtype(), DType::BF16);
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  EXPECT_EQ(b.grad().dtype(), DType::F32);
  const Tensor ref = batch_norm_ref(x.to(DType::F64), w.detach().to(DType::F64),
                                    b.detach().to(DType::F64), Tensor(), Tensor(), true, 1e-5);
  EXPECT_TRUE(testing::all_close(y, ref, testing::eps_of(DType::BF16), 4, "bf16 batch_norm"));
}

// Layer norm in f64 over the last `n` elements of each row.
Tensor layer_norm_ref(const Tensor& x, int64_t n, const Tensor& w, const Tensor& b, double eps) {
  const std::vector<double> xv = values(x);
  const std::vector<double> wv = w.defined() ? values(w) : std::vector<double>(size_t(n), 1.0);
  const std::vector<double> bv = b.defined() ? values(b) : std::vector<double>(size_t(n), 0.0);
  std::vector<double> out(xv.size());
  for (size_t r = 0; r < xv.size() / size_t(n); ++r) {
    const double* row = xv.data() + r * size_t(n);
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i)
      mean += row[i];
    mean /= double(n);
    for (int64_t i = 0; i < n; ++i)
      var += (row[i] - mean) * (row[i] - mean);
    var /= double(n);
    for (int64_t i = 0; i < n; ++i) {
      out[r * size_t(n) + size_t(i)] =
          (row[i] - mean) / std::sqrt(var + eps) * wv[size_t(i)] + bv[size_t(i)];
    }
  }
  return f64(out, x.shape());
}

TEST(NnNorm, LayerNormWithAffine) {
  check_op(op_case(
      "layer_norm (4, 5) affine",
      {random_f64({3, 4, 5}, 40, -1, 3), random_f64({4, 5}, 41, 0.5, 1.5), random_f64({4, 5}, 42)},
      [](const std::vector<Tensor>& in) {
        return layer_norm(in[0], {4, 5}, in[1], in[2]);
      },
      [](const std::vector<Tensor>& in) { return layer_norm_ref(in[0], 20, in[1], in[2], 1e-5); }));
  // Many rows: the weight/bias gradients are summed over several blocks.
  check_op(op_case(
      "layer_norm 200 rows",
      {random_f64({200, 6}, 43), random_f64({6}, 44, 0.5, 1.5), random_f64({6}, 45)},
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], {6}, in[1], in[2], 1e-4); },
      [](const std::vector<Tensor>& in) { return layer_norm_ref(in[0], 6, in[1], in[2], 1e-4); }));
}

TEST(NnNorm, LayerNormWithoutAffine) {
  check_op(op_case(
      "layer_norm no affine", {random_f64({6, 8}, 50, -2, 2)},
      [](const std::vector<Tensor>& in) { return layer_norm(in[0], {8}); },
      [](const std::vector<Tensor>& in) {
        return layer_norm_ref(in[0], 8, Tensor(), Tensor(), 1e-5);
      }));
}

TEST(NnNorm, ResultsDoNotDependOnTheThreadCount) {
  const int threads = get_num_threads();
  auto run = [](int n) {
    set_num_threads(n);
    const Tensor x = Tensor::uniform({64, 8, 96}, -3, 3, 60, DType::BF16);
    Tensor xl = x.detach().set_requires_grad(true);
    Tensor w = Tensor::uniform({96}, 0.5, 1.5, 61).set_requires_grad(true);
    Tensor bw = Tensor::uniform({8}, 0.5, 1.5, 62).set_requires_grad(true);
    const Tensor g = Tensor::uniform({64, 8, 96}, -1, 1, 63, DType::BF16);
    const Tensor y =
        add(add(layer_norm(xl, {96}, w), batch_norm(xl, bw, Tensor(), Tensor(), Tensor(), true)),
            add(softmax(xl, 1), log_softmax(xl, -1)));
    y.backward(g);
    // Cross-entropy over 512 rows of 96 classes, and a pooling pair.
    Tensor logits = x.reshape({512, 96}).detach().set_requires_grad(true);
    std::vector<int64_t> classes;
    for (int64_t i = 0; i < 512; ++i)
      classes.push_back(i % 97 == 0 ? -100 : i % 96);
    const Tensor target = Tensor::from_vector(classes, {512});
    const Tensor ce = cross_entropy(logits, target, ce_opts(-100, 0.1));
    ce.backward();
    const Tensor pooled = avg_pool2d(max_pool2d(x, pool_opts({2})), pool_opts({3}, {1}, {1}));
    return std::vector<std::vector<double>>{
        values(y),  values(xl.grad()),     values(w.grad()), values(bw.grad()),
        values(ce), values(logits.grad()), values(pooled)};
  };
  const auto one = run(1);
  const auto many = run(4);
  set_num_threads(threads);
  for (size_t i = 0; i < one.size(); ++i)
    EXPECT_EQ(one[i], many[i]) << "result " << i;
}

// ---- softmax ---------------------------------------------------------------------------------

// softmax / log_softmax of x along dim, in f64 straight from the definition.
Tensor softmax_ref(const Tensor& x, int dim, bool log) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d)
    outer *= x.size(d);
  for (int d = dim + 1; d < x.dim(); ++d)
    inner *= x.size(d);
  const int64_t n = x.size(dim);
  const std::vector<double> xv = values(x);
  std::vector<double> out(xv.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t j) { return size_t((o * n + j) * inner + i); };
      double mx = -INFINITY, s = 0;
      for (int64_t j = 0; j < n; ++j)
        mx = std::max(mx, xv[at(j)]);
      for (int64_t j = 0; j < n; ++j)
        s += std::exp(xv[at(j)] - mx);
      for (int64_t j = 0; j < n; ++j) {
        out[at(j)] = log ? xv[at(j)] - mx - std::log(s) : std::exp(xv[at(j)] - mx) / s;
      }
    }
  }
  return f64(out, x.shape());
}

TEST(NnSoftmax, SoftmaxAndLogSoftmaxAlongEachDim) {
  struct Case {
    Shape shape;
    int64_t dim;
  };
  for (bool log : {false, true}) {
    for (const Case& c : {Case{{5, 7}, -1}, Case{{5, 7}, 0}, Case{{3, 4, 5}, 1},
                          Case{{2, 3, 70}, 1}, Case{{9}, 0}}) {
      check_op(op_case(
          std::string(log ? "log_softmax " : "softmax ") + c.shape.str() + " dim " +
              std::to_string(c.dim),
          {random_f64(c.shape, 70, -4, 4)},
          [c, log](const std::vector<Tensor>& in) {
            return log ? log_softmax(in[0], c.dim) : softmax(in[0], c.dim);
          },
          [c, log](const std::vector<Tensor>& in) {
            return softmax_ref(in[0], int(c.dim < 0 ? c.dim + in[0].dim() : c.dim), log);
          },
          // softmax's gradient y * (g - sum(g * y)) cancels when one probability dominates: the
          // stored y's rounding leaves an error of ~eps * |g| on a much smaller result.
          4, 32));
    }
  }
}

TEST(NnSoftmax, LargeLogitsDoNotOverflow) {
  const Tensor x = Tensor::from_vector(std::vector<double>{1000, 1001, 1002}, {3}, DType::F16);
  const std::vector<double> p = values(softmax(x, 0));
  const std::vector<double> lp = values(log_softmax(x, 0));
  EXPECT_NEAR(p[2], 0.665, 0.01);
  EXPECT_NEAR(lp[0], -2.4076, 0.02);
  for (double v : p)
    EXPECT_TRUE(std::isfinite(v));
  // A scalar is a row of one.
  EXPECT_EQ(softmax(Tensor::scalar(3.0), 0).item(), 1.0);
}

TEST(NnSoftmax, Fp32IsAccurateAcrossTheExpRange) {
  // Rows [x, 0] for x from -110 to 30: every output against float64 on the same f32 inputs,
  // down to the subnormal results (softmax's exp is a vectorized polynomial, not libm's).
  std::vector<double> v;
  for (int i = 0; i <= 14000; ++i) {
    v.push_back(-110.0 + i * 0.01);
    v.push_back(0.0);
  }
  const Tensor x = Tensor::from_vector(v, {int64_t(v.size() / 2), 2}, DType::F32);
  const std::vector<double> xs = values(x);
  const std::vector<double> p = values(softmax(x, -1)), lp = values(log_softmax(x, -1));
  double worst = 0, worst_log = 0;
  for (size_t r = 0; r < xs.size() / 2; ++r) {
    const double a = xs[2 * r], mx = std::max(a, 0.0);
    const double s = std::exp(a - mx) + std::exp(-mx);
    for (size_t j = 0; j < 2; ++j) {
      const double ref = std::exp(xs[2 * r + j] - mx) / s;
      // Relative error in units of f32 eps; below the normal range, in units of the spacing.
      const double unit = std::max(std::fabs(ref) * 0x1p-23, 0x1p-149);
      worst = std::max(worst, std::fabs(p[2 * r + j] - ref) / unit);
      const double lref = xs[2 * r + j] - mx - std::log(s);
      worst_log = std::max(worst_log, std::fabs(lp[2 * r + j] - lref) /
                                          std::max(std::fabs(lref) * 0x1p-23, 0x1p-23));
    }
  }
  EXPECT_LE(worst, 4.0) << "softmax error in ulps";
  EXPECT_LE(worst_log, 4.0) << "log_softmax error in ulps";
}

// ---- cross entropy ---------------------------------------------------------------------------

// Per-sample losses of logits (rows, C) against targets, PyTorch's definition:
// (1 - ls) * (-log p_t) + ls * mean_c(-log p_c); 0 for ignored targets.
std::vector<double> ce_rows_ref(const std::vector<double>& logits, const std::vector<int64_t>& t,
                                int64_t classes, int64_t ignore, double ls) {
  std::vector<double> loss;
  for (size_t r = 0; r < t.size(); ++r) {
    if (t[r] == ignore) {
      loss.push_back(0);
      continue;
    }
    const double* row = logits.data() + r * size_t(classes);
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < classes; ++c)
      mx = std::max(mx, row[c]);
    for (int64_t c = 0; c < classes; ++c)
      s += std::exp(row[c] - mx);
    const double lse = mx + std::log(s);
    double smooth = 0;
    for (int64_t c = 0; c < classes; ++c)
      smooth += lse - row[c];
    loss.push_back((1 - ls) * (lse - row[t[r]]) + ls * smooth / double(classes));
  }
  return loss;
}

// logits (N, C, d...) and targets (N, d...): class dim moved last by hand.
Tensor ce_ref(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  const int64_t n = logits.size(0), c = logits.size(1), inner = logits.numel() / (n * c);
  const std::vector<double> lv = values(logits);
  std::vector<double> rows;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < inner; ++k) {
      for (int64_t j = 0; j < c; ++j)
        rows.push_back(lv[size_t((i * c + j) * inner + k)]);
    }
  }
  const std::vector<int64_t> t = target.contiguous().to_vector<int64_t>();
  const std::vector<double> loss = ce_rows_ref(rows, t, c, o.ignore_index, o.label_smoothing);
  double total = 0;
  int64_t counted = 0;
  for (size_t r = 0; r < t.size(); ++r) {
    total += loss[r];
    counted += t[r] != o.ignore_index;
  }
  switch (o.reduction) {
    case Reduction::None:
      return f64(loss, target.shape());
    case Reduction::Sum:
      return f64({total}, {});
    case Reduction::Mean:
      break;
  }
  return f64({total / double(counted)}, {});
}

OpCase ce_case(const std::string& name, const Shape& logits_shape, const Tensor& target,
               const CrossEntropyOptions& o) {
  return op_case(
      name, {random_f64(logits_shape, 80, -3, 3), target},
      // The loss is F32 for half logits; the harness compares in the logits' dtype.
      [o](const std::vector<Tensor>& in) {
        return cross_entropy(in[0], in[1], o).to(in[0].dtype());
      },
      [o](const std::vector<Tensor>& in) { return ce_ref(in[0], in[1], o); });
}

TEST(NnCrossEntropy, EachReductionWithIgnoreIndexAndLabelSmoothing) {
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{2, 0, -100, 4, 1, 3}, {6});
  for (Reduction red : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double ls : {0.0, 0.1}) {
      const std::string name = std::string("cross_entropy ") +
                               (red == Reduction::Mean  ? "mean"
                                : red == Reduction::Sum ? "sum"
                                                        : "none") +
                               " ls " + std::to_string(ls);
      check_op(ce_case(name, {6, 5}, t, ce_opts(-100, ls, red)));
    }
  }
}

TEST(NnCrossEntropy, SpatialLogitsAndCustomIgnoreIndex) {
  // (N, C, d1) logits with (N, d1) targets; targets equal to 1 are ignored.
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 1, 3, 2, 2, 1}, {2, 3});
  check_op(ce_case("cross_entropy (2, 4, 3) mean", {2, 4, 3}, t, ce_opts(1, 0.2)));
  check_op(ce_case("cross_entropy (2, 4, 3) none", {2, 4, 3}, t, ce_opts(1, 0, Reduction::None)));
}

TEST(NnCrossEntropy, LossDtypeAndEdgeCases) {
  const Tensor logits = Tensor::uniform({4, 3}, -1, 1, 90, DType::BF16);
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 1}, {4});
  EXPECT_EQ(cross_entropy(logits, t).dtype(), DType::F32);
  EXPECT_EQ(cross_entropy(logits.to(DType::F64), t).dtype(), DType::F64);
  // Gradients come back in the logits' dtype.
  Tensor l = logits.detach().set_requires_grad(true);
  cross_entropy(l, t).backward();
  EXPECT_EQ(l.grad().dtype(), DType::BF16);
  // All targets ignored: the mean is 0/0 (NaN, as PyTorch), the sum 0.
  const Tensor ignored = Tensor::full({4}, -100, DType::I64);
  EXPECT_TRUE(std::isnan(cross_entropy(logits, ignored).item()));
  EXPECT_EQ(cross_entropy(logits, ignored, ce_opts(-100, 0, Reduction::Sum)).item(), 0.0);
  // One unbatched sample: logits (C), target ().
  const Tensor one = Tensor::from_vector(std::vector<double>{0.5, -1, 2}, {3});
  EXPECT_NEAR(cross_entropy(one, Tensor::full({}, 2, DType::I64)).item(),
              ce_rows_ref({0.5, -1, 2}, {2}, 3, -100, 0)[0], 1e-6);
}

// ---- attention -------------------------------------------------------------------------------

// softmax(q k^T * scale + mask) v over the last two dims; q (B, Tq, D), k (B, Tk, D),
// v (B, Tk, Dv); mask_at(i, j) returns the additive mask (or -inf).
template <typename Mask>
Tensor attention_ref(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                     Mask mask_at) {
  const int64_t b = q.size(0), tq = q.size(1), tk = k.size(1), d = q.size(2), dv = v.size(2);
  const std::vector<double> qv = values(q), kv = values(k), vv = values(v);
  std::vector<double> out;
  for (int64_t n = 0; n < b; ++n) {
    for (int64_t i = 0; i < tq; ++i) {
      std::vector<double> s(static_cast<size_t>(tk));
      double mx = -INFINITY;
      for (int64_t j = 0; j < tk; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) {
          dot += qv[size_t((n * tq + i) * d + e)] * kv[size_t((n * tk + j) * d + e)];
        }
        s[size_t(j)] = dot * scale + mask_at(n, i, j);
        mx = std::max(mx, s[size_t(j)]);
      }
      double total = 0;
      for (double& x : s)
        total += (x = std::exp(x - mx));
      for (int64_t e = 0; e < dv; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < tk; ++j)
          acc += s[size_t(j)] / total * vv[size_t((n * tk + j) * dv + e)];
        out.push_back(acc);
      }
    }
  }
  return f64(out, {b, tq, dv});
}

constexpr double kTolAttention = 16;  // two matmuls, a scale, a softmax: four roundings

TEST(NnAttention, NoMaskWithDefaultAndExplicitScale) {
  check_op(op_case(
      "sdpa no mask",
      {random_f64({2, 3, 4}, 100), random_f64({2, 5, 4}, 101), random_f64({2, 5, 6}, 102)},
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2]);
      },
      [](const std::vector<Tensor>& in) {
        return attention_ref(in[0], in[1], in[2], 0.5,
                             [](int64_t, int64_t, int64_t) { return 0.0; });
      },
      kTolAttention, 2 * kTolAttention));
  check_op(op_case(
      "sdpa scale 0.3",
      {random_f64({1, 4, 3}, 103), random_f64({1, 4, 3}, 104), random_f64({1, 4, 2}, 105)},
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), false, 0.3);
      },
      [](const std::vector<Tensor>& in) {
        return attention_ref(in[0], in[1], in[2], 0.3,
                             [](int64_t, int64_t, int64_t) { return 0.0; });
      },
      kTolAttention, 2 * kTolAttention));
}

TEST(NnAttention, CausalMask) {
  check_op(op_case(
      "sdpa causal",
      {random_f64({2, 5, 4}, 110), random_f64({2, 5, 4}, 111), random_f64({2, 5, 3}, 112)},
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], Tensor(), true);
      },
      [](const std::vector<Tensor>& in) {
        return attention_ref(in[0], in[1], in[2], 0.5, [](int64_t, int64_t i, int64_t j) {
          return j <= i ? 0.0 : -INFINITY;
        });
      },
      kTolAttention, 2 * kTolAttention));
}

TEST(NnAttention, BoolAndAdditiveMasks) {
  // A (Tq, Tk) bool mask broadcast over the batch; every query keeps at least one key.
  const std::vector<int64_t> keep = {1, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0};
  const Tensor bool_mask = Tensor::from_vector(keep, {3, 5}, DType::I64).to(DType::Bool);
  check_op(op_case(
      "sdpa bool mask",
      {random_f64({2, 3, 4}, 120), random_f64({2, 5, 4}, 121), random_f64({2, 5, 2}, 122),
       bool_mask},
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], in[3]);
      },
      [keep](const std::vector<Tensor>& in) {
        return attention_ref(in[0], in[1], in[2], 0.5, [&keep](int64_t, int64_t i, int64_t j) {
          return keep[size_t(i * 5 + j)] ? 0.0 : -INFINITY;
        });
      },
      kTolAttention, 2 * kTolAttention));
  // A float mask (B, 1, Tk) is added to the scores, and is differentiable.
  check_op(op_case(
      "sdpa additive mask",
      {random_f64({2, 3, 4}, 130), random_f64({2, 5, 4}, 131), random_f64({2, 5, 2}, 132),
       random_f64({2, 1, 5}, 133)},
      [](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], in[3]);
      },
      [](const std::vector<Tensor>& in) {
        const std::vector<double> m = values(in[3]);
        return attention_ref(in[0], in[1], in[2], 0.5,
                             [m](int64_t n, int64_t, int64_t j) { return m[size_t(n * 5 + j)]; });
      },
      kTolAttention, 2 * kTolAttention));
}

// ---- errors ------------------------------------------------------------------------------------

TEST(NnPool, ErrorsNameTheProblem) {
  const Tensor x = Tensor::zeros({2, 3, 4, 4});
  expect_error(
      [] {
        max_pool2d(Tensor::zeros({4, 4}), pool_opts({2}));
      },
      "expected an (N, C, H, W) or (C, H, W) input, got a f32 tensor of shape (4, 4)");
  expect_error([&] { max_pool2d(x, pool_opts({2}, {}, {2})); },
               "must be between 0 and half the kernel size");
  expect_error([&] { avg_pool2d(x, pool_opts({5})); }, "is larger than the padded input");
  expect_error([&] { avg_pool2d(x, pool_opts({2, 2, 2})); }, "takes 1 or 2 values");
  expect_error([&] { adaptive_avg_pool2d(x, {0, 2}); }, "output_size must be positive");
  expect_error(
      [] {
        max_pool2d(Tensor::zeros({1, 1, 2, 2}, DType::I64), pool_opts({2}));
      },
      "must be a floating tensor");
}

TEST(NnNorm, ErrorsNameTheProblem) {
  const Tensor x = Tensor::zeros({2, 4, 3});
  expect_error([&] { batch_norm(x, Tensor::ones({3}), Tensor(), Tensor(), Tensor(), true); },
               "batch_norm: weight has 3 elements but the input has 4 channels");
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), false); },
               "evaluation mode (training = false) needs running_mean and running_var");
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), Tensor::zeros({4}), Tensor(), true); },
               "give both running_mean and running_var");
  expect_error(
      [] {
        batch_norm(Tensor::zeros({1, 3}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      "more than 1 value per channel");
  expect_error([&] { layer_norm(x, {4}); },
               "normalized_shape [4] does not match the last dims of the input f32 tensor of shape "
               "(2, 4, 3)");
  expect_error([&] { layer_norm(x, {3}, Tensor::ones({4})); },
               "layer_norm: weight is a f32 tensor of shape (4,) but normalized_shape is [3]");
}

TEST(NnSoftmax, ErrorsNameTheProblem) {
  expect_error([] { softmax(Tensor::zeros({2, 3}), 2); }, "out of range");
  expect_error(
      [] {
        log_softmax(Tensor::zeros({2, 3}, DType::I64), 1);
      },
      "log_softmax: the input must be a floating tensor");
}

TEST(NnCrossEntropy, ErrorsNameTheProblem) {
  const Tensor logits = Tensor::zeros({4, 3});
  expect_error([&] { cross_entropy(logits, Tensor::zeros({3}, DType::I64)); },
               "need targets of shape (4,)");
  expect_error([&] { cross_entropy(logits, Tensor::zeros({4})); },
               "targets must be class indices (i64), got a f32 tensor of shape (4,)");
  expect_error(
      [&] {
        cross_entropy(logits, Tensor::from_vector(std::vector<int64_t>{0, 1, 3, 2}, {4}));
      },
      "target 3 (sample 2) is out of range for 3 classes");
  expect_error([&] { cross_entropy(logits, Tensor::zeros({4}, DType::I64), ce_opts(-100, 1.5)); },
               "label_smoothing must be in [0, 1]");
}

TEST(NnAttention, ErrorsNameTheProblem) {
  const Tensor q = Tensor::zeros({2, 3, 4});
  expect_error(
      [&] {
        scaled_dot_product_attention(q, Tensor::zeros({2, 5, 3}), Tensor::zeros({2, 5, 4}));
      },
      "the query's last dim (4) must equal the key's (3)");
  expect_error(
      [&] {
        scaled_dot_product_attention(q, Tensor::zeros({2, 5, 4}), Tensor::zeros({2, 6, 4}));
      },
      "key and value need the same sequence length");
  expect_error(
      [&] {
        scaled_dot_product_attention(q, Tensor::zeros({2, 5, 4}), Tensor::zeros({2, 5, 4}),
                                     Tensor::zeros({4, 5}, DType::Bool));
      },
      "does not broadcast to the scores (2, 3, 5)");
}

}  // namespace
}  // namespace mantissa
