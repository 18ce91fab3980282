// The loss scaler: the fused unscale + inf/NaN kernel against a plain reference, the state
// machine (growth, backoff, hysteresis, clamps, skipping, static / disabled modes, misuse
// errors, several optimizers and losses, accumulation, clipping), the state dict through a
// safetensors file, fault injection into a training loop (a poisoned step leaves weights and
// optimizer moments bit-identical), and PyTorch's own torch.amp.GradScaler trajectory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "harness/op_harness.h"
#include "mantissa/amp/grad_scaler.h"
#include "mantissa/core/error.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/numerics/types.h"
#include "mantissa/optim/clip.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

#ifndef MANTISSA_GOLDEN_DIR
#error "tests/CMakeLists.txt passes MANTISSA_GOLDEN_DIR, the folder of the golden files"
#endif

namespace mantissa::amp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- the fused kernel --------------------------------------------------------------------------

using testing::store_as;

// The raw bytes of a tensor.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  std::vector<unsigned char> out(size_t(t.numel()) * dtype_size(t.dtype()));
  std::memcpy(out.data(), t.data_ptr(), out.size());
  return out;
}

Tensor random_grad(int64_t n, DType dt, uint64_t seed) {
  return Tensor::uniform(Shape{n}, -3000.0, 3000.0, seed).to(dt).contiguous();
}

TEST(UnscaleAndCheck, MatchesPlainReferenceBitExactForEveryDtype) {
  // Sizes around the chunk and the parallel grain, mixed dtypes in one call.
  const std::vector<int64_t> sizes = {1, 2047, 2048, 2049, 70001, 5};
  const std::vector<DType> dts = {DType::F32, DType::BF16, DType::F16, DType::F64};
  for (double inv : {1.0 / 65536.0, 1.0 / 3.0, 0.5, 1.0}) {
    std::vector<Tensor> grads;
    std::vector<std::vector<double>> expected;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const DType dt = dts[i % dts.size()];
      Tensor g = random_grad(sizes[i], dt, 7 + i);
      std::vector<double> ref = g.to_vector<double>();
      for (double& v : ref) {
        // fp32 multiply (f64 for f64), one rounding into the storage dtype.
        v = dt == DType::F64 ? v * inv : store_as(dt, double(float(v) * float(inv)));
      }
      grads.push_back(g);
      expected.push_back(ref);
    }
    Tensor flag = Tensor::zeros(Shape{}, DType::F32);
    EXPECT_FALSE(backend::cpu_backend().unscale_and_check(grads, inv, &flag));
    EXPECT_EQ(flag.item(), 0.0);
    for (size_t i = 0; i < grads.size(); ++i) {
      const std::vector<double> got = grads[i].to_vector<double>();
      ASSERT_EQ(got.size(), expected[i].size());
      for (size_t j = 0; j < got.size(); ++j)
        ASSERT_EQ(got[j], expected[i][j]) << "inv " << inv << " tensor " << i << " elem " << j;
    }
  }
}

TEST(UnscaleAndCheck, InvScaleOneLeavesBitsAlone) {
  Tensor g = random_grad(5000, DType::BF16, 3);
  const auto before = bytes_of(g);
  std::vector<Tensor> grads = {g};
  EXPECT_FALSE(backend::cpu_backend().unscale_and_check(grads, 1.0, nullptr));
  EXPECT_EQ(bytes_of(g), before);
}

