// The CUDA reductions, softmax, cross-entropy, layer norm and batch norm against the CPU backend
// (the reference semantics), forward and backward, for f32, f16, bf16 and f64, on random inputs
// of odd sizes and strided views, with outputs pre-filled with NaN so that an unwritten element
// shows. The reduction planning (reduce_plan.h) is host code and is tested everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/reduce_plan.h"
#include "backend/cuda_test_util.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa {
namespace {

using backend::ReduceOp;
using backend::cuda::plan_reduce;
using backend::cuda::ReducePlan;

// ---- reduce_plan.h (host code: runs everywhere) ---------------------------------------------

// Every element of a random strided tensor is found at plan.kept.offset(o) + plan.red.offset(r),
// o and r its row-major positions among the kept and the reduced dims.
TEST(CudaReducePlan, AddressesEveryElementAsNaiveIndexingDoes) {
  std::mt19937 rng(20261121);
  for (int trial = 0; trial < 500; ++trial) {
    const int nd = int(rng() % 6);
    std::vector<int64_t> sizes(static_cast<size_t>(nd)), strides(static_cast<size_t>(nd));
    for (auto& s : sizes)
      s = 1 + int64_t(rng() % 4);
    // Strides of a contiguous tensor in a random dim order, some stepped, some broadcast.
    std::vector<int> order(static_cast<size_t>(nd));
    for (int d = 0; d < nd; ++d)
      order[size_t(d)] = d;
    std::shuffle(order.begin(), order.end(), rng);
    int64_t step = 1 + int64_t(rng() % 2);
    for (int k = nd - 1; k >= 0; --k) {
      const size_t d = size_t(order[size_t(k)]);
      strides[d] = rng() % 7 == 0 ? 0 : step;
      step *= sizes[d] * (1 + int64_t(rng() % 2));
    }
    std::vector<int> dims;
    for (int d = 0; d < nd; ++d) {
      if (rng() % 2) dims.push_back(d);
    }
    const ReducePlan p = plan_reduce(sizes, strides, dims);

    int64_t numel = 1, n_out = 1, n_red = 1;
    for (int d = 0; d < nd; ++d) {
      numel *= sizes[size_t(d)];
      const bool red = std::find(dims.begin(), dims.end(), d) != dims.end();
      (red ? n_red : n_out) *= sizes[size_t(d)];
    }
    ASSERT_EQ(p.n_out, n_out);
    ASSERT_EQ(p.n_red, n_red);
    ASSERT_LE(p.kept.ndim + p.red.ndim, nd);
    ASSERT_LE(p.block_x * p.block_y, backend::cuda::kReduceThreads);
    ASSERT_EQ(p.block_x & (p.block_x - 1), 0);
    ASSERT_EQ(p.block_y & (p.block_y - 1), 0);
    for (int64_t e = 0; e < numel; ++e) {
      int64_t rem = e, offset = 0, o = 0, r = 0, o_mul = 1, r_mul = 1;
      for (int d = nd - 1; d >= 0; --d) {
        const int64_t i = rem % sizes[size_t(d)];
        rem /= sizes[size_t(d)];
        offset += i * strides[size_t(d)];
        if (std::find(dims.begin(), dims.end(), d) != dims.end()) {
          r += i * r_mul;
          r_mul *= sizes[size_t(d)];
        } else {
          o += i * o_mul;
          o_mul *= sizes[size_t(d)];
        }
      }
      ASSERT_EQ(p.kept.offset(o) + p.red.offset(r), offset)
          << "trial " << trial << " element " << e;
    }
  }
}

TEST(CudaReducePlan, MergesDimsAndPicksCoalescedThreads) {
  const std::vector<int64_t> sizes = {4, 5, 6}, strides = {30, 6, 1};
  // Rows: the reduced dim is contiguous, threads run along it.
  ReducePlan p = plan_reduce(sizes, strides, std::vector<int>{2});
  EXPECT_EQ(p.kept.ndim, 1);
  EXPECT_EQ(p.kept.sizes[0], 20);
  EXPECT_EQ(p.kept.strides[0], 6);
  EXPECT_EQ(p.red.ndim, 1);
  EXPECT_EQ(p.red.strides[0], 1);
  EXPECT_EQ(p.block_y, 8);
  EXPECT_EQ(p.block_x, 32);
  // Leading dims (a bias gradient): threads run across the outputs.
  p = plan_reduce(sizes, strides, std::vector<int>{0, 1});
  EXPECT_EQ(p.red.ndim, 1);
  EXPECT_EQ(p.red.sizes[0], 20);
  EXPECT_EQ(p.red.strides[0], 6);
  EXPECT_EQ(p.block_x, 8);
  EXPECT_EQ(p.block_y, 32);
  // Everything: one output, one merged run.
  p = plan_reduce(sizes, strides, std::vector<int>{0, 1, 2});
  EXPECT_EQ(p.kept.ndim, 0);
  EXPECT_EQ(p.n_out, 1);
  EXPECT_EQ(p.red.ndim, 1);
  EXPECT_EQ(p.red.sizes[0], 120);
  EXPECT_EQ(p.block_x, 1);
  EXPECT_EQ(p.block_y, 128);
  // Nothing reduced, and size-1 dims dropped.
  p = plan_reduce(std::vector<int64_t>{1, 3, 1}, std::vector<int64_t>{3, 1, 1}, std::vector<int>{});
  EXPECT_EQ(p.n_red, 1);
  EXPECT_EQ(p.red.ndim, 0);
  EXPECT_EQ(p.kept.ndim, 1);
  // A transposed view whose reduced dim is the contiguous one stays a row reduction.
  p = plan_reduce(std::vector<int64_t>{6, 20}, std::vector<int64_t>{1, 6}, std::vector<int>{0});
  EXPECT_EQ(p.red.strides[0], 1);
  EXPECT_EQ(p.block_y, 8);
}

// ---- CUDA against the CPU ----------------------------------------------------------------------

constexpr DType kFloats[] = {DType::F32, DType::F16, DType::BF16, DType::F64};

double eps_of(DType dt) {
  switch (dt) {
    case DType::F64:
      return 0x1p-52;
    case DType::F16:
      return 0x1p-10;
    case DType::BF16:
      return 0x1p-7;
    default:
      return 0x1p-23;
  }
}

// An absolute tolerance for fp32 arithmetic, scaled down for f64 (computed in double).
double atol_for(DType dt, double fp32_atol) {
  return dt == DType::F64 ? fp32_atol * 1e-8 : fp32_atol;
}

backend::Backend& cpu() {
  return backend::cpu_backend();
}
backend::Backend& gpu() {
  return backend::backend_for(Device::cuda());
}

Tensor random(const Shape& shape, DType dt, uint64_t seed, double lo = -3, double hi = 3) {
  return Tensor::uniform(shape, lo, hi, seed, dt == DType::F64 ? DType::F64 : DType::F32).to(dt);
}

Tensor nan_filled(const Shape& shape, DType dt) {
  return Tensor::full(shape, dt == DType::I64 ? -7.0 : double(NAN), dt, Device::cuda());
}

std::vector<double> host(const Tensor& t) {
  return t.to(Device::cpu()).contiguous().to(DType::F64).to_vector<double>();
}

// |gpu - cpu| <= rtol |cpu| + atol element by element; NaN must meet NaN.
void expect_close(const Tensor& got, const Tensor& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = host(got), w = host(want);
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 5; ++i) {
    // Equal values first: an infinity meets the same infinity (their difference is NaN).
    const bool ok = std::isnan(w[i])
                        ? std::isnan(g[i])
                        : g[i] == w[i] || std::abs(g[i] - w[i]) <= rtol * std::abs(w[i]) + atol;
    if (!ok) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << " is " << g[i] << ", the CPU says " << w[i];
    }
  }
}

