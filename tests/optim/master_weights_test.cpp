// Mixed precision in the optimizers: fp32 master weights (the master follows exactly the fp32
// trajectory, the parameter is its rounding), stochastic rounding on store (unbiased, seeded,
// reproducible, independent of threads and of which parameters have gradients), masters in the
// state dict, and the detection of parameters written behind the optimizer's back.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/round.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::optim {
namespace {

using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

std::unique_ptr<Optimizer> make_sgd(std::vector<Tensor> p) {
  SGDOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 1e-3;
  return std::make_unique<SGD>(std::move(p), o);
}

std::unique_ptr<Optimizer> make_adamw(std::vector<Tensor> p) {
  AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.05;
  return std::make_unique<AdamW>(std::move(p), o);
}

Tensor leaf(const Tensor& t) {
  Tensor x = t.detach().clone();
  x.set_requires_grad(true);
  return x;
}

// Gradient of step k for a parameter of `n` elements (fp32, deterministic).
Tensor grad_at(int k, int64_t n, uint64_t salt) {
  return Tensor::normal({n}, 0.0, 0.1, 1000 + 17 * uint64_t(k) + salt, DType::F32);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), size_t(x.nbytes())) == 0;
}

class MasterWeights : public ::testing::TestWithParam<std::pair<const char*, Factory>> {};