TEST(UnscaleAndCheck, FindsInfAndNaNInAnyTensorPositionAndDtype) {
  const std::vector<int64_t> sizes = {3, 2049, 40000};
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    for (double bad : {kInf, -kInf, kNaN}) {
      for (size_t which = 0; which < sizes.size(); ++which) {
        const int64_t n = sizes[which];
        for (int64_t pos : {int64_t(0), n / 2, int64_t(2048) % n, n - 1}) {
          std::vector<Tensor> grads;
          for (size_t i = 0; i < sizes.size(); ++i) {
            // The poisoned tensor has dtype dt; the others are f32 and bf16.
            const DType d = i == which ? dt : (i % 2 ? DType::BF16 : DType::F32);
            std::vector<double> v(size_t(sizes[i]), 0.25);
            if (i == which) v[size_t(pos)] = bad;
            grads.push_back(Tensor::from_vector(v, Shape{sizes[i]}, d));
          }
          Tensor flag = Tensor::zeros(Shape{}, DType::F32);
          const int64_t calls = backend::cpu::unscale_calls();
          EXPECT_TRUE(backend::cpu_backend().unscale_and_check(grads, 0.5, &flag))
              << dtype_name(dt) << " " << bad << " tensor " << which << " pos " << pos;
          EXPECT_EQ(backend::cpu::unscale_calls(), calls + 1);
          EXPECT_EQ(flag.item(), 1.0);
          // The finite values are unscaled all the same (PyTorch).
          const std::vector<double> got = grads[which].to_vector<double>();
          EXPECT_EQ(got[size_t(pos == 0 ? n - 1 : 0)], 0.125);
        }
      }
    }
  }
  // The flag accumulates: a clean call leaves a set flag set.
  Tensor flag = Tensor::full(Shape{}, 1.0, DType::F32);
  std::vector<Tensor> clean = {Tensor::ones(Shape{4})};
  EXPECT_FALSE(backend::cpu_backend().unscale_and_check(clean, 0.5, &flag));
  EXPECT_EQ(flag.item(), 1.0);
}

// ---- the state machine -------------------------------------------------------------------------

// One parameter, plain SGD, and an iteration whose scaled gradient is finite or poisoned.
struct Rig {
  Tensor p = Tensor::from_vector(std::vector<double>{1.0, -2.0}, Shape{2}).set_requires_grad();
  optim::SGD opt{{p}, optim::SGDOptions{.lr = 0.125}};

  // Sets p.grad = S * (0.5, -1) (or a poisoned one), steps and updates; returns skipped.
  bool iterate(GradScaler& s, bool overflow) {
    const double S = s.get_scale();
    p.set_grad(Tensor::from_vector(std::vector<double>{0.5 * S, overflow ? kInf : -S}, Shape{2}));
    const bool skipped = s.step(opt).skipped();
    s.update();
    return skipped;
  }
};

TEST(GradScaler, DefaultsArePyTorchs) {
  GradScaler s;
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_FALSE(s.found_inf());
}

TEST(GradScaler, ScaleMultipliesTheLossDifferentiably) {
  GradScaler s({.init_scale = 1024.0});
  Tensor w = Tensor::from_vector(std::vector<double>{3.0}, Shape{1}).set_requires_grad();
  Tensor loss = sum(mul(w, w));
  Tensor scaled = s.scale(loss);
  EXPECT_EQ(scaled.item(), 9.0 * 1024.0);
  scaled.backward();
  EXPECT_EQ(w.grad().item(), 6.0 * 1024.0);
}

