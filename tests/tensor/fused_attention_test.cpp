// The fused attention path of scaled_dot_product_attention (no mask): against a float64 reference
// written here with plain loops (forward and log-sum-exp), against the composed path (reached with
// an all-true Bool mask) for values and gradients, finite differences in f64, and every float
// dtype through the per-op harness. Shapes cross the CPU kernel's 64-row tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/vector_isa.h"
#include "harness/op_harness.h"
#include "mantissa/autograd/node.h"
#include "mantissa/core/allocator.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using testing::all_close;
using testing::check_op;
using testing::eps_of;
using testing::OpCase;
using testing::random_f64;

std::vector<double> values(const Tensor& t) {
  return t.contiguous().to_vector<double>();
}

// softmax(q k^T * scale) v for q (N, Tq, D), k and v (N, Tk, D) flattened over the leading dims,
// and each query row's log-sum-exp of the scaled scores.
struct Reference {
  std::vector<double> out, lse;
};

Reference attention_ref(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                        bool causal) {
  const int64_t tq = q.size(-2), tk = k.size(-2), d = q.size(-1);
  const int64_t n = q.numel() / (tq * d);
  const std::vector<double> qv = values(q), kv = values(k), vv = values(v);
  Reference r;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t seen = causal ? std::min(tk, i + 1) : tk;
      std::vector<double> s(static_cast<size_t>(seen));
      double mx = -INFINITY;
      for (int64_t j = 0; j < seen; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e)
          dot += qv[size_t((b * tq + i) * d + e)] * kv[size_t((b * tk + j) * d + e)];
        s[size_t(j)] = dot * scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      double total = 0;
      for (double& x : s)
        total += (x = std::exp(x - mx));
      r.lse.push_back(mx + std::log(total));
      for (int64_t e = 0; e < d; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < seen; ++j)
          acc += s[size_t(j)] / total * vv[size_t((b * tk + j) * d + e)];
        r.out.push_back(acc);
      }
    }
  }
  return r;
}

struct Case {
  Shape q, kv;
  bool causal;
};

// Tq != Tk both ways, lengths that are not multiples of the 64-row tile, 2-D to 4-D inputs;
// head dims below, at and above the vectorized kernel's 16-float tiles (16 and 32: f32 rows
// read in place, no padded copy).
const std::vector<Case> kCases = {
    {{1, 2, 70, 16}, {1, 2, 131, 16}, true},
    {{2, 65, 32}, {2, 64, 32}, false},
    {{1, 3, 20}, {1, 7, 20}, true},
    {{2, 3, 5, 8}, {2, 3, 5, 8}, false},
    {{2, 3, 5, 8}, {2, 3, 5, 8}, true},
    {{1, 2, 70, 6}, {1, 2, 131, 6}, false},
    {{1, 2, 70, 6}, {1, 2, 131, 6}, true},
    {{2, 130, 4}, {2, 65, 4}, true},
    {{2, 130, 4}, {2, 65, 4}, false},
    {{9, 3}, {1, 3}, false},
    {{9, 3}, {1, 3}, true},
    {{2, 2, 64, 32}, {2, 2, 64, 32}, true},  // GPT-2 tiny's heads: one causal block on the diagonal
};

// A case's q and k (in [-2, 2]), v and an incoming gradient (the output's shape), in dtype d,
// drawn from seeds seed .. seed + 3.
struct Inputs {
  Tensor q, k, v, g;
};

Inputs random_inputs(const Case& c, uint64_t seed, DType d) {
  return {random_f64(c.q, seed, -2, 2).to(d), random_f64(c.kv, seed + 1, -2, 2).to(d),
          random_f64(c.kv, seed + 2).to(d), random_f64(c.q, seed + 3).to(d)};
}

// The CPU's Auto path takes the composed GEMMs (faster there): these tests force the fused kernel
// for their whole body.
struct ForceFusedPath {
  ForceFusedPath() { set_attention_path(AttentionPath::Fused); }
  ~ForceFusedPath() { set_attention_path(AttentionPath::Auto); }
};

