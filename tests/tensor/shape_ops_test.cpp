#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "harness/op_harness.h"

namespace mantissa {
namespace {

using testing::check_op;
using testing::OpCase;
using testing::random_f64;

TEST(ShapeOps, CatStackSplitChunk) {
  OpCase c;
  c.name = "cat dim 1";
  c.inputs = {random_f64({2, 3, 4}, 1), random_f64({2, 5, 4}, 2)};
  c.fn = [](const std::vector<Tensor>& in) { return cat({in[0], in[1]}, 1); };
  c.reference = [](const std::vector<Tensor>& in) {
    std::vector<double> r;
    const auto a = in[0].to_vector<double>(), b = in[1].to_vector<double>();
    for (int i = 0; i < 2; ++i) {
      r.insert(r.end(), a.begin() + i * 12, a.begin() + (i + 1) * 12);
      r.insert(r.end(), b.begin() + i * 20, b.begin() + (i + 1) * 20);
    }
    return Tensor::from_vector(r, {2, 8, 4}, DType::F64);
  };
  check_op(c);

  OpCase s;
  s.name = "stack dim 0 then sum of chunks";
  s.inputs = {random_f64({3, 4}, 3), random_f64({3, 4}, 4)};
  s.fn = [](const std::vector<Tensor>& in) {
    const Tensor st = stack({in[0], in[1]}, 1);  // (3, 2, 4)
    const auto parts = chunk(st, 2, 2);          // two (3, 2, 2)
    return mul(parts[0], parts[1]);
  };
  check_op(s);

  const Tensor x = Tensor::arange(10);
  const auto pieces = split(x, 4);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2].to_vector<int64_t>(), (std::vector<int64_t>{8, 9}));
  EXPECT_EQ(chunk(x, 3).size(), 3u);
  EXPECT_EQ(chunk(x, 3)[0].numel(), 4);
  EXPECT_EQ(cat({x, x}).numel(), 20);
  EXPECT_EQ(cat({Tensor::ones({2}, DType::BF16), Tensor::ones({1}, DType::F32)}).dtype(),
            DType::F32);
}

// unbind and split: one node for all parts, gradients joined once (zeros for unused parts);
// checked against finite differences and the float64 reference.
TEST(ShapeOps, UnbindAndSplitAreOneNode) {
  OpCase u;
  u.name = "unbind dim 1, parts 1 and 2 unused";
  u.inputs = {random_f64({3, 5, 2}, 7)};
  u.fn = [](const std::vector<Tensor>& in) {
    const std::vector<Tensor> p = unbind(in[0], 1);
    return add(mul(p[0], p[3]), p[4]);
  };
  u.reference = [](const std::vector<Tensor>& in) {
    const auto v = in[0].to_vector<double>();
    std::vector<double> r;
    for (int a = 0; a < 3; ++a)
      for (int c = 0; c < 2; ++c)
        r.push_back(v[size_t(a * 10 + 0 * 2 + c)] * v[size_t(a * 10 + 3 * 2 + c)] +
                    v[size_t(a * 10 + 4 * 2 + c)]);
    return Tensor::from_vector(r, {3, 2}, DType::F64);
  };
  check_op(u);

  OpCase s;
  s.name = "split dim 0 into 2, 2, 1, the middle part unused";
  s.inputs = {random_f64({5, 3}, 8)};
  s.fn = [](const std::vector<Tensor>& in) {
    const std::vector<Tensor> p = split(in[0], 2, 0);
    return cat({mul(p[0], p[0]), p[2]}, 0);
  };
  check_op(s);

  Tensor x = random_f64({2, 4, 3}, 9);
  x.set_requires_grad(true);
  const std::vector<Tensor> parts = unbind(x, 1);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].shape(), Shape({2, 3}));
  EXPECT_TRUE(parts[0].grad_fn() && parts[0].grad_fn() == parts[3].grad_fn());
  EXPECT_EQ(parts[2].to_vector<double>(), x.select(1, 2).to_vector<double>());
}

