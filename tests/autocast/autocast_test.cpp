// Autocast: every op of the policy table runs in the dtype its policy asks for, under fp16 and
// bf16 regions; f64/integer tensors and code outside regions are untouched; regions nest; the
// weight-cast cache casts each parameter once per region; gradients of fp32 parameters come back
// fp32; a model trains a step under bf16; fp16 refuses binary_cross_entropy.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"
#include "mantissa/nn/models.h"
#include "mantissa/nn/module.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using amp::Autocast;
using amp::CastPolicy;
using amp::OpId;

struct OpRunner {
  std::vector<Shape> shapes;  // the floating inputs
  std::function<Tensor(const std::vector<Tensor>&)> run;
};

// One way to call each op of the table (values in (0.1, 0.9): valid for log, rsqrt, bce, ...).
std::map<OpId, OpRunner> runners() {
  using V = const std::vector<Tensor>&;
  std::map<OpId, OpRunner> r;
  r[OpId::Matmul] = {{{3, 4}, {4, 5}}, [](V in) { return matmul(in[0], in[1]); }};
  r[OpId::Linear] = {{{3, 4}, {5, 4}, {5}}, [](V in) { return linear(in[0], in[1], in[2]); }};
  r[OpId::Conv2d] = {{{1, 2, 5, 5}, {3, 2, 3, 3}, {3}},
                     [](V in) { return conv2d(in[0], in[1], in[2]); }};
  r[OpId::ConvTranspose2d] = {
      {{1, 2, 4, 4}, {2, 3, 3, 3}, {3}},
      [](V in) { return conv_transpose2d(in[0], in[1], in[2], {.stride = {2}, .padding = {1}}); }};
  r[OpId::ScaledDotProductAttention] = {{{2, 3, 4}, {2, 3, 4}, {2, 3, 4}}, [](V in) {
                                          return scaled_dot_product_attention(in[0], in[1], in[2]);
                                        }};
  r[OpId::LstmSequence] = {{{3, 2, 8}, {8, 2}, {2, 2}, {2, 2}},
                           [](V in) { return lstm_sequence(in[0], in[1], in[2], in[3])[0]; }};
  r[OpId::Softmax] = {{{3, 4}}, [](V in) { return softmax(in[0], -1); }};
  r[OpId::LogSoftmax] = {{{3, 4}}, [](V in) { return log_softmax(in[0], -1); }};
  r[OpId::LayerNorm] = {{{3, 4}, {4}, {4}},
                        [](V in) { return layer_norm(in[0], {4}, in[1], in[2]); }};
  r[OpId::BatchNorm] = {{{4, 3}, {3}, {3}}, [](V in) {
                          return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true);
                        }};
  r[OpId::CrossEntropy] = {
      {{3, 4}}, [](V in) {
        const Tensor t = Tensor::from_vector(std::vector<int64_t>{0, 3, 1}, {3});
        return cross_entropy(in[0], t, {.reduction = Reduction::None});
      }};
  r[OpId::BinaryCrossEntropy] = {
      {{3, 4}, {3, 4}}, [](V in) { return binary_cross_entropy(in[0], in[1], Reduction::None); }};
  r[OpId::BinaryCrossEntropyWithLogits] = {
      {{3, 4}, {3, 4}},
      [](V in) { return binary_cross_entropy_with_logits(in[0], in[1], Reduction::None); }};
  r[OpId::Exp] = {{{3, 4}}, [](V in) { return exp(in[0]); }};
  r[OpId::Log] = {{{3, 4}}, [](V in) { return log(in[0]); }};
  r[OpId::Pow] = {{{3, 4}, {3, 4}}, [](V in) { return pow(in[0], in[1]); }};
  r[OpId::Rsqrt] = {{{3, 4}}, [](V in) { return rsqrt(in[0]); }};
  r[OpId::Reciprocal] = {{{3, 4}}, [](V in) { return reciprocal(in[0]); }};
  r[OpId::Sum] = {{{3, 4}}, [](V in) { return sum(in[0], {0}); }};
  r[OpId::Mean] = {{{3, 4}}, [](V in) { return mean(in[0], {1}); }};
  r[OpId::Var] = {{{3, 4}}, [](V in) { return var(in[0], {1}); }};
  r[OpId::Add] = {{{3, 4}, {4}}, [](V in) { return add(in[0], in[1]); }};
  r[OpId::Sub] = {{{3, 4}, {4}}, [](V in) { return sub(in[0], in[1]); }};
  r[OpId::Mul] = {{{3, 4}, {4}}, [](V in) { return mul(in[0], in[1]); }};
  r[OpId::Div] = {{{3, 4}, {4}}, [](V in) { return div(in[0], in[1]); }};
  r[OpId::Maximum] = {{{3, 4}, {4}}, [](V in) { return maximum(in[0], in[1]); }};
  r[OpId::Minimum] = {{{3, 4}, {4}}, [](V in) { return minimum(in[0], in[1]); }};
  r[OpId::Where] = {{{3, 4}, {3, 4}}, [](V in) {
                      const Tensor c =
                          gt(Tensor::arange(4, DType::I64), Tensor::scalar(1, DType::I64));
                      return where(c, in[0], in[1]);
                    }};
  r[OpId::Cat] = {{{3, 4}, {2, 4}}, [](V in) { return cat({in[0], in[1]}); }};
  r[OpId::Stack] = {{{3, 4}, {3, 4}}, [](V in) { return stack({in[0], in[1]}); }};
  return r;
}

