// The pieces of the loss scaler's device path that run on the CPU too: the shared update rule
// (amp::backend::next_scale_state) against an independent transcription of GradScaler's rule and
// against GradScaler itself over long random overflow patterns, Backend::update_scale on a state
// tensor, and the optimizer kernels' found_inf skip (a set flag leaves parameters, masters and
// moments bit-identical; a clear one is a normal step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/step_math.h"
#include "mantissa/amp/grad_scaler.h"
#include "mantissa/core/error.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The dynamic rule written out on its own, as GradScaler::update() had it before the rule moved
// into step_math.h (std::max/min, std::isfinite): what next_scale_state must reproduce.
struct Reference {
  double scale;
  int64_t growth = 0, hysteresis = 0, overflows = 0;

  void update(bool found, const GradScalerOptions& o) {
    auto f32 = [](double x) { return double(float(x)); };
    if (found) {
      const bool at_min = scale <= o.min_scale;
      growth = 0;
      if (++hysteresis >= o.hysteresis) {
        hysteresis = 0;
        scale = f32(std::max(f32(scale * o.backoff_factor), o.min_scale));
      }
      if (at_min) ++overflows;
      return;
    }
    hysteresis = 0;
    const int64_t successful = growth + 1;
    if (successful >= o.growth_interval) {
      const double grown = f32(scale * o.growth_factor);
      if (std::isfinite(grown)) scale = f32(std::min(grown, o.max_scale));
      growth = 0;
    } else {
      growth = successful;
    }
  }
};

backend::ScaleUpdate rule_of(const GradScalerOptions& o) {
  return {.growth_factor = o.growth_factor,
          .backoff_factor = o.backoff_factor,
          .growth_interval = o.growth_interval,
          .hysteresis = o.hysteresis,
          .min_scale = o.min_scale,
          .max_scale = o.max_scale};
}

// A spread of option sets: PyTorch's defaults, hysteresis, clamps hit often, odd factors, a
// scale near fp32's top (growth refused), a min_scale between powers of two.
std::vector<GradScalerOptions> option_sets() {
  return {
      {.init_scale = 65536.0, .growth_interval = 3},
      {.init_scale = 1024.0, .growth_interval = 2, .hysteresis = 3},
      {.init_scale = 8.0, .growth_interval = 1, .min_scale = 2.0, .max_scale = 32.0},
      {.init_scale = 100.0,
       .growth_factor = 3.0,
       .backoff_factor = 0.3,
       .growth_interval = 2,
       .hysteresis = 2,
       .min_scale = 3.0,
       .max_scale = 5000.0},
      {.init_scale = 2e38, .growth_interval = 1, .min_scale = 1.0, .max_scale = 1e300},
  };
}

// found_inf for iteration i of a pattern: runs of clean and overflowing steps of random lengths,
// so that growth, hysteresis and both clamps are all reached.
std::vector<bool> pattern(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<bool> out;
  while (int(out.size()) < n) {
    const bool bad = rng() % 3 == 0;
    const int run = 1 + int(rng() % (bad ? 4 : 7));
    for (int k = 0; k < run && int(out.size()) < n; ++k)
      out.push_back(bad);
  }
  return out;
}

TEST(ScaleUpdateRule, MatchesTheHostRuleOverLongRandomPatterns) {
  int checked = 0;
  for (const GradScalerOptions& o : option_sets()) {
    const std::vector<bool> found = pattern(17u + uint32_t(checked), 3000);
    Reference ref{double(float(o.init_scale))};
    backend::ScaleState s{double(float(o.init_scale)), 0, 0, 0};
    bool grew = false, backed_off = false;
    for (size_t i = 0; i < found.size(); ++i) {
      const double before = s.scale;
      ref.update(found[i], o);
      s = backend::next_scale_state(s, found[i], rule_of(o));
      ASSERT_EQ(s.scale, ref.scale) << "option set " << checked << ", update " << i;
      ASSERT_EQ(s.growth_tracker, ref.growth) << "update " << i;
      ASSERT_EQ(s.hysteresis_tracker, ref.hysteresis) << "update " << i;
      ASSERT_EQ(s.min_scale_overflows, ref.overflows) << "update " << i;
      grew = grew || s.scale > before;
      backed_off = backed_off || s.scale < before;
    }
    EXPECT_TRUE(backed_off) << "option set " << checked << " never backed off";
    if (checked != 4) {
      EXPECT_TRUE(grew) << "option set " << checked << " never grew";
    }
    ++checked;
  }
}