// unbind of a permuted view, as attention splits q, k and v from one projection: the gradient
// is right (finite differences), and it reaches the tensor the view was permuted from laid out
// contiguously, so the reshape before it passes it on as a view instead of copying it.
TEST(ShapeOps, UnbindOfAPermutedViewGivesTheGradientInTheViewsLayout) {
  OpCase u;
  u.name = "unbind dim 0 of (B, T, 3, H, D) permuted to (3, B, H, T, D)";
  u.inputs = {random_f64({2, 3, 12}, 11)};
  u.fn = [](const std::vector<Tensor>& in) {
    const std::vector<Tensor> p =
        unbind(in[0].reshape({2, 3, 3, 2, 2}).permute({2, 0, 3, 1, 4}), 0);
    return add(mul(p[0], p[1]), p[2]);
  };
  check_op(u);

  Tensor w = random_f64({2, 3, 12}, 12);
  w.set_requires_grad(true);
  const Tensor r = mul(w, 2.0).reshape({2, 3, 3, 2, 2});
  bool contiguous = false;
  Shape shape;
  r.register_hook([&](const Tensor& g) {
    contiguous = g.is_contiguous();
    shape = g.shape();
    return Tensor();
  });
  const std::vector<Tensor> p = unbind(r.permute({2, 0, 3, 1, 4}), 0);
  sum(add(mul(p[0], p[1]), p[2])).backward();
  EXPECT_EQ(shape, Shape({2, 3, 3, 2, 2}));
  EXPECT_TRUE(contiguous) << "the gradient of the permuted view is laid out as its base";
  // Each element's gradient: 2 * (the other of q, k, or 1 for v).
  const std::vector<double> wv = w.to_vector<double>(), gv = w.grad().to_vector<double>();
  for (size_t i = 0; i < wv.size(); ++i) {
    const size_t part = (i % 12) / 4, other = part == 0 ? i + 4 : i - 4;
    const double expected = part == 2 ? 2.0 : 2.0 * 2.0 * wv[other];
    EXPECT_DOUBLE_EQ(gv[i], expected) << "element " << i;
  }
}

TEST(ShapeOps, IndexSelectGatherEmbedding) {
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{2, 0, 2, 1}, {4});
  OpCase is;
  is.name = "index_select dim 1 with repeats";
  is.inputs = {random_f64({3, 4, 2}, 5)};
  is.fn = [idx](const std::vector<Tensor>& in) { return index_select(in[0], 1, idx); };
  is.reference = [](const std::vector<Tensor>& in) {
    const auto v = in[0].to_vector<double>();
    const int order[4] = {2, 0, 2, 1};
    std::vector<double> r;
    for (int a = 0; a < 3; ++a)
      for (int j : order)
        for (int c = 0; c < 2; ++c)
          r.push_back(v[size_t(a * 8 + j * 2 + c)]);
    return Tensor::from_vector(r, {3, 4, 2}, DType::F64);
  };
  check_op(is);

  const Tensor tokens = Tensor::from_vector(std::vector<int64_t>{1, 3, 3, 0, 1, 1}, {2, 3});
  OpCase em;
  em.name = "embedding";
  em.inputs = {random_f64({5, 4}, 6)};
  em.fn = [tokens](const std::vector<Tensor>& in) { return embedding(in[0], tokens); };
  em.check_strided = false;
  check_op(em);
  EXPECT_EQ(embedding(Tensor::ones({5, 4}), tokens).shape(), (Shape{2, 3, 4}));

  const Tensor gidx = Tensor::from_vector(std::vector<int64_t>{0, 2, 1, 1, 0, 0}, {2, 3});
  OpCase ga;
  ga.name = "gather dim 1";
  ga.inputs = {random_f64({2, 3}, 7)};
  ga.fn = [gidx](const std::vector<Tensor>& in) { return gather(in[0], 1, gidx); };
  ga.reference = [gidx](const std::vector<Tensor>& in) {
    const auto v = in[0].to_vector<double>();
    const auto ix = gidx.to_vector<int64_t>();
    std::vector<double> r;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        r.push_back(v[size_t(i * 3 + ix[size_t(i * 3 + j)])]);
    return Tensor::from_vector(r, {2, 3}, DType::F64);
  };
  check_op(ga);
}

TEST(ShapeOps, ViewsAreDifferentiable) {
  OpCase v;
  v.name = "transpose, narrow, slice, select, expand, reshape";
  v.inputs = {random_f64({4, 6}, 8)};
  v.fn = [](const std::vector<Tensor>& in) {
    const Tensor t = in[0].t().narrow(0, 1, 4).slice(1, 0, 4, 2);  // (4, 2)
    const Tensor s = in[0].select(1, 3).unsqueeze(1).expand({4, 2});
    return mul(t, s).reshape({8}).squeeze();
  };
  check_op(v);
}

