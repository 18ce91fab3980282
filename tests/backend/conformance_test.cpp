// Backend conformance, generated from the backend table (backend_ops.h), as ggml's
// test-backend-ops: every row of MT_FORALL_BACKEND_OPS has cases here (a row without one fails
// EveryRowHasCases, naming it), each case in the dtypes its contract takes, with seeded inputs;
// each target runs every case and is compared with the CPU backend, the reference, by the case's
// tolerance: bit for bit where the contract says so (data movement, comparisons, IEEE-exact
// arithmetic, the optimizers and the loss scaler), else |got - cpu| <= k eps (|cpu| + mean |cpu|)
// sqrt(len) for a sum of len terms (the op harness's rule: tests/harness/op_harness.h).
//
// The targets: the CPU's other vector builds (baseline, AVX2, AVX-512: whichever this CPU runs
// that is not the default), the CPU fallback (a backend with only copy and fill, so every row
// goes through fallback.cpp's copies: bit for bit), and, on a machine with a GPU, the CUDA
// backend (scripts/device-check runs this program first). Outputs start as NaN, so an element a
// kernel forgets to write shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/vector_isa.h"
#include "backend/cuda_test_util.h"
#include "backend/forced_isa.h"
#include "harness/op_harness.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::backend {
namespace {

// ---- cases ------------------------------------------------------------------------------------

// Where a case runs: tensors are made on the host from seeds and moved to `device`.
struct Place {
  Device device;
  // Uniform in [lo, hi] (seeded), in dtype dt, on the device.
  Tensor rand(const Shape& s, DType dt, uint64_t seed, double lo = -1, double hi = 1) const {
    return testing::random_f64(s, seed, lo, hi).to(dt).to(device);
  }
  Tensor host(const Tensor& t) const { return t.to(device); }
  // An output: NaN where floating (a missed element shows), else zeros.
  Tensor out(const Shape& s, DType dt) const {
    return is_floating(dt) ? Tensor::full(s, NAN, dt, device) : Tensor::zeros(s, dt, device);
  }
  Tensor zeros(const Shape& s, DType dt) const { return Tensor::zeros(s, dt, device); }
  Tensor ints(const std::vector<int64_t>& v, const Shape& s) const {
    return Tensor::from_vector(v, s).to(device);
  }
  // rand() with f applied to each value (on the host).
  template <typename F>
  Tensor mapped(const Shape& s, DType dt, uint64_t seed, double lo, double hi, F f) const {
    std::vector<double> v = testing::random_f64(s, seed, lo, hi).to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = f(v[i], i);
    return Tensor::from_vector(v, s, DType::F64).to(dt).to(device);
  }
};

using Outputs = std::vector<Tensor>;
using Run = std::function<Outputs(Backend&, const Place&)>;

struct Case {
  std::string row;   // the backend op
  std::string name;  // what the trace says
  DType dtype = DType::F32;
  bool exact = true;
  double k = 4;     // the tolerance's multiple of eps (when not exact)
  int64_t len = 1;  // terms summed per output element
  Run run;
};

// A forward case from a runner that also returns what its backward case reads: the first n
// outputs are compared.
Run first_outputs(size_t n, Run forward) {
  return [n, forward = std::move(forward)](Backend& be, const Place& p) {
    Outputs o = forward(be, p);
    o.resize(n);
    return o;
  };
}

const std::vector<DType> kFloats = {DType::F32, DType::BF16, DType::F16, DType::F64};

std::string dt_name(DType d) {
  return std::string(dtype_name(d));
}

bool positive_domain(UnaryOp op) {
  return op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt ||
         op == UnaryOp::PowScalar || op == UnaryOp::Reciprocal;
}

// Ops whose math is a library function (exp, tanh, erf, pow, ...): a device's differs by ulps.
bool transcendental(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp:
    case UnaryOp::Log:
    case UnaryOp::Rsqrt:
    case UnaryOp::Gelu:
    case UnaryOp::GeluTanh:
    case UnaryOp::Silu:
    case UnaryOp::Sigmoid:
    case UnaryOp::Tanh:
    case UnaryOp::PowScalar:
      return true;
    default:
      return false;
  }
}