Tensor fused(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
             std::optional<double> scale = std::nullopt) {
  return scaled_dot_product_attention(q, k, v, Tensor(), causal, scale);
}

// The composed path: an all-true Bool mask changes nothing but the route.
Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                std::optional<double> scale = std::nullopt) {
  const Tensor all = Tensor::full({q.size(-2), k.size(-2)}, 1.0, DType::Bool, q.device());
  return scaled_dot_product_attention(q, k, v, all, causal, scale);
}

TEST(FusedAttention, ForwardMatchesFloat64Reference) {
  const ForceFusedPath force;
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.q.str() + " x " + c.kv.str() + (c.causal ? " causal" : ""));
    const Tensor q = random_f64(c.q, seed++, -2, 2), k = random_f64(c.kv, seed++, -2, 2),
                 v = random_f64(c.kv, seed++);
    const double scale = 1.0 / std::sqrt(double(q.size(-1)));
    const Reference ref = attention_ref(q, k, v, scale, c.causal);
    const Tensor want = Tensor::from_vector(ref.out, c.q, DType::F64);
    EXPECT_TRUE(all_close(fused(q, k, v, c.causal), want, 0x1p-52, 64, "f64"));
    EXPECT_TRUE(all_close(fused(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), c.causal),
                          want, eps_of(DType::F32), 16, "f32"));
  }
}

TEST(FusedAttention, LogSumExpOfTheBackend) {
  const ForceFusedPath force;
  uint64_t seed = 50;
  for (const Case& c : kCases) {
    if (c.q.size() != 4) continue;
    SCOPED_TRACE(c.q.str() + " x " + c.kv.str() + (c.causal ? " causal" : ""));
    const Tensor q = random_f64(c.q, seed++, -3, 3), k = random_f64(c.kv, seed++, -3, 3),
                 v = random_f64(c.kv, seed++);
    const Reference ref = attention_ref(q, k, v, 0.7, c.causal);
    const Shape lse_shape{c.q[0], c.q[1], c.q[2]};
    const Tensor want = Tensor::from_vector(ref.lse, lse_shape, DType::F64);
    backend::AttentionParams p;
    p.scale = 0.7;
    p.causal = c.causal;
    for (DType d : {DType::F64, DType::F32, DType::BF16}) {
      SCOPED_TRACE(dtype_name(d));
      const Tensor qd = q.to(d), kd = k.to(d), vd = v.to(d);
      Tensor out = Tensor::empty(c.q, d);
      Tensor lse = Tensor::empty(lse_shape, d == DType::F64 ? DType::F64 : DType::F32);
      backend::cpu_backend().attention(qd, kd, vd, out, lse, p);
      // The reference on the dtype's rounded inputs: lse is computed in fp32 (f64 for f64).
      const Reference rd =
          attention_ref(qd.to(DType::F64), kd.to(DType::F64), vd.to(DType::F64), 0.7, c.causal);
      const double e = d == DType::F64 ? 0x1p-52 : eps_of(DType::F32);
      EXPECT_TRUE(all_close(lse, Tensor::from_vector(rd.lse, lse_shape, DType::F64), e, 64, "lse"));
      if (d == DType::F64) {
        EXPECT_TRUE(all_close(lse, want, e, 64, "lse f64"));
      }
    }
  }
}