TEST(Dropout, SeededMaskScaleAndGradient) {
  const Tensor x = Tensor::ones({100000});
  const Tensor y = dropout(x, 0.3, true, 1234);
  const std::vector<float> v = y.to_vector<float>();
  size_t kept = 0;
  for (float e : v) {
    ASSERT_TRUE(e == 0.0f || std::fabs(e - 1.0f / 0.7f) < 1e-6f) << e;
    kept += e != 0.0f;
  }
  // 5 sigma of a binomial(100000, 0.7).
  EXPECT_NEAR(double(kept) / 1e5, 0.7, 5 * std::sqrt(0.21 / 1e5));
  EXPECT_EQ(dropout(x, 0.3, true, 1234).to_vector<float>(), v) << "same seed, same mask";
  EXPECT_NE(dropout(x, 0.3, true, 99).to_vector<float>(), v);
  EXPECT_TRUE(dropout(x, 0.3, false).is_same(x)) << "eval mode is the identity";

  manual_seed(5);
  const auto a = dropout(x, 0.5).to_vector<float>();
  const auto b = dropout(x, 0.5).to_vector<float>();
  EXPECT_NE(a, b) << "successive calls draw fresh masks";
  manual_seed(5);
  EXPECT_EQ(dropout(x, 0.5).to_vector<float>(), a) << "manual_seed replays";

  Tensor w = Tensor::full({1000}, 2.0).set_requires_grad(true);
  Tensor out = dropout(w, 0.5, true, 3);
  sum(out).backward();
  const auto g = w.grad().to_vector<float>(), o = out.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_EQ(g[i], o[i] == 0.0f ? 0.0f : 2.0f);
}

// index_select's gradient (an embedding's) adds grad_out's rows into the selected rows in index
// order: with repeated indices, in f32, the sums equal a plain loop in that order bit for bit,
// for any thread count and for row widths that are and are not multiples of the kernel's
// blocks, along dim 0 (an embedding) and dim 1 (outer > 1).
TEST(ShapeOps, IndexSelectGradientAddsRowsInIndexOrder) {
  const int before = get_num_threads();
  struct Case {
    Shape x;
    int dim;
  };
  for (const Case& c : {Case{{7, 130}, 0}, Case{{7, 16}, 0}, Case{{3, 7, 37}, 1}}) {
    const int64_t n = c.x[c.dim], m = 4000;
    std::vector<int64_t> idx(static_cast<size_t>(m));
    for (int64_t j = 0; j < m; ++j)
      idx[size_t(j)] = (j * 5 + j / 3) % n;  // every row, many times, in no sorted order
    const Tensor index = Tensor::from_vector(idx, {m}, DType::I64);
    const Tensor x = Tensor::uniform(c.x, -1, 1, 31);
    Shape gshape = c.x;
    gshape[c.dim] = m;
    const Tensor g = Tensor::uniform(gshape, -1, 1, 32);
    const int64_t outer = c.dim == 0 ? 1 : c.x[0], inner = c.x[c.x.size() - 1];
    // The plain loop: for each output element, its contributions in index order.
    std::vector<float> want(size_t(x.numel()), 0.0f);
    const std::vector<float> gv = g.to_vector<float>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t i = 0; i < inner; ++i)
          want[size_t((o * n + idx[size_t(j)]) * inner + i)] += gv[size_t((o * m + j) * inner + i)];
    for (const int threads : {1, 2, 3}) {
      SCOPED_TRACE(c.x.str() + " dim " + std::to_string(c.dim) + ", " + std::to_string(threads) +
                   " threads");
      set_num_threads(threads);
      const Tensor xr = x.detach().set_requires_grad();
      index_select(xr, c.dim, index).backward(g);
      const std::vector<float> got = xr.grad().to_vector<float>();
      ASSERT_EQ(got.size(), want.size());
      for (size_t k = 0; k < got.size(); ++k)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[k]), std::bit_cast<uint32_t>(want[k]))
            << "element " << k;
    }
  }
  set_num_threads(before);
}

}  // namespace
}  // namespace mantissa