std::vector<OpId> all_ops() {
  std::vector<OpId> ops;
  for (int i = 0; i < amp::kNumAutocastOps; ++i)
    ops.push_back(OpId(i));
  return ops;
}

// Inputs for `runner` in the given dtypes (one per input; the last repeats).
std::vector<Tensor> inputs(const OpRunner& runner, const std::vector<DType>& dtypes,
                           bool requires_grad = false) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < runner.shapes.size(); ++i) {
    const DType d = dtypes[std::min(i, dtypes.size() - 1)];
    Tensor t = Tensor::uniform(runner.shapes[i], 0.1, 0.9, 100 + i, d);
    if (requires_grad && is_floating(d)) t.set_requires_grad(true);
    in.push_back(t);
  }
  return in;
}

std::string name(OpId op) {
  return std::string(amp::op_name(op));
}

// ---- the table ---------------------------------------------------------------------------------

TEST(AutocastTable, EveryOpHasARowANameAndARunnerHere) {
  const auto r = runners();
  std::set<std::string> names;
  for (OpId op : all_ops()) {
    EXPECT_EQ(amp::policy_entry(op).op, op);
    EXPECT_TRUE(names.insert(name(op)).second) << name(op) << " appears twice";
    EXPECT_TRUE(r.count(op)) << name(op) << " has no runner in this test";
  }
}

TEST(AutocastTable, PolicyFamiliesFollowPyTorch) {
  for (OpId op : {OpId::Matmul, OpId::Linear, OpId::Conv2d, OpId::ScaledDotProductAttention,
                  OpId::LstmSequence})
    EXPECT_EQ(amp::policy_of(op), CastPolicy::LowerPrecision) << name(op);
  for (OpId op : {OpId::Softmax, OpId::LogSoftmax, OpId::LayerNorm, OpId::CrossEntropy,
                  OpId::BinaryCrossEntropyWithLogits, OpId::Exp, OpId::Log, OpId::Pow, OpId::Rsqrt,
                  OpId::Sum, OpId::Mean, OpId::Var})
    EXPECT_EQ(amp::policy_of(op), CastPolicy::Fp32) << name(op);
  for (OpId op : {OpId::Add, OpId::Sub, OpId::Mul, OpId::Div, OpId::Where, OpId::Cat, OpId::Stack})
    EXPECT_EQ(amp::policy_of(op), CastPolicy::Promote) << name(op);
  EXPECT_EQ(amp::policy_of(OpId::BatchNorm), CastPolicy::None);  // listed nowhere in PyTorch
  EXPECT_EQ(amp::policy_entry(OpId::BinaryCrossEntropy).fp16, amp::Fp16Rule::Banned);
  EXPECT_EQ(amp::policy_name(CastPolicy::LowerPrecision), "lower_precision");
}

// ---- every op follows its policy ---------------------------------------------------------------

class AutocastPolicy : public ::testing::TestWithParam<DType> {};