// Forward and the three gradients of the fused and the composed path agree, in every dtype.
TEST(FusedAttention, MatchesComposedPathWithGradients) {
  const ForceFusedPath force;
  // The vectorized kernels where this CPU has them, and the plain loops every CPU has.
  for (bool plain : {false, true}) {
    if (plain) backend::cpu::force_vector_isa(backend::cpu::VectorIsa::Baseline);
    SCOPED_TRACE(backend::cpu_fused_attention_vectorized() ? "vectorized kernels" : "plain loops");
    uint64_t seed = 100;
    for (const Case& c : kCases) {
      for (DType d : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
        SCOPED_TRACE(c.q.str() + " x " + c.kv.str() + (c.causal ? " causal " : " ") +
                     std::string(dtype_name(d)));
        const auto [q0, k0, v0, w] = random_inputs(c, seed, d);
        auto run = [&](bool use_fused) {
          Tensor q = q0.detach(), k = k0.detach(), v = v0.detach();
          q.set_requires_grad(true);
          k.set_requires_grad(true);
          v.set_requires_grad(true);
          Tensor out = use_fused ? fused(q, k, v, c.causal, 0.4) : composed(q, k, v, c.causal, 0.4);
          out.backward(w);
          return std::vector<Tensor>{out, q.grad(), k.grad(), v.grad()};
        };
        const std::vector<Tensor> a = run(true), b = run(false);
        // Both round each of their steps in d; the composed one rounds scores and probabilities
        // too, so the half dtypes get the room of a few roundings. The two sum in different
        // orders, and a gradient chains sums over the head dim (dP, delta) and over the keys or
        // queries: that error grows like sqrt(T d) eps (the f32 cases with 64-131 keys).
        const double sums = double(std::max(c.q[c.q.size() - 2], c.kv[c.kv.size() - 2])) *
                            double(c.q[c.q.size() - 1]);
        const double e = eps_of(d),
                     k_tol = d == DType::F64 ? 64 : std::max(24.0, 2 * std::sqrt(sums));
        const char* what[] = {"out", "grad q", "grad k", "grad v"};
        for (size_t i = 0; i < 4; ++i) {
          ASSERT_TRUE(a[i].defined() && b[i].defined()) << what[i];
          EXPECT_EQ(a[i].dtype(), d) << what[i];
          EXPECT_EQ(a[i].shape(), b[i].shape()) << what[i];
          EXPECT_TRUE(all_close(a[i], b[i], e, k_tol, what[i]));
        }
      }
      seed += 4;
    }
  }
  backend::cpu::force_vector_isa(std::nullopt);
}

OpCase sdpa_case(std::string name, Shape qs, Shape kvs, bool causal, uint64_t seed) {
  OpCase c;
  c.name = std::move(name);
  c.inputs = {random_f64(qs, seed), random_f64(kvs, seed + 1), random_f64(kvs, seed + 2)};
  c.fn = [causal](const std::vector<Tensor>& in) { return fused(in[0], in[1], in[2], causal); };
  c.reference = [causal](const std::vector<Tensor>& in) {
    const Tensor& q = in[0];
    return Tensor::from_vector(
        attention_ref(q, in[1], in[2], 1.0 / std::sqrt(double(q.size(-1))), causal).out, q.shape(),
        DType::F64);
  };
  c.k_forward = 16;
  c.k_backward = 32;
  return c;
}

// Every dtype against the f64 result on the same rounded inputs, strided inputs, and the f64
// gradients against finite differences.
TEST(FusedAttention, HarnessAllDtypesAndFiniteDifferences) {
  const ForceFusedPath force;
  check_op(sdpa_case("fused", {2, 2, 7, 5}, {2, 2, 9, 5}, false, 200));
  check_op(sdpa_case("fused causal", {1, 2, 67, 4}, {1, 2, 66, 4}, true, 210));
  check_op(sdpa_case("fused causal Tq > Tk", {2, 9, 3}, {2, 4, 3}, true, 220));
}

