// The CUDA multi-tensor kernels against the CPU backend, bit for bit: SGD and AdamW over several
// steps with mixed parameter dtypes, fp32 masters and stochastic rounding (the kernels use
// non-contracting _rn arithmetic, so no fused multiply-add separates them from the CPU); the
// found_inf skip; the fused unscale + check and update_scale along an injected inf/NaN pattern;
// the norm (deterministic, equal to the CPU to rounding) and the scale; and GradScaler with its
// state on the GPU against the same scaler on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_test_util.h"
#include "mantissa/amp/grad_scaler.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu()).contiguous();
  std::vector<unsigned char> out(size_t(h.numel()) * dtype_size(h.dtype()));
  std::memcpy(out.data(), h.data_ptr(), out.size());
  return out;
}

// A private copy of t on `device`.
Tensor copy_to(const Tensor& t, Device device) {
  Tensor c = Tensor::empty(t.shape(), t.dtype(), device);
  c.copy_(t.device() == device ? t : t.to(device));
  return c;
}

// Parameters of every float dtype an optimizer takes (bf16 / f16 / fp8 with fp32 masters),
// sizes that cross chunk boundaries, on one device.
struct StepRig {
  Device device;
  std::vector<Tensor> params, grads, masters, s0, s1;
  Tensor counts;  // I64 on the device: every id's row (ids skip rows on purpose)
  std::vector<uint64_t> ids;

  explicit StepRig(Device d) : device(d) {
    const DType dtypes[] = {DType::F32, DType::BF16,     DType::F16,
                            DType::F64, DType::FP8_E4M3, DType::BF16};
    const int64_t sizes[] = {40000, 16385, 70, 129, 1000, 33};
    for (int i = 0; i < 6; ++i) {
      const DType dt = dtypes[i];
      const Tensor init = Tensor::uniform(Shape{sizes[i]}, -1.0, 1.0, 100 + uint64_t(i));
      params.push_back(copy_to(init.to(dt), d));
      const bool narrow = dt != DType::F32 && dt != DType::F64;
      masters.push_back(narrow && i != 5 ? copy_to(init, d) : Tensor());  // the last: none
      const DType sd = dt == DType::F64 ? DType::F64 : DType::F32;
      s0.push_back(Tensor::empty(Shape{sizes[i]}, sd, d));  // written by the first step
      s1.push_back(Tensor::empty(Shape{sizes[i]}, sd, d));
      ids.push_back(uint64_t(3 * i + 1));
    }
    counts = Tensor::zeros(Shape{18}, DType::I64, d);
  }

  // Fresh gradients for step k (the same on every device), in mixed dtypes.
  void new_grads(int k) {
    grads.clear();
    for (size_t i = 0; i < params.size(); ++i) {
      const DType gd = i % 2 == 0 ? DType::F32 : params[i].dtype();
      const Tensor g = Tensor::uniform(params[i].shape(), -0.5, 0.5, 1000 * uint64_t(k) + i).to(gd);
      grads.push_back(copy_to(g, device));
    }
  }

  backend::MultiTensorOptions options(const Tensor* flag, uint64_t offset) {
    backend::MultiTensorOptions o;
    o.masters = masters;
    o.store_rounding = RoundingMode::Stochastic;
    o.seed = 42;
    (void)offset;  // the stochastic bits follow each tensor's step count now
    o.ids = ids;
    o.step_counts = &counts;
    o.found_inf = flag;
    return o;
  }

  void sgd(const Tensor* flag, uint64_t offset) {
    backend::SgdStep h;
    h.lr = 0.1;
    h.momentum = 0.9;
    h.dampening = 0.1;
    h.weight_decay = 0.01;
    h.options = options(flag, offset);
    backend::backend_for(device).sgd_step(params, grads, s0, h);
  }
  void nesterov(const Tensor* flag, uint64_t offset) {
    backend::SgdStep h;
    h.lr = 0.05;
    h.momentum = 0.8;
    h.weight_decay = 0.1;
    h.nesterov = true;
    h.options = options(flag, offset);
    backend::backend_for(device).sgd_step(params, grads, s0, h);
  }
  void adamw(const Tensor* flag, uint64_t offset) {
    backend::AdamWStep h;
    h.lr = 0.01;
    h.beta1 = 0.8;
    h.weight_decay = 0.1;
    h.options = options(flag, offset);
    backend::backend_for(device).adamw_step(params, grads, s0, s1, h);
  }
  // beta1 = 0.3: torch.lerp's other formula (weight >= 0.5).
  void adamw_high_weight(const Tensor* flag, uint64_t offset) {
    backend::AdamWStep h;
    h.lr = 0.02;
    h.beta1 = 0.3;
    h.beta2 = 0.99;
    h.eps = 1e-6;
    h.options = options(flag, offset);
    backend::backend_for(device).adamw_step(params, grads, s0, s1, h);
  }