std::string name(DType dt) {
  return std::string(dtype_name(dt));
}

// A view of base (the same view on either device): 0 itself, 1 its first and last dims swapped,
// 2 every other element of dim 0 of a doubled tensor.
Tensor make_view(const Tensor& base, int kind) {
  if (kind == 1) return base.transpose(0, base.dim() - 1);
  if (kind == 2) {
    Shape s = base.shape();
    s[0] *= 2;
    Tensor big = Tensor::zeros(s, base.dtype(), base.device());
    big.slice(0, 0, s[0], 2).copy_(base);
    return big.slice(0, 0, s[0], 2);
  }
  return base;
}

struct ReduceCase {
  Shape shape;
  std::vector<int> dims;
};

const std::vector<ReduceCase>& reduce_cases() {
  static const std::vector<ReduceCase> cases = {
      {{7}, {0}},          {{1}, {0}},          {{1000, 7}, {1}},       {{1000, 7}, {0}},
      {{1000, 7}, {0, 1}}, {{3, 1, 2051}, {2}}, {{3, 1, 2051}, {0, 2}}, {{4, 5, 6}, {0, 2}},
      {{4, 5, 6}, {1}},    {{2, 3000}, {1}},    {{5, 3}, {}},           {{64, 33, 3}, {0, 1}},
  };
  return cases;
}