TEST(GradScaler, GrowsAfterIntervalCleanStepsAndBacksOffOnOverflow) {
  GradScaler s({.init_scale = 1024.0, .growth_interval = 3});
  Rig r;
  EXPECT_FALSE(r.iterate(s, false));
  EXPECT_EQ(s.growth_tracker(), 1);
  EXPECT_FALSE(r.iterate(s, false));
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_EQ(s.get_scale(), 1024.0);
  EXPECT_FALSE(r.iterate(s, false));
  EXPECT_EQ(s.get_scale(), 2048.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_FALSE(r.iterate(s, false));
  EXPECT_EQ(s.growth_tracker(), 1);
  EXPECT_TRUE(r.iterate(s, true));
  EXPECT_TRUE(s.found_inf());
  EXPECT_EQ(s.get_scale(), 1024.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_FALSE(r.iterate(s, false));
  EXPECT_FALSE(s.found_inf());
  // The optimizer saw 5 of the 6 steps.
  EXPECT_EQ(r.opt.step_count(), 5);
}

// The overflow reducer sees each optimizer's flag before the step: what another rank found
// (here: a reducer that reports an overflow) skips this rank's clean step too.
TEST(GradScaler, TheOverflowReducerDecidesTheSkip) {
  GradScaler s({.init_scale = 1024.0});
  Rig r;
  int calls = 0;
  s.set_overflow_reducer([&](Tensor& flag) {
    ++calls;
    EXPECT_EQ(flag.numel(), 1);
    EXPECT_EQ(flag.item(), 0.0);  // this rank's gradients are clean
    flag.fill_(1.0);              // another rank's were not
  });
  EXPECT_TRUE(r.iterate(s, false));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(s.get_scale(), 512.0);
  EXPECT_EQ(r.opt.step_count(), 0);
  s.set_overflow_reducer(nullptr);
  EXPECT_FALSE(r.iterate(s, false));
}

TEST(GradScaler, HysteresisBacksOffOnlyAfterConsecutiveOverflows) {
  GradScaler s({.init_scale = 1024.0, .growth_interval = 100, .hysteresis = 2});
  Rig r;
  EXPECT_FALSE(r.iterate(s, false));
  EXPECT_EQ(s.growth_tracker(), 1);
  EXPECT_TRUE(r.iterate(s, true));  // first overflow: tolerated, but the tracker resets
  EXPECT_EQ(s.get_scale(), 1024.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_EQ(s.hysteresis_tracker(), 1);
  r.iterate(s, false);  // a clean step refills the hysteresis
  EXPECT_EQ(s.hysteresis_tracker(), 0);
  r.iterate(s, true);
  EXPECT_EQ(s.get_scale(), 1024.0);
  r.iterate(s, true);  // second in a row: back off
  EXPECT_EQ(s.get_scale(), 512.0);
  EXPECT_EQ(s.hysteresis_tracker(), 0);
  r.iterate(s, true);
  EXPECT_EQ(s.get_scale(), 512.0);
  r.iterate(s, true);
  EXPECT_EQ(s.get_scale(), 256.0);
}

TEST(GradScaler, ClampsAtMinAndMaxAndReportsOverflowsAtMin) {
  GradScaler s({.init_scale = 8.0, .growth_interval = 1, .min_scale = 2.0, .max_scale = 32.0});
  Rig r;
  r.iterate(s, true);
  EXPECT_EQ(s.get_scale(), 4.0);
  EXPECT_FALSE(s.at_min_scale());
  r.iterate(s, true);
  EXPECT_EQ(s.get_scale(), 2.0);
  EXPECT_TRUE(s.at_min_scale());
  EXPECT_EQ(s.min_scale_overflows(), 0);
  r.iterate(s, true);  // at the min: stays, counted
  EXPECT_EQ(s.get_scale(), 2.0);
  EXPECT_EQ(s.min_scale_overflows(), 1);
  for (int i = 0; i < 6; ++i)
    r.iterate(s, false);
  EXPECT_EQ(s.get_scale(), 32.0);  // 4, 8, 16, 32, then clamped
  EXPECT_EQ(s.growth_tracker(), 0);
  // A min_scale between powers of two is reached exactly.
  GradScaler t({.init_scale = 8.0, .min_scale = 3.0});
  r.iterate(t, true);
  r.iterate(t, true);
  EXPECT_EQ(t.get_scale(), 3.0);
}

TEST(GradScaler, ErrorAtMinScaleWhenAsked) {
  GradScaler s({.init_scale = 2.0, .min_scale = 1.0, .error_at_min_scale = true});
  Rig r;
  r.iterate(s, true);
  EXPECT_EQ(s.get_scale(), 1.0);
  try {
    r.iterate(s, true);
    ADD_FAILURE() << "no error at the min scale";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("minimum"), std::string::npos) << e.what();
  }
  // The update was completed before the error: the scaler is usable.
  EXPECT_EQ(s.min_scale_overflows(), 1);
  EXPECT_FALSE(r.iterate(s, false));
}

TEST(GradScaler, NoGrowthPastFp32) {
  GradScaler s({.init_scale = 2e38, .growth_interval = 1, .max_scale = 1e300});
  Rig r;
  r.p.set_grad(Tensor::from_vector(std::vector<double>{0.5, 1.0}, Shape{2}));
  s.step(r.opt);
  s.update();
  EXPECT_EQ(s.get_scale(), double(float(2e38)));  // 4e38 is inf in fp32
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, StaticModeKeepsTheScaleButSkips) {
  GradScaler s({.init_scale = 128.0, .growth_interval = 1, .mode = ScaleMode::Static});
  Rig r;
  EXPECT_FALSE(r.iterate(s, false));
  EXPECT_FALSE(r.iterate(s, false));
  EXPECT_EQ(s.get_scale(), 128.0);
  const std::vector<float> before = r.p.to_vector<float>();
  EXPECT_TRUE(r.iterate(s, true));
  EXPECT_EQ(r.p.to_vector<float>(), before);
  EXPECT_EQ(s.get_scale(), 128.0);
  EXPECT_TRUE(s.found_inf());
}

TEST(GradScaler, DisabledModeIsPlainTraining) {
  GradScaler s({.mode = ScaleMode::Disabled});
  EXPECT_EQ(s.get_scale(), 1.0);
  Tensor loss = Tensor::scalar(3.0);
  EXPECT_TRUE(s.scale(loss).is_same(loss));
  Rig r;
  r.p.set_grad(Tensor::from_vector(std::vector<double>{1.0, 2.0}, Shape{2}));
  const int64_t calls = backend::cpu::unscale_calls();
  s.unscale_(r.opt);
  s.unscale_(r.opt);  // no-op, no error
  EXPECT_FALSE(s.step(r.opt).skipped());
  s.update();
  EXPECT_EQ(backend::cpu::unscale_calls(), calls);
  EXPECT_EQ(r.p.to_vector<float>(), (std::vector<float>{0.875f, -2.25f}));
  EXPECT_TRUE(s.state_dict().empty());
}

TEST(GradScaler, MisuseIsRefusedWithAMessage) {
  GradScaler s;
  Rig r;
  r.p.set_grad(Tensor::ones(Shape{2}));
  EXPECT_THROW(s.update(), Error);  // nothing recorded
  s.unscale_(r.opt);
  try {
    s.unscale_(r.opt);
    ADD_FAILURE() << "a second unscale_ was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already been called"), std::string::npos) << e.what();
  }
  s.step(r.opt);
  EXPECT_THROW(s.step(r.opt), Error);
  EXPECT_THROW(s.unscale_(r.opt), Error);
  s.update();
  s.unscale_(r.opt);  // a new iteration
  s.step(r.opt);
  s.update();
  EXPECT_THROW(GradScaler({.growth_factor = 1.0}), Error);
  EXPECT_THROW(GradScaler({.backoff_factor = 1.0}), Error);
  EXPECT_THROW(GradScaler({.growth_interval = 0}), Error);
  EXPECT_THROW(GradScaler({.hysteresis = 0}), Error);
  EXPECT_THROW(GradScaler({.init_scale = 0.5}), Error);  // below min_scale 1
  EXPECT_THROW(GradScaler({.min_scale = 4.0, .max_scale = 2.0}), Error);
}