TEST_P(AutocastPolicy, OutputDtypeOfEveryOpMatchesItsPolicy) {
  const DType low = GetParam();
  const DType other_half = low == DType::BF16 ? DType::F16 : DType::BF16;
  const auto r = runners();
  Autocast ac(DeviceType::CPU, low);
  for (OpId op : all_ops()) {
    SCOPED_TRACE(name(op) + " under " + std::string(dtype_name(low)));
    const OpRunner& run = r.at(op);
    if (op == OpId::BinaryCrossEntropy && low == DType::F16) {
      EXPECT_THROW(run.run(inputs(run, {DType::F32})), Error);
      continue;
    }
    switch (amp::policy_of(op)) {
      case CastPolicy::LowerPrecision:
        EXPECT_EQ(run.run(inputs(run, {DType::F32})).dtype(), low);
        EXPECT_EQ(run.run(inputs(run, {other_half})).dtype(), low);
        EXPECT_EQ(run.run(inputs(run, {low})).dtype(), low);
        break;
      case CastPolicy::Fp32:
        EXPECT_EQ(run.run(inputs(run, {low})).dtype(), DType::F32);
        EXPECT_EQ(run.run(inputs(run, {DType::F32})).dtype(), DType::F32);
        break;
      case CastPolicy::Promote:
        EXPECT_EQ(run.run(inputs(run, {low})).dtype(), low);  // nothing to promote
        EXPECT_EQ(run.run(inputs(run, {low, DType::F32})).dtype(), DType::F32);
        EXPECT_EQ(run.run(inputs(run, {DType::F32, low})).dtype(), DType::F32);
        EXPECT_EQ(run.run(inputs(run, {low, other_half})).dtype(), DType::F32);
        break;
      case CastPolicy::None:
        EXPECT_EQ(run.run(inputs(run, {DType::F32})).dtype(), DType::F32);
        EXPECT_EQ(run.run(inputs(run, {low})).dtype(), low);
        EXPECT_EQ(run.run(inputs(run, {low, DType::F32})).dtype(), low);  // a conv's output
        break;
    }
    // f64 is never cast, whatever the policy.
    EXPECT_EQ(run.run(inputs(run, {DType::F64})).dtype(), DType::F64);
  }
}

TEST_P(AutocastPolicy, IntegerTensorsAreNeverCast) {
  Autocast ac(DeviceType::CPU, GetParam());
  const Tensor i = Tensor::arange(6, DType::I64).reshape({2, 3});
  EXPECT_EQ(add(i, i).dtype(), DType::I64);
  EXPECT_EQ(mul(i, i).dtype(), DType::I64);
  EXPECT_EQ(sum(i, {0}).dtype(), DType::I64);
  EXPECT_EQ(cat({i, i}).dtype(), DType::I64);
  // An integer tensor with a floating one takes the floating dtype (the ops' own rule).
  EXPECT_EQ(add(i, Tensor::ones({2, 3}, GetParam())).dtype(), GetParam());
}

