// FP4 training's op layer (mantissa/autocast/fp4.h): quantization and the RHT on the backends'
// kernels (fp4_quantize, hadamard16: backend/fp4_math.h's arithmetic), the GEMM of quantized
// operands (block_scaled_gemm of the exact bf16 values with the two tensor scales), and the
// differentiable fp4_linear with the NVFP4 paper's choices per GEMM.
#include "mantissa/autocast/fp4.h"

#include <algorithm>
#include <vector>

#include "autocast/linear_common.h"
#include "backend/backend.h"
#include "backend/fp4_math.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {

namespace {

backend::Fp4ScaleRule rule_of(Fp4Recipe r, MxScale mx) {
  if (r == Fp4Recipe::NVFP4) return backend::Fp4ScaleRule::Nvfp4;
  return mx == MxScale::Floor ? backend::Fp4ScaleRule::MxFloor : backend::Fp4ScaleRule::MxCeil;
}

// Its bookkeeping into the layer's tensor state: the amax, the tensor scale and whether it met
// inf or NaN (fp8_observe's stats; no history: FP4 scales come from the data).
void observe(Fp8TensorMeta& m, const Fp4Tensor& q) {
  m.place(q.amax.device());
  ++m.quantizations;
  backend::backend_for(q.amax.device()).fp8_observe(q.amax, q.scale_inv, m.stats, nullptr);
  m.stats.bump_version();
}

// x (R, C) with C padded by zero columns to a multiple of 16 (the RHT's groups; zeros leave the
// GEMM's sums as they are).
Tensor pad_to_16(const Tensor& x) {
  const int64_t C = x.size(1), padded = (C + 15) / 16 * 16;
  if (padded == C) return x.contiguous();
  Tensor out = Tensor::zeros({x.size(0), padded}, x.dtype(), x.device());
  out.narrow(1, 0, C).copy_(x);
  return out;
}

}  // namespace

Fp4Tensor fp4_quantize(const Tensor& x_arg, const Fp4Quantization& q) {
  MT_CHECK(x_arg.defined() && x_arg.dim() == 2 && x_arg.is_floating_point() &&
               x_arg.dtype() != DType::F64,
           "fp4_quantize: x must be a 2-D f32, bf16 or f16 matrix, got ",
           x_arg.defined() ? x_arg.describe() : std::string("an undefined tensor"));
  MT_CHECK(!q.two_d || q.recipe == Fp4Recipe::NVFP4,
           "fp4_quantize: 16 x 16 blocks are NVFP4's; MXFP4 blocks are 1 x 32");
  NoGrad ng;
  const Tensor x = x_arg.contiguous();
  const Device d = x.device();
  backend::Fp4QuantizeParams p;
  p.rule = rule_of(q.recipe, q.mx_scale);
  p.block_rows = q.two_d ? 16 : 1;
  p.stochastic = q.stochastic;
  p.seed = q.seed;
  p.offset = q.offset;
  const int64_t R = x.size(0), C = x.size(1), bc = backend::fp4_block_cols(p.rule);
  Fp4Tensor t;
  t.recipe = q.recipe;
  t.mx_scale = q.mx_scale;
  t.block_rows = p.block_rows;
  t.codes = Tensor::empty({R, C}, DType::U8, d);
  t.block_scales =
      Tensor::empty({(R + p.block_rows - 1) / p.block_rows, (C + bc - 1) / bc}, DType::U8, d);
  t.values = Tensor::empty({R, C}, DType::BF16, d);
  t.scale_inv = Tensor::empty({1}, DType::F32, d);
  t.amax = Tensor::empty({1}, DType::F32, d);
  backend::backend_for(d).fp4_quantize(x, p, t.codes, t.block_scales, t.scale_inv, t.amax,
                                       &t.values);
  return t;
}