Shape keep_shape(const Shape& s, const std::vector<int>& dims) {
  Shape k = s;
  for (int d : dims)
    k[d] = 1;
  return k;
}

TEST(CudaReduce, EveryOpMatchesTheCpu) {
  MT_REQUIRE_CUDA();
  uint64_t seed = 1;
  for (DType dt : kFloats) {
    for (const ReduceCase& rc : reduce_cases()) {
      for (int kind = 0; kind < 3; ++kind) {
        const Tensor base = random(rc.shape, dt, seed++);
        const Tensor xc = make_view(base, kind);
        const Tensor xg = make_view(base.to(Device::cuda()), kind);
        const Shape ks = keep_shape(xc.shape(), rc.dims);
        int64_t n_red = 1;
        for (int d : rc.dims)
          n_red *= xc.size(d);
        const std::string where = name(dt) + " " + xc.shape().str() + " view " +
                                  std::to_string(kind) + " dims " + std::to_string(rc.dims.size());
        const double acc = atol_for(dt, 2e-6);
        struct Op {
          ReduceOp op;
          int64_t correction;
          double atol;  // on top of 2 eps |cpu|
        };
        const Op ops[] = {{ReduceOp::Sum, 0, acc * 3 * double(n_red)},
                          {ReduceOp::Mean, 0, acc * 3},
                          {ReduceOp::Var, 1, acc * 10},
                          {ReduceOp::Var, 0, acc * 10}};
        for (const Op& o : ops) {
          Tensor oc = Tensor::empty(ks, dt), og = nan_filled(ks, dt);
          cpu().reduce(o.op, xc, rc.dims, oc, nullptr, o.correction);
          gpu().reduce(o.op, xg, rc.dims, og, nullptr, o.correction);
          expect_close(og, oc, 2 * eps_of(dt) + acc, o.atol,
                       where + " op " + std::to_string(int(o.op)));
        }
        for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
          Tensor oc = Tensor::empty(ks, dt), og = nan_filled(ks, dt);
          Tensor ic = Tensor::empty(ks, DType::I64), ig = nan_filled(ks, DType::I64);
          cpu().reduce(op, xc, rc.dims, oc, &ic, 0);
          gpu().reduce(op, xg, rc.dims, og, &ig, 0);
          expect_close(og, oc, 0, 0, where + " max/min values");
          expect_close(ig, ic, 0, 0, where + " max/min indices");
          // Without indices.
          Tensor og2 = nan_filled(ks, dt);
          gpu().reduce(op, xg, rc.dims, og2, nullptr, 0);
          expect_close(og2, oc, 0, 0, where + " max/min values without indices");
        }
        for (ReduceOp op : {ReduceOp::ArgMax, ReduceOp::ArgMin}) {
          Tensor oc = Tensor::empty(ks, DType::I64), og = nan_filled(ks, DType::I64);
          cpu().reduce(op, xc, rc.dims, oc, nullptr, 0);
          gpu().reduce(op, xg, rc.dims, og, nullptr, 0);
          expect_close(og, oc, 0, 0, where + " arg");
        }
      }
    }
  }
}

