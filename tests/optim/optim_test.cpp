// The optim module: SGD and AdamW trajectories against an independent float64 reference (plain
// loops of PyTorch's formulas), half parameters with fp32 state, checkpoint resume, thread-count
// independence, the one-kernel-per-step property, zero_grad, clipping and LR schedules.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "harness/op_harness.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/error.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/numerics/types.h"
#include "mantissa/optim/clip.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/optim/schedule.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::optim {
namespace {

using Vec = std::vector<double>;

// ---- the float64 reference ---------------------------------------------------------------------

using testing::store_as;

// torch.optim.SGD, written from its documentation.
struct RefSGD {
  explicit RefSGD(const SGDOptions& options) : o(options) {}
  SGDOptions o;
  std::vector<Vec> buf;

  void step(std::vector<Vec>& p, const std::vector<std::optional<Vec>>& g,
            const std::vector<DType>& dt) {
    buf.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      if (!g[i]) continue;
      Vec d = *g[i];
      for (size_t j = 0; j < d.size(); ++j) {
        if (o.weight_decay != 0) d[j] += o.weight_decay * p[i][j];
      }
      if (o.momentum != 0) {
        if (buf[i].empty()) {
          buf[i] = d;
        } else {
          for (size_t j = 0; j < d.size(); ++j)
            buf[i][j] = o.momentum * buf[i][j] + (1 - o.dampening) * d[j];
        }
        for (size_t j = 0; j < d.size(); ++j)
          d[j] = o.nesterov ? d[j] + o.momentum * buf[i][j] : buf[i][j];
      }
      for (size_t j = 0; j < d.size(); ++j)
        p[i][j] = store_as(dt[i], p[i][j] - o.lr * d[j]);
    }
  }
};

// torch.optim.AdamW, written from its documentation (per-parameter step counts).
struct RefAdamW {
  explicit RefAdamW(const AdamWOptions& options) : o(options) {}
  AdamWOptions o;
  std::vector<Vec> m, v;
  std::vector<int64_t> t;

  void step(std::vector<Vec>& p, const std::vector<std::optional<Vec>>& g,
            const std::vector<DType>& dt) {
    m.resize(p.size());
    v.resize(p.size());
    t.resize(p.size(), 0);
    for (size_t i = 0; i < p.size(); ++i) {
      if (!g[i]) continue;
      const Vec& gi = *g[i];
      if (m[i].empty()) {
        m[i].assign(gi.size(), 0.0);
        v[i].assign(gi.size(), 0.0);
      }
      const int64_t s = ++t[i];
      const double bc1 = 1 - std::pow(o.beta1, double(s));
      const double bc2 = 1 - std::pow(o.beta2, double(s));
      for (size_t j = 0; j < gi.size(); ++j) {
        double x = p[i][j] * (1 - o.lr * o.weight_decay);
        m[i][j] = o.beta1 * m[i][j] + (1 - o.beta1) * gi[j];
        v[i][j] = o.beta2 * v[i][j] + (1 - o.beta2) * gi[j] * gi[j];
        const double denom = std::sqrt(v[i][j] / bc2) + o.eps;
        x -= o.lr / bc1 * m[i][j] / denom;
        p[i][j] = store_as(dt[i], x);
      }
    }
  }
};

// ---- a driver: the same parameters and gradients for the optimizer and the reference ---------

struct Case {
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  bool skip_some = false;  // some parameters have no gradient at some steps
};

std::vector<Tensor> make_params(const Case& s, uint64_t seed = 7) {
  std::vector<Tensor> ps;
  for (size_t i = 0; i < s.shapes.size(); ++i) {
    Tensor p = Tensor::uniform(s.shapes[i], -1.0, 1.0, seed + i, s.dtypes[i]);
    p.set_requires_grad();
    ps.push_back(p);
  }
  return ps;
}

bool has_grad(const Case& s, size_t i, int step) {
  return !s.skip_some || (i + size_t(step)) % 3 != 0;
}

// Sets the gradients of `step` (seeded by step and index, in the parameter's dtype).
void set_grads(const Case& s, const std::vector<Tensor>& ps, int step, double scale = 1.0) {
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!has_grad(s, i, step)) {
      ps[i].set_grad(Tensor());
      continue;
    }
    Tensor g = Tensor::normal(ps[i].shape(), 0.0, scale, 1000 * uint64_t(step) + i, DType::F64);
    ps[i].set_grad(g.to(ps[i].dtype()));
  }
}

std::vector<Vec> values(const std::vector<Tensor>& ps) {
  std::vector<Vec> out;
  for (const Tensor& p : ps)
    out.push_back(p.to_vector<double>());
  return out;
}

std::vector<std::optional<Vec>> grad_values(const std::vector<Tensor>& ps) {
  std::vector<std::optional<Vec>> out;
  for (const Tensor& p : ps) {
    if (p.grad().defined()) {
      out.emplace_back(p.grad().to_vector<double>());
    } else {
      out.emplace_back(std::nullopt);
    }
  }
  return out;
}

// |a - ref| <= atol + rtol * |ref| everywhere; reports the worst element.
void expect_close(const std::vector<Vec>& a, const std::vector<Vec>& ref, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), ref.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), ref[i].size());
    double worst = 0;
    size_t at = 0;
    for (size_t j = 0; j < a[i].size(); ++j) {
      const double excess = std::abs(a[i][j] - ref[i][j]) - (atol + rtol * std::abs(ref[i][j]));
      if (!(excess <= worst)) {
        worst = std::isnan(excess) ? INFINITY : excess;
        at = j;
      }
    }
    EXPECT_LE(worst, 0.0) << what << ": tensor " << i << " element " << at << " is " << a[i][at]
                          << ", reference " << ref[i][at];
  }
}

template <typename Opt, typename Ref, typename Options>
void run_against_reference(const Case& s, const Options& options, int steps, double rtol,
                           double atol, const std::string& what) {
  std::vector<Tensor> ps = make_params(s);
  Opt opt(ps, options);
  Ref ref(options);
  std::vector<Vec> rp = values(ps);
  for (int k = 0; k < steps; ++k) {
    set_grads(s, ps, k);
    ref.step(rp, grad_values(ps), s.dtypes);
    opt.step();
    expect_close(values(ps), rp, rtol, atol, what + " after step " + std::to_string(k + 1));
  }
  EXPECT_EQ(opt.step_count(), steps);
}

const Case kF32{{{4, 5}, {7}, {3, 2, 2}, {1}}, {DType::F32, DType::F32, DType::F32, DType::F32}};
const Case kF64{{{4, 5}, {7}}, {DType::F64, DType::F64}};

// ---- SGD ---------------------------------------------------------------------------------------

TEST(SGD, PlainMatchesReference) {
  run_against_reference<SGD, RefSGD>(kF32, SGDOptions{.lr = 0.1}, 6, 1e-6, 1e-7, "sgd");
}

TEST(SGD, MomentumMatchesReference) {
  run_against_reference<SGD, RefSGD>(kF32,
                                     SGDOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.1}, 6,
                                     1e-5, 1e-6, "sgd momentum");
}

TEST(SGD, NesterovMatchesReference) {
  run_against_reference<SGD, RefSGD>(kF32,
                                     SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}, 6,
                                     1e-5, 1e-6, "sgd nesterov");
}