TEST(ScaleUpdateRule, ClampsAndFp32EdgeCases) {
  const backend::ScaleUpdate r{.growth_interval = 1, .min_scale = 3.0, .max_scale = 12.0};
  // Backoff below min_scale lands on it; an overflow there is counted, the scale stays.
  backend::ScaleState s = backend::next_scale_state({4.0, 0, 0, 0}, true, r);
  EXPECT_EQ(s.scale, 3.0);
  EXPECT_EQ(s.min_scale_overflows, 0);
  s = backend::next_scale_state(s, true, r);
  EXPECT_EQ(s.scale, 3.0);
  EXPECT_EQ(s.min_scale_overflows, 1);
  // Growth clamps at max_scale.
  s = backend::next_scale_state({8.0, 0, 0, 0}, false, r);
  EXPECT_EQ(s.scale, 12.0);
  // Growth that overflows fp32 is refused, and the tracker still resets.
  const backend::ScaleUpdate huge{.growth_interval = 1, .max_scale = 1e300};
  s = backend::next_scale_state({double(float(2e38)), 0, 0, 0}, false, huge);
  EXPECT_EQ(s.scale, double(float(2e38)));
  EXPECT_EQ(s.growth_tracker, 0);
  // The scale stays an fp32 value.
  const backend::ScaleUpdate odd{.backoff_factor = 0.1, .min_scale = 1e-30};
  s = backend::next_scale_state({1.0, 0, 0, 0}, true, odd);
  EXPECT_EQ(s.scale, double(float(0.1)));
}

// One parameter with a gradient to step: what GradScaler drives.
struct Rig {
  Tensor p = Tensor::from_vector(std::vector<double>{0.5, -1.0, 2.0}, Shape{3}).set_requires_grad();
  optim::SGD opt{{p}, {.lr = 0.01}};

  void iterate(GradScaler& s, bool overflow) {
    const double S = s.get_scale();
    p.set_grad(
        Tensor::from_vector(std::vector<double>{S * 0.25, overflow ? kInf : S, -S}, Shape{3}));
    s.step(opt);
    s.update();
  }
};

TEST(ScaleUpdateRule, GradScalerFollowsItOverLongRandomPatterns) {
  int checked = 0;
  for (const GradScalerOptions& o : option_sets()) {
    const std::vector<bool> found = pattern(91u + uint32_t(checked), 1500);
    GradScaler scaler(o);
    Rig rig;
    Reference ref{double(float(o.init_scale))};
    for (size_t i = 0; i < found.size(); ++i) {
      rig.iterate(scaler, found[i]);
      ref.update(found[i], o);
      ASSERT_EQ(scaler.get_scale(), ref.scale) << "option set " << checked << ", update " << i;
      ASSERT_EQ(scaler.growth_tracker(), ref.growth) << "update " << i;
      ASSERT_EQ(scaler.hysteresis_tracker(), ref.hysteresis) << "update " << i;
      ASSERT_EQ(scaler.min_scale_overflows(), ref.overflows) << "update " << i;
    }
    EXPECT_EQ(scaler.skipped_steps(), int64_t(std::count(found.begin(), found.end(), true)));
    ++checked;
  }
}

TEST(CpuUpdateScale, FollowsTheRuleOnAStateTensor) {
  backend::Backend& be = backend::cpu_backend();
  int checked = 0;
  for (const GradScalerOptions& o : option_sets()) {
    const std::vector<bool> found = pattern(5u + uint32_t(checked), 2000);
    Tensor state = Tensor::from_vector(std::vector<double>{double(float(o.init_scale)), 0, 0, 0},
                                       Shape{4}, DType::F64);
    Tensor flag = Tensor::zeros(Shape{}, DType::F32);
    Reference ref{double(float(o.init_scale))};
    for (size_t i = 0; i < found.size(); ++i) {
      // Any non-zero flag counts (update() adds the flags of several optimizers).
      flag.fill_(found[i] ? double(1 + i % 3) : 0.0);
      be.update_scale(state, flag, rule_of(o));
      ref.update(found[i], o);
      const std::vector<double> s = state.to_vector<double>();
      ASSERT_EQ(s[0], ref.scale) << "option set " << checked << ", update " << i;
      ASSERT_EQ(s[1], double(ref.growth)) << "update " << i;
      ASSERT_EQ(s[2], double(ref.hysteresis)) << "update " << i;
      ASSERT_EQ(s[3], double(ref.overflows)) << "update " << i;
    }
    ++checked;
  }
}

// ---- the optimizer kernels' found_inf skip ---------------------------------------------------

std::vector<unsigned char> bytes_of(const Tensor& t) {
  std::vector<unsigned char> out(size_t(t.numel()) * dtype_size(t.dtype()));
  std::memcpy(out.data(), t.data_ptr(), out.size());
  return out;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  c.copy_(t);
  return c;
}