// The master of a bf16/f16 parameter follows the fp32 run bit for bit, and the parameter is the
// master rounded to nearest even after every step.
TEST_P(MasterWeights, MasterFollowsTheFp32TrajectoryExactly) {
  const Factory make = GetParam().second;
  for (DType half : {DType::BF16, DType::F16}) {
    const int64_t n = 5000;
    const Tensor init = Tensor::normal({n}, 0.0, 0.5, 7, DType::F32);
    Tensor p32 = leaf(init), p16 = leaf(init);
    auto opt32 = make({p32});
    auto opt16 = make({p16});
    opt16->set_master_weights(true);
    p16.set_data(p16.to(half));  // what Module::to does: the same handle, a new dtype
    for (int k = 0; k < 6; ++k) {
      const Tensor g = grad_at(k, n, 0);
      p32.set_grad(g.clone());
      p16.set_grad(g.clone());  // an fp32 gradient for a half parameter
      opt32->step();
      opt16->step();
      ASSERT_TRUE(same_bits(opt16->master(0), p32)) << dtype_name(half) << " step " << k;
      ASSERT_TRUE(same_bits(p16, p32.to(half))) << dtype_name(half) << " step " << k;
    }
    EXPECT_EQ(p16.dtype(), half);
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, MasterWeights,
                         ::testing::Values(std::make_pair("SGD", Factory(make_sgd)),
                                           std::make_pair("AdamW", Factory(make_adamw))),
                         [](const auto& param_info) {
                           return std::string(param_info.param.first);
                         });

TEST(MasterWeightsBasics, OnlyNarrowParametersKeepAMaster) {
  Tensor a = leaf(Tensor::ones({4}, DType::F32));
  Tensor b = leaf(Tensor::ones({4}, DType::F64));
  Tensor c = leaf(Tensor::ones({4}, DType::F32));
  SGD opt({a, b, c}, SGDOptions{});
  opt.set_master_weights(true);
  EXPECT_TRUE(opt.master_weights());
  EXPECT_TRUE(opt.master(0).defined());   // captured: a may still be cast
  EXPECT_FALSE(opt.master(1).defined());  // never for f64
  c.set_data(c.to(DType::BF16));
  for (Tensor& t : std::vector<Tensor>{a, b, c})
    t.set_grad(Tensor::ones({4}, t.dtype()));
  opt.step();
  EXPECT_FALSE(opt.master(0).defined());  // still f32: the master would duplicate it
  EXPECT_FALSE(opt.master(1).defined());
  ASSERT_TRUE(opt.master(2).defined());
  EXPECT_EQ(opt.master(2).dtype(), DType::F32);
  opt.set_master_weights(false);
  EXPECT_FALSE(opt.master(2).defined());
  EXPECT_THROW(opt.master(3), Error);
}

TEST(MasterWeightsBasics, CastAfterCaptureKeepsTheFp32Values) {
  // 1 + 2^-10 is not a bf16 value: the master must remember it across the cast.
  const float v = 1.0f + 0x1p-10f;
  Tensor p = leaf(Tensor::full({8}, v, DType::F32));
  SGD opt({p}, SGDOptions{});
  opt.set_lr(0);
  opt.set_master_weights(true);
  p.set_data(p.to(DType::BF16));
  p.set_grad(Tensor::zeros({8}, DType::F32));
  opt.step();
  EXPECT_EQ(opt.master(0).to_vector<float>(), std::vector<float>(8, v));
  EXPECT_EQ(p.to(DType::F32).to_vector<float>(), std::vector<float>(8, 1.0f));
}

TEST(MasterWeightsBasics, AParameterWrittenBehindTheOptimizerRestartsItsMaster) {
  Tensor p = leaf(Tensor::full({16}, 1.0, DType::F32));
  SGD opt({p}, SGDOptions{0.5});
  opt.set_master_weights(true);
  p.set_data(p.to(DType::BF16));
  p.set_grad(Tensor::full({16}, 0.001, DType::F32));
  opt.step();  // master 0.9995, parameter bf16(0.9995) = 1.0
  EXPECT_FLOAT_EQ(opt.master(0).to_vector<float>()[0], 1.0f - 0.0005f);
  {
    NoGrad ng;
    p.copy_(Tensor::full({16}, 3.0, DType::F32));  // e.g. a model load_state_dict
  }
  opt.step();  // the master restarts from 3 (not 0.9995 - 0.0005)
  EXPECT_FLOAT_EQ(opt.master(0).to_vector<float>()[0], 3.0f - 0.0005f);
  // A write of the master's own rounding is not a change: the master keeps its fp32 bits.
  const float kept = opt.master(0).to_vector<float>()[0];
  {
    NoGrad ng;
    p.copy_(p.clone());
  }
  p.set_grad(Tensor::zeros({16}, DType::F32));
  opt.step();
  EXPECT_EQ(opt.master(0).to_vector<float>()[0], kept);
}

// ---- stochastic rounding on store --------------------------------------------------------------

// SGD without momentum, lr * grad = 1e-4 on weights at 1.0: a bf16 ulp at 1 is 2^-7, so nearest
// rounding loses every update, stochastic rounding keeps them in expectation, a master keeps them
// exactly.
TEST(StochasticRounding, SmallUpdatesSurviveInExpectation) {
  const int64_t n = 1 << 16;
  const int steps = 20;
  auto run = [&](RoundingMode mode, bool master) {
    Tensor p = leaf(Tensor::ones({n}, DType::F32));
    SGD opt({p}, SGDOptions{1e-4});
    opt.set_master_weights(master);
    opt.set_store_rounding(mode, 42);
    p.set_data(p.to(DType::BF16));
    for (int k = 0; k < steps; ++k) {
      p.set_grad(Tensor::ones({n}, DType::F32));
      opt.step();
    }
    return p.to(DType::F64).to_vector<double>();
  };
  const double expected = 1.0 - steps * 1e-4;
  const std::vector<double> nearest = run(RoundingMode::NearestEven, false);
  EXPECT_EQ(nearest, std::vector<double>(size_t(n), 1.0));  // stuck

  const std::vector<double> sr = run(RoundingMode::Stochastic, false);
  double mean = 0;
  for (double v : sr)
    mean += v;
  mean /= double(n);
  // Each value is one of the neighbours of its running sum; the sum of n independent roundings
  // of steps draws has a standard deviation below sqrt(steps / n) * ulp.
  const double ulp = 0x1p-8;  // below 1 (the values fall under 1 after the first step)
  const double sigma = std::sqrt(double(steps) / double(n)) * ulp;
  EXPECT_NEAR(mean, expected, 5 * sigma);
  EXPECT_NE(sr, std::vector<double>(size_t(n), sr[0]));  // not all rounded the same way

  const std::vector<double> with_master = run(RoundingMode::NearestEven, true);
  EXPECT_NEAR(with_master[0], expected, 0x1p-9);  // the rounding of the exact master
}

TEST(StochasticRounding, SeededReproducibleAndFreshEveryStep) {
  const int threads_before = get_num_threads();
  auto run = [&](uint64_t seed, int threads, bool grad_for_first) {
    set_num_threads(threads);
    Tensor a = leaf(Tensor::normal({300}, 0, 1, 3, DType::F32));
    Tensor b = leaf(Tensor::normal({70000}, 0, 1, 4, DType::F32));
    AdamW opt({a, b}, AdamWOptions{});
    opt.set_store_rounding(RoundingMode::Stochastic, seed);
    a.set_data(a.to(DType::BF16));
    b.set_data(b.to(DType::BF16));
    std::vector<Tensor> history;
    for (int k = 0; k < 3; ++k) {
      if (grad_for_first) a.set_grad(grad_at(k, 300, 1));
      b.set_grad(grad_at(k, 70000, 2));
      opt.step();
      history.push_back(b.clone());
    }
    set_num_threads(threads_before);
    return history;
  };
  const auto base = run(5, 1, true);
  const auto again = run(5, 2, true);
  const auto without_a = run(5, 1, false);
  const auto other_seed = run(6, 1, true);
  for (size_t k = 0; k < base.size(); ++k) {
    EXPECT_TRUE(same_bits(base[k], again[k])) << "thread count changed step " << k;
    EXPECT_TRUE(same_bits(base[k], without_a[k])) << "another parameter changed step " << k;
    EXPECT_FALSE(same_bits(base[k], other_seed[k])) << "the seed is ignored at step " << k;
  }
}

TEST(StochasticRounding, StoresIntoFp32AreExact) {
  Tensor a = leaf(Tensor::normal({1000}, 0, 1, 3, DType::F32));
  Tensor b = leaf(a);
  SGD sr({a}, SGDOptions{0.1});
  SGD rne({b}, SGDOptions{0.1});
  sr.set_store_rounding(RoundingMode::Stochastic, 1);
  a.set_grad(grad_at(0, 1000, 0));
  b.set_grad(grad_at(0, 1000, 0));
  sr.step();
  rne.step();
  EXPECT_TRUE(same_bits(a, b));
}

// Truncation (the BFLOAT16 study's comparison): every stored value is the master's value rounded
// toward zero, element for element, through the fused AdamW step with masters.
TEST(TruncatedStores, EveryStoreIsTheMasterRoundedTowardZero) {
  const int64_t n = 70000;  // more than one chunk and one thread's share
  Tensor p = leaf(Tensor::normal({n}, 0, 1, 7, DType::F32));
  AdamW opt({p}, AdamWOptions{});
  opt.set_master_weights(true);
  opt.set_store_rounding(RoundingMode::TowardZero);
  p.set_data(p.to(DType::BF16));
  int64_t differs_from_nearest = 0;
  for (int k = 0; k < 3; ++k) {
    p.set_grad(grad_at(k, n, 5));
    opt.step();
    const std::vector<float> master = opt.master(0).to_vector<float>();
    const std::vector<double> stored = p.to(DType::F64).to_vector<double>();
    for (int64_t i = 0; i < n; ++i) {
      const float m = master[size_t(i)];
      const double want = double(round_to(Format::BF16, m, RoundingMode::TowardZero));
      ASSERT_EQ(stored[size_t(i)], want) << "element " << i << " step " << k << " master " << m;
      if (want != double(round_to(Format::BF16, m, RoundingMode::NearestEven)))
        ++differs_from_nearest;
    }
  }
  EXPECT_GT(differs_from_nearest, n / 2);  // about half of the values round differently
}

// ---- state dicts -------------------------------------------------------------------------------

TEST(MasterStateDict, MastersAreSavedAndResumeBitIdentically) {
  const int64_t n = 3000;
  const Tensor init = Tensor::normal({n}, 0, 0.5, 9, DType::F32);
  auto fresh = [&](Tensor& p) {
    p = leaf(init);
    auto opt = make_adamw({p});
    opt->set_master_weights(true);
    opt->set_store_rounding(RoundingMode::Stochastic, 3);
    p.set_data(p.to(DType::BF16));
    return opt;
  };
  Tensor p1, p2;
  auto straight = fresh(p1);
  auto resumed = fresh(p2);
  for (int k = 0; k < 4; ++k) {
    p1.set_grad(grad_at(k, n, 0));
    straight->step();
    if (k < 2) {
      p2.set_grad(grad_at(k, n, 0));
      resumed->step();
    }
  }
  const NamedTensors saved = resumed->state_dict();
  bool has_master = false;
  for (const auto& [key, t] : saved) {
    if (key == "master.0") {
      has_master = true;
      EXPECT_EQ(t.dtype(), DType::F32);
    }
  }
  EXPECT_TRUE(has_master);
  // A new optimizer (and a parameter restored from a model checkpoint) continues identically.
  Tensor p3 = leaf(init);
  auto again = make_adamw({p3});
  again->set_master_weights(true);
  again->set_store_rounding(RoundingMode::Stochastic, 3);
  p3.set_data(p2.detach().clone());
  again->load_state_dict(saved);
  for (int k = 2; k < 4; ++k) {
    p3.set_grad(grad_at(k, n, 0));
    again->step();
  }
  EXPECT_TRUE(same_bits(p3, p1));
  EXPECT_TRUE(same_bits(again->master(0), straight->master(0)));

  // Masters into an optimizer without master weights: refused, naming the key, nothing changed.
  Tensor p4 = leaf(init);
  auto plain = make_adamw({p4});
  try {
    plain->load_state_dict(saved);
    FAIL() << "masters accepted without master weights";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("master.0"), std::string::npos) << e.message();
  }
  EXPECT_EQ(plain->step_count(), 0);
}

}  // namespace
}  // namespace mantissa::optim