// Scores far apart: small integers in q and k make every score an exact integer up to 1296, so
// most probabilities fall below e^-104, where the vectorized exponential returns 0 (and does not
// compute a subnormal). Against float64 and, with gradients, against the composed path, at ViT's
// 50 keys (a row that ends inside a vector) and causal with a key block boundary.
TEST(FusedAttention, FarApartScoresUnderflowToZeroProbabilities) {
  const ForceFusedPath force;
  auto integers = [](const Shape& shape, uint64_t seed) {
    std::vector<double> v(size_t(shape.numel()));
    for (double& x : v) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      x = double(int64_t(seed >> 33) % 19 - 9);  // -9 .. 9
    }
    return Tensor::from_vector(v, shape, DType::F64);
  };
  for (const auto& [shape, causal] :
       {std::pair{Shape{2, 3, 50, 16}, false}, std::pair{Shape{1, 2, 70, 16}, true}}) {
    SCOPED_TRACE(shape.str() + (causal ? " causal" : ""));
    const Tensor q = integers(shape, 1), k = integers(shape, 2), v = random_f64(shape, 3);
    const Reference ref = attention_ref(q, k, v, 1.0, causal);
    int64_t zeros = 0;  // scores more than 104 below their row's max
    {
      const Tensor s = matmul(q, k.transpose(-2, -1));
      const auto sv = s.to_vector<double>();
      const int64_t t = shape[2];
      for (int64_t r = 0; r < s.numel() / t; ++r) {
        const int64_t seen = causal ? r % t + 1 : t;
        const double mx = *std::max_element(sv.begin() + r * t, sv.begin() + r * t + seen);
        for (int64_t j = 0; j < seen; ++j)
          zeros += sv[size_t(r * t + j)] < mx - 104;
      }
    }
    EXPECT_GT(zeros, shape.numel() / 16 * 2) << "the case should reach the underflow";
    const Tensor want = Tensor::from_vector(ref.out, shape, DType::F64);
    const Tensor q32 = q.to(DType::F32), k32 = k.to(DType::F32), v32 = v.to(DType::F32);
    EXPECT_TRUE(all_close(fused(q32, k32, v32, causal, 1.0), want, eps_of(DType::F32), 16, "out"));
    auto grads = [&](bool use_fused) {
      Tensor qg = q32.detach().set_requires_grad(true), kg = k32.detach().set_requires_grad(true),
             vg = v32.detach().set_requires_grad(true);
      Tensor out = use_fused ? fused(qg, kg, vg, causal, 1.0) : composed(qg, kg, vg, causal, 1.0);
      sum(mul(out, v32)).backward();
      return std::vector<Tensor>{qg.grad(), kg.grad(), vg.grad()};
    };
    const std::vector<Tensor> a = grads(true), b = grads(false);
    // The fused backward recomputes each p as e^(s - lse) from the saved log-sum-exp: lse is
    // rounded to fp32 at its magnitude (here a few hundred), an error of about |lse| eps in every
    // p, where the composed path's s - max is exact. The gradients sum such p times entries of
    // q or k (up to 9) and dP, so the room is |lse| times that, over the usual 64.
    double max_lse = 0;
    for (double x : ref.lse)
      max_lse = std::max(max_lse, std::abs(x));
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(
          all_close(a[i], b[i], eps_of(DType::F32), 64 + 9 * max_lse, "grad " + std::to_string(i)));
    }
  }
}

// q, k and v as a multi-head layer makes them, the heads of one (B, T, 3, H, D) projection: the
// kernels read them in place and write the output in (B, T, H, D) order, which the layer's
// transpose then reshapes without a copy; values and gradients equal those of contiguous
// copies bit for bit (the same sums in the same order), with the vectorized kernels and the
// plain loops, and head dims on and off the 8- and 16-float vectors.
TEST(FusedAttention, HeadsOfOneProjectionAreReadInPlace) {
  const ForceFusedPath force;
  for (bool plain : {false, true}) {
    if (plain) backend::cpu::force_vector_isa(backend::cpu::VectorIsa::Baseline);
    SCOPED_TRACE(backend::cpu_fused_attention_vectorized() ? "vectorized kernels" : "plain loops");
    for (const int64_t d : {int64_t(16), int64_t(20), int64_t(32)}) {
      for (const bool causal : {false, true}) {
        for (const DType dt : {DType::F32, DType::BF16}) {
          SCOPED_TRACE("d " + std::to_string(d) + (causal ? " causal " : " ") +
                       std::string(dtype_name(dt)));
          const int64_t b = 2, t = 37, h = 3;
          const Tensor qkv0 = random_f64({b, t, 3, h, d}, 500 + uint64_t(d), -2, 2).to(dt);
          const Tensor w = random_f64({b, h, t, d}, 600).to(dt);
          auto run = [&](bool strided) {
            Tensor qkv = qkv0.detach().set_requires_grad(true);
            const std::vector<Tensor> heads = unbind(qkv.permute({2, 0, 3, 1, 4}), 0);
            std::vector<Tensor> in;
            for (const Tensor& x : heads)
              in.push_back(strided ? x : x.contiguous());
            if (strided) {
              EXPECT_FALSE(in[0].is_contiguous());
            }
            Tensor out = fused(in[0], in[1], in[2], causal);
            if (strided && !plain) {
              EXPECT_TRUE(out.transpose(1, 2).is_contiguous()) << "the output in (B, T, H, D)";
            }
            out.backward(w);
            return std::vector<Tensor>{out, qkv.grad()};
          };
          const std::vector<Tensor> a = run(true), c = run(false);
          EXPECT_EQ(values(a[0]), values(c[0])) << "out";
          EXPECT_EQ(values(a[1]), values(c[1])) << "grad of the projection";
        }
      }
    }
  }
  backend::cpu::force_vector_isa(std::nullopt);
}