TEST_P(AutocastPolicy, GradientsFlowBackInEachInputsDtype) {
  const DType low = GetParam();
  const auto r = runners();
  for (OpId op : all_ops()) {
    if (op == OpId::BinaryCrossEntropy && low == DType::F16) continue;
    SCOPED_TRACE(name(op));
    const OpRunner& run = r.at(op);
    for (DType d : {DType::F32, low}) {
      std::vector<Tensor> in = inputs(run, {d}, /*requires_grad=*/true);
      Tensor out;
      {
        Autocast ac(DeviceType::CPU, low);
        out = run.run(in);
      }
      sum(out.to(DType::F32)).backward();
      for (const Tensor& t : in) {
        ASSERT_TRUE(t.grad().defined());
        EXPECT_EQ(t.grad().dtype(), d);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HalfTypes, AutocastPolicy, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& p) { return std::string(dtype_name(p.param)); });

// ---- regions -----------------------------------------------------------------------------------

TEST(AutocastRegion, OutsideAnyRegionNothingChanges) {
  EXPECT_FALSE(amp::autocast_active());
  EXPECT_EQ(amp::autocast_nesting(), 0);
  const auto r = runners();
  for (OpId op : all_ops()) {
    SCOPED_TRACE(name(op));
    const OpRunner& run = r.at(op);
    const Tensor before = run.run(inputs(run, {DType::F32}));
    EXPECT_EQ(before.dtype(), DType::F32);
    { Autocast ac(DeviceType::CPU, DType::BF16); }
    const Tensor after = run.run(inputs(run, {DType::F32}));
    EXPECT_EQ(after.to_vector<double>(), before.to_vector<double>());  // bit for bit
  }
  // Half inputs of fp32-policy ops stay half outside (softmax of bf16 gives bf16).
  const Tensor h = Tensor::uniform({2, 3}, 0, 1, 1, DType::BF16);
  EXPECT_EQ(softmax(h, -1).dtype(), DType::BF16);
  EXPECT_EQ(exp(h).dtype(), DType::BF16);
  EXPECT_EQ(sum(h, {0}).dtype(), DType::BF16);
}

TEST(AutocastRegion, NestingChangesAndRestoresTheDtypeAndDisabling) {
  const Tensor a = Tensor::ones({2, 2}), b = Tensor::ones({2, 2});
  {
    Autocast outer(DeviceType::CPU, DType::BF16);
    EXPECT_EQ(matmul(a, b).dtype(), DType::BF16);
    EXPECT_EQ(amp::autocast_nesting(), 1);
    {
      Autocast inner(DeviceType::CPU, DType::F16);
      EXPECT_EQ(matmul(a, b).dtype(), DType::F16);
      EXPECT_EQ(amp::autocast_dtype(DeviceType::CPU), DType::F16);
      {
        Autocast off(DeviceType::CPU, DType::BF16, false);
        EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU));
        EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
        EXPECT_EQ(amp::autocast_nesting(), 3);
        {
          Autocast back_on(Device::cpu(), DType::BF16);
          EXPECT_EQ(matmul(a, b).dtype(), DType::BF16);
        }
        EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
      }
      EXPECT_EQ(matmul(a, b).dtype(), DType::F16);
      {
        amp::NoAutocast none;
        EXPECT_FALSE(amp::autocast_active());
        EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
      }
      EXPECT_EQ(matmul(a, b).dtype(), DType::F16);
    }
    EXPECT_EQ(matmul(a, b).dtype(), DType::BF16);
  }
  EXPECT_FALSE(amp::autocast_active());
  EXPECT_EQ(matmul(a, b).dtype(), DType::F32);
}

TEST(AutocastRegion, PoliciesApplyOnlyToTheRegionsDeviceType) {
  Autocast cuda(DeviceType::CUDA, DType::F16);
  EXPECT_TRUE(amp::is_autocast_enabled(DeviceType::CUDA));
  EXPECT_FALSE(amp::is_autocast_enabled(DeviceType::CPU));
  const Tensor a = Tensor::ones({2, 2});
  EXPECT_EQ(matmul(a, a).dtype(), DType::F32);  // CPU tensors: untouched
  EXPECT_EQ(softmax(a.to(DType::BF16), 0).dtype(), DType::BF16);
}

// The trap: Autocast defaulted to the CPU, so `Autocast ac;` around a GPU model did nothing.
// The device type is now required, and a region that only meets another device's tensors says so.
static_assert(!std::is_default_constructible_v<Autocast>, "a region names its device");
static_assert(!std::is_constructible_v<Autocast, DType>, "a dtype alone is not a region");

// The autocast region's warnings (others, such as a CPU without bf16 kernels saying so once, are
// not these tests' subject).
struct WarningCapture {
  std::vector<std::pair<std::string, std::string>> got;
  WarningHandler prev;
  bool prev_check = amp::autocast_region_check();
  WarningCapture() {
    reset_warnings();
    amp::set_autocast_region_check(true);
    prev = set_warning_handler([this](std::string_view key, const std::string& message) {
      if (key.starts_with("autocast:")) got.emplace_back(std::string(key), message);
    });
  }
  ~WarningCapture() {
    set_warning_handler(prev);
    amp::set_autocast_region_check(prev_check);
    reset_warnings();
  }
};