void data_cases(std::vector<Case>& c) {
  for (DType dt : kFloats) {
    c.push_back({"uniform", dt_name(dt), dt, true, 4, 1, [dt](Backend& be, const Place& p) {
                   Tensor t = p.out({33, 17}, dt);
                   be.uniform(t, -2, 3, 7, 5);
                   return Outputs{t};
                 }});
    c.push_back({"normal", dt_name(dt), dt, false, 8, 1, [dt](Backend& be, const Place& p) {
                   Tensor t = p.out({33, 17}, dt);
                   be.normal(t, 0.5, 2, 7, 5);
                   return Outputs{t};
                 }});
  }
  for (Format f : {Format::BF16, Format::FP16, Format::TF32, Format::FP8_E4M3}) {
    c.push_back({"round_to_format", std::string(format_info(f).name), DType::F32, true, 4, 1,
                 [f](Backend& be, const Place& p) {
                   Tensor t = p.rand({19, 23}, DType::F32, 3, -500, 500);
                   be.round_to_format(t, f);
                   return Outputs{t};
                 }});
  }
  for (DType to : {DType::BF16, DType::F16, DType::FP8_E4M3, DType::FP8_E5M2}) {
    for (RoundingMode mode :
         {RoundingMode::NearestEven, RoundingMode::Stochastic, RoundingMode::TowardZero}) {
      c.push_back({"copy_rounded", dt_name(to) + " mode " + std::to_string(int(mode)), to, true, 4,
                   1, [to, mode](Backend& be, const Place& p) {
                     const Tensor src = p.rand({21, 30}, DType::F32, 4, -3, 3).t();  // strided
                     Tensor dst = p.zeros({30, 21}, to);
                     RoundingOptions r;
                     r.mode = mode;
                     r.seed = 9;
                     r.offset = 2;
                     r.index = 100;
                     be.copy_rounded(src, dst, r);
                     return Outputs{dst};
                   }});
    }
  }
  // fp8 quantization, every scale rule and block shape of the recipes.
  struct Q {
    const char* name;
    int64_t br, bc;
    Fp8ScaleRule rule;
  };
  for (const Q& q : {Q{"given", 0, 0, Fp8ScaleRule::Given}, Q{"current", 0, 0, Fp8ScaleRule::Amax},
                     Q{"mxfp8", 1, 32, Fp8ScaleRule::AmaxPow2},
                     Q{"blockwise 128x128", 128, 128, Fp8ScaleRule::Amax},
                     Q{"blockwise 1x128", 1, 128, Fp8ScaleRule::Amax}}) {
    for (DType in : {DType::F32, DType::BF16, DType::F16}) {
      for (DType code : {DType::FP8_E4M3, DType::FP8_E5M2}) {
        c.push_back({"fp8_quantize", std::string(q.name) + " " + dt_name(in) + "->" + dt_name(code),
                     in, true, 4, 1, [q, in, code](Backend& be, const Place& p) {
                       const int64_t R = 130, C = 160;
                       const Tensor x = p.rand({R, C}, in, 5, -40, 40);
                       const Tensor given = p.host(Tensor::full({1}, 3.5, DType::F32));
                       Fp8QuantizeParams params{q.br, q.bc, q.rule, &given};
                       const int64_t br = q.br ? q.br : R, bc = q.bc ? q.bc : C;
                       const Shape blocks{(R + br - 1) / br, (C + bc - 1) / bc};
                       Tensor codes = p.zeros({R, C}, code), values = p.out({R, C}, DType::BF16);
                       Tensor scale_inv = p.out(blocks, DType::F32),
                              amax = p.out(blocks, DType::F32);
                       be.fp8_quantize(x, params, codes, scale_inv, amax, &values);
                       return Outputs{codes, values, scale_inv, amax};
                     }});
      }
    }
  }
  // FP4 quantization: each rule, 1 x 16 and 16 x 16 blocks, nearest and stochastic, a given
  // amax; ragged shapes (the last blocks short).
  struct Q4 {
    const char* name;
    Fp4ScaleRule rule;
    int64_t br;
    bool stochastic, given;
  };
  for (const Q4& q : {Q4{"nvfp4 1x16", Fp4ScaleRule::Nvfp4, 1, false, false},
                      Q4{"nvfp4 16x16", Fp4ScaleRule::Nvfp4, 16, false, false},
                      Q4{"nvfp4 sr", Fp4ScaleRule::Nvfp4, 1, true, false},
                      Q4{"nvfp4 given amax", Fp4ScaleRule::Nvfp4, 1, false, true},
                      Q4{"mx floor", Fp4ScaleRule::MxFloor, 1, false, false},
                      Q4{"mx ceil sr", Fp4ScaleRule::MxCeil, 1, true, false}}) {
    for (DType in : {DType::F32, DType::BF16, DType::F16}) {
      c.push_back({"fp4_quantize", std::string(q.name) + " " + dt_name(in), in, true, 4, 1,
                   [q, in](Backend& be, const Place& p) {
                     const int64_t R = 70, C = 90, bc = q.rule == Fp4ScaleRule::Nvfp4 ? 16 : 32;
                     const Tensor x = p.rand({R, C}, in, 8, -20, 20);
                     const Tensor given = p.host(Tensor::full({1}, 50.0, DType::F32));
                     Fp4QuantizeParams params{q.rule, q.br, q.stochastic,
                                              31,     4,    q.given ? &given : nullptr};
                     Tensor codes = p.zeros({R, C}, DType::U8);
                     Tensor scales = p.zeros({(R + q.br - 1) / q.br, (C + bc - 1) / bc}, DType::U8);
                     Tensor scale_inv = p.out({1}, DType::F32), amax = p.out({1}, DType::F32);
                     Tensor values = p.out({R, C}, DType::BF16);
                     be.fp4_quantize(x, params, codes, scales, scale_inv, amax, &values);
                     return Outputs{codes, scales, scale_inv, amax, values};
                   }});
    }
  }
  // Transposed FP4 quantization (down x's columns, rows padded to whole blocks), the RHT fused.
  for (const Fp4ScaleRule rule : {Fp4ScaleRule::Nvfp4, Fp4ScaleRule::MxCeil}) {
    for (DType in : {DType::F32, DType::BF16}) {
      c.push_back({"fp4_quantize",
                   std::string(rule == Fp4ScaleRule::Nvfp4 ? "nvfp4" : "mx ceil") +
                       " columns rht sr " + dt_name(in),
                   in, true, 4, 1, [rule, in](Backend& be, const Place& p) {
                     const int64_t R = 70, C = 90, bc = rule == Fp4ScaleRule::Nvfp4 ? 16 : 32;
                     const int64_t Rp = (R + bc - 1) / bc * bc;
                     const Tensor x = p.rand({R, C}, in, 12, -20, 20);
                     Fp4QuantizeParams params{rule, 1, true, 31, 4};
                     params.columns = params.rht = true;
                     params.rht_signs = 0xd7e8u;
                     Tensor codes = p.zeros({Rp, C}, DType::U8);
                     Tensor scales = p.zeros({Rp / bc, C}, DType::U8);
                     Tensor scale_inv = p.out({1}, DType::F32), amax = p.out({1}, DType::F32);
                     Tensor values = p.out({Rp, C}, DType::BF16);
                     be.fp4_quantize(x, params, codes, scales, scale_inv, amax, &values);
                     return Outputs{codes, scales, scale_inv, amax, values};
                   }});
    }
  }
  // The FP4 GEMM, or where a backend has no FP4 tensor cores (it says false) what its caller
  // then runs, the emulation: the same products, fp32 sums in either's order.
  for (const Fp4ScaleRule rule : {Fp4ScaleRule::Nvfp4, Fp4ScaleRule::MxCeil}) {
    const bool nv = rule == Fp4ScaleRule::Nvfp4;
    c.push_back(
        {"fp4_gemm", nv ? "nvfp4 1x16 x 16x16" : "mxfp4", DType::F32, false, 8, 256,
         [rule, nv](Backend& be, const Place& p) {
           const int64_t M = 40, N = 48, K = 256, bc = nv ? 16 : 32, wr = nv ? 16 : 1;
           auto quantize = [&](const Tensor& x, int64_t br, Tensor& codes, Tensor& scales,
                               Tensor& scale_inv, Tensor& amax, Tensor& values) {
             const int64_t R = x.size(0);
             codes = p.zeros({R, K}, DType::U8);
             scales = p.zeros({(R + br - 1) / br, K / bc}, DType::U8);
             scale_inv = p.out({1}, DType::F32);
             amax = p.out({1}, DType::F32);
             values = p.out({R, K}, DType::BF16);
             be.fp4_quantize(x, Fp4QuantizeParams{rule, br}, codes, scales, scale_inv, amax,
                             &values);
           };
           Tensor ac, as, ai, aa, av, bc_, bs, bi, ba, bv;
           quantize(p.rand({M, K}, DType::F32, 10, -3, 3), 1, ac, as, ai, aa, av);
           quantize(p.rand({N, K}, DType::F32, 11, -1, 1), wr, bc_, bs, bi, ba, bv);
           Tensor out = p.out({M, N}, DType::F32);
           if (!be.fp4_gemm(ac, as, 1, ai, aa, bc_, bs, wr, bi, ba, rule, out)) {
             be.block_scaled_gemm(av, ai.view({1, 1}), M, bv, bi.view({1, 1}), N, K, nullptr, out);
           }
           return Outputs{out};
         }});
  }
  for (DType in : {DType::F32, DType::BF16, DType::F16}) {
    c.push_back({"hadamard16", std::string("rht ") + dt_name(in), in, true, 4, 1,
                 [in](Backend& be, const Place& p) {
                   const Tensor x = p.rand({9, 48}, in, 9, -4, 4);
                   Tensor out = p.out({9, 48}, in), wide = p.out({9, 48}, DType::F32);
                   be.hadamard16(x, 0xd7e8u, out);
                   be.hadamard16(x, 0x1234u, wide);
                   return Outputs{out, wide};
                 }});
  }
  c.push_back({"fp8_observe", "blocks and a history", DType::F32, true, 4, 1,
               [](Backend& be, const Place& p) {
                 const Tensor amax = p.rand({4, 3}, DType::F32, 6, 0, 9);
                 const Tensor scale_inv = p.rand({4, 3}, DType::F32, 7, 0.01, 2);
                 Tensor stats = p.host(Tensor::from_vector(std::vector<float>{0, 1, 2}, {3}));
                 Tensor history = p.host(Tensor::from_vector(std::vector<float>{1, 5, 2}, {3}));
                 be.fp8_observe(amax, scale_inv, stats, &history);
                 Tensor inf_amax = p.host(Tensor::full({2}, INFINITY, DType::F32));
                 Tensor stats2 = p.host(Tensor::from_vector(std::vector<float>{0, 1, 0}, {3}));
                 be.fp8_observe(inf_amax, scale_inv.reshape({-1}).narrow(0, 0, 2).contiguous(),
                                stats2, &history);
                 return Outputs{stats, history, stats2};
               }});
  for (bool use_max : {true, false}) {
    c.push_back({"fp8_update_scales", use_max ? "max" : "most recent", DType::F32, true, 4, 1,
                 [use_max](Backend& be, const Place& p) {
                   std::vector<Tensor> h{
                       p.host(Tensor::from_vector(std::vector<float>{3, 9, 1, 4}, {4})),
                       p.host(Tensor::from_vector(std::vector<float>{0, 0, 0}, {3})),
                       p.host(Tensor::from_vector(std::vector<float>{1e-30f, 2}, {2}))};
                   std::vector<Tensor> s{p.host(Tensor::ones({1})), p.host(Tensor::ones({1})),
                                         p.host(Tensor::ones({1}))};
                   const std::vector<float> fp8_max{448, 57344, 448};
                   be.fp8_update_scales(h, s, fp8_max, use_max, 1);
                   return Outputs{h[0], h[1], h[2], s[0], s[1], s[2]};
                 }});
  }
}