Tensor hadamard16(const Tensor& x, uint32_t signs) {
  MT_CHECK(x.defined() && x.dim() == 2 && x.is_floating_point() && x.dtype() != DType::F64 &&
               x.size(1) % 16 == 0,
           "hadamard16: x must be a 2-D f32, bf16 or f16 matrix whose rows are groups of 16, got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  NoGrad ng;
  const Tensor c = x.contiguous();
  Tensor out = Tensor::empty(c.shape(), c.dtype(), c.device());
  backend::backend_for(c.device()).hadamard16(c, signs, out);
  return out;
}

uint32_t fp4_rht_signs(uint64_t seed) {
  return backend::hadamard16_signs(seed);
}

Tensor fp4_gemm(const Fp4Tensor& a, const Fp4Tensor& b, const Tensor& bias, DType out_dtype) {
  MT_CHECK(a.values.defined() && b.values.defined() && a.values.dim() == 2 && b.values.dim() == 2 &&
               a.values.size(1) == b.values.size(1),
           "fp4_gemm: a (M, K) and b (N, K) must share K, got ",
           a.values.defined() ? a.values.describe() : "undefined", " and ",
           b.values.defined() ? b.values.describe() : "undefined");
  MT_CHECK(a.recipe == b.recipe, "fp4_gemm: a and b must be quantized by one recipe, got ",
           name_of(a.recipe), " and ", name_of(b.recipe));
  NoGrad ng;
  const int64_t M = a.values.size(0), N = b.values.size(0), K = a.values.size(1);
  if (a.values.device().is_cuda() && a.codes.defined() && b.codes.defined()) {
    // FP4 tensor cores, where the GPU has them (the backend says false elsewhere).
    const bool direct = out_dtype == DType::BF16 && !bias.defined();
    Tensor native = Tensor::empty({M, N}, direct ? DType::BF16 : DType::F32, a.values.device());
    if (backend::backend_for(native.device())
            .fp4_gemm(a.codes, a.block_scales, a.block_rows, a.scale_inv, a.amax, b.codes,
                      b.block_scales, b.block_rows, b.scale_inv, b.amax,
                      rule_of(a.recipe, a.mx_scale), native)) {
      if (direct) return native;
      return (bias.defined() ? add(native, bias.to(DType::F32)) : native).to(out_dtype);
    }
  }
  Tensor out = Tensor::empty({M, N}, out_dtype, a.values.device());
  // One K slice, each operand's one tensor scale: (sum of exact products in fp32) * sa * sb.
  backend::backend_for(out.device())
      .block_scaled_gemm(a.values, a.scale_inv.view({1, 1}), std::max<int64_t>(M, 1), b.values,
                         b.scale_inv.view({1, 1}), std::max<int64_t>(N, 1), std::max<int64_t>(K, 1),
                         bias.defined() ? &bias : nullptr, out);
  return out;
}

Tensor fp4_linear(const Tensor& x, const Tensor& w, const Tensor& b, Fp8LinearState& state,
                  const Fp4Options& o) {
  check_linear_operands("fp4_linear", x, w, b);
  const int64_t in = w.size(1), out_features = w.size(0);
  const DType out_dtype = linear_output_dtype(x, w, b);
  const bool training = autograd::needs_grad({&x, &w, &b});
  const bool nv = o.recipe == Fp4Recipe::NVFP4;
  const Fp4Quantization rne{o.recipe, o.mx_scale, false, false, 0, 0};
  Fp4Quantization weights = rne;
  weights.two_d = nv && o.two_d;

  const Tensor x2 = x.reshape({-1, in}).contiguous();  // (M, in)
  const Fp4Tensor qx = fp4_quantize(x2, rne), qw = fp4_quantize(w, weights);
  observe(state[Fp8Role::Input], qx);
  observe(state[Fp8Role::Weight], qw);
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out_features;
  Tensor y = fp4_gemm(qx, qw, b, out_dtype).view(out_shape);
  if (!training) return y;

  // Backward quantizes again along each GEMM's reduction dimension, from the inputs kept in
  // their dtype; a 16 x 16-block weight serves dgrad as it is (its transposed view).
  const autograd::SavedTensor saved_x(x2.detach());
  const autograd::SavedTensor saved_w(weights.two_d ? Tensor() : w.detach());
  const Fp4Tensor kept_w = weights.two_d ? qw : Fp4Tensor{};
  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype(), b_dtype = b.defined() ? b.dtype() : w_dtype;
  const bool gx = x.requires_grad(), gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
  const uint32_t signs = fp4_rht_signs(o.seed);
  Fp8LinearState* st = &state;
  autograd::record(
      "fp4LinearBackward", {x, w, b}, {y},
      [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor& g = grads[0];
        if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
        const Tensor g2 = g.reshape({-1, out_features}).contiguous();  // (M, out)
        // The gradient's quantizations, stochastically rounded under sr, each its own stream.
        auto grad_q = [&]() {
          Fp4Quantization q = rne;
          q.stochastic = o.sr;
          q.seed = st->sr_seed;
          q.offset = o.sr ? uint64_t(st->sr_draws++) : 0;
          return q;
        };
        Tensor dx, dw, db;
        if (gx) {  // dx (M, in) = g (M, out) . w (out, in): reduction along out
          const Fp4Tensor qg = fp4_quantize(g2, grad_q());
          observe((*st)[Fp8Role::GradOutput], qg);
          Fp4Tensor wt;
          if (kept_w.values.defined()) {
            wt = kept_w;
            wt.codes = kept_w.codes.t();
            wt.block_scales = kept_w.block_scales.t();
            wt.values = kept_w.values.t();
          } else {
            wt = fp4_quantize(saved_w.unpack().t().contiguous(), rne);
          }
          dx = fp4_gemm(qg, wt, Tensor(), x_dtype);
        }
        if (gw) {  // dw (out, in) = g^T (out, M) . x^T (in, M): reduction along M (the batch)
          Tensor gt = g2.t().contiguous(), xt = saved_x.unpack().t().contiguous();
          if (o.rht) {
            gt = hadamard16(pad_to_16(gt), signs);
            xt = hadamard16(pad_to_16(xt), signs);
          }
          const Fp4Tensor qgt = fp4_quantize(gt, grad_q());
          dw = fp4_gemm(qgt, fp4_quantize(xt, rne), Tensor(), w_dtype);
        }
        if (gb) db = linear_bias_grad(g2, b_dtype);
        return {gx ? dx.reshape(x_shape) : Tensor(), dw, db};
      });
  return y;
}

}  // namespace mantissa::amp