TEST(AutocastRegion, ARegionThatNeverMeetsItsDeviceSaysSo) {
  const Tensor a = Tensor::ones({2, 2});
  {
    WarningCapture w;
    {
      Autocast cuda(DeviceType::CUDA);  // around CPU tensors: nothing is autocast
      EXPECT_EQ(amp::autocast_dtype(DeviceType::CUDA), DType::F16) << "CUDA's default dtype";
      EXPECT_EQ(matmul(a, a).dtype(), DType::F32);
    }
    ASSERT_EQ(w.got.size(), 1u);
    EXPECT_EQ(w.got[0].first, "autocast:device:cuda:0");
    EXPECT_NE(w.got[0].second.find("without meeting a cuda:0 tensor"), std::string::npos)
        << w.got[0].second;
    EXPECT_NE(w.got[0].second.find("Autocast(x.device()"), std::string::npos);
    EXPECT_EQ(warning_count("autocast:device:cuda:0"), 1);
  }
  {
    WarningCapture w;
    {
      Autocast cpu(DeviceType::CPU);  // the right device: no warning, bf16 by default
      EXPECT_EQ(matmul(a, a).dtype(), DType::BF16);
    }
    { Autocast cuda(DeviceType::CUDA); }                    // no op at all: nothing to say
    { Autocast off(DeviceType::CUDA, DType::F16, false); }  // a disabled region neither
    {
      Autocast cuda(DeviceType::CUDA);
      NoGrad ng;
      (void)add(a, a);  // not under any policy of the region's device: still counted as met
    }
    EXPECT_EQ(w.got.size(), 1u) << "only the last region met ops, all on the CPU";
  }
  {
    WarningCapture w;
    amp::set_autocast_region_check(false);
    {
      Autocast cuda(DeviceType::CUDA);
      (void)matmul(a, a);
    }
    EXPECT_TRUE(w.got.empty()) << "the check is off";
  }
}

TEST(AutocastRegion, RejectsANonHalfDtypeWithAHint) {
  try {
    Autocast ac(DeviceType::CPU, DType::F32);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16 or bf16"), std::string::npos) << e.what();
  }
  EXPECT_EQ(amp::autocast_nesting(), 0);
  Autocast disabled(DeviceType::CPU, DType::F32, false);  // a disabled region takes any dtype
  EXPECT_FALSE(amp::autocast_active());
}

TEST(AutocastRegion, StateIsPerThread) {
  Autocast ac(DeviceType::CPU, DType::BF16);
  DType seen = DType::Bool;
  std::thread t([&] { seen = matmul(Tensor::ones({2, 2}), Tensor::ones({2, 2})).dtype(); });
  t.join();
  EXPECT_EQ(seen, DType::F32);
}

// ---- the cast cache ----------------------------------------------------------------------------

TEST(AutocastCache, EachParameterIsCastOncePerRegionAndFreedAtItsEnd) {
  Tensor w = Tensor::uniform({8, 16}, -1, 1, 1).set_requires_grad(true);
  Tensor b = Tensor::uniform({8}, -1, 1, 2).set_requires_grad(true);
  const Tensor x = Tensor::uniform({4, 16}, -1, 1, 3);  // an activation: never cached
  amp::clear_cast_cache();
  amp::reset_cast_cache_stats();
  {
    Autocast ac(DeviceType::CPU, DType::BF16);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(linear(x, w, b).dtype(), DType::BF16);
    amp::CastCacheStats s = amp::cast_cache_stats();
    EXPECT_EQ(s.casts, 2);  // w and b, once each
    EXPECT_EQ(s.hits, 4);
    EXPECT_EQ(s.entries, 2);
    EXPECT_EQ(s.bytes, (8 * 16 + 8) * 2);
    {
      // A nested region shares the outermost region's cache.
      Autocast inner(DeviceType::CPU, DType::BF16);
      (void)linear(x, w, b);
      EXPECT_EQ(amp::cast_cache_stats().casts, 2);
    }
    EXPECT_EQ(amp::cast_cache_stats().entries, 2);  // not freed by the inner region's end
    // An in-place update (an optimizer step) makes a fresh copy.
    {
      NoGrad ng;
      w.mul_(0.5);
    }
    (void)linear(x, w, b);
    s = amp::cast_cache_stats();
    EXPECT_EQ(s.casts, 3);
    EXPECT_EQ(s.entries, 2);
  }
  const amp::CastCacheStats after = amp::cast_cache_stats();
  EXPECT_EQ(after.entries, 0);
  EXPECT_EQ(after.bytes, 0);
  {
    Autocast ac(DeviceType::CPU, DType::BF16);
    (void)linear(x, w, b);
    EXPECT_EQ(amp::cast_cache_stats().casts, 5);  // a new region casts again
  }
  // Frozen weights (no grad) and fp16 weights are not parameters to cache.
  amp::reset_cast_cache_stats();
  {
    Autocast ac(DeviceType::CPU, DType::BF16);
    const Tensor frozen = Tensor::uniform({8, 16}, -1, 1, 4);
    (void)linear(x, frozen);
    (void)linear(x, frozen);
    EXPECT_EQ(amp::cast_cache_stats().casts, 0);
  }
}