void elementwise_cases(std::vector<Case>& c) {
  for (const UnaryOpInfo& info : kUnaryOps) {
    const UnaryOp op = info.op;
    const Scalars s{op == UnaryOp::ClampScalar ? -0.4 : 0.7, 0.5};
    for (DType dt : kFloats) {
      const bool exact = !transcendental(op);
      // Magnitudes in [0.25, 2.5]; every other value negative where the op's domain allows.
      auto input = [op, dt](const Place& p) {
        const bool pos = positive_domain(op);
        return p.mapped({13, 37}, dt, 11, 0.25, 2.5,
                        [pos](double x, size_t i) { return pos || i % 2 == 0 ? x : -x; });
      };
      c.push_back({"unary", std::string(info.name) + " " + dt_name(dt), dt, exact, 4, 1,
                   [op, s, dt, input](Backend& be, const Place& p) {
                     const Tensor x = input(p);
                     Tensor out = p.out(x.shape(), dt);
                     be.unary(op, x, out, s);
                     return Outputs{out};
                   }});
      c.push_back({"unary_backward", std::string(info.name) + " " + dt_name(dt), dt, exact, 8, 1,
                   [op, s, dt, input](Backend& be, const Place& p) {
                     const Tensor x = input(p);
                     Tensor y = p.out(x.shape(), dt);
                     be.unary(op, x, y, s);
                     const Tensor g = p.rand(x.shape(), dt, 13);
                     Tensor gx = p.out(x.shape(), dt);
                     be.unary_backward(op, g, x, y, gx, s);
                     return Outputs{gx};
                   }});
    }
  }
  for (const BinaryOpInfo& info : kBinaryOps) {
    const BinaryOp op = info.op;
    const bool cmp = info.kind == BinaryKind::Comparison;
    for (DType dt : kFloats) {
      c.push_back({"binary", std::string(info.name) + " " + dt_name(dt), dt, op != BinaryOp::Pow, 4,
                   1, [op, cmp, dt](Backend& be, const Place& p) {
                     // Broadcast both ways: (5, 1, 9) with (4, 9); ties for the comparisons.
                     const Tensor a = p.rand({5, 1, 9}, dt, 14, 0.5, 2);
                     Tensor b = p.rand({4, 9}, dt, 15, 0.5, 2);
                     if (cmp)
                       b = p.host(a.to(Device::cpu()).select(0, 1).expand({4, 9}).contiguous());
                     Tensor out = p.out({5, 4, 9}, cmp ? DType::Bool : dt);
                     be.binary(op, a, b, out);
                     return Outputs{out};
                   }});
    }
  }
  for (DType dt : kFloats) {
    c.push_back({"add_scaled", dt_name(dt), dt, true, 4, 1, [dt](Backend& be, const Place& p) {
                   Tensor a = p.rand({6, 50}, dt, 16);
                   const Tensor b = p.rand({50}, dt, 17);
                   be.add_scaled(a, b, -0.3, a);  // in place, b broadcast
                   return Outputs{a};
                 }});
    c.push_back({"where", dt_name(dt), dt, true, 4, 1, [dt](Backend& be, const Place& p) {
                   const Tensor r = testing::random_f64({4, 9}, 18);
                   const Tensor cond = p.host(gt(r, Tensor::zeros({4, 9}, DType::F64)));
                   const Tensor a = p.rand({5, 1, 9}, dt, 19), b = p.rand({4, 9}, dt, 20);
                   Tensor out = p.out({5, 4, 9}, dt);
                   be.where(cond, a, b, out);
                   return Outputs{out};
                 }});
    c.push_back({"dropout", dt_name(dt), dt, true, 4, 1, [dt](Backend& be, const Place& p) {
                   const Tensor x = p.rand({17, 40}, dt, 21);
                   Tensor out = p.out(x.shape(), dt), mask = p.zeros(x.shape(), DType::Bool);
                   be.dropout(x, 0.3, 5, 9, out, mask);
                   return Outputs{out, mask};
                 }});
  }
  for (DType dt : kFloats) {
    for (bool with_add : {false, true}) {
      const std::string name = dt_name(dt) + (with_add ? " gates_add" : "");
      auto forward = [dt, with_add](Backend& be, const Place& p) {
        const int64_t B = 5, H = 11;
        const DType cdt = dt == DType::F64 ? DType::F64 : DType::F32;
        const Tensor gates = p.rand({B, 4 * H}, dt, 22, -2, 2);
        const Tensor add = with_add ? p.rand({B, 4 * H}, cdt, 23) : Tensor();
        const Tensor c_prev = p.rand({B, H}, dt, 24);
        Tensor acts = p.out({B, 4 * H}, dt), c_next = p.out({B, H}, dt), h = p.out({B, H}, dt);
        be.lstm_cell(gates, add, c_prev, acts, c_next, h);
        return Outputs{acts, c_next, h, c_prev, add};
      };
      c.push_back({"lstm_cell", name, dt, false, 4, 1, first_outputs(3, forward)});
      c.push_back({"lstm_cell_backward", name, dt, false, 8, 1,
                   [forward, dt, with_add](Backend& be, const Place& p) {
                     const Outputs f = forward(be, p);
                     const int64_t B = 5, H = 11;
                     const DType cdt = dt == DType::F64 ? DType::F64 : DType::F32;
                     const Tensor dh = p.rand({B, H}, dt, 25), dc = p.rand({B, H}, dt, 26);
                     const Tensor dh_add = with_add ? p.rand({B, H}, cdt, 27) : Tensor();
                     Tensor dgates = p.out({B, 4 * H}, dt), dc_prev = p.out({B, H}, dt);
                     be.lstm_cell_backward(f[0], f[1], f[3], dh, dh_add, dc, dgates, dc_prev);
                     return Outputs{dgates, dc_prev};
                   }});
    }
  }
}