TEST(SGD, WeightDecayMatchesReference) {
  run_against_reference<SGD, RefSGD>(kF32,
                                     SGDOptions{.lr = 0.05, .momentum = 0.5, .weight_decay = 0.1},
                                     6, 1e-5, 1e-6, "sgd weight decay");
  run_against_reference<SGD, RefSGD>(kF32, SGDOptions{.lr = 0.05, .weight_decay = 0.3}, 6, 1e-5,
                                     1e-6, "sgd weight decay without momentum");
}

TEST(SGD, ParametersWithoutGradientAreSkippedAndStartTheirMomentumLater) {
  Case s = kF32;
  s.skip_some = true;
  run_against_reference<SGD, RefSGD>(s, SGDOptions{.lr = 0.05, .momentum = 0.9}, 7, 1e-5, 1e-6,
                                     "sgd skipping");
}

TEST(SGD, Float64ComputesInDouble) {
  run_against_reference<SGD, RefSGD>(
      kF64, SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true}, 6, 1e-14, 1e-15, "sgd f64");
}

TEST(SGD, RejectsBadOptions) {
  std::vector<Tensor> ps = make_params(kF32);
  EXPECT_THROW(SGD(ps, {.lr = -1}), Error);
  EXPECT_THROW(SGD(ps, {.momentum = -0.5}), Error);
  EXPECT_THROW(SGD(ps, {.weight_decay = -1}), Error);
  EXPECT_THROW(SGD(ps, {.nesterov = true}), Error);  // needs momentum
  EXPECT_THROW(SGD(ps, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(SGD(std::vector<Tensor>{}, {}), Error);
  EXPECT_THROW(SGD({ps[0], ps[1], ps[0]}, {}), Error);  // a parameter twice
  EXPECT_THROW(SGD({Tensor::arange(4)}, {}), Error);    // integer
}

// ---- AdamW -------------------------------------------------------------------------------------

TEST(AdamW, MatchesReference) {
  run_against_reference<AdamW, RefAdamW>(kF32, AdamWOptions{.lr = 0.01}, 8, 1e-5, 1e-6, "adamw");
}

TEST(AdamW, MatchesReferenceWithOtherHyperparameters) {
  run_against_reference<AdamW, RefAdamW>(
      kF32, AdamWOptions{.lr = 0.05, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-3, .weight_decay = 0.2},
      8, 1e-5, 1e-6, "adamw hyper");
  // beta1 >= 0.5 switches torch.lerp to its other formula.
  run_against_reference<AdamW, RefAdamW>(kF32, AdamWOptions{.lr = 0.02, .beta1 = 0.3}, 8, 1e-5,
                                         1e-6, "adamw small beta1");
}

TEST(AdamW, PerParameterStepCountsWhenGradientsAreMissing) {
  Case s = kF32;
  s.skip_some = true;
  run_against_reference<AdamW, RefAdamW>(s, AdamWOptions{.lr = 0.01}, 7, 1e-5, 1e-6,
                                         "adamw skipping");
}

TEST(AdamW, Float64ComputesInDouble) {
  run_against_reference<AdamW, RefAdamW>(kF64, AdamWOptions{.lr = 0.01}, 6, 1e-13, 1e-15,
                                         "adamw f64");
}

TEST(AdamW, RejectsBadOptions) {
  std::vector<Tensor> ps = make_params(kF32);
  EXPECT_THROW(AdamW(ps, {.beta1 = 1.0}), Error);
  EXPECT_THROW(AdamW(ps, {.beta2 = -0.1}), Error);
  EXPECT_THROW(AdamW(ps, {.eps = -1}), Error);
  EXPECT_THROW(AdamW(ps, {.weight_decay = NAN}), Error);
  AdamW opt(ps);
  EXPECT_THROW(opt.set_lr(-1e-3), Error);
  EXPECT_THROW(opt.set_lr(INFINITY), Error);
  opt.set_lr(0.5);
  EXPECT_EQ(opt.lr(), 0.5);
  EXPECT_EQ(opt.options().lr, 0.5);
}

// ---- half parameters: fp32 state, one rounding per step -------------------------------------

TEST(HalfParams, Bf16AndF16WithFp32StateMatchTheReference) {
  const Case bf16{{{16, 9}, {33}}, {DType::BF16, DType::BF16}};
  const Case f16{{{16, 9}, {33}}, {DType::F16, DType::F16}};
  // Two bf16/f16 ulps: the fp32 kernel and the f64 reference may round a near-tie differently.
  run_against_reference<AdamW, RefAdamW>(bf16, AdamWOptions{.lr = 0.02}, 8, 0x1p-7, 1e-6,
                                         "adamw bf16");
  run_against_reference<SGD, RefSGD>(bf16, SGDOptions{.lr = 0.05, .momentum = 0.9}, 8, 0x1p-7, 1e-6,
                                     "sgd bf16");
  run_against_reference<AdamW, RefAdamW>(f16, AdamWOptions{.lr = 0.02}, 8, 0x1p-9, 1e-6,
                                         "adamw f16");
}

TEST(HalfParams, StateIsFp32AndAsAccurateAsFp32) {
  const Case s{{{40}, {3, 5}}, {DType::BF16, DType::F16}};
  std::vector<Tensor> ps = make_params(s);
  AdamW opt(ps, {.lr = 0.01});
  RefAdamW ref(opt.options());
  std::vector<Vec> rp = values(ps);
  for (int k = 0; k < 5; ++k) {
    set_grads(s, ps, k);
    ref.step(rp, grad_values(ps), s.dtypes);
    opt.step();
  }
  std::vector<Vec> m, v;
  for (const auto& [key, t] : opt.state_dict()) {
    if (key.ends_with(".exp_avg")) {
      EXPECT_EQ(t.dtype(), DType::F32) << key;
      m.push_back(t.to_vector<double>());
    } else if (key.ends_with(".exp_avg_sq")) {
      EXPECT_EQ(t.dtype(), DType::F32) << key;
      v.push_back(t.to_vector<double>());
    }
  }
  // fp32 accuracy (a bf16 state would be off by ~2^-9).
  expect_close(m, ref.m, 1e-6, 1e-7, "exp_avg");
  expect_close(v, ref.v, 1e-6, 1e-12, "exp_avg_sq");
}

TEST(HalfParams, SubUlpUpdatesRoundAwayButTheFp32StateKeepsThem) {
  // bf16 1.0 has neighbours 1 - 2^-8 and 1 + 2^-7: a step of 1e-3 rounds back to 1 every time.
  // The fp32 state still carries the momentum, so SGD keeps producing the same tiny step.
  Tensor p = Tensor::full({8}, 1.0, DType::BF16);
  SGD opt({p}, {.lr = 1e-3, .momentum = 0.5});
  for (int k = 0; k < 4; ++k) {
    p.set_grad(Tensor::full({8}, 1.0, DType::BF16));
    opt.step();
  }
  for (double x : p.to_vector<double>())
    EXPECT_EQ(x, 1.0);
  const NamedTensors sd = opt.state_dict();
  EXPECT_EQ(sd[3].first, "state.0.momentum_buffer");
  EXPECT_EQ(sd[3].second.dtype(), DType::F32);
  EXPECT_FLOAT_EQ(float(sd[3].second.to_vector<double>()[0]), 1.875f);  // 1 + .5 + .25 + .125
}

TEST(HalfParams, MixedDtypesInOneOptimizer) {
  const Case s{{{6, 7}, {13}, {5}, {2, 3}}, {DType::F32, DType::BF16, DType::F64, DType::F16}};
  std::vector<Tensor> ps = make_params(s);
  AdamW opt(ps, {.lr = 0.02});
  RefAdamW ref(opt.options());
  std::vector<Vec> rp = values(ps);
  for (int k = 0; k < 5; ++k) {
    set_grads(s, ps, k);
    ref.step(rp, grad_values(ps), s.dtypes);
    opt.step();
  }
  const std::vector<Vec> got = values(ps);
  expect_close({got[0]}, {rp[0]}, 1e-5, 1e-6, "f32 part");
  expect_close({got[1]}, {rp[1]}, 0x1p-7, 1e-6, "bf16 part");
  expect_close({got[2]}, {rp[2]}, 1e-13, 1e-15, "f64 part");
  expect_close({got[3]}, {rp[3]}, 0x1p-9, 1e-6, "f16 part");
}

TEST(HalfParams, Fp32GradientsForBf16ParametersAreAccepted) {
  Tensor p = Tensor::full({5}, 0.5, DType::BF16);
  SGD opt({p}, {.lr = 0.25});
  p.set_grad(Tensor::full({5}, 1.0, DType::F32));
  opt.step();
  for (double x : p.to_vector<double>())
    EXPECT_EQ(x, 0.25);
}

// ---- the fused property ------------------------------------------------------------------------

TEST(Fused, OneBackendCallPerStepForAllParameters) {
  const Case s{{{64, 32}, {32}, {0}, {10, 3, 3, 3}, {10}, {100}},
               {DType::F32, DType::F32, DType::F32, DType::BF16, DType::F16, DType::F64}};
  for (int which = 0; which < 2; ++which) {
    std::vector<Tensor> ps = make_params(s);
    std::unique_ptr<Optimizer> opt;
    if (which == 0) {
      opt = std::make_unique<AdamW>(ps);
    } else {
      opt = std::make_unique<SGD>(ps, SGDOptions{.momentum = 0.9, .weight_decay = 1e-4});
    }
    set_grads(s, ps, 0);
    for (int k = 0; k < 4; ++k) {
      std::vector<uint32_t> versions;
      for (const Tensor& p : ps)
        versions.push_back(p.version());
      const int64_t calls = backend::cpu::multi_tensor_calls();
      const int64_t allocations = memory_stats().total_allocations;
      opt->step();
      // One multi-tensor kernel for six parameters of four dtypes...
      EXPECT_EQ(backend::cpu::multi_tensor_calls() - calls, 1) << "optimizer " << which;
      // ...no temporaries once the state exists (no per-tensor op ran)...
      if (k > 0) {
        EXPECT_EQ(memory_stats().total_allocations - allocations, 0);
      }
      // ...and each parameter written once.
      for (size_t i = 0; i < ps.size(); ++i)
        EXPECT_EQ(ps[i].version(), versions[i] + 1) << "parameter " << i;
    }
  }
}

TEST(Fused, SameResultAsOneOptimizerPerParameter) {
  const Case s{{{50, 40}, {7}, {300}}, {DType::F32, DType::BF16, DType::F16}};
  std::vector<Tensor> fused = make_params(s), single = make_params(s);
  AdamW all(fused, {.lr = 0.01});
  std::vector<std::unique_ptr<AdamW>> each;
  for (const Tensor& p : single)
    each.push_back(std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 0.01}));
  for (int k = 0; k < 4; ++k) {
    set_grads(s, fused, k);
    set_grads(s, single, k);
    all.step();
    for (auto& o : each)
      o->step();
  }
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_EQ(fused[i].to_vector<double>(), single[i].to_vector<double>()) << "parameter " << i;
  }
}