TEST(AutocastCache, FreesTheCopiesMemory) {
  Tensor w = Tensor::uniform({256, 256}, -1, 1, 1).set_requires_grad(true);
  const Tensor x = Tensor::uniform({2, 256}, -1, 1, 3);
  const int64_t before = memory_stats(Device::cpu()).current_bytes;
  int64_t inside = 0;
  {
    Autocast ac(DeviceType::CPU, DType::BF16);
    const Tensor y = linear(x, w);
    inside = memory_stats(Device::cpu()).current_bytes;
  }
  EXPECT_GE(inside - before, 256 * 256 * 2);  // the bf16 copy of w
  EXPECT_LT(memory_stats(Device::cpu()).current_bytes - before, 256 * 256 * 2);
}

TEST(AutocastCache, EveryUseOfACachedCopyRoutesItsGradientToTheParameter) {
  Tensor w = Tensor::uniform({4, 6}, -1, 1, 1).set_requires_grad(true);
  const Tensor x1 = Tensor::uniform({3, 6}, -1, 1, 2), x2 = Tensor::uniform({3, 6}, -1, 1, 3);
  // fp32 reference of d/dw [sum(x1 w^T) + sum(x2 w^T)].
  add(sum(linear(x1, w)), sum(linear(x2, w))).backward();
  const std::vector<double> ref = w.grad().to_vector<double>();
  w.set_grad(Tensor());
  {
    Autocast ac(DeviceType::CPU, DType::BF16);
    // Two forward/backward passes in one region: the second reuses the cached copy after the
    // first backward released its graph.
    for (int step = 0; step < 2; ++step) {
      w.set_grad(Tensor());
      Tensor loss = add(sum(linear(x1, w)), sum(linear(x2, w)));
      EXPECT_EQ(loss.dtype(), DType::F32);
      loss.backward();
      ASSERT_TRUE(w.grad().defined());
      EXPECT_EQ(w.grad().dtype(), DType::F32);
      const std::vector<double> g = w.grad().to_vector<double>();
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_NEAR(g[i], ref[i], 0.02 * (1 + std::abs(ref[i]))) << i;
    }
    EXPECT_EQ(amp::cast_cache_stats().entries, 1);
  }
}

// ---- gradients of fp32 parameters ---------------------------------------------------------------

TEST(AutocastGradients, LinearWeightGradIsF32AndMatchesTheFp32Run) {
  const Tensor x = Tensor::uniform({16, 32}, -1, 1, 1);
  Tensor w = Tensor::uniform({8, 32}, -0.3, 0.3, 2).set_requires_grad(true);
  Tensor b = Tensor::uniform({8}, -0.3, 0.3, 3).set_requires_grad(true);
  const Tensor target = Tensor::from_vector(
      std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7}, {16});
  cross_entropy(linear(x, w, b), target).backward();
  const Tensor gw_ref = w.grad(), gb_ref = b.grad();
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  Tensor loss;
  {
    Autocast ac(DeviceType::CPU, DType::BF16);
    const Tensor logits = linear(x, w, b);
    EXPECT_EQ(logits.dtype(), DType::BF16);
    loss = cross_entropy(logits, target);
  }
  EXPECT_EQ(loss.dtype(), DType::F32);
  loss.backward();
  ASSERT_EQ(w.grad().dtype(), DType::F32);
  ASSERT_EQ(b.grad().dtype(), DType::F32);
  const double scale = max(abs(gw_ref)).item();
  const std::vector<double> g = w.grad().to_vector<double>(), r = gw_ref.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_NEAR(g[i], r[i], 3 * std::ldexp(1.0, -8) * (std::abs(r[i]) + scale)) << i;
  const std::vector<double> gb = b.grad().to_vector<double>(), rb = gb_ref.to_vector<double>();
  for (size_t i = 0; i < gb.size(); ++i)
    EXPECT_NEAR(gb[i], rb[i], 3 * std::ldexp(1.0, -8) * (std::abs(rb[i]) + scale)) << i;
}

