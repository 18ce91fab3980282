// The CUDA fused attention against the CPU one (both compute in fp32, f64 for f64, and round
// once): forward, log-sum-exp and the three gradients, over dtypes, causal or not, lengths
// around the kernels' 16- and 32-row tiles and head dims up to the 128 limit; then
// scaled_dot_product_attention end to end on the device, and the head-dim limit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_test_util.h"
#include "harness/op_harness.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using testing::all_close;
using testing::eps_of;
using testing::random_f64;

struct Result {
  Tensor out, lse, gq, gk, gv;
};

// The backend's forward and backward on q (B, H, Tq, D), k and v (B, H, Tk, D), results on the
// host.
Result run_backend(backend::Backend& be, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& grad_out, const backend::AttentionParams& p) {
  const Device dev = q.device();
  const DType lse_dt = q.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Result r;
  r.out = Tensor::empty(q.shape(), q.dtype(), dev);
  r.lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, lse_dt, dev);
  be.attention(q, k, v, r.out, r.lse, p);
  r.gq = Tensor::empty(q.shape(), q.dtype(), dev);
  r.gk = Tensor::empty(k.shape(), k.dtype(), dev);
  r.gv = Tensor::empty(v.shape(), v.dtype(), dev);
  be.attention_backward(grad_out, q, k, v, r.out, r.lse, r.gq, r.gk, r.gv, p);
  for (Tensor* t : {&r.out, &r.lse, &r.gq, &r.gk, &r.gv})
    *t = t->to(Device::cpu());
  return r;
}

TEST(CudaAttention, MatchesCpuForwardAndBackward) {
  MT_REQUIRE_CUDA();
  struct Size {
    int64_t b, h, tq, tk, d;
  };
  const std::vector<Size> sizes = {
      {1, 1, 1, 1, 8},     {2, 3, 17, 17, 32},  {1, 2, 33, 70, 64}, {2, 2, 100, 45, 128},
      {1, 1, 130, 130, 3}, {1, 2, 64, 64, 100}, {3, 1, 31, 96, 16}, {1, 1, 257, 257, 40},
  };
  backend::Backend& cpu = backend::cpu_backend();
  backend::Backend& gpu = backend::backend_for(Device::cuda());
  uint64_t seed = 1;
  for (const Size& s : sizes) {
    for (bool causal : {false, true}) {
      for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
        SCOPED_TRACE("B " + std::to_string(s.b) + " H " + std::to_string(s.h) + " Tq " +
                     std::to_string(s.tq) + " Tk " + std::to_string(s.tk) + " D " +
                     std::to_string(s.d) + (causal ? " causal " : " ") +
                     std::string(dtype_name(d)));
        const Tensor q = random_f64({s.b, s.h, s.tq, s.d}, seed++, -2, 2).to(d);
        const Tensor k = random_f64({s.b, s.h, s.tk, s.d}, seed++, -2, 2).to(d);
        const Tensor v = random_f64({s.b, s.h, s.tk, s.d}, seed++).to(d);
        const Tensor g = random_f64({s.b, s.h, s.tq, s.d}, seed++).to(d);
        backend::AttentionParams p;
        p.scale = 1.0 / std::sqrt(double(s.d));
        p.causal = causal;
        const Result want = run_backend(cpu, q, k, v, g, p);
        const Result got = run_backend(gpu, q.to(Device::cuda()), k.to(Device::cuda()),
                                       v.to(Device::cuda()), g.to(Device::cuda()), p);
        // Same fp32 math in another order, then one rounding into d.
        const double e = eps_of(d), kt = d == DType::F32 || d == DType::F64 ? 256 : 4;
        EXPECT_TRUE(all_close(got.out, want.out, e, kt, "out"));
        EXPECT_TRUE(
            all_close(got.lse, want.lse, d == DType::F64 ? e : eps_of(DType::F32), 256, "lse"));
        EXPECT_TRUE(all_close(got.gq, want.gq, e, 2 * kt, "grad q"));
        EXPECT_TRUE(all_close(got.gk, want.gk, e, 2 * kt, "grad k"));
        EXPECT_TRUE(all_close(got.gv, want.gv, e, 2 * kt, "grad v"));
      }
    }
  }
}

// scaled_dot_product_attention on the device: the fused path with autograd, 3-D inputs, and a
// head dim over the kernel's limit (the composed path) all agree with the CPU.
TEST(CudaAttention, ScaledDotProductAttentionEndToEnd) {
  MT_REQUIRE_CUDA();
  for (int64_t d : {24, 160}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE("D " + std::to_string(d) + (causal ? " causal" : ""));
      const Tensor q0 = random_f64({3, 40, d}, 10 + d), k0 = random_f64({3, 50, d}, 11 + d),
                   v0 = random_f64({3, 50, d}, 12 + d), w = random_f64({3, 40, d}, 13 + d);
      auto run = [&](Device dev) {
        Tensor q = q0.to(DType::F32).to(dev), k = k0.to(DType::F32).to(dev),
               v = v0.to(DType::F32).to(dev);
        q.set_requires_grad(true);
        k.set_requires_grad(true);
        v.set_requires_grad(true);
        Tensor out = scaled_dot_product_attention(q, k, v, Tensor(), causal);
        out.backward(w.to(DType::F32).to(dev));
        return std::vector<Tensor>{out.to(Device::cpu()), q.grad().to(Device::cpu()),
                                   k.grad().to(Device::cpu()), v.grad().to(Device::cpu())};
      };
      const std::vector<Tensor> got = run(Device::cuda()), want = run(Device::cpu());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(all_close(got[i], want[i], eps_of(DType::F32), 512, std::to_string(i)));
    }
  }
}

TEST(CudaAttention, HeadDimOverTheLimitIsRefusedByTheBackend) {
  MT_REQUIRE_CUDA();
  const Tensor q = Tensor::zeros({1, 1, 4, 129}, DType::F32, Device::cuda());
  Tensor out = Tensor::empty(q.shape(), DType::F32, Device::cuda());
  Tensor lse = Tensor::empty({1, 1, 4}, DType::F32, Device::cuda());
  try {
    backend::backend_for(Device::cuda()).attention(q, q, q, out, lse, {});
    FAIL() << "a head dim of 129 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dims up to 128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace mantissa