// Ties go to the first index, NaN wins (the first NaN), -0 and +0 tie: as the CPU.
TEST(CudaReduce, TiesAndNansPickTheCpusWinner) {
  MT_REQUIRE_CUDA();
  std::vector<double> v(3000);
  std::mt19937 rng(5);
  for (auto& e : v)
    e = double(int(rng() % 5) - 2);  // many ties
  v[2500] = NAN;
  v[2900] = NAN;
  v[10] = -0.0;
  for (DType dt : kFloats) {
    const Tensor xc = Tensor::from_vector(v, {3, 1000}, dt);
    const Tensor xg = xc.to(Device::cuda());
    for (std::vector<int> dims :
         {std::vector<int>{1}, std::vector<int>{0}, std::vector<int>{0, 1}}) {
      const Shape ks = keep_shape(xc.shape(), dims);
      for (ReduceOp op : {ReduceOp::ArgMax, ReduceOp::ArgMin}) {
        Tensor oc = Tensor::empty(ks, DType::I64), og = nan_filled(ks, DType::I64);
        cpu().reduce(op, xc, dims, oc, nullptr, 0);
        gpu().reduce(op, xg, dims, og, nullptr, 0);
        expect_close(og, oc, 0, 0, name(dt) + " ties");
      }
      for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min, ReduceOp::Sum}) {
        Tensor oc = Tensor::empty(ks, dt), og = nan_filled(ks, dt);
        Tensor ic = Tensor::empty(ks, DType::I64), ig = nan_filled(ks, DType::I64);
        const bool idx = op != ReduceOp::Sum;
        cpu().reduce(op, xc, dims, oc, idx ? &ic : nullptr, 0);
        gpu().reduce(op, xg, dims, og, idx ? &ig : nullptr, 0);
        expect_close(og, oc, 0, 0, name(dt) + " values with NaN");
        if (idx) expect_close(ig, ic, 0, 0, name(dt) + " indices with NaN");
      }
    }
  }
}

TEST(CudaReduce, IntegersAndEmptyReductions) {
  MT_REQUIRE_CUDA();
  std::vector<int64_t> v(2 * 1003);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = int64_t((i * 7919) % 1001) - 500;
  for (DType dt : {DType::I64, DType::I32}) {
    const Tensor xc = Tensor::from_vector(v, {2, 1003}).to(dt);
    const Tensor xg = xc.to(Device::cuda());
    const std::vector<int> dims = {1};
    Tensor sc = Tensor::empty({2, 1}, DType::I64), sg = nan_filled({2, 1}, DType::I64);
    cpu().reduce(ReduceOp::Sum, xc, dims, sc, nullptr, 0);
    gpu().reduce(ReduceOp::Sum, xg, dims, sg, nullptr, 0);
    expect_close(sg, sc, 0, 0, name(dt) + " sum");
    Tensor mc = Tensor::empty({2, 1}, dt), ic = Tensor::empty({2, 1}, DType::I64);
    Tensor mg = Tensor::full({2, 1}, 3, dt, Device::cuda()), ig = nan_filled({2, 1}, DType::I64);
    cpu().reduce(ReduceOp::Max, xc, dims, mc, &ic, 0);
    gpu().reduce(ReduceOp::Max, xg, dims, mg, &ig, 0);
    expect_close(mg, mc, 0, 0, name(dt) + " max");
    expect_close(ig, ic, 0, 0, name(dt) + " argmax");
  }
  // Sum of nothing is 0, mean of nothing NaN; max of nothing is an error.
  const Tensor e = Tensor::empty({3, 0}, DType::F32, Device::cuda());
  Tensor s = nan_filled({3, 1}, DType::F32);
  gpu().reduce(ReduceOp::Sum, e, std::vector<int>{1}, s, nullptr, 0);
  EXPECT_EQ(host(s), std::vector<double>(3, 0.0));
  gpu().reduce(ReduceOp::Mean, e, std::vector<int>{1}, s, nullptr, 0);
  EXPECT_TRUE(std::isnan(host(s)[0]));
  EXPECT_THROW(gpu().reduce(ReduceOp::Max, e, std::vector<int>{1}, s, nullptr, 0), Error);
}

// The op layer on CUDA tensors (sum, mean, var, max, argmax) gives the CPU's results.
TEST(CudaReduce, OpLayerMatchesTheCpu) {
  MT_REQUIRE_CUDA();
  const Tensor xc = random({37, 129}, DType::F32, 99);
  const Tensor xg = xc.to(Device::cuda());
  expect_close(sum(xg, {1}), sum(xc, {1}), 1e-5, 1e-4, "sum");
  expect_close(mean(xg, {0}, true), mean(xc, {0}, true), 1e-5, 1e-6, "mean");
  expect_close(var(xg, {0, 1}), var(xc, {0, 1}), 1e-5, 1e-6, "var");
  expect_close(max(xg, 1).values, max(xc, 1).values, 0, 0, "max");
  expect_close(max(xg, 1).indices, max(xc, 1).indices, 0, 0, "max indices");
  expect_close(argmax(xg, 0), argmax(xc, 0), 0, 0, "argmax");
}