TEST(Fused, StepWithoutGradientsCallsNothingButCounts) {
  std::vector<Tensor> ps = make_params(kF32);
  const std::vector<Vec> before = values(ps);
  AdamW opt(ps);
  const int64_t calls = backend::cpu::multi_tensor_calls();
  opt.step();
  EXPECT_EQ(backend::cpu::multi_tensor_calls(), calls);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_EQ(values(ps), before);
  EXPECT_EQ(opt.state_dict().size(), 2u);  // step and lr only
}

// ---- thread-count independence -----------------------------------------------------------------

std::vector<std::vector<uint8_t>> bytes_of(const std::vector<Tensor>& ts) {
  std::vector<std::vector<uint8_t>> out;
  for (const Tensor& t : ts) {
    std::vector<uint8_t> b(t.nbytes());
    t.copy_to_host(b.data(), b.size());
    out.push_back(std::move(b));
  }
  return out;
}

TEST(Threads, ResultsDoNotDependOnTheThreadCount) {
  // Above the parallel threshold (32K elements), with tensors of several dtypes and sizes.
  const Case s{{{300, 200}, {40000}, {1000}, {5000}},
               {DType::BF16, DType::F32, DType::F64, DType::F16}};
  const int saved = get_num_threads();
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<Tensor> ps = make_params(s), qs = make_params(s);
    AdamW adamw(ps, {.lr = 0.01});
    SGD sgd(qs, {.lr = 0.01, .momentum = 0.9, .nesterov = true});
    std::vector<double> norms;
    for (int k = 0; k < 3; ++k) {
      set_grads(s, ps, k, 3.0);
      set_grads(s, qs, k, 3.0);
      norms.push_back(clip_grad_norm(ps, 100.0).item());
      norms.push_back(grad_norm(qs, INFINITY).item());
      norms.push_back(grad_norm(qs, 1.0).item());
      adamw.step();
      sgd.step();
    }
    auto b = bytes_of(ps);
    for (auto& x : bytes_of(qs))
      b.push_back(std::move(x));
    return std::make_pair(b, norms);
  };
  const auto one = run(1);
  const auto two = run(2);
  set_num_threads(saved);
  EXPECT_TRUE(one.first == two.first);
  for (size_t i = 0; i < one.second.size(); ++i)
    EXPECT_EQ(std::memcmp(&one.second[i], &two.second[i], sizeof(double)), 0) << "norm " << i;
}

// ---- zero_grad ---------------------------------------------------------------------------------

TEST(ZeroGrad, SetToNoneDropsTheGradients) {
  std::vector<Tensor> ps = make_params(kF32);
  SGD opt(ps);
  set_grads(kF32, ps, 0);
  const int64_t live = memory_stats().live_allocations;
  opt.zero_grad();
  for (const Tensor& p : ps)
    EXPECT_FALSE(p.grad().defined());
  EXPECT_EQ(memory_stats().live_allocations, live - int64_t(ps.size()));  // memory freed
  opt.zero_grad();                                                        // nothing to do
  const std::vector<Vec> before = values(ps);
  opt.step();  // no gradients: no update
  EXPECT_EQ(values(ps), before);
}

