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

}  // namespace

Fp4Tensor fp4_quantize(const Tensor& x_arg, const Fp4Quantization& q) {
  MT_CHECK(x_arg.defined() && x_arg.dim() == 2 && x_arg.is_floating_point() &&
               x_arg.dtype() != DType::F64,
           "fp4_quantize: x must be a 2-D f32, bf16 or f16 matrix, got ",
           x_arg.defined() ? x_arg.describe() : std::string("an undefined tensor"));
  MT_CHECK(!q.two_d || q.recipe == Fp4Recipe::NVFP4,
           "fp4_quantize: 16 x 16 blocks are NVFP4's; MXFP4 blocks are 1 x 32");
  MT_CHECK(!q.transposed || !q.two_d,
           "fp4_quantize: a transposed quantization has 1-D blocks; quantize a 16 x 16-block "
           "matrix as it is and read its transposed view");
  MT_CHECK(!q.rht || q.transposed,
           "fp4_quantize: the fused Hadamard transform runs along a transposed quantization's "
           "rows; for x's own rows call hadamard16 first");
  NoGrad ng;
  const Tensor x = x_arg.contiguous();
  const Device d = x.device();
  backend::Fp4QuantizeParams p;
  p.rule = rule_of(q.recipe, q.mx_scale);
  p.block_rows = q.two_d ? 16 : 1;
  p.stochastic = q.stochastic;
  p.seed = q.seed;
  p.offset = q.offset;
  p.columns = q.transposed;
  p.rht = q.rht;
  p.rht_signs = q.rht_signs;
  p.values_only = !q.codes;
  const int64_t R = x.size(0), C = x.size(1), bc = backend::fp4_block_cols(p.rule);
  // The stored layout: x's, rows padded to whole blocks when transposed (x^T's blocks run down
  // x's columns); the block scales one per block in the same orientation.
  const int64_t rows = q.transposed ? (R + bc - 1) / bc * bc : R;
  const Shape scales = q.transposed
                           ? Shape{rows / bc, C}
                           : Shape{(R + p.block_rows - 1) / p.block_rows, (C + bc - 1) / bc};
  Fp4Tensor t;
  t.recipe = q.recipe;
  t.mx_scale = q.mx_scale;
  t.block_rows = p.block_rows;
  Tensor codes =
      q.codes ? Tensor::empty({rows, C}, DType::U8, d) : Tensor::empty({0}, DType::U8, d);
  t.block_scales = Tensor::empty(scales, DType::U8, d);
  t.values = Tensor::empty({rows, C}, DType::BF16, d);
  t.scale_inv = Tensor::empty({1}, DType::F32, d);
  t.amax = Tensor::empty({1}, DType::F32, d);
  backend::backend_for(d).fp4_quantize(x, p, codes, t.block_scales, t.scale_inv, t.amax, &t.values);
  if (q.codes) t.codes = codes;
  if (q.transposed) {
    if (t.codes.defined()) t.codes = t.codes.t();
    t.block_scales = t.block_scales.t();
    t.values = t.values.t();
  }
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
  Fp4Quantization rne{.recipe = o.recipe, .mx_scale = o.mx_scale};
  rne.codes = x.device().is_cuda();  // the codes feed FP4 tensor cores; the CPU emulates
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
            if (kept_w.codes.defined()) wt.codes = kept_w.codes.t();
            wt.block_scales = kept_w.block_scales.t();
            wt.values = kept_w.values.t();
          } else {
            // w^T along w's rows, as wide as g's (a transposed quantization would pad them).
            wt = fp4_quantize(saved_w.unpack().t().contiguous(), rne);
          }
          dx = fp4_gemm(qg, wt, Tensor(), x_dtype);
        }
        if (gw) {  // dw (out, in) = g^T (out, M) . x^T (in, M): reduction along M (the batch)
          // Both quantized along M without a transpose (the RHT fused), M zero-padded to whole
          // blocks (zeros leave the sums as they are).
          auto along_batch = [&](Fp4Quantization q) {
            q.transposed = true;
            q.rht = o.rht;
            q.rht_signs = signs;
            return q;
          };
          const Fp4Tensor qgt = fp4_quantize(g2, along_batch(grad_q()));
          dw = fp4_gemm(qgt, fp4_quantize(saved_x.unpack(), along_batch(rne)), Tensor(), w_dtype);
        }
        if (gb) db = linear_bias_grad(g2, b_dtype);
        return {gx ? dx.reshape(x_shape) : Tensor(), dw, db};
      });
  return y;
}

}  // namespace mantissa::amp