void reduction_cases(std::vector<Case>& c) {
  for (const ReduceOpInfo& info : kReduceOps) {
    const ReduceOp op = info.op;
    const bool index = info.kind == ReduceKind::Index;
    const bool accumulate = info.kind == ReduceKind::Accumulate;
    for (DType dt : kFloats) {
      for (const std::vector<int>& dims : {std::vector<int>{1}, std::vector<int>{0, 2}}) {
        c.push_back(
            {"reduce",
             std::string(info.name) + " " + dt_name(dt) + " dims " + std::to_string(dims.size()),
             dt, !accumulate, 4, 60, [op, index, dt, dims](Backend& be, const Place& p) {
               const Tensor x = p.rand({6, 29, 10}, dt, 28);
               Shape keep = x.shape();
               for (int d : dims)
                 keep[size_t(d)] = 1;
               const DType odt = index ? DType::I64
                                 : dt == DType::F64 || op == ReduceOp::Max || op == ReduceOp::Min
                                     ? dt
                                     : DType::F32;
               Tensor out = p.out(keep, odt);
               const bool with_idx = op == ReduceOp::Max || op == ReduceOp::Min;
               Tensor idx = with_idx ? p.zeros(keep, DType::I64) : Tensor();
               be.reduce(op, x, dims, out, with_idx ? &idx : nullptr, 1);
               return with_idx ? Outputs{out, idx} : Outputs{out};
             }});
      }
    }
  }
}

void linalg_cases(std::vector<Case>& c) {
  for (DType dt : kFloats) {
    for (bool bias : {false, true}) {
      c.push_back({"matmul", dt_name(dt) + (bias ? " bias" : "") + " strided", dt, false, 4, 40,
                   [dt, bias](Backend& be, const Place& p) {
                     const Tensor a = p.rand({2, 40, 17}, dt, 29).transpose(1, 2);  // (2, 17, 40)
                     const Tensor b = p.rand({1, 40, 9}, dt, 30);                   // broadcast
                     const Tensor bv = p.rand({9}, dt, 31);
                     Tensor out = p.out({2, 17, 9}, dt);
                     be.matmul(a, b, bias ? &bv : nullptr, out, MatmulOptions{});
                     return Outputs{out};
                   }});
    }
  }
  c.push_back({"matmul", "tf32 inputs", DType::F32, false, 4, 40, [](Backend& be, const Place& p) {
                 const Tensor a = p.rand({1, 17, 40}, DType::F32, 32);
                 const Tensor b = p.rand({1, 40, 9}, DType::F32, 33);
                 Tensor out = p.out({1, 17, 9}, DType::F32);
                 be.matmul(a, b, nullptr, out, MatmulOptions{Format::TF32});
                 return Outputs{out};
               }});
  for (DType out_dt : {DType::F32, DType::BF16, DType::F16}) {
    // fp8 tensor cores sum at reduced precision within a k-group (docs/fp8.md: 2^-10.7 of the
    // terms' magnitudes measured): the device's tolerance is the emulation's plus that.
    c.push_back(
        {"fp8_gemm", dt_name(out_dt), out_dt, false, 64, 64, [out_dt](Backend& be, const Place& p) {
           const Tensor a = p.rand({33, 64}, DType::F32, 34, -30, 30).to(DType::FP8_E4M3);
           const Tensor b = p.rand({48, 64}, DType::F32, 35, -2, 2).to(DType::FP8_E5M2);
           const Tensor sa = p.host(Tensor::full({1}, 0.25, DType::F32));
           const Tensor sb = p.host(Tensor::full({1}, 3.0, DType::F32));
           Tensor out = p.out({33, 48}, out_dt);
           be.fp8_gemm(a, sa, b, sb, false, out);
           return Outputs{out};
         }});
    c.push_back({"block_scaled_gemm", dt_name(out_dt) + " 1x128 / 16-row blocks, bias", out_dt,
                 false, 4, 128, [out_dt](Backend& be, const Place& p) {
                   const int64_t M = 37, N = 21, K = 300, bk = 128, S = 3;
                   const Tensor a =
                       p.rand({M, K}, DType::F32, 36, -8, 8).to(DType::FP8_E4M3).to(DType::BF16);
                   const Tensor b = p.rand({K, N}, DType::F32, 37, -8, 8)
                                        .to(DType::FP8_E4M3)
                                        .to(DType::BF16)
                                        .t();  // K outer, as a weight gradient's operand
                   const Tensor sa = p.rand({M, S}, DType::F32, 38, 0.01, 2);
                   const Tensor sb = p.rand({2, S}, DType::F32, 39, 0.01, 2);
                   const Tensor bias = p.rand({N}, DType::BF16, 40);
                   Tensor out = p.out({M, N}, out_dt);
                   be.block_scaled_gemm(a, sa, 1, b, sb, 16, bk, &bias, out);
                   return Outputs{out};
                 }});
    // The fast accumulator is a sequence of IEEE operations in a fixed order: the same bits.
    for (const int64_t promote : {int64_t(0), int64_t(32)}) {
      c.push_back(
          {"fast_accumulate_gemm",
           dt_name(out_dt) + " 1x128 / 16-row blocks, promote " + std::to_string(promote), out_dt,
           true, 4, 1, [out_dt, promote](Backend& be, const Place& p) {
             const int64_t M = 37, N = 21, K = 300, bk = 128, S = 3;
             const Tensor a =
                 p.rand({M, K}, DType::F32, 41, -300, 300).to(DType::FP8_E4M3).to(DType::BF16);
             const Tensor b =
                 p.rand({K, N}, DType::F32, 42, -8, 8).to(DType::FP8_E4M3).to(DType::BF16).t();
             const Tensor sa = p.rand({M, S}, DType::F32, 43, 0.01, 2);
             const Tensor sb = p.rand({2, S}, DType::F32, 44, 0.01, 2);
             const Tensor bias = p.rand({N}, DType::BF16, 45);
             Tensor out = p.out({M, N}, out_dt);
             be.fast_accumulate_gemm(a, sa, 1, b, sb, 16, bk, promote, &bias, out);
             return Outputs{out};
           }});
    }
  }
}