TEST(ZeroGrad, InPlaceKeepsTheTensorsAndZeroesThem) {
  std::vector<Tensor> ps = make_params(kF32);
  SGD opt(ps);
  set_grads(kF32, ps, 0);
  std::vector<Tensor> grads;
  for (const Tensor& p : ps)
    grads.push_back(p.grad());
  ps[1].set_grad(Tensor());
  opt.zero_grad(/*set_to_none=*/false);
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i == 1) {
      EXPECT_FALSE(ps[i].grad().defined());
      continue;
    }
    ASSERT_TRUE(ps[i].grad().defined());
    EXPECT_TRUE(ps[i].grad().shares_storage(grads[i]));
    for (double x : ps[i].grad().to_vector<double>())
      EXPECT_EQ(x, 0.0);
  }
}

TEST(ZeroGrad, WorksWithBackward) {
  Tensor w = Tensor::from_vector(std::vector<double>{1, 2, 3}, {3}).set_requires_grad();
  SGD opt({w}, {.lr = 0.5});
  for (int k = 0; k < 2; ++k) {
    opt.zero_grad();
    sum(mul(w, w)).backward();  // grad = 2w
    opt.step();                 // w -= 0.5 * 2w = 0
  }
  for (double x : w.to_vector<double>())
    EXPECT_EQ(x, 0.0);
}

// ---- state dicts -------------------------------------------------------------------------------

template <typename Opt, typename Options>
void expect_resume_bit_identical(const Case& s, const Options& options) {
  // Six steps straight...
  std::vector<Tensor> straight = make_params(s);
  Opt a(straight, options);
  for (int k = 0; k < 6; ++k) {
    set_grads(s, straight, k);
    a.step();
  }
  // ...against three, a checkpoint through a safetensors file, a fresh optimizer, three more.
  std::vector<Tensor> first = make_params(s);
  Opt b(first, options);
  for (int k = 0; k < 3; ++k) {
    set_grads(s, first, k);
    b.step();
  }
  const std::string path =
      (std::filesystem::temp_directory_path() /
       ("mantissa_optim_" + std::to_string(::getpid()) + "_" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".safetensors"))
          .string();
  NamedTensors sd = b.state_dict();
  for (size_t i = 0; i < first.size(); ++i)
    sd.emplace_back("param." + std::to_string(i), first[i]);
  save_safetensors(path, sd);
  const SafetensorsFile file = load_safetensors(path);
  std::filesystem::remove(path);

  std::vector<Tensor> resumed;
  NamedTensors opt_state;
  for (const auto& [key, t] : file.tensors) {
    if (key.starts_with("param.")) {
      resumed.push_back(t.clone().set_requires_grad());
    } else {
      opt_state.emplace_back(key, t);
    }
  }
  Opt c(resumed, options);
  c.load_state_dict(opt_state);
  EXPECT_EQ(c.step_count(), 3);
  EXPECT_EQ(c.lr(), b.lr());
  for (int k = 3; k < 6; ++k) {
    set_grads(s, resumed, k);
    c.step();
  }
  EXPECT_EQ(c.step_count(), 6);
  EXPECT_TRUE(bytes_of(resumed) == bytes_of(straight));
  const NamedTensors sa = a.state_dict(), sc = c.state_dict();
  ASSERT_EQ(sa.size(), sc.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sc[i].first);
    EXPECT_TRUE(bytes_of({sa[i].second}) == bytes_of({sc[i].second})) << sa[i].first;
  }
}

const Case kResume{{{8, 6}, {6}, {20}, {3}},
                   {DType::F32, DType::F32, DType::BF16, DType::F64},
                   /*skip_some=*/true};

TEST(NamedTensors, AdamWResumesBitIdentically) {
  expect_resume_bit_identical<AdamW>(kResume, AdamWOptions{.lr = 0.01});
}

TEST(NamedTensors, SGDResumesBitIdentically) {
  expect_resume_bit_identical<SGD>(kResume,
                                   SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
}

TEST(NamedTensors, NamesAndContents) {
  std::vector<Tensor> ps = make_params(kF32);
  AdamW opt(ps, {.lr = 0.01});
  set_grads(kF32, ps, 0);
  ps[2].set_grad(Tensor());
  opt.step();
  opt.set_lr(0.004);
  NamedTensors sd = opt.state_dict();
  std::vector<std::string> names;
  for (const auto& [key, t] : sd)
    names.push_back(key);
  const std::vector<std::string> want = {"step",
                                         "lr",
                                         "state.0.step",
                                         "state.0.exp_avg",
                                         "state.0.exp_avg_sq",
                                         "state.1.step",
                                         "state.1.exp_avg",
                                         "state.1.exp_avg_sq",
                                         "state.3.step",
                                         "state.3.exp_avg",
                                         "state.3.exp_avg_sq"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(sd[0].second.dtype(), DType::I64);
  EXPECT_EQ(sd[0].second.dim(), 0);
  EXPECT_EQ(sd[0].second.item(), 1.0);
  EXPECT_EQ(sd[1].second.dtype(), DType::F64);
  EXPECT_EQ(sd[1].second.item(), 0.004);
  EXPECT_EQ(sd[2].second.dtype(), DType::I64);
  EXPECT_EQ(sd[3].second.shape(), ps[0].shape());
  // Copies: changing them does not touch the optimizer.
  sd[3].second.fill_(42.0);
  EXPECT_NE(opt.state_dict()[3].second.to_vector<double>()[0], 42.0);
}

// The message of the error `f` throws ("" if none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

TEST(NamedTensors, LoadIsStrictAndNamesTheKey) {
  std::vector<Tensor> ps = make_params(kF32);
  AdamW opt(ps, {.lr = 0.01});
  set_grads(kF32, ps, 0);
  opt.step();
  const NamedTensors good = opt.state_dict();
  auto with = [&](const std::string& key, const Tensor& t) {
    NamedTensors d = good;
    for (auto& [k, v] : d) {
      if (k == key) {
        v = t;
        return d;
      }
    }
    d.emplace_back(key, t);
    return d;
  };
  auto without = [&](const std::string& key) {
    NamedTensors d;
    for (const auto& kv : good) {
      if (kv.first != key) d.push_back(kv);
    }
    return d;
  };
  auto fails_naming = [&](const NamedTensors& d, const std::string& needle) {
    AdamW fresh(make_params(kF32), {});
    const std::string msg = error_of([&] { fresh.load_state_dict(d); });
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: '" << msg << "'";
    EXPECT_EQ(fresh.step_count(), 0);  // nothing changed
    EXPECT_EQ(fresh.state_dict().size(), 2u);
  };
  fails_naming(with("momentum", Tensor::zeros({1})), "'momentum'");
  fails_naming(with("state.9.exp_avg", Tensor::zeros({1})), "'state.9.exp_avg'");
  fails_naming(with("state.0.momentum_buffer", Tensor::zeros({4, 5})), "'state.0.momentum_buffer'");
  fails_naming(with("state.x.exp_avg", Tensor::zeros({4, 5})), "'state.x.exp_avg'");
  fails_naming(with("state.0.exp_avg", Tensor::zeros({5, 4})), "'state.0.exp_avg'");
  fails_naming(with("state.0.exp_avg", Tensor::zeros({4, 5}, DType::BF16)), "'state.0.exp_avg'");
  fails_naming(with("step", Tensor::scalar(1.0)), "'step'");
  fails_naming(without("step"), "'step'");
  fails_naming(without("lr"), "'lr'");
  fails_naming(without("state.1.exp_avg_sq"), "'state.1.exp_avg_sq'");
  NamedTensors twice = good;
  twice.push_back(good[3]);
  fails_naming(twice, "'state.0.exp_avg'");

  AdamW fresh(make_params(kF32), {});
  fresh.load_state_dict(good);
  EXPECT_EQ(fresh.step_count(), 1);
  EXPECT_EQ(fresh.lr(), 0.01);
}

// ---- clipping ----------------------------------------------------------------------------------

TEST(Clip, NormValuesAndScaling) {
  Tensor a = Tensor::zeros({2}), b = Tensor::zeros({1}, DType::F64), c = Tensor::zeros({3});
  a.set_grad(Tensor::from_vector(std::vector<double>{3, -4}, {2}));
  b.set_grad(Tensor::from_vector(std::vector<double>{12}, {1}, DType::F64));
  const std::vector<Tensor> ps = {a, b, c};  // c has no gradient
  EXPECT_DOUBLE_EQ(grad_norm(ps).item(), 13.0);
  EXPECT_DOUBLE_EQ(grad_norm(ps, 1.0).item(), 19.0);
  EXPECT_DOUBLE_EQ(grad_norm(ps, INFINITY).item(), 12.0);
  EXPECT_NEAR(grad_norm(ps, 3.0).item(), std::cbrt(27.0 + 64.0 + 1728.0), 1e-5);
  // Below the threshold: untouched, bit for bit.
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 20.0).item(), 13.0);
  EXPECT_EQ(a.grad().to_vector<double>(), (Vec{3, -4}));
  // Above: scaled by max_norm / (norm + 1e-6), each gradient rounded once into its dtype.
  const uint32_t version = a.grad().version();
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 6.5).item(), 13.0);
  const double coef = 6.5 / (13.0 + 1e-6);
  EXPECT_EQ(a.grad().to_vector<double>(),
            (Vec{double(3.0f * float(coef)), double(-4.0f * float(coef))}));
  EXPECT_EQ(b.grad().to_vector<double>()[0], 12.0 * coef);
  EXPECT_GT(a.grad().version(), version);
  EXPECT_NEAR(grad_norm(ps).item(), 6.5, 1e-5);
  // The inf norm clips too.
  EXPECT_DOUBLE_EQ(clip_grad_norm(ps, 1.0, INFINITY).item(), 12.0 * coef);
  EXPECT_NEAR(grad_norm(ps, INFINITY).item(), 1.0, 1e-6);
}