TEST(GradScaler, UnscaleThenClipActsOnTrueGradients) {
  GradScaler s({.init_scale = 4096.0});
  Rig r;
  // True gradient (3, 4): norm 5, clipped to norm 1 -> (0.6, 0.8).
  r.p.set_grad(Tensor::from_vector(std::vector<double>{3.0 * 4096, 4.0 * 4096}, Shape{2}));
  s.unscale_(r.opt);
  EXPECT_EQ(r.p.grad().to_vector<float>(), (std::vector<float>{3.0f, 4.0f}));
  EXPECT_NEAR(optim::clip_grad_norm({r.p}, 1.0).item(), 5.0, 1e-6);
  const std::vector<float> g = r.p.grad().to_vector<float>();
  EXPECT_NEAR(g[0], 0.6, 1e-6);
  EXPECT_NEAR(g[1], 0.8, 1e-6);
  const int64_t calls = backend::cpu::unscale_calls();
  EXPECT_FALSE(s.step(r.opt).skipped());  // no second unscale
  EXPECT_EQ(backend::cpu::unscale_calls(), calls);
  s.update();
  // Clipping an overflowing gradient cannot hide it: unscale_ recorded it.
  r.p.set_grad(Tensor::from_vector(std::vector<double>{kInf, 1.0}, Shape{2}));
  s.unscale_(r.opt);
  optim::clip_grad_norm({r.p}, 1.0);
  EXPECT_TRUE(s.step(r.opt).skipped());
}