  void run(int which, const Tensor* flag, uint64_t offset) {
    switch (which) {
      case 0:
        return sgd(flag, offset);
      case 1:
        return nesterov(flag, offset);
      case 2:
        return adamw(flag, offset);
      default:
        return adamw_high_weight(flag, offset);
    }
  }

  // Every buffer a step writes, as bytes on the host.
  std::vector<std::vector<unsigned char>> snapshot(bool with_second_state) const {
    std::vector<std::vector<unsigned char>> out;
    for (const auto* v : {&params, &masters, &s0}) {
      for (const Tensor& t : *v)
        if (t.defined()) out.push_back(bytes_of(t));
    }
    if (with_second_state) {
      for (const Tensor& t : s1)
        out.push_back(bytes_of(t));
    }
    out.push_back(bytes_of(counts));
    return out;
  }
};

const char* kKernelNames[] = {"sgd", "nesterov", "adamw", "adamw (lerp weight >= 0.5)"};

TEST(CudaMultiTensor, OptimizerStepsMatchTheCpuBitForBit) {
  MT_REQUIRE_CUDA();
  for (int which = 0; which < 4; ++which) {
    SCOPED_TRACE(kKernelNames[which]);
    StepRig cpu(Device::cpu()), gpu(Device::cuda());
    for (int k = 1; k <= 4; ++k) {
      cpu.new_grads(k);
      gpu.new_grads(k);
      cpu.run(which, nullptr, uint64_t(k));
      gpu.run(which, nullptr, uint64_t(k));
      const bool adam = which >= 2;
      const auto a = cpu.snapshot(adam), b = gpu.snapshot(adam);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_EQ(a[i], b[i]) << "buffer " << i << " after step " << k;
    }
  }
}

TEST(CudaMultiTensor, ASetFlagSkipsTheStepAndAClearOneDoesNot) {
  MT_REQUIRE_CUDA();
  for (int which = 0; which < 4; ++which) {
    SCOPED_TRACE(kKernelNames[which]);
    const bool adam = which >= 2;
    StepRig cpu(Device::cpu()), gpu(Device::cuda());
    cpu.new_grads(1);
    gpu.new_grads(1);
    cpu.run(which, nullptr, 1);
    gpu.run(which, nullptr, 1);
    cpu.new_grads(2);
    gpu.new_grads(2);
    // Set: nothing written (weights, masters, moments).
    const Tensor set = Tensor::scalar(1.0, DType::F32, Device::cuda());
    const auto before = gpu.snapshot(adam);
    gpu.run(which, &set, 2);
    EXPECT_EQ(gpu.snapshot(adam), before);
    // Clear: the CPU's normal step.
    const Tensor clear = Tensor::scalar(0.0, DType::F32, Device::cuda());
    gpu.run(which, &clear, 2);
    cpu.run(which, nullptr, 2);
    EXPECT_EQ(gpu.snapshot(adam), cpu.snapshot(adam));
  }
}

// Gradients for the scaler tests: every dtype unscale_and_check takes, with an inf or NaN put in
// one of them (by `poison`: 0 none, else which tensor and value).
std::vector<Tensor> scaled_grads(int k, double scale, int poison, Device device) {
  const DType dtypes[] = {DType::F32, DType::BF16, DType::F16, DType::F64};
  const int64_t sizes[] = {20000, 17000, 300, 5};
  std::vector<Tensor> out;
  for (int i = 0; i < 4; ++i) {
    // Small enough that scale * g fits f16 for every scale the rule reaches (<= 1e6).
    Tensor g = mul(Tensor::uniform(Shape{sizes[i]}, -1e-3, 1e-3, 77 * uint64_t(k) + i), scale);
    if (poison != 0 && (poison - 1) % 4 == i) {
      std::vector<double> v = g.to_vector<double>();
      v[size_t(k * 7919) % v.size()] = poison > 4 ? kNaN : (k % 2 ? kInf : -kInf);
      g = Tensor::from_vector(v, g.shape(), DType::F64);
    }
    out.push_back(copy_to(g.to(dtypes[i]), device));
  }
  return out;
}