// Parameters of several dtypes (bf16 and f16 with fp32 masters), gradients, and state that is
// already initialized (one update done, so this one is the second): every buffer a step could
// write, the step counts included.
struct StepRig {
  std::vector<Tensor> params, grads, masters, s0, s1;
  Tensor counts = Tensor::from_vector(std::vector<int64_t>{1, 1, 1, 1}, Shape{4});
  std::vector<uint64_t> ids;

  StepRig() {
    const DType dtypes[] = {DType::F32, DType::BF16, DType::F16, DType::F64};
    const int64_t sizes[] = {3000, 2500, 70, 129};
    for (int i = 0; i < 4; ++i) {
      const DType dt = dtypes[i];
      const Tensor init = Tensor::uniform(Shape{sizes[i]}, -1.0, 1.0, 100 + uint64_t(i));
      params.push_back(init.to(dt).contiguous());
      grads.push_back(
          Tensor::uniform(Shape{sizes[i]}, -0.5, 0.5, 200 + uint64_t(i)).to(dt).contiguous());
      masters.push_back(dt == DType::BF16 || dt == DType::F16 ? copy_of(init) : Tensor());
      const DType sd = dt == DType::F64 ? DType::F64 : DType::F32;
      s0.push_back(
          Tensor::uniform(Shape{sizes[i]}, -0.1, 0.1, 300 + uint64_t(i)).to(sd).contiguous());
      s1.push_back(
          Tensor::uniform(Shape{sizes[i]}, 0.0, 0.1, 400 + uint64_t(i)).to(sd).contiguous());
      ids.push_back(uint64_t(i));
    }
  }

  StepRig clone() const {
    StepRig r(*this);
    for (auto* v : {&r.params, &r.grads, &r.masters, &r.s0, &r.s1}) {
      for (Tensor& t : *v)
        if (t.defined()) t = copy_of(t);
    }
    r.counts = copy_of(counts);
    return r;
  }

  backend::MultiTensorOptions options(const Tensor* flag) {
    backend::MultiTensorOptions o;
    o.masters = masters;
    o.store_rounding = RoundingMode::Stochastic;
    o.seed = 7;
    o.ids = ids;
    o.step_counts = &counts;
    o.found_inf = flag;
    return o;
  }

  void sgd(const Tensor* flag) {
    backend::SgdStep h;
    h.lr = 0.1;
    h.momentum = 0.9;
    h.dampening = 0.1;
    h.weight_decay = 0.01;
    h.options = options(flag);
    backend::cpu_backend().sgd_step(params, grads, s0, h);
  }

  void adamw(const Tensor* flag) {
    backend::AdamWStep h;
    h.lr = 0.01;
    h.weight_decay = 0.1;
    h.options = options(flag);
    backend::cpu_backend().adamw_step(params, grads, s0, s1, h);
  }

  std::vector<std::vector<unsigned char>> snapshot() const {
    std::vector<std::vector<unsigned char>> out;
    for (const auto* v : {&params, &masters, &s0, &s1}) {
      for (const Tensor& t : *v)
        if (t.defined()) out.push_back(bytes_of(t));
    }
    out.push_back(bytes_of(counts));
    return out;
  }
};

TEST(FoundInfSkip, CpuStepsWithTheFlagSetChangeNothing) {
  const Tensor set = Tensor::scalar(1.0, DType::F32);
  for (const bool adamw : {false, true}) {
    StepRig r;
    const auto before = r.snapshot();
    adamw ? r.adamw(&set) : r.sgd(&set);
    EXPECT_EQ(r.snapshot(), before) << (adamw ? "adamw" : "sgd");
  }
}

TEST(FoundInfSkip, CpuStepsWithTheFlagClearAreNormalSteps) {
  const Tensor clear = Tensor::scalar(0.0, DType::F32);
  for (const bool adamw : {false, true}) {
    StepRig with_flag;
    StepRig plain = with_flag.clone();
    const auto before = with_flag.snapshot();
    adamw ? with_flag.adamw(&clear) : with_flag.sgd(&clear);
    adamw ? plain.adamw(nullptr) : plain.sgd(nullptr);
    EXPECT_NE(with_flag.snapshot(), before) << (adamw ? "adamw" : "sgd") << " did not step";
    EXPECT_EQ(with_flag.snapshot(), plain.snapshot()) << (adamw ? "adamw" : "sgd");
    EXPECT_EQ(with_flag.counts.to_vector<int64_t>(), std::vector<int64_t>(4, 2));
  }
}