TEST(Clip, LargeMixedDtypeGradientsAgainstFloat64) {
  const Case s{{{300, 100}, {20000}, {777}}, {DType::F32, DType::BF16, DType::F16}};
  std::vector<Tensor> ps = make_params(s);
  set_grads(s, ps, 3);
  double sq = 0, mx = 0, l1 = 0;
  for (const auto& g : grad_values(ps)) {
    for (double x : *g) {
      sq += x * x;
      l1 += std::abs(x);
      mx = std::max(mx, std::abs(x));
    }
  }
  EXPECT_NEAR(grad_norm(ps).item(), std::sqrt(sq), 1e-6 * std::sqrt(sq));
  EXPECT_NEAR(grad_norm(ps, 1.0).item(), l1, 1e-6 * l1);
  EXPECT_EQ(grad_norm(ps, INFINITY).item(), mx);
  const int64_t calls = backend::cpu::multi_tensor_calls();
  const double total = clip_grad_norm(ps, 1.0).item();
  EXPECT_EQ(backend::cpu::multi_tensor_calls() - calls, 2);  // one norm pass, one scale pass
  EXPECT_NEAR(total, std::sqrt(sq), 1e-6 * std::sqrt(sq));
  EXPECT_NEAR(grad_norm(ps).item(), 1.0, 4e-3);  // half gradients round after scaling
}

TEST(Clip, EdgeCases) {
  Tensor a = Tensor::zeros({3});
  EXPECT_EQ(grad_norm({a}).item(), 0.0);  // no gradients
  EXPECT_EQ(clip_grad_norm({a}, 1.0).item(), 0.0);
  a.set_grad(Tensor::from_vector(std::vector<double>{1, NAN, 2}, {3}));
  EXPECT_TRUE(std::isnan(grad_norm({a}).item()));
  EXPECT_TRUE(std::isnan(grad_norm({a}, INFINITY).item()));
  EXPECT_THROW(grad_norm({a}, 0.0).item(), Error);
  EXPECT_THROW(grad_norm({a}, -2.0).item(), Error);
  EXPECT_THROW(clip_grad_norm({a}, -1.0).item(), Error);
  // A non-finite norm scales as PyTorch does (NaN here): the loss scaler must catch it first.
  clip_grad_norm({a}, 1.0).item();
  EXPECT_TRUE(std::isnan(a.grad().to_vector<double>()[0]));
}

// A sharded run's clipping: each "rank" holds part of the gradients, the combiner adds the other
// part's partial norm, and the result is the norm of all of them, the clipping the same.
TEST(Clip, ACombinerMakesAPartialNormGlobal) {
  const Case s{{{300, 100}, {2000}, {777}, {5}}, {DType::F32, DType::BF16, DType::F32, DType::F16}};
  std::vector<Tensor> all = make_params(s);
  set_grads(s, all, 4);
  const std::vector<Tensor> mine = {all[0], all[2]}, theirs = {all[1], all[3]};
  for (const double p : {2.0, 1.0, double(INFINITY)}) {
    SCOPED_TRACE(p);
    int calls = 0;
    const NormCombiner add_theirs = [&](Tensor& partial, bool max) {
      ++calls;
      EXPECT_EQ(max, std::isinf(p));
      const double other = grad_norm(theirs, p).item();
      const double mine_part = partial.item();
      partial.fill_(max ? std::max(mine_part, other) : mine_part + std::pow(other, p));
    };
    const double whole = grad_norm(all, p).item();
    EXPECT_NEAR(grad_norm(mine, p, add_theirs).item(), whole, 1e-12 * whole);
    EXPECT_EQ(calls, 1);
  }
  // Clipping scales my part by the global factor, as clipping everything does.
  std::vector<Tensor> copy = make_params(s);
  set_grads(s, copy, 4);
  const NormCombiner add_theirs = [&](Tensor& partial, bool) {
    partial.fill_(partial.item() + std::pow(grad_norm(theirs).item(), 2.0));
  };
  const double total = clip_grad_norm(mine, 0.5, 2.0, add_theirs).item();
  EXPECT_NEAR(total, clip_grad_norm(copy, 0.5).item(), 1e-12 * total);
  for (const size_t i : {size_t(0), size_t(2)}) {
    const std::vector<float> a = all[i].grad().to_vector<float>(),
                             b = copy[i].grad().to_vector<float>();
    for (size_t j = 0; j < a.size(); ++j)
      ASSERT_NEAR(a[j], b[j], 2e-7 * std::fabs(b[j])) << "parameter " << i << "[" << j << "]";
  }
  // A rank without gradients still takes part (the combiner is a collective).
  int calls = 0;
  Tensor none = Tensor::zeros({3});
  EXPECT_EQ(clip_grad_norm({none}, 1.0, 2.0,
                           [&](Tensor& partial, bool) {
                             ++calls;
                             partial.fill_(16.0);
                           })
                .item(),
            4.0);
  EXPECT_EQ(calls, 1);
}