void conv_cases(std::vector<Case>& c) {
  for (DType dt : kFloats) {
    Conv2dParams cp;
    cp.stride[0] = cp.stride[1] = 2;
    cp.padding[0] = cp.padding[1] = 1;
    auto inputs = [dt](const Place& p) {
      return Outputs{p.rand({2, 4, 9, 9}, dt, 41), p.rand({6, 4, 3, 3}, dt, 42),
                     p.rand({6}, dt, 43)};
    };
    c.push_back(
        {"conv2d", dt_name(dt), dt, false, 4, 36, [dt, cp, inputs](Backend& be, const Place& p) {
           const Outputs in = inputs(p);
           Tensor out = p.out({2, 6, 5, 5}, dt);
           be.conv2d(in[0], in[1], &in[2], out, cp, MatmulOptions{});
           return Outputs{out};
         }});
    c.push_back({"conv2d_backward", dt_name(dt), dt, false, 8, 50,
                 [dt, cp, inputs](Backend& be, const Place& p) {
                   const Outputs in = inputs(p);
                   const Tensor g = p.rand({2, 6, 5, 5}, dt, 44);
                   Tensor gx = p.out(in[0].shape(), dt), gw = p.out(in[1].shape(), dt),
                          gb = p.out({6}, dt);
                   be.conv2d_backward(g, in[0], in[1], &gx, &gw, &gb, cp, MatmulOptions{});
                   return Outputs{gx, gw, gb};
                 }});
    Pool2dParams pp;
    pp.kernel[0] = pp.kernel[1] = 3;
    pp.stride[0] = pp.stride[1] = 2;
    pp.padding[0] = pp.padding[1] = 1;
    c.push_back({"max_pool2d", dt_name(dt), dt, true, 4, 1, [dt, pp](Backend& be, const Place& p) {
                   const Tensor x = p.rand({2, 3, 9, 9}, dt, 45);
                   Tensor out = p.out({2, 3, 5, 5}, dt), idx = p.zeros({2, 3, 5, 5}, DType::I64);
                   be.max_pool2d(x, out, idx, pp);
                   return Outputs{out, idx};
                 }});
    c.push_back({"max_pool2d_backward", dt_name(dt), dt, false, 4, 4,
                 [dt, pp](Backend& be, const Place& p) {
                   const Tensor x = p.rand({2, 3, 9, 9}, dt, 45);
                   Tensor out = p.out({2, 3, 5, 5}, dt), idx = p.zeros({2, 3, 5, 5}, DType::I64);
                   be.max_pool2d(x, out, idx, pp);
                   Tensor gx = p.zeros(x.shape(), dt);
                   be.max_pool2d_backward(p.rand({2, 3, 5, 5}, dt, 46), idx, gx);
                   return Outputs{gx};
                 }});
    for (bool include_pad : {true, false}) {
      Pool2dParams ap = pp;
      ap.count_include_pad = include_pad;
      const std::string name = dt_name(dt) + (include_pad ? "" : " excluding pad");
      c.push_back({"avg_pool2d", name, dt, false, 4, 9, [dt, ap](Backend& be, const Place& p) {
                     Tensor out = p.out({2, 3, 5, 5}, dt);
                     be.avg_pool2d(p.rand({2, 3, 9, 9}, dt, 47), out, ap);
                     return Outputs{out};
                   }});
      c.push_back(
          {"avg_pool2d_backward", name, dt, false, 4, 9, [dt, ap](Backend& be, const Place& p) {
             Tensor gx = p.out({2, 3, 9, 9}, dt);
             be.avg_pool2d_backward(p.rand({2, 3, 5, 5}, dt, 48), gx, ap);
             return Outputs{gx};
           }});
    }
    c.push_back(
        {"adaptive_avg_pool2d", dt_name(dt), dt, false, 4, 16, [dt](Backend& be, const Place& p) {
           Tensor out = p.out({2, 3, 3, 2}, dt);
           be.adaptive_avg_pool2d(p.rand({2, 3, 10, 7}, dt, 49), out);
           return Outputs{out};
         }});
    c.push_back({"adaptive_avg_pool2d_backward", dt_name(dt), dt, false, 4, 16,
                 [dt](Backend& be, const Place& p) {
                   Tensor gx = p.out({2, 3, 10, 7}, dt);
                   be.adaptive_avg_pool2d_backward(p.rand({2, 3, 3, 2}, dt, 50), gx);
                   return Outputs{gx};
                 }});
  }
}

DType stats_of(DType dt) {
  return dt == DType::F64 ? DType::F64 : DType::F32;
}