// bf16 and f16 run in fp32 on their widened values and round each result once: the backend's
// output, log-sum-exp and gradients are the f32 kernel's on the same values (the backward given
// the same, rounded, output), rounded to the dtype, bit for bit. This checks the kernels' own
// conversions of rows, including head dims that are no multiple of the vector width.
TEST(FusedAttention, HalfDtypesAreTheF32KernelRoundedOnce) {
  // The kernels this CPU runs (with avx512_bf16: bf16's scores and dP on bf16 dot products), the
  // AVX2 kernels (fp32 tiles throughout), and the plain loops.
  using backend::cpu::VectorIsa;
  for (const std::optional<VectorIsa> isa :
       {std::optional<VectorIsa>(), std::optional(VectorIsa::Avx2),
        std::optional(VectorIsa::Baseline)}) {
    if (isa && !backend::cpu::vector_isa_supported(*isa)) continue;
    backend::cpu::force_vector_isa(isa);
    SCOPED_TRACE(
        std::string(backend::cpu::vector_isa_name(backend::cpu::vector_isa())) +
        (backend::cpu_fused_attention_vectorized() ? ", vectorized kernels" : ", plain loops"));
    uint64_t seed = 700;
    for (const Case& c : kCases) {
      if (c.q.size() != 4) continue;
      backend::AttentionParams p;
      p.scale = 0.4;
      p.causal = c.causal;
      const Shape lse_shape{c.q[0], c.q[1], c.q[2]};
      for (const DType d : {DType::BF16, DType::F16}) {
        SCOPED_TRACE(c.q.str() + " x " + c.kv.str() + (c.causal ? " causal " : " ") +
                     std::string(dtype_name(d)));
        const auto [q, k, v, g] = random_inputs(c, seed, d);
        seed += 4;
        Tensor out_half;
        auto run = [&](DType dt) {
          Tensor out = Tensor::empty(c.q, dt), lse = Tensor::empty(lse_shape, DType::F32);
          backend::cpu_backend().attention(q.to(dt), k.to(dt), v.to(dt), out, lse, p);
          if (dt == d) out_half = out;
          Tensor gq = Tensor::empty(c.q, dt), gk = Tensor::empty(c.kv, dt),
                 gv = Tensor::empty(c.kv, dt);
          backend::cpu_backend().attention_backward(g.to(dt), q.to(dt), k.to(dt), v.to(dt),
                                                    out_half.to(dt), lse, gq, gk, gv, p);
          return std::vector<Tensor>{out, lse, gq, gk, gv};
        };
        const std::vector<Tensor> half = run(d), single = run(DType::F32);
        const char* what[] = {"out", "lse", "grad q", "grad k", "grad v"};
        for (size_t i = 0; i < half.size(); ++i) {
          const DType want = i == 1 ? DType::F32 : d;
          EXPECT_EQ(values(half[i]), values(single[i].to(want))) << what[i];
        }
      }
    }
  }
  backend::cpu::force_vector_isa(std::nullopt);
}