// ---- sharding (ZeRO-1) -------------------------------------------------------------------------

TEST(Sharding, OnlyOwnedParametersAreUpdatedAndKeepState) {
  const Case s{{{40, 3}, {17}, {9, 2}}, {DType::BF16, DType::BF16, DType::F16}};
  std::vector<Tensor> full_p = make_params(s), shard_p = make_params(s);
  AdamW full(full_p, {.lr = 0.01}), shard(shard_p, {.lr = 0.01});
  full.set_master_weights(true);
  shard.set_master_weights(true);
  const int64_t full_bytes = full.state_nbytes();
  shard.set_owned({true, false, true});
  EXPECT_FALSE(shard.owns(1));
  EXPECT_TRUE(shard.master(0).defined() && shard.master(2).defined());
  EXPECT_FALSE(shard.master(1).defined());
  // fp32 masters of every half parameter, and of the owned ones.
  EXPECT_EQ(full_bytes, (120 + 17 + 18) * 4);
  EXPECT_EQ(shard.state_nbytes(), (120 + 18) * 4);
  const std::vector<float> frozen = shard_p[1].to_vector<float>();
  for (int step = 0; step < 3; ++step) {
    set_grads(s, full_p, 10 + step);
    set_grads(s, shard_p, 10 + step);  // parameter 1 has a gradient but is not owned
    full.step();
    shard.step();
  }
  EXPECT_EQ(shard_p[1].to_vector<float>(), frozen);
  for (const size_t i : {size_t(0), size_t(2)})
    EXPECT_EQ(shard_p[i].to_vector<float>(), full_p[i].to_vector<float>()) << i;
  // State: moments and masters of parameters 0 and 2 only.
  EXPECT_EQ(shard.state_nbytes(), (120 + 18) * 4 * 3);
  EXPECT_EQ(full.state_nbytes(), (120 + 17 + 18) * 4 * 3);
  EXPECT_EQ(shard.updates(1), 0);
  EXPECT_EQ(shard.step_count(), 3);
  NamedTensors owned_only;
  for (auto& [k, t] : full.state_dict()) {
    if (k.find(".1.") == std::string::npos && k != "master.1") owned_only.emplace_back(k, t);
  }
  const NamedTensors sd = shard.state_dict();
  ASSERT_EQ(sd.size(), owned_only.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(sd[i].first, owned_only[i].first);
    EXPECT_EQ(sd[i].second.to_vector<float>(), owned_only[i].second.to_vector<float>())
        << sd[i].first;
  }
  // A whole optimizer's dict loads into a sharded one, which keeps its own share.
  std::vector<Tensor> other_p = make_params(s);
  AdamW other(other_p, {.lr = 0.01});
  other.set_master_weights(true);
  other.set_owned({false, true, false});
  other.load_state_dict(full.state_dict());
  EXPECT_EQ(other.updates(1), 3);
  EXPECT_EQ(other.updates(0), 0);
  EXPECT_FALSE(other.master(0).defined());
  EXPECT_EQ(other.state_nbytes(), 17 * 4 * 3);
  EXPECT_THROW(other.set_owned({true}), Error);
  // Owning everything again: the dropped state starts afresh at the next update.
  shard.set_owned({});
  EXPECT_TRUE(shard.owns(1));
}

// Two "ranks" that split every parameter at some element, each stepping its own slice (state and
// masters of that slice alone): put together, they are the whole optimizer's step, bit for bit,
// with stochastic rounding too (a slice draws the bits its elements draw in the whole).
TEST(Sharding, SlicesOfParametersStepAsTheWhole) {
  const Case s{{{40, 3}, {17}, {9, 2}, {5}}, {DType::BF16, DType::F32, DType::F16, DType::BF16}};
  for (const RoundingMode mode : {RoundingMode::NearestEven, RoundingMode::Stochastic}) {
    SCOPED_TRACE(rounding_name(mode));
    std::vector<Tensor> whole_p = make_params(s), a_p = make_params(s), b_p = make_params(s);
    AdamW whole(whole_p, {.lr = 0.01}), a(a_p, {.lr = 0.01}), b(b_p, {.lr = 0.01});
    std::vector<ElementRange> a_ranges, b_ranges;
    for (size_t i = 0; i < whole_p.size(); ++i) {
      const int64_t n = whole_p[i].numel(), cut = i == 3 ? n : n / 3;  // parameter 3: all a's
      a_ranges.push_back({0, cut});
      b_ranges.push_back({cut, n});
    }
    for (AdamW* o : {&whole, &a, &b}) {
      o->set_master_weights(true);
      o->set_store_rounding(mode, 99);
    }
    a.set_owned_ranges(a_ranges);
    b.set_owned_ranges(b_ranges);
    EXPECT_FALSE(b.owns(3));
    EXPECT_EQ(a.state_nbytes() + b.state_nbytes(), whole.state_nbytes());  // the masters
    for (int step = 0; step < 4; ++step) {
      for (const std::vector<Tensor>* ps : {&whole_p, &a_p, &b_p})
        set_grads(s, *ps, 20 + step);
      whole.step();
      a.step();
      b.step();
      // Each rank's elements to the other (what ZeRO-1's all-gather does).
      for (size_t i = 0; i < whole_p.size(); ++i) {
        const int64_t n = whole_p[i].numel();
        Tensor fa = a_p[i].reshape({n}), fb = b_p[i].reshape({n});
        const ElementRange ra = a_ranges[i], rb = b_ranges[i];
        fb.narrow(0, ra.begin, ra.size()).copy_(fa.narrow(0, ra.begin, ra.size()));
        fa.narrow(0, rb.begin, rb.size()).copy_(fb.narrow(0, rb.begin, rb.size()));
      }
    }
    for (size_t i = 0; i < whole_p.size(); ++i) {
      EXPECT_EQ(a_p[i].to_vector<float>(), whole_p[i].to_vector<float>()) << i;
      EXPECT_EQ(b_p[i].to_vector<float>(), whole_p[i].to_vector<float>()) << i;
    }
    EXPECT_EQ(a.state_nbytes() + b.state_nbytes(), whole.state_nbytes());
    // A slice's state is written flat, its own elements of the whole's.
    const NamedTensors sa = a.state_dict(), sw = whole.state_dict();
    auto entry = [](const NamedTensors& d, const std::string& key) {
      for (const auto& [k, t] : d) {
        if (k == key) return t;
      }
      return Tensor();
    };
    const Tensor slice = entry(sa, "state.0.exp_avg");
    ASSERT_TRUE(slice.defined());
    EXPECT_EQ(slice.shape(), Shape({40}));
    EXPECT_EQ(slice.to_vector<float>(),
              entry(sw, "state.0.exp_avg").reshape({120}).narrow(0, 0, 40).to_vector<float>());
    EXPECT_EQ(entry(sa, "master.2").to_vector<float>(),
              entry(sw, "master.2").reshape({18}).narrow(0, 0, 6).to_vector<float>());
    // The whole optimizer's dict loads into a slice-owning one: it takes its slices.
    std::vector<Tensor> c_p = make_params(s);
    AdamW c(c_p, {.lr = 0.01});
    c.set_master_weights(true);
    c.set_owned_ranges(b_ranges);
    c.load_state_dict(sw);
    EXPECT_EQ(entry(c.state_dict(), "state.1.exp_avg_sq").to_vector<float>(),
              entry(b.state_dict(), "state.1.exp_avg_sq").to_vector<float>());
    EXPECT_EQ(entry(c.state_dict(), "master.0").to_vector<float>(),
              entry(b.state_dict(), "master.0").to_vector<float>());
  }
  std::vector<Tensor> ps = make_params(s);
  AdamW bad(ps, {});
  EXPECT_THROW(bad.set_owned_ranges({{0, 121}, {0, 1}, {0, 1}, {0, 1}}), Error);
  EXPECT_THROW(bad.set_owned_ranges({{3, 2}, {0, 1}, {0, 1}, {0, 1}}), Error);
}