TEST(GradScaler, SeveralOptimizersKeepTheirOwnFlagsCombinedAtUpdate) {
  GradScaler s({.init_scale = 256.0, .growth_interval = 2});
  Rig a, b;
  a.p.set_grad(Tensor::from_vector(std::vector<double>{kNaN, 1.0}, Shape{2}));
  b.p.set_grad(Tensor::from_vector(std::vector<double>{256.0, 512.0}, Shape{2}));
  const std::vector<float> a_before = a.p.to_vector<float>();
  EXPECT_TRUE(s.step(a.opt).skipped());
  EXPECT_FALSE(s.step(b.opt).skipped());  // b's own gradients are finite: it steps (PyTorch)
  EXPECT_EQ(a.p.to_vector<float>(), a_before);
  EXPECT_EQ(b.p.to_vector<float>(), (std::vector<float>{0.875f, -2.25f}));
  EXPECT_TRUE(s.found_inf());
  s.update();
  EXPECT_EQ(s.get_scale(), 128.0);  // one overflow anywhere backs off
  // Both clean for two iterations: growth.
  for (int i = 0; i < 2; ++i) {
    a.p.set_grad(Tensor::ones(Shape{2}));
    b.p.set_grad(Tensor::ones(Shape{2}));
    EXPECT_FALSE(s.step(a.opt).skipped());
    EXPECT_FALSE(s.step(b.opt).skipped());
    s.update();
  }
  EXPECT_EQ(s.get_scale(), 256.0);
}

TEST(GradScaler, SeveralLossesAndAccumulationShareOneScale) {
  GradScaler s({.init_scale = 1024.0, .growth_interval = 1});
  Tensor w = Tensor::from_vector(std::vector<double>{2.0, -1.0}, Shape{2}).set_requires_grad();
  optim::SGD opt({w}, {.lr = 0.5});
  // Two losses, and two micro-batches each: 4 backward passes, one step.
  for (int micro = 0; micro < 2; ++micro) {
    EXPECT_EQ(s.get_scale(), 1024.0);    // constant between update() calls
    s.scale(sum(mul(w, w))).backward();  // grad 2w
    s.scale(sum(w)).backward();          // grad 1
  }
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{10.0f * 1024, -2.0f * 1024}));
  EXPECT_FALSE(s.step(opt).skipped());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{10.0f, -2.0f}));
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{-3.0f, 0.0f}));
  s.update();
  EXPECT_EQ(s.get_scale(), 2048.0);
}

TEST(GradScaler, OneFusedUnscalePerOptimizerWhateverItsParameters) {
  Tensor a = Tensor::ones(Shape{3000}, DType::F32).set_requires_grad();
  Tensor b = Tensor::ones(Shape{17}, DType::BF16).set_requires_grad();
  Tensor c = Tensor::ones(Shape{40000}, DType::F16).set_requires_grad();
  Tensor d = Tensor::ones(Shape{5}).set_requires_grad();  // no gradient: skipped
  optim::AdamW opt({a, b, c, d});
  a.set_grad(Tensor::full(Shape{3000}, 64.0));
  b.set_grad(Tensor::full(Shape{17}, 64.0, DType::BF16));
  c.set_grad(Tensor::full(Shape{40000}, 64.0, DType::F16));
  GradScaler s({.init_scale = 64.0});
  const int64_t calls = backend::cpu::unscale_calls();
  EXPECT_FALSE(s.step(opt).skipped());
  EXPECT_EQ(backend::cpu::unscale_calls(), calls + 1);
  EXPECT_EQ(b.grad().to_vector<float>()[5], 1.0f);
  EXPECT_EQ(c.grad().to_vector<float>()[39999], 1.0f);
  EXPECT_FALSE(d.grad().defined());
  s.update();
}

// ---- state dict --------------------------------------------------------------------------------

TEST(GradScaler, StateDictRoundTripsThroughACheckpoint) {
  const GradScalerOptions o{.init_scale = 1024.0, .growth_interval = 3, .hysteresis = 2};
  GradScaler s(o);
  Rig r;
  for (bool overflow : {false, true, true, false, false, true})
    r.iterate(s, overflow);
  const auto path = std::filesystem::temp_directory_path() /
                    ("mantissa_scaler_" + std::to_string(getpid()) + ".safetensors");
  NamedTensors dict = s.state_dict();
  NamedTensors named;
  for (const auto& [k, t] : dict)
    named.emplace_back("scaler." + k, t);
  save_safetensors(path.string(), named);
  SafetensorsFile file = load_safetensors(path.string());
  std::filesystem::remove(path);
  NamedTensors back;
  for (const auto& [k, t] : file.tensors)
    back.emplace_back(k.substr(7), t);

  GradScaler t(GradScalerOptions{.growth_interval = 1000});
  t.load_state_dict(back);
  EXPECT_EQ(t.get_scale(), s.get_scale());
  EXPECT_EQ(t.growth_tracker(), s.growth_tracker());
  EXPECT_EQ(t.hysteresis_tracker(), s.hysteresis_tracker());
  EXPECT_EQ(t.skipped_steps(), s.skipped_steps());
  EXPECT_EQ(t.options().growth_interval, 3);  // from the dict, as PyTorch
  // Both continue identically (hysteresis is an option: same in both).
  GradScaler u(o);
  u.load_state_dict(back);
  Rig r2;
  for (bool overflow : {true, false, false, false, true, true, false}) {
    r.iterate(s, overflow);
    r2.iterate(u, overflow);
    EXPECT_EQ(u.get_scale(), s.get_scale());
    EXPECT_EQ(u.growth_tracker(), s.growth_tracker());
    EXPECT_EQ(u.hysteresis_tracker(), s.hysteresis_tracker());
  }
}