void norm_cases(std::vector<Case>& c) {
  for (DType dt : kFloats) {
    const DType sdt = stats_of(dt);
    for (bool training : {true, false}) {
      auto forward = [dt, sdt, training](Backend& be, const Place& p) {
        const Tensor x = p.rand({4, 5, 6, 7}, dt, 51, -2, 3);
        const Tensor w = p.rand({5}, sdt, 52, 0.5, 1.5), b = p.rand({5}, sdt, 53);
        Tensor rm = p.rand({5}, sdt, 54), rv = p.rand({5}, sdt, 55, 0.5, 2);
        Tensor out = p.out(x.shape(), dt), mean = p.out({5}, sdt), rstd = p.out({5}, sdt);
        be.batch_norm(x, &w, &b, &rm, &rv, training, 0.1, 1e-5, out, mean, rstd);
        return Outputs{out, training ? mean : Tensor(), training ? rstd : Tensor(), rm, rv, x, w};
      };
      const std::string name = dt_name(dt) + (training ? " training" : " eval");
      c.push_back({"batch_norm", name, dt, false, 8, 168, first_outputs(5, forward)});
      c.push_back({"batch_norm_backward", name, dt, false, 16, 168,
                   [forward, dt, sdt, training](Backend& be, const Place& p) {
                     Outputs f = forward(be, p);
                     // Eval: the running statistics stand for the saved ones.
                     const Tensor mean = training ? f[1] : f[3];
                     Tensor rstd = f[2];
                     if (!training) rstd = p.host(rsqrt(add(f[4].to(Device::cpu()), 1e-5)));
                     const Tensor g = p.rand(f[5].shape(), dt, 56);
                     Tensor gx = p.out(f[5].shape(), dt), gw = p.out({5}, sdt),
                            gb = p.out({5}, sdt);
                     be.batch_norm_backward(g, f[5], &f[6], mean, rstd, training, &gx, &gw, &gb);
                     return Outputs{gx, gw, gb};
                   }});
    }
    auto ln_forward = [dt, sdt](Backend& be, const Place& p) {
      const Tensor x = p.rand({9, 70}, dt, 57, -2, 3);
      const Tensor w = p.rand({70}, dt, 58, 0.5, 1.5), b = p.rand({70}, dt, 59);
      Tensor out = p.out(x.shape(), dt), mean = p.out({9}, sdt), rstd = p.out({9}, sdt);
      be.layer_norm(x, &w, &b, 1e-5, out, mean, rstd);
      return Outputs{out, mean, rstd, x, w};
    };
    c.push_back({"layer_norm", dt_name(dt), dt, false, 8, 70, first_outputs(3, ln_forward)});
    c.push_back({"layer_norm_backward", dt_name(dt), dt, false, 16, 70,
                 [ln_forward, dt](Backend& be, const Place& p) {
                   const Outputs f = ln_forward(be, p);
                   const Tensor g = p.rand(f[3].shape(), dt, 60);
                   Tensor gx = p.out(f[3].shape(), dt), gw = p.out({70}, dt), gb = p.out({70}, dt);
                   be.layer_norm_backward(g, f[3], &f[4], f[1], f[2], &gx, &gw, &gb);
                   return Outputs{gx, gw, gb};
                 }});
  }
}

void softmax_attention_cases(std::vector<Case>& c) {
  for (DType dt : kFloats) {
    for (bool log : {false, true}) {
      const std::string name = dt_name(dt) + (log ? " log" : "");
      c.push_back({"softmax", name, dt, false, 8, 50, [dt, log](Backend& be, const Place& p) {
                     Tensor out = p.out({6, 50}, dt);
                     be.softmax(p.rand({6, 50}, dt, 61, -4, 4), 1, log, out);
                     return Outputs{out};
                   }});
      c.push_back(
          {"softmax_backward", name, dt, false, 8, 50, [dt, log](Backend& be, const Place& p) {
             Tensor y = p.out({6, 50}, dt);
             be.softmax(p.rand({6, 50}, dt, 61, -4, 4), 1, log, y);
             Tensor gx = p.out({6, 50}, dt);
             be.softmax_backward(p.rand({6, 50}, dt, 62), y, 1, log, gx);
             return Outputs{gx};
           }});
    }
    auto ce_forward = [dt](Backend& be, const Place& p) {
      const Tensor logits = p.rand({12, 17}, dt, 63, -3, 3);
      std::vector<int64_t> t(12);
      for (size_t i = 0; i < t.size(); ++i)
        t[i] = i % 4 == 3 ? -100 : int64_t(i * 7 % 17);
      const Tensor target = p.ints(t, {12});
      Tensor loss = p.out({12}, stats_of(dt)), log_probs = p.out({12, 17}, stats_of(dt));
      be.cross_entropy(logits, target, -100, 0.1, loss, log_probs);
      return Outputs{loss, log_probs, target};
    };
    c.push_back({"cross_entropy", dt_name(dt), dt, false, 8, 17, first_outputs(2, ce_forward)});
    c.push_back({"cross_entropy_backward", dt_name(dt), dt, false, 8, 17,
                 [ce_forward, dt](Backend& be, const Place& p) {
                   const Outputs f = ce_forward(be, p);
                   Tensor g = p.out({12, 17}, dt);
                   be.cross_entropy_backward(p.rand({12}, stats_of(dt), 64), f[1], f[2], -100, 0.1,
                                             g);
                   return Outputs{g};
                 }});
    for (bool causal : {false, true}) {
      const std::string name = dt_name(dt) + (causal ? " causal" : "");
      auto forward = [dt, causal](Backend& be, const Place& p) {
        const Tensor q = p.rand({2, 3, 19, 16}, dt, 65), k = p.rand({2, 3, 19, 16}, dt, 66),
                     v = p.rand({2, 3, 19, 16}, dt, 67);
        Tensor out = p.out(q.shape(), dt), lse = p.out({2, 3, 19}, stats_of(dt));
        be.attention(q, k, v, out, lse, AttentionParams{0.25, causal});
        return Outputs{out, lse, q, k, v};
      };
      c.push_back({"attention", name, dt, false, 8, 19, first_outputs(2, forward)});
      c.push_back({"attention_backward", name, dt, false, 16, 19,
                   [forward, dt, causal](Backend& be, const Place& p) {
                     const Outputs f = forward(be, p);
                     const Tensor g = p.rand(f[2].shape(), dt, 68);
                     Tensor gq = p.out(f[2].shape(), dt), gk = p.out(f[3].shape(), dt),
                            gv = p.out(f[4].shape(), dt);
                     be.attention_backward(g, f[2], f[3], f[4], f[0], f[1], gq, gk, gv,
                                           AttentionParams{0.25, causal});
                     return Outputs{gq, gk, gv};
                   }});
    }
  }
}

void indexing_cases(std::vector<Case>& c) {
  for (DType dt : kFloats) {
    c.push_back({"index_select", dt_name(dt), dt, true, 4, 1, [dt](Backend& be, const Place& p) {
                   const Tensor x = p.rand({7, 12}, dt, 69);
                   const Tensor idx = p.ints({6, 0, 3, 3, 1}, {5});
                   Tensor out = p.out({7, 5}, dt);
                   be.index_select(x, 1, idx, out);
                   return Outputs{out};
                 }});
    c.push_back({"gather", dt_name(dt), dt, true, 4, 1, [dt](Backend& be, const Place& p) {
                   const Tensor x = p.rand({7, 12}, dt, 70);
                   std::vector<int64_t> v(21);
                   for (size_t i = 0; i < v.size(); ++i)
                     v[i] = int64_t(i * 5 % 12);
                   Tensor out = p.out({7, 3}, dt);
                   be.gather(x, 1, p.ints(v, {7, 3}), out);
                   return Outputs{out};
                 }});
    // Accumulations into f32 (f64): a device adds repeated indices in another order.
    const DType acc = stats_of(dt);
    c.push_back({"index_add", dt_name(acc), acc, false, 4, 2, [acc](Backend& be, const Place& p) {
                   Tensor gx = p.zeros({7, 5}, acc);
                   be.index_add(gx, 0, p.ints({6, 0, 3, 3}, {4}), p.rand({4, 5}, acc, 71));
                   return Outputs{gx};
                 }});
    c.push_back({"scatter_add", dt_name(acc), acc, false, 4, 3, [acc](Backend& be, const Place& p) {
                   Tensor gx = p.zeros({7, 12}, acc);
                   std::vector<int64_t> v(21);
                   for (size_t i = 0; i < v.size(); ++i)
                     v[i] = int64_t(i * 5 % 4);
                   be.scatter_add(gx, 1, p.ints(v, {7, 3}), p.rand({7, 3}, acc, 72));
                   return Outputs{gx};
                 }});
  }
}