// ---- softmax -----------------------------------------------------------------------------------

struct SoftmaxCase {
  Shape shape;
  int dim;
};

TEST(CudaSoftmax, ForwardAndBackwardMatchTheCpu) {
  MT_REQUIRE_CUDA();
  const SoftmaxCase cases[] = {{{1}, 0},        {{7}, 0},       {{5, 1000}, 1},
                               {{3, 3001}, 1},  {{4, 7, 5}, 1}, {{1000, 3}, 0},
                               {{2, 9, 33}, 0}, {{6, 1}, 1},    {{17, 300}, 0}};
  uint64_t seed = 100;
  for (DType dt : kFloats) {
    for (const SoftmaxCase& c : cases) {
      for (int kind = 0; kind < 2; ++kind) {
        for (bool log : {false, true}) {
          const Tensor base = random(c.shape, dt, seed++, -8, 8);
          const Tensor xc = make_view(base, kind);
          const Tensor xg = make_view(base.to(Device::cuda()), kind);
          const std::string where = name(dt) + " " + xc.shape().str() + " dim " +
                                    std::to_string(c.dim) + " view " + std::to_string(kind) +
                                    (log ? " log" : "");
          Tensor yc = Tensor::empty(xc.shape(), dt), yg = nan_filled(xc.shape(), dt);
          cpu().softmax(xc, c.dim, log, yc);
          gpu().softmax(xg, c.dim, log, yg);
          expect_close(yg, yc, 2 * eps_of(dt) + atol_for(dt, 4e-6), atol_for(dt, 4e-6),
                       where + " forward");
          // Backward from the CPU's forward output (the same y on both sides).
          const Tensor gc = random(xc.shape(), dt, seed++);
          Tensor dxc = Tensor::empty(xc.shape(), dt), dxg = nan_filled(xc.shape(), dt);
          cpu().softmax_backward(gc, yc, c.dim, log, dxc);
          gpu().softmax_backward(gc.to(Device::cuda()), yc.to(Device::cuda()), c.dim, log, dxg);
          const double n = double(xc.size(c.dim));
          expect_close(dxg, dxc, 2 * eps_of(dt) + atol_for(dt, 4e-6),
                       atol_for(dt, 4e-6 * (log ? n : 1.0) * 3), where + " backward");
        }
      }
    }
  }
}

TEST(CudaSoftmax, NanAndInfinityPropagateAsOnTheCpu) {
  MT_REQUIRE_CUDA();
  const std::vector<double> v = {1,         NAN,       3, -INFINITY, 0, -INFINITY,
                                 -INFINITY, -INFINITY, 2, INFINITY,  1, 0};
  const Tensor xc = Tensor::from_vector(v, {3, 4}, DType::F32);
  for (bool log : {false, true}) {
    Tensor yc = Tensor::empty({3, 4}), yg = nan_filled({3, 4}, DType::F32);
    cpu().softmax(xc, 1, log, yc);
    gpu().softmax(xc.to(Device::cuda()), 1, log, yg);
    expect_close(yg, yc, 1e-6, 1e-7, log ? "log_softmax specials" : "softmax specials");
  }
}

// ---- cross entropy -----------------------------------------------------------------------------