TEST(GradScaler, LoadStateDictIsStrictAndAtomic) {
  GradScaler s({.init_scale = 512.0});
  const NamedTensors good = s.state_dict();
  GradScaler t({.init_scale = 8.0});
  EXPECT_THROW(t.load_state_dict({}), Error);
  NamedTensors missing(good.begin() + 1, good.end());
  EXPECT_THROW(t.load_state_dict(missing), Error);
  NamedTensors extra = good;
  extra.emplace_back("bogus", Tensor::scalar(1.0, DType::F64));
  EXPECT_THROW(t.load_state_dict(extra), Error);
  NamedTensors wrong_dtype = good;
  wrong_dtype[0].second = Tensor::scalar(512.0, DType::F32);
  EXPECT_THROW(t.load_state_dict(wrong_dtype), Error);
  NamedTensors bad_scale = good;
  bad_scale[0].second = Tensor::scalar(-1.0, DType::F64);
  EXPECT_THROW(t.load_state_dict(bad_scale), Error);
  EXPECT_EQ(t.get_scale(), 8.0);  // nothing changed
  t.load_state_dict(good);
  EXPECT_EQ(t.get_scale(), 512.0);
}

// ---- fault injection in a training loop --------------------------------------------------------

// Least squares y = X w* on 16 samples; w has 4 elements. A poisoned gradient at step k.
struct Regression {
  Tensor x = Tensor::uniform(Shape{16, 4}, -1.0, 1.0, 11);
  Tensor y = matmul(x, Tensor::from_vector(std::vector<double>{0.5, -1.0, 2.0, 0.25}, Shape{4, 1}));
  Tensor w = Tensor::zeros(Shape{4, 1}).set_requires_grad();

  double loss_value() { return mean(square(sub(matmul(x, w), y))).item(); }
};

void train_with_fault(optim::Optimizer& opt, Regression& m, double poison, int steps,
                      double lr_expect_loss) {
  GradScaler s({.init_scale = 65536.0, .growth_interval = 5});
  const int k = 7;
  int64_t skipped = 0;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    s.scale(mean(square(sub(matmul(m.x, m.w), m.y)))).backward();
    if (i == k) static_cast<float*>(m.w.grad().data_ptr())[2] = float(poison);
    const std::vector<unsigned char> w_before = bytes_of(m.w);
    const NamedTensors state_before = opt.state_dict();
    const double scale_before = s.get_scale();
    const bool was_skipped = s.step(opt).skipped();
    s.update();
    EXPECT_EQ(was_skipped, i == k) << "step " << i;
    if (was_skipped) {
      ++skipped;
      EXPECT_EQ(bytes_of(m.w), w_before);
      const NamedTensors state_after = opt.state_dict();
      ASSERT_EQ(state_after.size(), state_before.size());
      for (size_t j = 0; j < state_after.size(); ++j) {
        EXPECT_EQ(state_after[j].first, state_before[j].first);
        EXPECT_EQ(bytes_of(state_after[j].second), bytes_of(state_before[j].second))
            << state_after[j].first;
      }
      EXPECT_EQ(s.get_scale(), scale_before / 2);
    }
  }
  EXPECT_EQ(skipped, 1);
  EXPECT_EQ(opt.step_count(), steps - 1);
  EXPECT_LT(m.loss_value(), lr_expect_loss);
}

