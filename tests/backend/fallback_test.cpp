// The CPU fallback of the Backend interface: a backend that has only copy and fill (and one op
// of its own) runs every other op through the CPU backend, with the results the CPU gives bit for
// bit, what the kernels write copied back (outputs, in-place operands, optimizer state, masters
// and step counts), and one warning per op with every call counted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "mantissa/core/warning.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using backend::Backend;

// What every backend must have, and unary of its own.
class PartialBackend final : public Backend {
 public:
  std::string_view name() const override { return "partial"; }
  void copy(const Tensor& src, Tensor& dst) override { backend::cpu_backend().copy(src, dst); }
  void fill(Tensor& dst, double value) override { backend::cpu_backend().fill(dst, value); }
  void unary(backend::UnaryOp op, const Tensor& x, Tensor& out, backend::Scalars s) override {
    ++native_unary;
    backend::cpu_backend().unary(op, x, out, s);
  }
  int native_unary = 0;
};

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<unsigned char> out(c.nbytes());
  std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

Tensor nan_like(const Tensor& t) {
  return Tensor::full(t.shape(), NAN, t.dtype());
}

struct Capture {
  std::vector<std::string> keys, messages;
  WarningHandler prev;
  Capture() {
    reset_warnings();
    prev = set_warning_handler([this](std::string_view key, const std::string& message) {
      keys.emplace_back(key);
      messages.push_back(message);
    });
  }
  ~Capture() {
    set_warning_handler(prev);
    reset_warnings();
  }
};

TEST(Fallback, OpsABackendLacksRunOnTheCpuWithTheCpusResults) {
  Capture warnings;
  PartialBackend partial;
  Backend& cpu = backend::cpu_backend();
  const Tensor a = Tensor::uniform({3, 5}, -1, 1, 1), b = Tensor::uniform({5, 4}, -1, 1, 2);
  const Tensor bias = Tensor::uniform({4}, -1, 1, 3);

  // An output filled by the kernel.
  Tensor mine = nan_like(Tensor::empty({1, 3, 4})), ref = nan_like(mine);
  partial.matmul(a.view({1, 3, 5}), b.view({1, 5, 4}), &bias, mine, {});
  cpu.matmul(a.view({1, 3, 5}), b.view({1, 5, 4}), &bias, ref, {});
  EXPECT_EQ(bytes_of(mine), bytes_of(ref));

  // A nullable output and a second one (max with indices).
  Tensor mx = nan_like(Tensor::empty({3, 1})), idx = Tensor::zeros({3, 1}, DType::I64);
  Tensor mx_ref = nan_like(mx), idx_ref = Tensor::zeros({3, 1}, DType::I64);
  const int dims[] = {1};
  partial.reduce(backend::ReduceOp::Max, a, dims, mx, &idx, 0);
  cpu.reduce(backend::ReduceOp::Max, a, dims, mx_ref, &idx_ref, 0);
  EXPECT_EQ(bytes_of(mx), bytes_of(mx_ref));
  EXPECT_EQ(bytes_of(idx), bytes_of(idx_ref));

  // An in-place operand.
  Tensor r = Tensor::uniform({64}, -3, 3, 4), r_ref = r.clone();
  partial.round_to_format(r, Format::BF16);
  cpu.round_to_format(r_ref, Format::BF16);
  EXPECT_EQ(bytes_of(r), bytes_of(r_ref));

  // A bool result.
  std::vector<Tensor> g{Tensor::from_vector(std::vector<double>{1, INFINITY}, {2})};
  EXPECT_TRUE(partial.unscale_and_check(g, 0.5, nullptr));
  EXPECT_EQ(g[0].to_vector<double>()[0], 0.5) << "the unscaled gradient came back";

  // The op the backend has runs natively: no warning for it.
  Tensor u = nan_like(a), u_ref = nan_like(a);
  partial.unary(backend::UnaryOp::Exp, a, u, {});
  cpu.unary(backend::UnaryOp::Exp, a, u_ref, {});
  EXPECT_EQ(partial.native_unary, 1);
  EXPECT_EQ(bytes_of(u), bytes_of(u_ref));

  // One warning per op, naming the backend and the op; every call counted.
  EXPECT_EQ(warnings.keys,
            (std::vector<std::string>{"fallback:partial:matmul", "fallback:partial:reduce",
                                      "fallback:partial:round_to_format",
                                      "fallback:partial:unscale_and_check"}));
  EXPECT_NE(warnings.messages[0].find("the partial backend has no matmul kernel"),
            std::string::npos)
      << warnings.messages[0];
  partial.matmul(a.view({1, 3, 5}), b.view({1, 5, 4}), &bias, mine, {});
  EXPECT_EQ(warnings.keys.size(), 4u) << "shown once";
  EXPECT_EQ(warning_count("fallback:partial:matmul"), 2);
  EXPECT_EQ(warning_count("fallback:partial:unary"), 0);
}

// The optimizer kernels write parameters, masters, state and step counts: all of it comes back,
// and a set found-inf flag still skips the whole call.
TEST(Fallback, OptimizerStepsWriteBackEveryBuffer) {
  Capture warnings;
  PartialBackend partial;
  auto rig = [] {
    struct Rig {
      std::vector<Tensor> params, grads, masters, m, v;
      Tensor counts = Tensor::zeros({3}, DType::I64);
      std::vector<uint64_t> ids{0, 2};
    } r;
    const Tensor init = Tensor::uniform({100}, -1, 1, 7);
    r.params = {init.to(DType::BF16).contiguous(), Tensor::uniform({10}, -1, 1, 8)};
    r.grads = {Tensor::uniform({100}, -1, 1, 9), Tensor::uniform({10}, -1, 1, 10)};
    r.masters = {init.clone(), Tensor()};
    for (const Tensor& p : r.params) {
      r.m.push_back(Tensor::zeros(p.shape()));
      r.v.push_back(Tensor::zeros(p.shape()));
    }
    return r;
  };
  auto step = [](Backend& be, auto& r, const Tensor* flag) {
    backend::AdamWStep h;
    h.lr = 0.1;
    h.options.ids = r.ids;
    h.options.step_counts = &r.counts;
    h.options.masters = r.masters;
    h.options.store_rounding = RoundingMode::Stochastic;
    h.options.seed = 3;
    h.options.found_inf = flag;
    be.adamw_step(r.params, r.grads, r.m, r.v, h);
  };
  auto mine = rig(), ref = rig();
  for (int k = 0; k < 3; ++k) {
    step(partial, mine, nullptr);
    step(backend::cpu_backend(), ref, nullptr);
  }
  const Tensor set = Tensor::scalar(1.0, DType::F32);
  step(partial, mine, &set);
  step(backend::cpu_backend(), ref, &set);
  EXPECT_EQ(mine.counts.to_vector<int64_t>(), (std::vector<int64_t>{3, 0, 3}));
  EXPECT_EQ(bytes_of(mine.counts), bytes_of(ref.counts));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(bytes_of(mine.params[i]), bytes_of(ref.params[i])) << i;
    EXPECT_EQ(bytes_of(mine.m[i]), bytes_of(ref.m[i])) << i;
    EXPECT_EQ(bytes_of(mine.v[i]), bytes_of(ref.v[i])) << i;
  }
  EXPECT_EQ(bytes_of(mine.masters[0]), bytes_of(ref.masters[0]));
  EXPECT_EQ(warning_count("fallback:partial:adamw_step"), 4);
}

}  // namespace
}  // namespace mantissa