// Where the CPU has AVX-512, the kernels run 12-row tiles and the softmax rows in 16 lanes; they
// must give the AVX2 kernels' values to the bit (the same multiply-adds in the same order, the
// row sums in the AVX2 order): output, log-sum-exp and the three gradients, in every dtype the
// vectorized kernels take, causal or not, including ViT's 50 tokens of head dim 16 and a head dim
// of 64 (its products into the head dim on the 6 x 64 tiles too).
TEST(FusedAttention, WideKernelsAreTheAvx2KernelsBitForBit) {
  using backend::cpu::VectorIsa;
  if (!backend::cpu::vector_isa_supported(VectorIsa::Avx512))
    GTEST_SKIP() << "this CPU has no AVX-512";
  std::vector<Case> cases;
  for (const Case& c : kCases)
    if (c.q.size() == 4) cases.push_back(c);
  cases.push_back({{2, 4, 50, 16}, {2, 4, 50, 16}, false});
  cases.push_back({{1, 3, 97, 24}, {1, 3, 97, 24}, true});
  cases.push_back({{1, 2, 70, 64}, {1, 2, 131, 64}, false});  // 6 x 64 tiles into dO, dQ, dK, dV
  cases.push_back({{1, 2, 70, 64}, {1, 2, 131, 64}, true});
  uint64_t seed = 900;
  for (const Case& c : cases) {
    backend::AttentionParams p;
    p.scale = 0.4;
    p.causal = c.causal;
    const Shape lse_shape{c.q[0], c.q[1], c.q[2]};
    for (const DType d : {DType::F32, DType::BF16, DType::F16}) {
      SCOPED_TRACE(c.q.str() + " x " + c.kv.str() + (c.causal ? " causal " : " ") +
                   std::string(dtype_name(d)));
      const auto [q, k, v, g] = random_inputs(c, seed, d);
      seed += 4;
      auto run = [&](VectorIsa isa) {
        backend::cpu::force_vector_isa(isa);
        Tensor out = Tensor::empty(c.q, d), lse = Tensor::empty(lse_shape, DType::F32);
        backend::cpu_backend().attention(q, k, v, out, lse, p);
        Tensor gq = Tensor::empty(c.q, d), gk = Tensor::empty(c.kv, d), gv = Tensor::empty(c.kv, d);
        backend::cpu_backend().attention_backward(g, q, k, v, out, lse, gq, gk, gv, p);
        backend::cpu::force_vector_isa(std::nullopt);
        return std::vector<Tensor>{out, lse, gq, gk, gv};
      };
      const std::vector<Tensor> wide = run(VectorIsa::Avx512), narrow = run(VectorIsa::Avx2);
      const char* what[] = {"out", "lse", "grad q", "grad k", "grad v"};
      for (size_t i = 0; i < wide.size(); ++i)
        EXPECT_EQ(values(wide[i]), values(narrow[i])) << what[i];
    }
  }
}

// Batch dims broadcast as in the composed path (one key/value head shared by every query head),
// and the broadcast gradients are summed back.
TEST(FusedAttention, BroadcastBatchDims) {
  const ForceFusedPath force;
  const Tensor q0 = random_f64({2, 3, 6, 4}, 300), k0 = random_f64({2, 1, 5, 4}, 301),
               v0 = random_f64({1, 5, 4}, 302);
  auto run = [&](bool use_fused) {
    Tensor q = q0.detach(), k = k0.detach(), v = v0.detach();
    q.set_requires_grad(true);
    k.set_requires_grad(true);
    v.set_requires_grad(true);
    Tensor out = use_fused ? fused(q, k, v, true) : composed(q, k, v, true);
    sum(mul(out, out)).backward();
    return std::vector<Tensor>{out, q.grad(), k.grad(), v.grad()};
  };
  const std::vector<Tensor> a = run(true), b = run(false);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i].shape(), b[i].shape());
    EXPECT_TRUE(all_close(a[i], b[i], 0x1p-52, 64, "broadcast " + std::to_string(i)));
  }
}