TEST(FoundInfSkip, OptimizerSkipsOneStepAndKeepsValidState) {
  Tensor p = Tensor::from_vector(std::vector<double>{0.5, -1.0, 2.0}, Shape{3}).set_requires_grad();
  optim::AdamW opt({p}, {.lr = 0.1});
  p.set_grad(Tensor::from_vector(std::vector<double>{1.0, 2.0, -3.0}, Shape{3}));
  const std::vector<float> before = p.to_vector<float>();
  // A skipped first update: nothing moves, nothing counts, the state is zeros.
  opt.skip_next_step_if(Tensor::scalar(1.0, DType::F32));
  opt.step();
  EXPECT_EQ(p.to_vector<float>(), before);
  EXPECT_EQ(opt.step_count(), 0);
  EXPECT_EQ(opt.updates(0), 0);
  for (const auto& [name, t] : opt.state_dict()) {
    if (name == "state.0.exp_avg" || name == "state.0.exp_avg_sq") {
      EXPECT_EQ(t.to_vector<float>(), std::vector<float>(3, 0.0f)) << name;
    }
  }
  // The flag was for one step: the next one moves the weights, to finite values.
  opt.step();
  const std::vector<float> after = p.to_vector<float>();
  EXPECT_NE(after, before);
  for (float v : after)
    EXPECT_TRUE(std::isfinite(v));
  EXPECT_EQ(opt.updates(0), 1);
  // A flag must be one f32 element on the parameters' device.
  EXPECT_THROW(opt.skip_next_step_if(Tensor::zeros(Shape{2}, DType::F32)), Error);
  EXPECT_THROW(opt.skip_next_step_if(Tensor::scalar(0.0, DType::F64)), Error);
}

// The trap: AdamW counted a skipped step in its bias correction (1 - beta^t), so a run with an
// overflow drifted from PyTorch, whose fused Adam does not advance its step counts on found_inf.
// A skipped step followed by a real one must equal the real one alone, bit for bit, through the
// optimizer and through GradScaler; and the scaler's answer comes back as a StepResult.
TEST(FoundInfSkip, ASkippedStepIsNotCountedInAdamWsBiasCorrection) {
  auto make = [] {
    return Tensor::from_vector(std::vector<double>{0.5, -1.0, 2.0, 0.25}, Shape{4})
        .set_requires_grad();
  };
  const Tensor g = Tensor::from_vector(std::vector<double>{1.0, 2.0, -3.0, 0.5}, Shape{4});
  Tensor fresh = make(), skipped = make();
  optim::AdamW a({fresh}, {.lr = 0.1, .weight_decay = 0.05});
  optim::AdamW b({skipped}, {.lr = 0.1, .weight_decay = 0.05});
  fresh.set_grad(g.clone());
  a.step();
  skipped.set_grad(g.clone());
  b.skip_next_step_if(Tensor::scalar(1.0, DType::F32));
  b.step();
  b.step();
  EXPECT_EQ(skipped.to_vector<float>(), fresh.to_vector<float>());
  EXPECT_EQ(b.updates(0), a.updates(0));

  // Through the scaler: an overflowing iteration, then a clean one; against a clean one alone
  // at the backed-off scale.
  Tensor p = make(), q = make();
  optim::AdamW opt_p({p}, {.lr = 0.1}), opt_q({q}, {.lr = 0.1});
  GradScaler sp({.init_scale = 8.0}), sq({.init_scale = 4.0});
  p.set_grad(Tensor::from_vector(std::vector<double>{kInf, 0, 0, 0}, Shape{4}));
  const StepResult first = sp.step(opt_p);
  sp.update();
  EXPECT_TRUE(first.skipped());
  ASSERT_TRUE(first.found_inf().defined());
  EXPECT_EQ(first.found_inf().device(), Device::cpu());
  EXPECT_EQ(sp.get_scale(), 4.0);
  p.set_grad(mul(g, 4.0));
  q.set_grad(mul(g, 4.0));
  const StepResult second = sp.step(opt_p);
  sp.update();
  EXPECT_FALSE(second.skipped());
  EXPECT_TRUE(first.skipped()) << "an earlier result keeps its own answer";
  EXPECT_FALSE(sq.step(opt_q).skipped());
  sq.update();
  EXPECT_EQ(p.to_vector<float>(), q.to_vector<float>());
  EXPECT_EQ(opt_p.updates(0), 1);
  EXPECT_EQ(opt_p.step_count(), 1) << "the skipped step is not counted";
  EXPECT_EQ(sp.skipped_steps(), 1);
  // A disabled scaler never skips and has no flag.
  GradScaler off({.mode = ScaleMode::Disabled});
  const StepResult r = off.step(opt_q);
  EXPECT_FALSE(r.skipped());
  EXPECT_FALSE(r.found_inf().defined());
}

}  // namespace
}  // namespace mantissa::amp