// ---- schedules ---------------------------------------------------------------------------------

TEST(Schedule, Constant) {
  const LRSchedule s = LRSchedule::constant(3e-4);
  EXPECT_EQ(s.lr_at(0), 3e-4);
  EXPECT_EQ(s.lr_at(123456), 3e-4);
  EXPECT_EQ(s.name(), "constant");
}

TEST(Schedule, Step) {
  const LRSchedule s = LRSchedule::step(0.1, 10, 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(25), 0.025);
  EXPECT_DOUBLE_EQ(s.lr_at(30), 0.0125);
}

TEST(Schedule, CosineWithWarmup) {
  const LRSchedule s = LRSchedule::cosine(1.0, 10, 110, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);  // (0 + 1) / 10 of the peak
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);    // warmup ends at the peak
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);   // the cosine starts there
  EXPECT_DOUBLE_EQ(s.lr_at(60), 0.55);  // halfway: (lr + min_lr) / 2
  EXPECT_NEAR(s.lr_at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(5000), 0.1);
  for (int64_t k = 10; k < 110; ++k)
    EXPECT_GE(s.lr_at(k), s.lr_at(k + 1));  // monotone after warmup
  const LRSchedule plain = LRSchedule::cosine(2.0, 0, 4);
  EXPECT_DOUBLE_EQ(plain.lr_at(0), 2.0);
  EXPECT_DOUBLE_EQ(plain.lr_at(2), 1.0);
  EXPECT_DOUBLE_EQ(plain.lr_at(4), 0.0);
}

TEST(Schedule, OfKindByNameAndErrors) {
  ScheduleOptions o;
  o.lr = 0.2;
  o.step_size = 5;
  o.gamma = 0.1;
  o.warmup_steps = 2;
  o.total_steps = 20;
  EXPECT_EQ(LRSchedule::of_kind(ScheduleKind::Constant, o).lr_at(7), 0.2);
  EXPECT_DOUBLE_EQ(LRSchedule::of_kind(ScheduleKind::Step, o).lr_at(7), 0.02);
  EXPECT_EQ(LRSchedule::of_kind(ScheduleKind::Cosine, o).kind(), ScheduleKind::Cosine);
  EXPECT_DOUBLE_EQ(LRSchedule::of_kind(ScheduleKind::Cosine, o).lr_at(0), 0.1);
  EXPECT_EQ(find_word<ScheduleKind>("cosine"), ScheduleKind::Cosine);
  const std::string msg = error_of([&] { parse_word<ScheduleKind>("linear", "--schedule"); });
  EXPECT_NE(msg.find("'linear'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cosine"), std::string::npos) << msg;
  EXPECT_THROW(LRSchedule::step(0.1, 0, 0.5), Error);
  EXPECT_THROW(LRSchedule::step(0.1, 3, 0.0), Error);
  EXPECT_THROW(LRSchedule::cosine(0.1, 30, 20), Error);  // warmup beyond the end
  EXPECT_THROW(LRSchedule::cosine(0.1, 0, 0), Error);
  EXPECT_THROW(LRSchedule::cosine(0.1, 0, 10, 0.5), Error);  // min_lr above lr
  EXPECT_THROW(LRSchedule::constant(-1), Error);
  EXPECT_THROW(LRSchedule::constant(0.1).lr_at(-1), Error);
}

TEST(Schedule, DrivesAnOptimizer) {
  std::vector<Tensor> ps = make_params(kF32);
  SGD opt(ps, {.lr = 1.0});
  const LRSchedule s = LRSchedule::step(0.1, 2, 0.5);
  std::vector<double> seen;
  for (int k = 0; k < 5; ++k) {
    opt.set_lr(s.lr_at(opt.step_count()));
    seen.push_back(opt.lr());
    opt.step();
  }
  EXPECT_EQ(seen, (std::vector<double>{0.1, 0.1, 0.05, 0.05, 0.025}));
}

// ---- parameter groups
// ----------------------------------------------------------------------------

// Two groups with their own lr, weight decay and betas are exactly two optimizers, one per group,
// in one call per group; the state dict numbers the parameters across the groups.
TEST(ParamGroups, EachGroupStepsWithItsOwnHyperparameters) {
  const Case s{{{20, 10}, {10}, {5, 3}, {7}}, {DType::F32, DType::F32, DType::BF16, DType::F32}};
  std::vector<Tensor> grouped = make_params(s), alone = make_params(s);
  AdamW opt(
      {ParamGroup{
           .params = {grouped[0], grouped[2]}, .options = {.weight_decay = 0.1}, .name = "decay"},
       ParamGroup{.params = {grouped[1], grouped[3]},
                  .options = {.lr = 0.003, .weight_decay = 0.0, .beta2 = 0.95},
                  .name = "no_decay"}},
      {.lr = 0.01, .weight_decay = 0.5});
  AdamW a({alone[0], alone[2]}, {.lr = 0.01, .weight_decay = 0.1});
  AdamW b({alone[1], alone[3]}, {.lr = 0.003, .beta2 = 0.95, .weight_decay = 0.0});
  ASSERT_EQ(opt.num_groups(), 2u);
  EXPECT_EQ(opt.group_name(1), "no_decay");
  EXPECT_EQ(opt.lr(1), 0.003);
  EXPECT_EQ(opt.options(0).weight_decay, 0.1);
  EXPECT_EQ(opt.options(1).beta2, 0.95);
  EXPECT_EQ(opt.options(1).beta1, 0.9) << "unset: the optimizer's";
  for (int k = 0; k < 4; ++k) {
    set_grads(s, grouped, k);
    set_grads(s, alone, k);
    const int64_t calls = backend::cpu::multi_tensor_calls();
    opt.step();
    EXPECT_EQ(backend::cpu::multi_tensor_calls() - calls, 2) << "one fused call per group";
    a.step();
    b.step();
  }
  for (size_t i = 0; i < grouped.size(); ++i)
    EXPECT_EQ(bytes_of({grouped[i]}), bytes_of({alone[i]})) << "parameter " << i;
  // Parameters are numbered as given: group 0's, then group 1's.
  EXPECT_EQ(opt.params()[1].data_ptr(), grouped[2].data_ptr());
  const NamedTensors sd = opt.state_dict();
  auto find = [&](const std::string& key) {
    for (const auto& [k, t] : sd)
      if (k == key) return t;
    return Tensor();
  };
  EXPECT_EQ(find("group.1.lr").item(), 0.003);
  EXPECT_EQ(find("state.3.exp_avg").shape(), grouped[3].shape());
  // And it resumes: a fresh grouped optimizer loaded from the dict continues identically.
  std::vector<Tensor> again = make_params(s);
  {
    NoGrad ng;
    for (size_t i = 0; i < again.size(); ++i)
      again[i].copy_(grouped[i]);
  }
  AdamW resumed({ParamGroup{.params = {again[0], again[2]}, .options = {.weight_decay = 0.1}},
                 ParamGroup{.params = {again[1], again[3]},
                            .options = {.lr = 0.003, .weight_decay = 0.0, .beta2 = 0.95}}},
                {.lr = 0.01});
  resumed.load_state_dict(sd);
  set_grads(s, grouped, 9);
  set_grads(s, again, 9);
  opt.step();
  resumed.step();
  for (size_t i = 0; i < grouped.size(); ++i)
    EXPECT_EQ(bytes_of({grouped[i]}), bytes_of({again[i]})) << "parameter " << i;
}