// On the CPU, Auto takes the fused kernel where it is the vectorized one (AVX2 + FMA), for
// f32/bf16/f16, with a (batch, head) task for every thread and at least 16 queries; the composed
// path otherwise.
TEST(FusedAttention, AutoFollowsTheCpuKernelsDtypeThreadsAndQueries) {
  ASSERT_EQ(get_attention_path(), AttentionPath::Auto);
  auto graph_of = [&](const Tensor& q, const Tensor& kv, AttentionPath path) {
    set_attention_path(path);
    const Tensor out = scaled_dot_product_attention(q, kv, kv);
    set_attention_path(AttentionPath::Auto);
    // The node names along the first input edges, from the output back to the leaf.
    std::string names;
    for (std::shared_ptr<autograd::Node> node = out.grad_fn(); node;
         node = node->next_edges.empty() ? nullptr : node->next_edges[0].node)
      names += node->name() + " ";
    return names;
  };
  auto takes = [&](const Tensor& q, const Tensor& kv) {
    const std::string auto_graph = graph_of(q, kv, AttentionPath::Auto);
    if (auto_graph == graph_of(q, kv, AttentionPath::Fused)) return AttentionPath::Fused;
    EXPECT_EQ(auto_graph, graph_of(q, kv, AttentionPath::Composed));
    return AttentionPath::Composed;
  };
  const int threads = get_num_threads();
  set_num_threads(1);
  // 2 x 2 = 4 (batch, head) pairs of 16 queries.
  const Tensor q = Tensor::uniform({2, 2, 16, 4}, -1, 1, 1).set_requires_grad(true);
  const Tensor q64 = q.detach().to(DType::F64).set_requires_grad(true);
  const Tensor qbf = q.detach().to(DType::BF16).set_requires_grad(true);
  const AttentionPath vectorized =
      backend::cpu_fused_attention_vectorized() ? AttentionPath::Fused : AttentionPath::Composed;
  EXPECT_EQ(takes(q, q), vectorized);
  EXPECT_EQ(takes(qbf, qbf), vectorized);
  EXPECT_EQ(takes(q64, q64), AttentionPath::Composed);  // the plain f64 loops: composed is faster
  // 15 queries against 40 keys (a short step of a decode): the composed GEMMs read k and v in
  // place, the fused kernel would copy them.
  const Tensor kv = Tensor::uniform({2, 2, 40, 4}, -1, 1, 2).set_requires_grad(true);
  EXPECT_EQ(takes(q.narrow(2, 0, 15), kv), AttentionPath::Composed);
  EXPECT_EQ(takes(q.narrow(2, 0, 16), kv), vectorized);
  set_num_threads(8);  // more threads than pairs: the fused backward would leave some idle
  EXPECT_EQ(takes(q, q), AttentionPath::Composed);
  set_num_threads(1);
  backend::cpu::force_vector_isa(backend::cpu::VectorIsa::Baseline);
  EXPECT_FALSE(backend::cpu_fused_attention_vectorized());
  EXPECT_EQ(takes(q, q), AttentionPath::Composed);
  backend::cpu::force_vector_isa(std::nullopt);
  set_num_threads(threads);
}

// The fused path never materializes the (Tq, Tk) scores: its peak is well under the composed
// path's, which holds several score-sized tensors.
TEST(FusedAttention, PeakMemoryBelowComposedPath) {
  const ForceFusedPath force;
  const Tensor q = random_f64({1, 2, 512, 16}, 400).to(DType::F32);
  const Tensor k = random_f64({1, 2, 512, 16}, 401).to(DType::F32);
  const Tensor v = random_f64({1, 2, 512, 16}, 402).to(DType::F32);
  auto peak = [&](bool use_fused) {
    NoGrad ng;
    const int64_t before = memory_stats().current_bytes;
    reset_peak_memory();
    const Tensor out = use_fused ? fused(q, k, v, false) : composed(q, k, v, false);
    return memory_stats().peak_bytes - before;
  };
  const int64_t scores_bytes = 2 * 512 * 512 * 4;
  const int64_t fused_peak = peak(true), composed_peak = peak(false);
  EXPECT_LT(fused_peak, scores_bytes / 4) << "fused " << fused_peak;
  EXPECT_GT(composed_peak, scores_bytes) << "composed " << composed_peak;
}

}  // namespace
}  // namespace mantissa