TEST(AutocastGradients, ModelsTrainAStepUnderBf16WithAnFp32Loss) {
  for (const std::string model_name : {"mlp", "cnn"}) {
    SCOPED_TRACE(model_name);
    nn::ModelConfig cfg;
    auto model = nn::make_model(model_name, cfg);
    const Tensor x = nn::example_input(model_name, cfg, 4);
    const Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 3, 5, 7}, {4});
    const Tensor ref_loss = cross_entropy((*model)(x), y);
    ref_loss.backward();
    std::vector<Tensor> ref_grads;
    for (const Tensor& p : model->parameters()) {
      ref_grads.push_back(p.grad());
      p.set_grad(Tensor());
    }
    Tensor loss;
    {
      Autocast ac(DeviceType::CPU, DType::BF16);
      const Tensor logits = (*model)(x);
      EXPECT_EQ(logits.dtype(), DType::BF16);
      loss = cross_entropy(logits, y);
      EXPECT_EQ(loss.dtype(), DType::F32);
    }
    EXPECT_NEAR(loss.item(), ref_loss.item(), 0.02 * std::abs(ref_loss.item()));
    loss.backward();
    const std::vector<Tensor> params = model->parameters();
    double max_norm = 0;
    for (const Tensor& g : ref_grads)
      max_norm = std::max(max_norm, std::sqrt(sum(square(g)).item()));
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_TRUE(params[i].grad().defined()) << i;
      EXPECT_EQ(params[i].grad().dtype(), DType::F32) << i;
      // Close to the fp32 run in norm. Not elementwise: a ReLU whose bf16 pre-activation
      // rounds across zero moves a whole term of a small batch's gradient (~8% in norm here).
      // (A conv bias before batch norm has a gradient of zero up to rounding: absolute there.)
      const double err = std::sqrt(sum(square(sub(params[i].grad(), ref_grads[i]))).item());
      const double ref = std::sqrt(sum(square(ref_grads[i])).item());
      EXPECT_LE(err, 0.25 * ref + 0.01 * max_norm) << "parameter " << i;
    }
  }
}

TEST(AutocastGradients, AutocastEqualsTheHandCastBf16Model) {
  // The mlp under Autocast(CPU, BF16) computes exactly what the model with every linear's
  // inputs cast to bf16 by hand computes: same loss, same fp32 gradients.
  nn::ModelConfig cfg;
  auto model = nn::make_model("mlp", cfg);
  const Tensor x = nn::example_input("mlp", cfg, 4);
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 3, 5, 7}, {4});
  const std::vector<Tensor> p = model->parameters();
  ASSERT_EQ(p.size(), 6u);
  const DType b = DType::BF16;
  Tensor h = relu(linear(x.reshape({4, -1}).to(b), p[0].to(b), p[1].to(b)));
  h = relu(linear(h, p[2].to(b), p[3].to(b)));
  const Tensor manual = cross_entropy(linear(h, p[4].to(b), p[5].to(b)), y);
  manual.backward();
  std::vector<std::vector<double>> want;
  for (const Tensor& t : p) {
    want.push_back(t.grad().to_vector<double>());
    t.set_grad(Tensor());
  }
  Tensor loss;
  {
    Autocast ac(DeviceType::CPU, DType::BF16);
    loss = cross_entropy((*model)(x), y);
  }
  loss.backward();
  EXPECT_EQ(loss.item(), manual.item());
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(p[i].grad().dtype(), DType::F32);
    EXPECT_EQ(p[i].grad().to_vector<double>(), want[i]) << "parameter " << i;
  }
}

// ---- fp16-unsafe ops ---------------------------------------------------------------------------

TEST(AutocastUnsafe, BinaryCrossEntropyIsRefusedUnderFp16WithTheSafeAlternative) {
  const Tensor p = Tensor::uniform({4}, 0.1, 0.9, 1), y = Tensor::uniform({4}, 0, 1, 2);
  {
    Autocast ac(DeviceType::CPU, DType::F16);
    try {
      (void)binary_cross_entropy(p, y);
      FAIL() << "expected an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("binary_cross_entropy is unsafe to autocast"), std::string::npos) << msg;
      EXPECT_NE(msg.find("use binary_cross_entropy_with_logits, which is safe"), std::string::npos)
          << msg;
    }
    EXPECT_EQ(binary_cross_entropy_with_logits(p, y).dtype(), DType::F32);
    {
      amp::NoAutocast off;  // the documented way to keep it
      EXPECT_EQ(binary_cross_entropy(p, y).dtype(), DType::F32);
    }
  }
  {
    Autocast ac(DeviceType::CPU, DType::BF16);  // bf16 has fp32's range: allowed, in fp32
    EXPECT_EQ(binary_cross_entropy(p.to(DType::BF16), y).dtype(), DType::F32);
  }
}

}  // namespace
}  // namespace mantissa