TEST(CudaMultiTensor, UnscaleAndUpdateScaleFollowTheCpuAlongAnInjectedPattern) {
  MT_REQUIRE_CUDA();
  const backend::ScaleUpdate rule{.growth_interval = 3, .hysteresis = 2, .max_scale = 1e6};
  backend::Backend& cpu = backend::cpu_backend();
  backend::Backend& gpu = backend::backend_for(Device::cuda());
  Tensor cpu_state =
      Tensor::from_vector(std::vector<double>{65536.0, 0, 0, 0}, Shape{4}, DType::F64);
  Tensor gpu_state = copy_to(cpu_state, Device::cuda());
  std::mt19937 rng(3);
  int overflows = 0;
  for (int k = 0; k < 120; ++k) {
    SCOPED_TRACE("iteration " + std::to_string(k));
    const int poison = rng() % 4 == 0 ? 1 + int(rng() % 8) : 0;
    overflows += poison != 0;
    const double scale = cpu_state.to_vector<double>()[0];
    const double inv = double(float(1.0 / scale));
    std::vector<Tensor> gc = scaled_grads(k, scale, poison, Device::cpu());
    std::vector<Tensor> gg = scaled_grads(k, scale, poison, Device::cuda());
    Tensor cpu_flag = Tensor::zeros(Shape{}, DType::F32);
    Tensor gpu_flag = Tensor::zeros(Shape{}, DType::F32, Device::cuda());
    const bool found = cpu.unscale_and_check(gc, inv, &cpu_flag);
    EXPECT_EQ(found, poison != 0);
    // With a flag the GPU answers through it, without waiting; without one, it returns it.
    EXPECT_FALSE(gpu.unscale_and_check(gg, inv, &gpu_flag));
    EXPECT_EQ(gpu_flag.item(), cpu_flag.item());
    std::vector<Tensor> again = scaled_grads(k, scale, poison, Device::cuda());
    EXPECT_EQ(gpu.unscale_and_check(again, inv, nullptr), found);
    for (size_t i = 0; i < gc.size(); ++i) {
      EXPECT_EQ(bytes_of(gg[i]), bytes_of(gc[i])) << "gradient " << i;
      EXPECT_EQ(bytes_of(again[i]), bytes_of(gc[i])) << "gradient " << i;
    }
    cpu.update_scale(cpu_state, cpu_flag, rule);
    gpu.update_scale(gpu_state, gpu_flag, rule);
    ASSERT_EQ(gpu_state.to_vector<double>(), cpu_state.to_vector<double>());
  }
  EXPECT_GT(overflows, 10);
}

TEST(CudaMultiTensor, InvScaleOneLeavesTheBitsAlone) {
  MT_REQUIRE_CUDA();
  std::vector<Tensor> g = scaled_grads(5, 1.0, 7, Device::cuda());
  std::vector<std::vector<unsigned char>> before;
  for (const Tensor& t : g)
    before.push_back(bytes_of(t));
  EXPECT_TRUE(backend::backend_for(Device::cuda()).unscale_and_check(g, 1.0, nullptr));
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_EQ(bytes_of(g[i]), before[i]);
}

TEST(CudaMultiTensor, NormIsDeterministicAndAgreesWithTheCpu) {
  MT_REQUIRE_CUDA();
  std::vector<Tensor> c = scaled_grads(2, 3.0, 0, Device::cpu());
  std::vector<Tensor> g = scaled_grads(2, 3.0, 0, Device::cuda());
  for (const double p : {2.0, 1.0, 3.0, kInf}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    Tensor oc = Tensor::zeros(Shape{}, DType::F64);
    Tensor og = Tensor::zeros(Shape{}, DType::F64, Device::cuda());
    backend::cpu_backend().multi_tensor_norm(c, p, oc);
    backend::backend_for(Device::cuda()).multi_tensor_norm(g, p, og);
    const double a = oc.item(), b = og.item();
    EXPECT_NEAR(b, a, 1e-5 * a);
    if (std::isinf(p)) {
      EXPECT_EQ(b, a);  // a max is exact
    }
    backend::backend_for(Device::cuda()).multi_tensor_norm(g, p, og);
    EXPECT_EQ(og.item(), b);  // the same bits every time
  }
  // NaN wins the inf-norm; no tensors give 0.
  std::vector<Tensor> bad = scaled_grads(2, 3.0, 6, Device::cuda());
  Tensor og = Tensor::zeros(Shape{}, DType::F64, Device::cuda());
  backend::backend_for(Device::cuda()).multi_tensor_norm(bad, kInf, og);
  EXPECT_TRUE(std::isnan(og.item()));
  backend::backend_for(Device::cuda()).multi_tensor_norm({}, 2.0, og);
  EXPECT_EQ(og.item(), 0.0);
}