// The parameters of an optimizer step: an f32 and a bf16 parameter with an fp32 master, its
// moments, ids and counts (rows 3 and 5 of the counts), stochastic stores.
struct StepTensors {
  std::vector<Tensor> params, grads, s0, s1, masters;
  Tensor counts;
  std::vector<uint64_t> ids{3, 5};
  MultiTensorOptions options() {
    MultiTensorOptions o;
    o.ids = ids;
    o.step_counts = &counts;
    o.masters = masters;
    o.store_rounding = RoundingMode::Stochastic;
    o.seed = 4;
    return o;
  }
};

StepTensors step_tensors(const Place& p) {
  StepTensors t;
  t.params = {p.rand({50}, DType::F32, 73), p.rand({7, 30}, DType::BF16, 74)};
  t.grads = {p.rand({50}, DType::F32, 75), p.rand({7, 30}, DType::BF16, 76)};
  t.s0 = {p.rand({50}, DType::F32, 77), p.rand({7, 30}, DType::F32, 78)};
  t.s1 = {p.rand({50}, DType::F32, 79, 0, 1), p.rand({7, 30}, DType::F32, 80, 0, 1)};
  t.masters = {Tensor(), t.params[1].to(DType::F32)};
  t.counts = p.host(Tensor::from_vector(std::vector<int64_t>{0, 0, 0, 4, 0, 0}, {6}));
  return t;
}

void multi_tensor_cases(std::vector<Case>& c) {
  for (bool nesterov : {false, true}) {
    c.push_back({"sgd_step", nesterov ? "nesterov" : "momentum", DType::F32, true, 4, 1,
                 [nesterov](Backend& be, const Place& p) {
                   StepTensors t = step_tensors(p);
                   SgdStep h{.lr = 0.1,
                             .momentum = 0.9,
                             .dampening = 0,
                             .weight_decay = 0.01,
                             .nesterov = nesterov,
                             .options = t.options()};
                   for (int i = 0; i < 2; ++i)
                     be.sgd_step(t.params, t.grads, t.s0, h);
                   return Outputs{t.params[0], t.params[1], t.masters[1],
                                  t.s0[0],     t.s0[1],     t.counts};
                 }});
  }
  c.push_back({"adamw_step", "f32 and bf16 with a master", DType::F32, true, 4, 1,
               [](Backend& be, const Place& p) {
                 StepTensors t = step_tensors(p);
                 AdamWStep h{.lr = 0.01, .weight_decay = 0.1, .options = t.options()};
                 for (int i = 0; i < 2; ++i)
                   be.adamw_step(t.params, t.grads, t.s0, t.s1, h);
                 return Outputs{t.params[0], t.params[1], t.masters[1], t.s0[0], t.s1[1], t.counts};
               }});
  c.push_back({"adamw_step", "skipped by the flag", DType::F32, true, 4, 1,
               [](Backend& be, const Place& p) {
                 StepTensors t = step_tensors(p);
                 const Tensor flag = p.host(Tensor::ones({1}));
                 MultiTensorOptions o = t.options();
                 o.found_inf = &flag;
                 be.adamw_step(t.params, t.grads, t.s0, t.s1, {.lr = 0.01, .options = o});
                 return Outputs{t.params[0], t.params[1], t.counts};
               }});
  c.push_back(
      {"sparse_adamw_step", "bf16 table with a master, f32 table", DType::F32, true, 4, 1,
       [](Backend& be, const Place& p) {
         std::vector<Tensor> tables{p.rand({9, 6}, DType::BF16, 81),
                                    p.rand({5, 4}, DType::F32, 82)};
         std::vector<Tensor> masters{tables[0].to(DType::F32), Tensor()};
         std::vector<Tensor> rows{p.ints({7, 2, 4}, {3}), p.ints({0, 4}, {2})};
         std::vector<Tensor> grads{p.rand({3, 6}, DType::F32, 83), p.rand({2, 4}, DType::BF16, 84)};
         std::vector<Tensor> m{p.zeros({9, 6}, DType::F32), p.zeros({5, 4}, DType::F32)};
         std::vector<Tensor> v{p.zeros({9, 6}, DType::F32), p.zeros({5, 4}, DType::F32)};
         std::vector<Tensor> steps{p.zeros({9}, DType::I64), p.zeros({5}, DType::I64)};
         const std::vector<uint64_t> ids{0, 1};
         AdamWStep h{.lr = 0.01, .options = {}};
         h.options.ids = ids;
         h.options.masters = masters;
         h.options.store_rounding = RoundingMode::Stochastic;
         h.options.seed = 3;
         for (int i = 0; i < 2; ++i)
           be.sparse_adamw_step(tables, rows, grads, m, v, steps, h);
         return Outputs{tables[0], tables[1], masters[0], m[0], v[1], steps[0], steps[1]};
       }});
  for (double norm_type : {2.0, 1.0, double(INFINITY), 3.0}) {
    c.push_back({"multi_tensor_norm", "p " + std::to_string(norm_type), DType::F32, false, 8, 260,
                 [norm_type](Backend& be, const Place& p) {
                   const std::vector<Tensor> ts{p.rand({50}, DType::F32, 85),
                                                p.rand({7, 30}, DType::BF16, 86)};
                   Tensor out = p.out({1}, DType::F64);
                   be.multi_tensor_norm(ts, norm_type, out);
                   return Outputs{out};
                 }});
  }
  c.push_back(
      {"multi_tensor_scale", "f32 and bf16", DType::F32, true, 4, 1,
       [](Backend& be, const Place& p) {
         std::vector<Tensor> ts{p.rand({50}, DType::F32, 87), p.rand({7, 30}, DType::BF16, 88)};
         be.multi_tensor_scale(ts, p.host(Tensor::full({1}, 0.37, DType::F64)));
         return Outputs{ts[0], ts[1]};
       }});
  for (bool bad : {false, true}) {
    c.push_back({"unscale_and_check", bad ? "an inf" : "finite", DType::F32, true, 4, 1,
                 [bad](Backend& be, const Place& p) {
                   std::vector<Tensor> gs{
                       p.rand({50}, DType::F32, 89),
                       p.mapped({7, 30}, DType::F16, 90, -1, 1, [bad](double x, size_t i) {
                         return bad && i == 77 ? INFINITY : x;
                       })};
                   Tensor flag = p.host(Tensor::zeros({1}));
                   const bool host = be.unscale_and_check(gs, 0.125, nullptr);
                   std::vector<Tensor> again{gs[0].clone()};
                   be.unscale_and_check(again, 2.0, &flag);
                   return Outputs{gs[0], gs[1], flag, Tensor::full({1}, host ? 1 : 0, DType::F32)};
                 }});
    c.push_back({"unscale_with_state", bad ? "an inf" : "finite", DType::F32, true, 4, 1,
                 [bad](Backend& be, const Place& p) {
                   std::vector<Tensor> gs{
                       p.mapped({50}, DType::F32, 91, -1e4, 1e4,
                                [bad](double x, size_t i) { return bad && i == 13 ? NAN : x; }),
                       p.rand({7, 30}, DType::BF16, 92, -1e4, 1e4)};
                   const Tensor state = p.host(
                       Tensor::from_vector(std::vector<double>{65536, 3, 0, 0}, {4}, DType::F64));
                   Tensor flag = p.host(Tensor::zeros({1}));
                   be.unscale_with_state(gs, state, flag);
                   return Outputs{gs[0], gs[1], flag};
                 }});
    c.push_back({"update_scale", bad ? "backoff" : "growth", DType::F64, true, 4, 1,
                 [bad](Backend& be, const Place& p) {
                   Tensor state = p.host(
                       Tensor::from_vector(std::vector<double>{1024, 1, 0, 0}, {4}, DType::F64));
                   const Tensor flag = p.host(Tensor::full({1}, bad ? 1.0 : 0.0, DType::F32));
                   const ScaleUpdate rule{.growth_interval = 2, .hysteresis = 1};
                   for (int i = 0; i < 3; ++i)
                     be.update_scale(state, flag, rule);
                   return Outputs{state};
                 }});
  }
}

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> c;
    data_cases(c);
    elementwise_cases(c);
    reduction_cases(c);
    linalg_cases(c);
    conv_cases(c);
    norm_cases(c);
    softmax_attention_cases(c);
    indexing_cases(c);
    multi_tensor_cases(c);
    return c;
  }();
  return cases;
}