TEST(CudaCrossEntropy, ForwardAndBackwardMatchTheCpu) {
  MT_REQUIRE_CUDA();
  const int64_t ignore = -100;
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {7, 5}, {33, 1000}, {3, 2999}, {300, 7}};
  uint64_t seed = 500;
  for (DType dt : kFloats) {
    const DType sdt = dt == DType::F64 ? DType::F64 : DType::F32;
    for (auto [rows, classes] : shapes) {
      for (double ls : {0.0, 0.1}) {
        std::vector<int64_t> t(static_cast<size_t>(rows));
        std::mt19937 rng(static_cast<uint32_t>(seed));
        for (auto& e : t)
          e = rng() % 4 == 0 ? ignore : int64_t(rng() % uint64_t(classes));
        const Tensor tc = Tensor::from_vector(t, {rows});
        const Tensor lc = random({rows, classes}, dt, seed++, -6, 6);
        // A transposed (strided) logits view on both sides.
        const Tensor lcv = lc.t().contiguous().t();
        const Tensor lgv = lc.t().contiguous().to(Device::cuda()).t();
        const std::string where = name(dt) + " " + std::to_string(rows) + "x" +
                                  std::to_string(classes) + " ls " + std::to_string(ls);
        Tensor lossc = Tensor::empty({rows}, sdt), lpc = Tensor::empty({rows, classes}, sdt);
        Tensor lossg = nan_filled({rows}, sdt), lpg = nan_filled({rows, classes}, sdt);
        cpu().cross_entropy(lcv, tc, ignore, ls, lossc, lpc);
        gpu().cross_entropy(lgv, tc.to(Device::cuda()), ignore, ls, lossg, lpg);
        const double tol = atol_for(dt, 1e-5);
        expect_close(lpg, lpc, tol, tol, where + " log_probs");
        expect_close(lossg, lossc, tol, tol, where + " loss");

        const Tensor glc = random({rows}, sdt, seed++, 0.5, 2);
        Tensor gc = Tensor::empty({rows, classes}, dt), gg = nan_filled({rows, classes}, dt);
        cpu().cross_entropy_backward(glc, lpc, tc, ignore, ls, gc);
        gpu().cross_entropy_backward(glc.to(Device::cuda()), lpc.to(Device::cuda()),
                                     tc.to(Device::cuda()), ignore, ls, gg);
        expect_close(gg, gc, 2 * eps_of(dt) + tol, tol, where + " grad_logits");
      }
    }
  }
}

// The CPU raises an error for a target outside [0, classes); the GPU cannot without the host
// waiting for it, so that sample's loss and gradient row are NaN, the rest unaffected.
TEST(CudaCrossEntropy, OutOfRangeTargetsGiveNan) {
  MT_REQUIRE_CUDA();
  const Tensor logits = random({3, 4}, DType::F32, 31).to(Device::cuda());
  const Tensor target =
      Tensor::from_vector(std::vector<int64_t>{1, 4, -100}, {3}).to(Device::cuda());
  Tensor loss = nan_filled({3}, DType::F32), lp = nan_filled({3, 4}, DType::F32);
  gpu().cross_entropy(logits, target, -100, 0.0, loss, lp);
  const std::vector<double> l = host(loss);
  EXPECT_TRUE(std::isfinite(l[0]));
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_EQ(l[2], 0.0);
  Tensor g = nan_filled({3, 4}, DType::F32);
  gpu().cross_entropy_backward(Tensor::ones({3}).to(Device::cuda()), lp, target, -100, 0.0, g);
  const std::vector<double> gv = host(g);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(gv[size_t(i)]));
    EXPECT_TRUE(std::isnan(gv[size_t(4 + i)]));
    EXPECT_EQ(gv[size_t(8 + i)], 0.0);
  }
}

// ---- layer norm --------------------------------------------------------------------------------