TEST(ParamGroups, SgdGroupsWithAndWithoutMomentum) {
  const Case s{{{8, 4}, {4}}, {DType::F32, DType::F32}};
  std::vector<Tensor> ps = make_params(s), qs = make_params(s);
  SGD opt({ParamGroup{.params = {ps[0]}, .options = {.momentum = 0.9, .nesterov = true}},
           ParamGroup{.params = {ps[1]}, .options = {.lr = 0.5}}},
          {.lr = 0.1});
  SGD a({qs[0]}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  SGD b({qs[1]}, {.lr = 0.5});
  EXPECT_EQ(opt.state_names(0), std::vector<std::string>{"momentum_buffer"});
  EXPECT_TRUE(opt.state_names(1).empty());
  for (int k = 0; k < 3; ++k) {
    set_grads(s, ps, k);
    set_grads(s, qs, k);
    opt.step();
    a.step();
    b.step();
  }
  EXPECT_EQ(bytes_of(ps), bytes_of(qs));
  for (const auto& [key, t] : opt.state_dict())
    EXPECT_EQ(key.find("state.1.momentum"), std::string::npos) << "group 1 keeps no momentum";
}

TEST(ParamGroups, WeightDecayGroupsSkipBiasesAndNorms) {
  const Tensor w = Tensor::zeros({4, 3}).set_requires_grad(), b = Tensor::zeros({4});
  const Tensor ln = Tensor::ones({3}), conv = Tensor::zeros({2, 1, 3, 3});
  const std::vector<ParamGroup> g = weight_decay_groups(
      {{"fc.weight", w}, {"fc.bias", b}, {"ln.weight", ln}, {"conv", conv}}, 0.1);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "decay");
  ASSERT_EQ(g[0].params.size(), 2u);
  EXPECT_TRUE(g[0].params[0].is_same(w));
  EXPECT_TRUE(g[0].params[1].is_same(conv));
  EXPECT_EQ(*g[0].options.weight_decay, 0.1);
  EXPECT_EQ(g[1].name, "no_decay");
  EXPECT_EQ(g[1].params.size(), 2u);
  EXPECT_EQ(*g[1].options.weight_decay, 0.0);
  // All decayed: one group.
  EXPECT_EQ(weight_decay_groups({{"w", w}}, 0.1).size(), 1u);
}

TEST(ParamGroups, MistakesAreNamed) {
  std::vector<Tensor> ps = make_params(kF32);
  auto message = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              SGD({ParamGroup{.params = {ps[0]}, .options = {.beta1 = 0.9}, .name = "x"}}, {});
            }).find("parameter group 0 ('x') sets 'beta1', which SGD does not have"),
            std::string::npos);
  EXPECT_NE(message([&] {
              AdamW({ParamGroup{.params = {ps[0]}, .options = {.momentum = 0.9}}}, {});
            }).find("sets 'momentum', which AdamW does not have"),
            std::string::npos);
  EXPECT_NE(message([&] {
              AdamW({ParamGroup{.params = {ps[0]}}, ParamGroup{.params = {ps[0]}}}, {});
            }).find("the same tensor"),
            std::string::npos);
  EXPECT_NE(message([&] {
              AdamW({ParamGroup{.params = {ps[0]}}, ParamGroup{}}, {});
            }).find("parameter group 1 has no parameters"),
            std::string::npos);
  EXPECT_NE(message([&] {
              AdamW({ParamGroup{.params = {ps[0]}},
                     ParamGroup{.params = {ps[1]}, .options = {.beta2 = 1.5}}},
                    {});
            }).find("beta2 (parameter group 1) must be in [0, 1)"),
            std::string::npos);
  SGD opt({ParamGroup{.params = {ps[0]}}}, {});
  EXPECT_THROW(opt.lr(1), Error);
  EXPECT_THROW(opt.set_lr(3, 0.1), Error);
}

TEST(Schedule, ActsOnEveryGroupFromItsBaseRate) {
  std::vector<Tensor> ps = make_params(kF32);
  SGD opt({ParamGroup{.params = {ps[0]}}, ParamGroup{.params = {ps[1]}, .options = {.lr = 0.02}}},
          {.lr = 0.1});
  EXPECT_EQ(opt.base_lr(0), 0.1);
  EXPECT_EQ(opt.base_lr(1), 0.02);
  const LRSchedule step = LRSchedule::step(0.1, 2, 0.5);
  step.apply(opt, 3);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.05);
  EXPECT_DOUBLE_EQ(opt.lr(1), 0.01);
  // Cosine with warmup: the same shape from each base, down to the (absolute) min_lr.
  const LRSchedule cos = LRSchedule::cosine(0.1, 2, 10, 0.001);
  cos.apply(opt, 0);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.05);
  EXPECT_DOUBLE_EQ(opt.lr(1), 0.01);
  cos.apply(opt, 6);
  EXPECT_DOUBLE_EQ(opt.lr(0), cos.lr_at(6));
  EXPECT_DOUBLE_EQ(opt.lr(1),
                   0.001 + (0.02 - 0.001) * 0.5 * (1 + std::cos(std::numbers::pi * 0.5)));
  cos.apply(opt, 10);
  EXPECT_EQ(opt.lr(1), 0.001);
  EXPECT_EQ(opt.base_lr(1), 0.02) << "the base stays";
}

// The trap: clip_grad_norm returned a host double, a wait per step on a GPU. It returns the norm
// as a tensor where the gradients are, as PyTorch's, and clips without reading it.
TEST(Clip, ReturnsTheNormAsATensorOnTheGradientsDevice) {
  Tensor a = Tensor::zeros({2});
  a.set_grad(Tensor::from_vector(std::vector<double>{3, -4}, {2}));
  const Tensor n = clip_grad_norm({a}, 1.0);
  EXPECT_EQ(n.dtype(), DType::F64);
  EXPECT_EQ(n.numel(), 1);
  EXPECT_EQ(n.device(), a.device());
  EXPECT_EQ(n.item(), 5.0);
  const Tensor g = grad_norm({a});
  EXPECT_EQ(g.device(), a.device());
  EXPECT_NEAR(g.item(), 1.0, 1e-6);
  EXPECT_EQ(grad_norm({Tensor::zeros({2})}).item(), 0.0) << "no gradients: 0";
}

}  // namespace
}  // namespace mantissa::optim