constexpr std::string_view kRows[] = {
#define MT_CONFORMANCE_ROW(family, R, op, params, args) #op,
    MT_FORALL_BACKEND_OPS(MT_CONFORMANCE_ROW)
#undef MT_CONFORMANCE_ROW
};

TEST(BackendConformance, EveryRowHasCases) {
  std::map<std::string, int> count;
  for (const Case& c : all_cases())
    ++count[c.row];
  for (std::string_view row : kRows)
    EXPECT_GT(count[std::string(row)], 0) << "backend row '" << row << "' has no conformance case";
  for (const auto& [row, n] : count) {
    bool known = false;
    for (std::string_view r : kRows)
      known = known || r == row;
    EXPECT_TRUE(known) << "a case names '" << row << "', which is no backend row";
  }
}

// ---- the comparison ---------------------------------------------------------------------------

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  std::vector<unsigned char> out(c.nbytes());
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

void compare(const Case& c, const Outputs& got, const Outputs& want, bool exact) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    if (!want[i].defined()) continue;
    ASSERT_TRUE(got[i].defined());
    ASSERT_EQ(got[i].shape(), want[i].shape());
    ASSERT_EQ(got[i].dtype(), want[i].dtype());
    if (exact || !is_floating(want[i].dtype())) {
      EXPECT_EQ(bytes_of(got[i]), bytes_of(want[i])) << "bit for bit";
      continue;
    }
    const DType dt = want[i].dtype() == DType::F64 ? c.dtype : want[i].dtype();
    EXPECT_TRUE(testing::all_close(got[i].to(Device::cpu()), want[i].to(Device::cpu()),
                                   testing::eps_of(dt == DType::F64 ? DType::F32 : dt),
                                   c.k * std::sqrt(double(c.len)), c.name));
  }
}

// Runs every case on a target (`run`: the case's outputs there) and on the CPU backend, and
// compares them; `exact`: bit for bit whatever the case says (the fallback).
void run_all(const std::string& target, bool exact,
             const std::function<Outputs(const Case&)>& run) {
  SCOPED_TRACE(target);
  Backend& cpu = cpu_backend();
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.row + ": " + c.name);
    const Outputs want = c.run(cpu, Place{Device::cpu()});
    compare(c, run(c), want, exact || c.exact);
  }
  std::printf("%zu cases on %s\n", all_cases().size(), target.c_str());
}

// Every case on backend `be`, its tensors on `device`.
void run_all_on(Backend& be, Device device, bool exact) {
  run_all(std::string(be.name()), exact, [&](const Case& c) { return c.run(be, Place{device}); });
}

// A backend with only what every backend must have: every row runs through the CPU fallback.
class FallbackOnly final : public Backend {
 public:
  std::string_view name() const override { return "fallback-only"; }
  void copy(const Tensor& src, Tensor& dst) override { cpu_backend().copy(src, dst); }
  void fill(Tensor& dst, double value) override { cpu_backend().fill(dst, value); }
};

TEST(BackendConformance, TheFallbackIsTheCpuBitForBit) {
  FallbackOnly be;
  run_all_on(be, Device::cpu(), /*exact=*/true);
}

// The CPU's other vector builds against its default one: the contract's exact rows bit for bit
// (the loops' sums run in 16 fixed lanes whatever the width), the GEMM-backed ones by their
// tolerance (oneDNN's kernels differ by ISA).
TEST(BackendConformance, EveryVectorBuildOfTheCpu) {
  int builds = 0;
  for (cpu::VectorIsa isa :
       {cpu::VectorIsa::Baseline, cpu::VectorIsa::Avx2, cpu::VectorIsa::Avx512}) {
    if (!cpu::vector_isa_supported(isa) || isa == cpu::vector_isa()) continue;
    // The reference runs first, with the default build; the target with `isa` forced.
    run_all(cpu::vector_isa_name(isa), /*exact=*/false, [isa](const Case& c) {
      cpu::ForcedIsa forced(isa);
      return c.run(cpu_backend(), Place{Device::cpu()});
    });
    ++builds;
  }
  if (builds == 0) GTEST_SKIP() << "this CPU runs one vector build only";
}

TEST(BackendConformance, TheCudaBackendFollowsTheCpu) {
  MT_REQUIRE_CUDA();
  run_all_on(backend_for(Device::cuda(0)), Device::cuda(0), /*exact=*/false);
}

}  // namespace
}  // namespace mantissa::backend