TEST(CudaLayerNorm, ForwardAndBackwardMatchTheCpu) {
  MT_REQUIRE_CUDA();
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},    {7, 7},    {3, 1000},
                                                {2, 3001}, {1000, 5}, {513, 64}};
  uint64_t seed = 900;
  for (DType dt : kFloats) {
    const DType sdt = dt == DType::F64 ? DType::F64 : DType::F32;
    for (auto [m, n] : shapes) {
      for (int affine = 0; affine < 3; ++affine) {  // none, weight and bias, weight only
        const Tensor xb = random({n, m}, dt, seed++, -2, 5);
        const Tensor xc = xb.t();  // strided
        const Tensor xg = xb.to(Device::cuda()).t();
        const Tensor wc = affine ? random({n}, dt, seed++, 0.5, 1.5) : Tensor();
        const Tensor bc = affine == 1 ? random({n}, dt, seed++) : Tensor();
        const Tensor wg = wc.defined() ? wc.to(Device::cuda()) : Tensor();
        const Tensor bg = bc.defined() ? bc.to(Device::cuda()) : Tensor();
        const std::string where = name(dt) + " " + std::to_string(m) + "x" + std::to_string(n) +
                                  " affine " + std::to_string(affine);
        Tensor oc = Tensor::empty({m, n}, dt), og = nan_filled({m, n}, dt);
        Tensor mc = Tensor::empty({m}, sdt), rc = Tensor::empty({m}, sdt);
        Tensor mg = nan_filled({m}, sdt), rg = nan_filled({m}, sdt);
        cpu().layer_norm(xc, wc.defined() ? &wc : nullptr, bc.defined() ? &bc : nullptr, 1e-5, oc,
                         mc, rc);
        gpu().layer_norm(xg, wg.defined() ? &wg : nullptr, bg.defined() ? &bg : nullptr, 1e-5, og,
                         mg, rg);
        const double tol = atol_for(dt, 2e-5);
        expect_close(og, oc, 2 * eps_of(dt) + tol, tol, where + " out");
        expect_close(mg, mc, tol, tol, where + " mean");
        expect_close(rg, rc, tol, tol, where + " rstd");

        const Tensor gc = random({m, n}, dt, seed++);
        const Tensor ggd = gc.to(Device::cuda());
        Tensor dxc = Tensor::empty({m, n}, dt), dxg = nan_filled({m, n}, dt);
        Tensor dwc = Tensor::empty({n}, dt), dwg = nan_filled({n}, dt);
        Tensor dbc = Tensor::empty({n}, dt), dbg = nan_filled({n}, dt);
        cpu().layer_norm_backward(gc, xc, wc.defined() ? &wc : nullptr, mc, rc, &dxc, &dwc, &dbc);
        gpu().layer_norm_backward(ggd, xg, wg.defined() ? &wg : nullptr, mc.to(Device::cuda()),
                                  rc.to(Device::cuda()), &dxg, &dwg, &dbg);
        expect_close(dxg, dxc, 2 * eps_of(dt) + tol, tol * 5, where + " grad_x");
        expect_close(dwg, dwc, 2 * eps_of(dt) + tol, tol * 3 * double(m), where + " grad_weight");
        expect_close(dbg, dbc, 2 * eps_of(dt) + tol, tol * 3 * double(m), where + " grad_bias");
        // Only the parameter gradients.
        Tensor dwg2 = nan_filled({n}, dt);
        gpu().layer_norm_backward(ggd, xg, wg.defined() ? &wg : nullptr, mc.to(Device::cuda()),
                                  rc.to(Device::cuda()), nullptr, &dwg2, nullptr);
        expect_close(dwg2, dwc, 2 * eps_of(dt) + tol, tol * 3 * double(m),
                     where + " grad_weight alone");
      }
    }
  }
}

// ---- batch norm --------------------------------------------------------------------------------