TEST(FaultInjection, SgdMomentumSkipsThePoisonedStepAndConverges) {
  for (double poison : {kInf, -kInf, kNaN}) {
    Regression m;
    optim::SGD opt({m.w}, {.lr = 0.1, .momentum = 0.9});
    const double start = m.loss_value();
    train_with_fault(opt, m, poison, 200, 1e-6 * start + 1e-8);
  }
}

TEST(FaultInjection, AdamWSkipsThePoisonedStepAndConverges) {
  for (double poison : {kInf, kNaN}) {
    Regression m;
    optim::AdamW opt({m.w}, {.lr = 0.05, .weight_decay = 0.0});
    train_with_fault(opt, m, poison, 400, 1e-4);
  }
}

// ---- PyTorch's trajectory ----------------------------------------------------------------------

TEST(GoldenTrajectory, MatchesTorchAmpGradScaler) {
  const std::string path = std::string(MANTISSA_GOLDEN_DIR) + "/grad_scaler_trajectory.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing " << path << " (tools/reference/make_scaler_golden.py)";
  const nlohmann::json g = nlohmann::json::parse(in);
  GradScaler s({.init_scale = g["init_scale"].get<double>(),
                .growth_factor = g["growth_factor"].get<double>(),
                .backoff_factor = g["backoff_factor"].get<double>(),
                .growth_interval = g["growth_interval"].get<int64_t>()});
  const double lr = g["lr"].get<double>();
  Tensor a = Tensor::from_vector(g["a0"].get<std::vector<double>>(), Shape{5}).set_requires_grad();
  Tensor b = Tensor::from_vector(g["b0"].get<std::vector<double>>(), Shape{3}).set_requires_grad();
  optim::SGD opt_a({a}, {.lr = lr});
  optim::SGD opt_b({b}, {.lr = lr});
  size_t k = 0;
  for (const nlohmann::json& st : g["steps"]) {
    SCOPED_TRACE("step " + std::to_string(k++) + " " + st["event"].get<std::string>());
    const double S = s.get_scale();
    std::vector<double> ga = st["grad_a"].get<std::vector<double>>();
    std::vector<double> gb = st["grad_b"].get<std::vector<double>>();
    for (double& v : ga)
      v *= S;
    for (double& v : gb)
      v *= S;
    const std::string ev = st["event"].get<std::string>();
    const size_t pa = st["pos_a"].get<size_t>(), pb = st["pos_b"].get<size_t>();
    auto poison = [](const std::string& kind) {
      return kind == "inf" ? kInf : kind == "ninf" ? -kInf : kNaN;
    };
    if (ev == "both") {
      ga[pa] = kNaN;
      gb[pb] = kInf;
    } else if (ev != "clean") {
      const std::string kind = ev.substr(0, ev.find('_'));
      (ev.back() == 'a' ? ga[pa] : gb[pb]) = poison(kind);
    }
    a.set_grad(Tensor::from_vector(ga, Shape{5}));
    b.set_grad(Tensor::from_vector(gb, Shape{3}));
    if (st["unscale_first"].get<bool>()) s.unscale_(opt_a);
    EXPECT_EQ(s.step(opt_a).skipped(), st["skipped_a"].get<bool>());
    EXPECT_EQ(s.step(opt_b).skipped(), st["skipped_b"].get<bool>());
    EXPECT_EQ(s.found_inf(), st["found_inf"].get<bool>());
    if (st["new_scale"].is_null()) {
      s.update();
    } else {
      s.update(st["new_scale"].get<double>());
    }
    EXPECT_EQ(s.get_scale(), st["scale"].get<double>());
    EXPECT_EQ(s.growth_tracker(), st["growth_tracker"].get<int64_t>());
    const std::vector<float> wa = a.to_vector<float>(), wb = b.to_vector<float>();
    const std::vector<double> ea = st["a"].get<std::vector<double>>();
    const std::vector<double> eb = st["b"].get<std::vector<double>>();
    for (size_t i = 0; i < ea.size(); ++i)
      EXPECT_EQ(double(wa[i]), ea[i]) << "a[" << i << "]";
    for (size_t i = 0; i < eb.size(); ++i)
      EXPECT_EQ(double(wb[i]), eb[i]) << "b[" << i << "]";
  }
  EXPECT_EQ(k, 60u);
}

}  // namespace
}  // namespace mantissa::amp