TEST(CudaMultiTensor, ScaleMatchesTheCpuBitForBit) {
  MT_REQUIRE_CUDA();
  std::vector<Tensor> c = scaled_grads(4, 5.0, 0, Device::cpu());
  std::vector<Tensor> g = scaled_grads(4, 5.0, 0, Device::cuda());
  backend::cpu_backend().multi_tensor_scale(c, Tensor::scalar(0.3, DType::F64));
  backend::backend_for(Device::cuda())
      .multi_tensor_scale(g, Tensor::scalar(0.3, DType::F64, Device::cuda()));
  for (size_t i = 0; i < c.size(); ++i)
    EXPECT_EQ(bytes_of(g[i]), bytes_of(c[i])) << "tensor " << i;
}

// GradScaler with its state on the GPU follows the CPU scaler: the same scales, trackers,
// skipped steps, step results and weights; with AdamW too (whose bias correction reads the
// device's step counts, which a skipped step leaves alone).
TEST(CudaMultiTensor, GradScalerOnTheGpuFollowsTheCpuScaler) {
  MT_REQUIRE_CUDA();
  const amp::GradScalerOptions o{.init_scale = 1024.0, .growth_interval = 2, .hysteresis = 2};
  amp::GradScaler sc(o), sg(o);
  Tensor pc = Tensor::uniform(Shape{300}, -1.0, 1.0, 9).to(DType::BF16).set_requires_grad();
  Tensor pg = copy_to(pc.detach(), Device::cuda()).set_requires_grad();
  optim::SGD oc({pc}, {.lr = 0.1}), og({pg}, {.lr = 0.1});
  oc.set_master_weights(true);
  og.set_master_weights(true);
  Tensor qc = Tensor::uniform(Shape{300}, -1.0, 1.0, 19).set_requires_grad();
  Tensor qg = copy_to(qc.detach(), Device::cuda()).set_requires_grad();
  optim::AdamW ac({qc}, {.lr = 0.01}), ag({qg}, {.lr = 0.01});
  std::mt19937 rng(11);
  int skipped = 0;
  for (int k = 0; k < 60; ++k) {
    SCOPED_TRACE("iteration " + std::to_string(k));
    const bool bad = rng() % 3 == 0;
    skipped += bad;
    const Tensor loss_c = sc.scale(Tensor::scalar(0.5));
    const Tensor loss_g = sg.scale(Tensor::scalar(0.5, DType::F32, Device::cuda()));
    EXPECT_EQ(loss_g.item(), loss_c.item());
    std::vector<double> g =
        Tensor::uniform(Shape{300}, -1.0, 1.0, 500 + uint64_t(k)).to_vector<double>();
    for (double& v : g)
      v *= sc.get_scale();
    if (bad) g[size_t(k)] = k % 2 ? kNaN : kInf;
    const Tensor grad = Tensor::from_vector(g, Shape{300}, DType::BF16);
    pc.set_grad(copy_to(grad, Device::cpu()));
    pg.set_grad(copy_to(grad, Device::cuda()));
    qc.set_grad(copy_to(grad.to(DType::F32), Device::cpu()));
    qg.set_grad(copy_to(grad.to(DType::F32), Device::cuda()));
    EXPECT_EQ(sc.step(oc).skipped(), bad);
    const amp::StepResult rg = sg.step(og);  // decided on the device, read when asked
    EXPECT_EQ(sc.step(ac).skipped(), bad);
    sg.step(ag);
    sc.update();
    sg.update();
    EXPECT_EQ(rg.found_inf().device(), Device::cuda());
    EXPECT_EQ(rg.skipped(), bad);
    EXPECT_TRUE(sg.on_device());
    EXPECT_EQ(sg.found_inf(), bad);
    ASSERT_EQ(sg.get_scale(), sc.get_scale());
    EXPECT_EQ(sg.growth_tracker(), sc.growth_tracker());
    EXPECT_EQ(sg.hysteresis_tracker(), sc.hysteresis_tracker());
    EXPECT_EQ(bytes_of(pg), bytes_of(pc));
    EXPECT_EQ(bytes_of(og.master(0)), bytes_of(oc.master(0)));
    EXPECT_EQ(bytes_of(qg), bytes_of(qc));
    EXPECT_EQ(ag.updates(0), ac.updates(0));
  }
  EXPECT_EQ(ag.updates(0), 60 - skipped);
  EXPECT_EQ(sg.skipped_steps(), 2 * skipped);
  EXPECT_EQ(sc.skipped_steps(), 2 * skipped);
  // The state dict reads the device state back.
  const NamedTensors a = sc.state_dict(), b = sg.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(b[i].second.item(), a[i].second.item()) << a[i].first;
}

}  // namespace
}  // namespace mantissa