TEST(CudaBatchNorm, TrainingAndEvalMatchTheCpu) {
  MT_REQUIRE_CUDA();
  const Shape shapes[] = {{2, 1}, {7, 3}, {1000, 5}, {4, 3, 7, 9}, {2, 2, 1031}, {3, 70, 2, 2}};
  uint64_t seed = 1300;
  for (DType dt : kFloats) {
    const DType sdt = dt == DType::F64 ? DType::F64 : DType::F32;
    for (const Shape& s : shapes) {
      const int64_t ch = s[1];
      for (bool training : {true, false}) {
        for (int affine = 0; affine < 2; ++affine) {
          const Tensor xc = random(s, dt, seed++, -2, 6);
          const Tensor xg = xc.to(Device::cuda());
          const Tensor wc = affine ? random({ch}, dt, seed++, 0.5, 1.5) : Tensor();
          const Tensor bc = affine ? random({ch}, dt, seed++) : Tensor();
          const Tensor wg = affine ? wc.to(Device::cuda()) : Tensor();
          const Tensor bg = affine ? bc.to(Device::cuda()) : Tensor();
          // Running stats in f32 (the usual case) for f32/half inputs, f64 for f64.
          Tensor rmc = random({ch}, sdt, seed++, -1, 1), rvc = random({ch}, sdt, seed++, 0.5, 2);
          Tensor rmg = rmc.to(Device::cuda()), rvg = rvc.to(Device::cuda());
          const std::string where = name(dt) + " " + s.str() + (training ? " train" : " eval") +
                                    " affine " + std::to_string(affine);
          Tensor oc = Tensor::empty(s, dt), og = nan_filled(s, dt);
          Tensor smc = Tensor::empty({ch}, sdt), src = Tensor::empty({ch}, sdt);
          Tensor smg = nan_filled({ch}, sdt), srg = nan_filled({ch}, sdt);
          cpu().batch_norm(xc, affine ? &wc : nullptr, affine ? &bc : nullptr, &rmc, &rvc, training,
                           0.1, 1e-5, oc, smc, src);
          gpu().batch_norm(xg, affine ? &wg : nullptr, affine ? &bg : nullptr, &rmg, &rvg, training,
                           0.1, 1e-5, og, smg, srg);
          const double tol = atol_for(dt, 2e-5);
          expect_close(og, oc, 2 * eps_of(dt) + tol, tol, where + " out");
          expect_close(smg, smc, tol, tol, where + " save_mean");
          expect_close(srg, src, tol, tol, where + " save_rstd");
          expect_close(rmg, rmc, tol, tol, where + " running_mean");
          expect_close(rvg, rvc, tol, tol, where + " running_var");

          const Tensor gc = random(s, dt, seed++);
          Tensor dxc = Tensor::empty(s, dt), dxg = nan_filled(s, dt);
          Tensor dwc = Tensor::empty({ch}, dt), dwg = nan_filled({ch}, dt);
          Tensor dbc = Tensor::empty({ch}, dt), dbg = nan_filled({ch}, dt);
          cpu().batch_norm_backward(gc, xc, affine ? &wc : nullptr, smc, src, training, &dxc, &dwc,
                                    &dbc);
          gpu().batch_norm_backward(gc.to(Device::cuda()), xg, affine ? &wg : nullptr,
                                    smc.to(Device::cuda()), src.to(Device::cuda()), training, &dxg,
                                    &dwg, &dbg);
          const double count = double(s.numel() / ch);
          expect_close(dxg, dxc, 2 * eps_of(dt) + tol, tol * 5, where + " grad_x");
          expect_close(dwg, dwc, 2 * eps_of(dt) + tol, tol * 10 * count, where + " grad_weight");
          expect_close(dbg, dbc, 2 * eps_of(dt) + tol, tol * 3 * count, where + " grad_bias");
        }
      }
    }
  }
}

// Running statistics of another dtype (bf16) and no running statistics at all.
TEST(CudaBatchNorm, RunningStatsOfAnyDtypeOrNone) {
  MT_REQUIRE_CUDA();
  const Tensor xc = random({16, 4, 5}, DType::F32, 77);
  const Tensor xg = xc.to(Device::cuda());
  Tensor rmc = Tensor::zeros({4}, DType::BF16), rvc = Tensor::ones({4}, DType::BF16);
  Tensor rmg = rmc.to(Device::cuda()), rvg = rvc.to(Device::cuda());
  Tensor oc = Tensor::empty({16, 4, 5}), og = nan_filled({16, 4, 5}, DType::F32);
  Tensor smc = Tensor::empty({4}), src = Tensor::empty({4});
  Tensor smg = nan_filled({4}, DType::F32), srg = nan_filled({4}, DType::F32);
  cpu().batch_norm(xc, nullptr, nullptr, &rmc, &rvc, true, 0.3, 1e-5, oc, smc, src);
  gpu().batch_norm(xg, nullptr, nullptr, &rmg, &rvg, true, 0.3, 1e-5, og, smg, srg);
  // One bf16 rounding of nearly equal f64 values: at most one ulp apart.
  expect_close(rmg, rmc, 0x1p-7, 1e-6, "bf16 running_mean");
  expect_close(rvg, rvc, 0x1p-7, 1e-6, "bf16 running_var");
  expect_close(og, oc, 1e-5, 1e-5, "out");
  Tensor og2 = nan_filled({16, 4, 5}, DType::F32);
  gpu().batch_norm(xg, nullptr, nullptr, nullptr, nullptr, true, 0.1, 1e-5, og2, smg, srg);
  expect_close(og2, oc, 1e-5, 1e-5, "out without running stats");
}

}  // namespace
}  // namespace mantissa
