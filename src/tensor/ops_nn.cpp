// Pooling, normalization, softmax, cross-entropy and attention: argument checks (a mistake gets
// a message naming shapes and dtypes), dtype rules, the device's kernel, the autograd record.
//
// Dtypes: outputs and gradients have the input's dtype (half types stay half in memory; the
// kernels compute in fp32). Saved statistics (batch/layer-norm mean and rstd) and the
// cross-entropy loss and log-probs are F32, or F64 for f64 inputs. Per-channel tensors (weight,
// bias, running stats) may have another float dtype than the input (fp32 norms of a half model,
// Apex O2); their gradients come back in their own dtype.
#include <cmath>
#include <sstream>

#include "backend/backend.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"
#include "tensor/layout.h"
#include "tensor/matmul_options.h"

namespace mantissa {

namespace {

backend::Backend& backend_of(const Tensor& t) {
  return backend::backend_for(t.device());
}

DType stats_dtype(DType d) {
  return d == DType::F64 ? DType::F64 : DType::F32;
}

std::string list_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i)
    os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

void check_floating(const Tensor& t, const char* op, const char* what) {
  MT_CHECK(t.defined(), op, ": ", what, " is undefined");
  MT_CHECK(t.is_floating_point(), op, ": ", what, " must be a floating tensor, got a ",
           t.describe(), "; cast with to(DType::F32)");
}

// An optional tensor that accompanies x: defined ones must be floating and on x's device.
void check_companion(const Tensor& t, const Tensor& x, const char* op, const char* what) {
  if (!t.defined()) return;
  check_floating(t, op, what);
  MT_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device().str(),
           " but the input is on ", x.device().str());
}

const Tensor* opt(const Tensor& t) {
  return t.defined() ? &t : nullptr;
}

// ---- pooling helpers -------------------------------------------------------------------------

// (N, C, H, W), or (C, H, W) seen as a batch of one.
Tensor as_nchw(const Tensor& x, const char* op) {
  check_floating(x, op, "the input");
  MT_CHECK(x.dim() == 3 || x.dim() == 4, op,
           ": expected an (N, C, H, W) or (C, H, W) input, got a ", x.describe());
  return x.dim() == 3 ? x.unsqueeze(0) : x;
}

// One value for both spatial dims, or (h, w).
std::array<int64_t, 2> hw_pair(const std::vector<int64_t>& v, const char* op, const char* what) {
  MT_CHECK(v.size() == 1 || v.size() == 2, op, ": ", what, " takes 1 or 2 values, got ",
           list_str(v));
  return {v[0], v.size() == 2 ? v[1] : v[0]};
}

backend::Pool2dParams pool_params(const Tensor& x4, const Pool2dOptions& o, const char* op,
                                  Shape& out_shape) {
  const auto k = hw_pair(o.kernel_size, op, "kernel_size");
  const auto s = o.stride.empty() ? k : hw_pair(o.stride, op, "stride");
  const auto p = hw_pair(o.padding, op, "padding");
  backend::Pool2dParams bp;
  out_shape = {x4.size(0), x4.size(1), 0, 0};
  for (int i = 0; i < 2; ++i) {
    MT_CHECK(k[size_t(i)] > 0, op, ": kernel_size must be positive, got ", list_str(o.kernel_size));
    MT_CHECK(s[size_t(i)] > 0, op, ": stride must be positive, got ", list_str(o.stride));
    MT_CHECK(p[size_t(i)] >= 0 && 2 * p[size_t(i)] <= k[size_t(i)], op, ": padding ",
             list_str(o.padding), " must be between 0 and half the kernel size ",
             list_str(o.kernel_size));
    const int64_t in = x4.size(2 + i) + 2 * p[size_t(i)];
    MT_CHECK(in >= k[size_t(i)], op, ": the kernel ", list_str(o.kernel_size),
             " is larger than the padded input (", x4.size(2) + 2 * p[0], ", ",
             x4.size(3) + 2 * p[1], ") of a ", x4.describe());
    out_shape[2 + i] = (in - k[size_t(i)]) / s[size_t(i)] + 1;
    bp.kernel[i] = k[size_t(i)];
    bp.stride[i] = s[size_t(i)];
    bp.padding[i] = p[size_t(i)];
  }
  bp.count_include_pad = o.count_include_pad;
  return bp;
}

// The result in the caller's rank: a (C, H, W) input gets a (C, OH, OW) output.
Tensor restore_rank(const Tensor& out4, const Tensor& x) {
  return x.dim() == 3 ? out4.squeeze(0) : out4;
}

}  // namespace

// ---- pooling ---------------------------------------------------------------------------------

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const Tensor x4 = as_nchw(x, "max_pool2d");
  Shape out_shape;
  const backend::Pool2dParams p = pool_params(x4, options, "max_pool2d", out_shape);
  // The CPU kernel keeps a channels-last input's layout (output, indices and gradient).
  const bool channels_last =
      x4.device().is_cpu() && x4.is_contiguous(MemoryFormat::ChannelsLast) && !x4.is_contiguous();
  const Device device = x.device();
  auto empty_like_input = [channels_last, device](const Shape& s, DType dt) {
    return channels_last ? layout::empty_channels_last(s, dt, device)
                         : Tensor::empty(s, dt, device);
  };
  Tensor out = empty_like_input(out_shape, x.dtype());
  Tensor indices = empty_like_input(out_shape, DType::I64);
  backend_of(x).max_pool2d(x4.detach(), out, indices, p);
  if (autograd::needs_grad({&x4})) {
    const Shape xs = x4.shape();
    const DType dt = x.dtype();
    const Device dev = x.device();
    autograd::record("max_pool2dBackward", {x4}, {out}, [=](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
      Tensor gx = empty_like_input(xs, dt);
      backend::backend_for(dev).max_pool2d_backward(g[0].to(dt), indices, gx);
      return std::vector<Tensor>{gx};
    });
  }
  return restore_rank(out, x);
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options) {
  const Tensor x4 = as_nchw(x, "avg_pool2d");
  Shape out_shape;
  const backend::Pool2dParams p = pool_params(x4, options, "avg_pool2d", out_shape);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  backend_of(x).avg_pool2d(x4.detach(), out, p);
  if (autograd::needs_grad({&x4})) {
    const Shape xs = x4.shape();
    const DType dt = x.dtype();
    const Device dev = x.device();
    autograd::record("avg_pool2dBackward", {x4}, {out}, [=](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
      Tensor gx = Tensor::empty(xs, dt, dev);
      backend::backend_for(dev).avg_pool2d_backward(g[0].to(dt), gx, p);
      return std::vector<Tensor>{gx};
    });
  }
  return restore_rank(out, x);
}

Tensor adaptive_avg_pool2d(const Tensor& x, const std::vector<int64_t>& output_size) {
  const Tensor x4 = as_nchw(x, "adaptive_avg_pool2d");
  const auto o = hw_pair(output_size, "adaptive_avg_pool2d", "output_size");
  MT_CHECK(o[0] > 0 && o[1] > 0, "adaptive_avg_pool2d: output_size must be positive, got ",
           list_str(output_size));
  MT_CHECK(x4.size(2) > 0 && x4.size(3) > 0,
           "adaptive_avg_pool2d: the input has an empty spatial dim: ", x.describe());
  Tensor out = Tensor::empty({x4.size(0), x4.size(1), o[0], o[1]}, x.dtype(), x.device());
  backend_of(x).adaptive_avg_pool2d(x4.detach(), out);
  if (autograd::needs_grad({&x4})) {
    const Shape xs = x4.shape();
    const DType dt = x.dtype();
    const Device dev = x.device();
    autograd::record("adaptive_avg_pool2dBackward", {x4}, {out}, [=](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
      Tensor gx = Tensor::empty(xs, dt, dev);
      backend::backend_for(dev).adaptive_avg_pool2d_backward(g[0].to(dt), gx);
      return std::vector<Tensor>{gx};
    });
  }
  return restore_rank(out, x);
}

// ---- normalization ---------------------------------------------------------------------------

Tensor batch_norm(const Tensor& x_arg, const Tensor& weight_arg, const Tensor& bias_arg,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  // The running statistics are updated in place, so autocast never replaces them by copies.
  const amp::AutocastInputs cast_in(amp::OpId::BatchNorm, x_arg, weight_arg, bias_arg);
  const Tensor &x = cast_in[0], &weight = cast_in[1], &bias = cast_in[2];
  check_floating(x, "batch_norm", "the input");
  MT_CHECK(x.dim() >= 2, "batch_norm: expected an input of shape (N, C, ...), got a ",
           x.describe());
  const int64_t channels = x.size(1);
  const std::pair<const Tensor*, const char*> per_channel[] = {{&weight, "weight"},
                                                               {&bias, "bias"},
                                                               {&running_mean, "running_mean"},
                                                               {&running_var, "running_var"}};
  for (const auto& [t, name] : per_channel) {
    check_companion(*t, x, "batch_norm", name);
    MT_CHECK(!t->defined() || t->numel() == channels, "batch_norm: ", name, " has ", t->numel(),
             " elements but the input has ", channels, " channels (input ", x.describe(), ", ",
             name, " ", t->describe(), ")");
  }
  MT_CHECK(running_mean.defined() == running_var.defined(),
           "batch_norm: give both running_mean and running_var, or neither");
  MT_CHECK(training || running_mean.defined(),
           "batch_norm: evaluation mode (training = false) needs running_mean and running_var");
  MT_CHECK(eps >= 0, "batch_norm: eps must be non-negative, got ", eps);
  if (training) {
    MT_CHECK(channels == 0 || x.numel() / channels > 1,
             "batch_norm: training needs more than 1 value per channel to compute a variance, "
             "got an input ",
             x.describe());
  }
  Tensor rm = running_mean, rv = running_var;  // handles: updated in place when training
  const bool update = training && rm.defined();
  if (update) {
    autograd::check_inplace(rm);
    autograd::check_inplace(rv);
  }
  const DType sdt = stats_dtype(x.dtype());
  // The CPU kernels keep a channels-last input's layout (output and gradient).
  auto like_input = [](const Tensor& t) {
    return t.device().is_cpu() && t.is_contiguous(MemoryFormat::ChannelsLast)
               ? layout::empty_like(t, t.dtype())
               : Tensor::empty(t.shape(), t.dtype(), t.device());
  };
  Tensor out = like_input(x);
  Tensor save_mean = Tensor::empty({channels}, sdt, x.device());
  Tensor save_rstd = Tensor::empty({channels}, sdt, x.device());
  backend_of(x).batch_norm(x.detach(), opt(weight), opt(bias), rm.defined() ? &rm : nullptr,
                           rv.defined() ? &rv : nullptr, training, momentum, eps, out, save_mean,
                           save_rstd);
  if (update) {
    rm.bump_version();
    rv.bump_version();
  }
  if (autograd::needs_grad({&x, &weight, &bias})) {
    const autograd::SavedTensor sx(x), sw(weight);
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    const Shape ws = weight.defined() ? weight.shape() : Shape{},
                bs = bias.defined() ? bias.shape() : Shape{};
    const DType wdt = weight.defined() ? weight.dtype() : x.dtype(),
                bdt = bias.defined() ? bias.dtype() : x.dtype();
    autograd::record("batch_normBackward", {x, weight, bias}, {out},
                     [=](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                       if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
                       const Tensor xv = sx.unpack(), wv = sw.unpack();
                       Tensor dx = gx ? like_input(xv) : Tensor();
                       Tensor dw = gw ? Tensor::empty(ws, wdt, xv.device()) : Tensor();
                       Tensor db = gb ? Tensor::empty(bs, bdt, xv.device()) : Tensor();
                       backend::backend_for(xv.device())
                           .batch_norm_backward(g[0].to(xv.dtype()), xv, opt(wv), save_mean,
                                                save_rstd, training, gx ? &dx : nullptr,
                                                gw ? &dw : nullptr, gb ? &db : nullptr);
                       return {dx, dw, db};
                     });
  }
  return out;
}

Tensor layer_norm(const Tensor& x_arg, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight_arg, const Tensor& bias_arg, double eps) {
  const amp::AutocastInputs cast_in(amp::OpId::LayerNorm, x_arg, weight_arg, bias_arg);
  const Tensor &x = cast_in[0], &weight = cast_in[1], &bias = cast_in[2];
  check_floating(x, "layer_norm", "the input");
  const int k = int(normalized_shape.size());
  MT_CHECK(k >= 1, "layer_norm: normalized_shape is empty; give the trailing dims to normalize");
  bool matches = x.dim() >= k;
  for (int i = 0; matches && i < k; ++i) {
    matches = x.size(x.dim() - k + i) == normalized_shape[size_t(i)];
  }
  MT_CHECK(matches, "layer_norm: normalized_shape ", list_str(normalized_shape),
           " does not match the last dims of the input ", x.describe());
  const Shape ns(normalized_shape);
  const std::pair<const Tensor*, const char*> params[] = {{&weight, "weight"}, {&bias, "bias"}};
  for (const auto& [t, name] : params) {
    check_companion(*t, x, "layer_norm", name);
    MT_CHECK(!t->defined() || t->shape() == ns, "layer_norm: ", name, " is a ", t->describe(),
             " but normalized_shape is ", list_str(normalized_shape));
  }
  MT_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got ", eps);
  const int64_t n = ns.numel();
  const int64_t m = n ? x.numel() / n : 0;
  const DType sdt = stats_dtype(x.dtype());
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({m}, sdt, x.device());
  Tensor rstd = Tensor::empty({m}, sdt, x.device());
  backend_of(x).layer_norm(x.detach(), opt(weight), opt(bias), eps, out, mean, rstd);
  if (autograd::needs_grad({&x, &weight, &bias})) {
    const autograd::SavedTensor sx(x), sw(weight);
    const bool gx = x.requires_grad(), gw = weight.defined() && weight.requires_grad(),
               gb = bias.defined() && bias.requires_grad();
    const DType wdt = weight.defined() ? weight.dtype() : x.dtype(),
                bdt = bias.defined() ? bias.dtype() : x.dtype();
    autograd::record(
        "layer_normBackward", {x, weight, bias}, {out},
        [=](const std::vector<Tensor>& g) -> std::vector<Tensor> {
          if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
          const Tensor xv = sx.unpack(), wv = sw.unpack();
          Tensor dx = gx ? Tensor::empty(xv.shape(), xv.dtype(), xv.device()) : Tensor();
          Tensor dw = gw ? Tensor::empty(ns, wdt, xv.device()) : Tensor();
          Tensor db = gb ? Tensor::empty(ns, bdt, xv.device()) : Tensor();
          backend::backend_for(xv.device())
              .layer_norm_backward(g[0].to(xv.dtype()), xv, opt(wv), mean, rstd, gx ? &dx : nullptr,
                                   gw ? &dw : nullptr, gb ? &db : nullptr);
          return {dx, dw, db};
        });
  }
  return out;
}

// ---- softmax ---------------------------------------------------------------------------------

namespace {

Tensor softmax_op(const Tensor& x, int64_t dim_in, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check_floating(x, name, "the input");
  const int dim = wrap_dim(dim_in, x.dim());
  // A scalar is a row of one.
  const Tensor xs = x.dim() == 0 ? x.reshape({1}) : x;
  Tensor out = Tensor::empty(xs.shape(), xs.dtype(), xs.device());
  backend_of(xs).softmax(xs.detach(), dim, log, out);
  if (autograd::needs_grad({&xs})) {
    const autograd::SavedTensor sy(out);
    autograd::record(
        std::string(name) + "Backward", {xs}, {out}, [=](const std::vector<Tensor>& g) {
          if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
          const Tensor y = sy.unpack();
          Tensor gx = Tensor::empty(y.shape(), y.dtype(), y.device());
          backend::backend_for(y.device()).softmax_backward(g[0].to(y.dtype()), y, dim, log, gx);
          return std::vector<Tensor>{gx};
        });
  }
  return x.dim() == 0 ? out.reshape({}) : out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  const amp::AutocastInputs cast_in(amp::OpId::Softmax, x);
  return softmax_op(cast_in[0], dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  const amp::AutocastInputs cast_in(amp::OpId::LogSoftmax, x);
  return softmax_op(cast_in[0], dim, true);
}

// ---- cross entropy ---------------------------------------------------------------------------

Tensor cross_entropy(const Tensor& logits_arg, const Tensor& target,
                     const CrossEntropyOptions& options) {
  const amp::AutocastInputs cast_in(amp::OpId::CrossEntropy, logits_arg);
  const Tensor& logits = cast_in[0];
  check_floating(logits, "cross_entropy", "the logits");
  MT_CHECK(target.defined(), "cross_entropy: the target is undefined");
  MT_CHECK(target.dtype() == DType::I64 || target.dtype() == DType::I32,
           "cross_entropy: targets must be class indices (i64), got a ", target.describe(),
           " (probability targets are not supported)");
  MT_CHECK(target.device() == logits.device(), "cross_entropy: the logits are on ",
           logits.device().str(), " but the target is on ", target.device().str());
  MT_CHECK(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0,
           "cross_entropy: label_smoothing must be in [0, 1], got ", options.label_smoothing);
  MT_CHECK(logits.dim() >= 1, "cross_entropy: expected logits (N, C) or (N, C, d1, ...), got a ",
           logits.describe());

  // Logits as (rows, C) with the class dim last; targets as (rows).
  Tensor logits2;
  Shape loss_shape;
  if (logits.dim() == 1) {  // one unbatched sample: logits (C), target ()
    MT_CHECK(target.dim() == 0, "cross_entropy: logits ", logits.describe(),
             " (one sample) need a scalar target, got a ", target.describe());
    logits2 = logits.unsqueeze(0);
  } else {
    Shape expected = logits.shape();
    expected.erase(1);
    MT_CHECK(target.shape() == expected, "cross_entropy: logits ", logits.describe(),
             " need targets of shape ", expected.str(),
             " (the logits' shape without the class "
             "dim 1), got a ",
             target.describe());
    loss_shape = expected;
    if (logits.dim() == 2) {
      logits2 = logits;
    } else {
      std::vector<int64_t> perm = {0};
      for (int64_t d = 2; d < logits.dim(); ++d)
        perm.push_back(d);
      perm.push_back(1);
      logits2 = logits.permute(perm).reshape({-1, logits.size(1)});
    }
  }
  const int64_t classes = logits2.size(1), rows = logits2.size(0);
  MT_CHECK(classes > 0, "cross_entropy: the logits have no classes: ", logits.describe());
  const Tensor tgt = target.to(DType::I64).reshape({rows}).contiguous().detach();

  const DType ldt = stats_dtype(logits.dtype());
  const int64_t ignore = options.ignore_index;
  const double ls = options.label_smoothing;
  Tensor loss = Tensor::empty({rows}, ldt, logits.device());
  Tensor log_probs = Tensor::empty({rows, classes}, ldt, logits.device());
  backend_of(logits).cross_entropy(logits2.detach(), tgt, ignore, ls, loss, log_probs);
  if (autograd::needs_grad({&logits2})) {
    const DType dt = logits.dtype();
    autograd::record("cross_entropyBackward", {logits2}, {loss}, [=](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
      Tensor gl = Tensor::empty(log_probs.shape(), dt, log_probs.device());
      backend::backend_for(gl.device())
          .cross_entropy_backward(g[0].to(ldt), log_probs, tgt, ignore, ls, gl);
      return std::vector<Tensor>{gl};
    });
  }
  switch (options.reduction) {
    case Reduction::None:
      return loss.reshape(loss_shape);
    case Reduction::Sum:
      return sum(loss);
    case Reduction::Mean: {
      // The mean over the targets that count (PyTorch's rule); NaN when every one is ignored.
      const Tensor counted =
          sum(ne(tgt, Tensor::full({}, double(ignore), DType::I64, tgt.device())));
      return div(sum(loss), counted.to(ldt));
    }
  }
  return loss;
}

// ---- binary cross entropy --------------------------------------------------------------------

namespace {

void check_binary_loss(const Tensor& input, const Tensor& target, const char* op,
                       const char* what) {
  check_floating(input, op, what);
  check_floating(target, op, "the targets");
  MT_CHECK(target.device() == input.device(), op, ": ", what, " are on ", input.device().str(),
           " but the targets are on ", target.device().str());
  MT_CHECK(target.shape() == input.shape(), op, ": the targets ", target.describe(),
           " must have the shape of ", what, " ", input.describe());
}

Tensor reduce_loss(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::None:
      return loss;
    case Reduction::Sum:
      return sum(loss);
    case Reduction::Mean:
      return mean(loss);
  }
  return loss;
}

}  // namespace

Tensor binary_cross_entropy(const Tensor& p_arg, const Tensor& y_arg, Reduction reduction) {
  const char* op = "binary_cross_entropy";
  const amp::AutocastInputs cast_in(amp::OpId::BinaryCrossEntropy, p_arg, y_arg);
  const Tensor &probs = cast_in[0], &target = cast_in[1];
  check_binary_loss(probs, target, op, "the probabilities");
  const DType ldt = stats_dtype(promote_types(probs.dtype(), target.dtype()));
  Tensor p, y, log_p, log_1mp, loss;
  {
    NoGrad ng;
    p = probs.to(ldt).detach();
    y = target.to(ldt).detach();
    log_p = clamp(log(p), -100.0, std::nullopt);
    log_1mp = clamp(log(rsub(p, 1.0)), -100.0, std::nullopt);
    loss = neg(add(mul(y, log_p), mul(rsub(y, 1.0), log_1mp)));
  }
  if (autograd::needs_grad({&probs, &target})) {
    const bool gp = probs.requires_grad(), gy = target.requires_grad();
    autograd::record("binary_cross_entropyBackward", {probs, target}, {loss},
                     [=](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                       if (!g[0].defined()) return {Tensor(), Tensor()};
                       // d/dp = (p - y) / (p (1 - p)), the denominator kept >= 1e-12 as PyTorch
                       // does.
                       Tensor dp, dy;
                       if (gp) {
                         const Tensor denom = clamp(mul(p, rsub(p, 1.0)), 1e-12, std::nullopt);
                         dp = mul(g[0], div(sub(p, y), denom));
                       }
                       if (gy) dy = mul(g[0], sub(log_1mp, log_p));
                       return {dp, dy};
                     });
  }
  return reduce_loss(loss, reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& x_arg, const Tensor& y_arg,
                                        Reduction reduction) {
  const char* op = "binary_cross_entropy_with_logits";
  const amp::AutocastInputs cast_in(amp::OpId::BinaryCrossEntropyWithLogits, x_arg, y_arg);
  const Tensor &logits = cast_in[0], &target = cast_in[1];
  check_binary_loss(logits, target, op, "the logits");
  const DType ldt = stats_dtype(promote_types(logits.dtype(), target.dtype()));
  Tensor x, y, loss;
  {
    NoGrad ng;
    x = logits.to(ldt).detach();
    y = target.to(ldt).detach();
    // max(x, 0) - x y + log(1 + exp(-|x|)): no overflow for any x.
    loss = add(sub(relu(x), mul(x, y)), log(add(exp(neg(abs(x))), 1.0)));
  }
  if (autograd::needs_grad({&logits, &target})) {
    const bool gx = logits.requires_grad(), gy = target.requires_grad();
    autograd::record("binary_cross_entropy_with_logitsBackward", {logits, target}, {loss},
                     [=](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                       if (!g[0].defined()) return {Tensor(), Tensor()};
                       Tensor dx = gx ? mul(g[0], sub(sigmoid(x), y)) : Tensor();
                       Tensor dy = gy ? mul(g[0], neg(x)) : Tensor();
                       return {dx, dy};
                     });
  }
  return reduce_loss(loss, reduction);
}

// ---- recurrent --------------------------------------------------------------------------------

std::vector<Tensor> lstm_pointwise(const Tensor& gates_in, const Tensor& c_in) {
  MT_CHECK(gates_in.defined() && gates_in.dim() == 2 && gates_in.size(1) % 4 == 0 &&
               gates_in.is_floating_point(),
           "lstm_pointwise: the gates must be a float (B, 4H), got a ",
           gates_in.defined() ? gates_in.describe() : std::string("undefined tensor"));
  const int64_t b = gates_in.size(0), n = gates_in.size(1) / 4;
  if (c_in.defined()) {
    MT_CHECK(c_in.dim() == 2 && c_in.size(0) == b && c_in.size(1) == n &&
                 c_in.is_floating_point() && c_in.device() == gates_in.device(),
             "lstm_pointwise: the cell state must be a float (", b, ", ", n, ") on ",
             gates_in.device().str(), " as the gates, got a ", c_in.describe());
  }
  const DType dt =
      c_in.defined() ? promote_types(gates_in.dtype(), c_in.dtype()) : gates_in.dtype();
  const Device device = gates_in.device();
  // Gates stored narrower than the state (bf16 from an autocast GEMM, fp32 cell state) are read
  // as they are: the kernel converts them on load, and writes their gradient back in their dtype.
  const DType g_dt = stats_dtype(gates_in.dtype()) == stats_dtype(dt) ? gates_in.dtype() : dt;
  const Tensor gates = gates_in.to(g_dt).contiguous().detach();
  const Tensor c = c_in.defined() ? c_in.to(dt).contiguous().detach() : Tensor();
  Tensor acts = Tensor::empty({b, 4 * n}, dt, device);
  Tensor c_next = Tensor::empty({b, n}, dt, device);
  Tensor h = Tensor::empty({b, n}, dt, device);
  backend::backend_for(device).lstm_cell(gates, Tensor(), c, acts, c_next, h);
  if (autograd::needs_grad({&gates_in, &c_in})) {
    const autograd::SavedTensor s_acts(acts), s_c(c_next), s_prev(c);
    const DType g_dtype = gates_in.dtype();
    const DType c_dtype = c_in.defined() ? c_in.dtype() : dt;
    const bool has_prev = c_in.defined();
    autograd::record(
        "lstm_pointwiseBackward", {gates_in, c_in}, {h, c_next},
        [=](const std::vector<Tensor>& g) -> std::vector<Tensor> {
          if (!g[0].defined() && !g[1].defined()) return {Tensor(), Tensor()};
          auto as_dt = [&](const Tensor& t) { return t.defined() ? t.to(dt).contiguous() : t; };
          Tensor dz = Tensor::empty({b, 4 * n}, g_dt, device);
          Tensor dc_prev = Tensor::empty({b, n}, dt, device);
          backend::backend_for(device).lstm_cell_backward(s_acts.unpack(), s_c.unpack(),
                                                          s_prev.unpack(), as_dt(g[0]), Tensor(),
                                                          as_dt(g[1]), dz, dc_prev);
          return {dz.to(g_dtype), has_prev ? dc_prev.to(c_dtype) : Tensor()};
        });
  }
  return {h, c_next};
}

namespace {

// The (1, M, K) @ (1, K, N) product into out (1, M, N), in the backend's GEMM (inputs of one
// dtype, out F32/F64 or theirs): the recurrence's GEMMs write into buffers they reuse.
void gemm_into(const Tensor& a, const Tensor& b, Tensor& out) {
  backend_of(out).matmul(a.unsqueeze(0), b.unsqueeze(0), nullptr, out, detail::matmul_options());
}

}  // namespace

std::vector<Tensor> lstm_sequence(const Tensor& gx_arg, const Tensor& w_arg, const Tensor& h0_arg,
                                  const Tensor& c0_arg) {
  const amp::AutocastInputs cast_in(amp::OpId::LstmSequence, gx_arg, w_arg, h0_arg, c0_arg);
  const Tensor &gx_in = cast_in[0], &w_in = cast_in[1], &h0_in = cast_in[2], &c0_in = cast_in[3];
  MT_CHECK(
      gx_in.defined() && gx_in.dim() == 3 && gx_in.size(0) > 0 && gx_in.size(2) % 4 == 0 &&
          gx_in.is_floating_point(),
      "lstm_sequence: the input gates must be a float (T, B, 4H) with T > 0 (time-major), got ",
      gx_in.defined() ? gx_in.describe() : std::string("undefined tensor"));
  const int64_t steps = gx_in.size(0), b = gx_in.size(1), n = gx_in.size(2) / 4;
  const Device device = gx_in.device();
  MT_CHECK(w_in.defined() && w_in.dim() == 2 && w_in.size(0) == 4 * n && w_in.size(1) == n &&
               w_in.is_floating_point() && w_in.device() == device,
           "lstm_sequence: the recurrent weight must be a float (", 4 * n, ", ", n, ") on ",
           device.str(), " for gates (T, ", b, ", ", 4 * n, "), got ",
           w_in.defined() ? w_in.describe() : std::string("undefined tensor"));
  DType dt = promote_types(gx_in.dtype(), w_in.dtype());
  for (const Tensor* s : {&h0_in, &c0_in}) {
    if (!s->defined()) continue;
    MT_CHECK(s->dim() == 2 && s->size(0) == b && s->size(1) == n && s->is_floating_point() &&
                 s->device() == device,
             "lstm_sequence: an initial state must be a float (", b, ", ", n, ") on ", device.str(),
             ", got a ", s->describe());
    dt = promote_types(dt, s->dtype());
  }
  const DType cdt = stats_dtype(dt);  // the GEMMs' outputs and the pointwise math
  const Tensor gx = gx_in.to(dt).contiguous(), w = w_in.to(dt);
  const Tensor h0 = h0_in.defined() ? h0_in.to(dt).contiguous() : Tensor();
  const Tensor c0 = c0_in.defined() ? c0_in.to(dt).contiguous() : Tensor();
  const bool grad = autograd::needs_grad({&gx, &w, &h0, &c0});
  backend::Backend& be = backend_of(gx);

  // Every step's h is an output; the activations and cell states are kept for backward only
  // (without grad, one step's acts and two alternating cell states).
  Tensor y = Tensor::empty({steps, b, n}, dt, device);
  Tensor acts = Tensor::empty({grad ? steps : 1, b, 4 * n}, dt, device);
  Tensor cs = Tensor::empty({grad ? steps : 2, b, n}, dt, device);
  Tensor rec = Tensor::empty({1, b, 4 * n}, cdt, device);
  const Tensor w_t = w.t();  // (H, 4H): h (B, H) @ w^T
  for (int64_t t = 0; t < steps; ++t) {
    const Tensor h_prev = t == 0 ? h0 : y.select(0, t - 1);
    const Tensor c_prev = t == 0 ? c0 : cs.select(0, grad ? t - 1 : (t - 1) % 2);
    if (h_prev.defined()) gemm_into(h_prev, w_t, rec);
    Tensor a_t = acts.select(0, grad ? t : 0), c_t = cs.select(0, grad ? t : t % 2);
    Tensor h_t = y.select(0, t);
    be.lstm_cell(gx.select(0, t), h_prev.defined() ? rec.select(0, 0) : Tensor(), c_prev, a_t, c_t,
                 h_t);
  }
  const Tensor h_last = y.select(0, steps - 1).clone();
  const Tensor c_last = cs.select(0, grad ? steps - 1 : (steps - 1) % 2).clone();
  if (!grad) return {y, h_last, c_last};

  const autograd::SavedTensor s_y(y), s_acts(acts), s_cs(cs), s_w(w), s_h0(h0), s_c0(c0);
  const DType gx_dtype = gx.dtype();
  autograd::record(
      "lstm_sequenceBackward", {gx, w, h0, c0}, {y, h_last, c_last},
      [=](const std::vector<Tensor>& g) -> std::vector<Tensor> {
        if (!g[0].defined() && !g[1].defined() && !g[2].defined()) return {{}, {}, {}, {}};
        NoGrad no_grad;
        const Tensor yv = s_y.unpack(), av = s_acts.unpack(), cv = s_cs.unpack();
        const Tensor wv = s_w.unpack(), h0v = s_h0.unpack(), c0v = s_c0.unpack();
        backend::Backend& bk = backend::backend_for(device);
        // y's gradient as it comes (a transposed view from a batch-first caller is read in
        // place: the kernel takes any row stride), unless its rows are not unit-stride.
        Tensor gy = g[0].defined() ? g[0].to(dt) : Tensor();
        if (gy.defined() && gy.stride(2) != 1) gy = gy.contiguous();
        Tensor dgx = Tensor::empty({steps, b, 4 * n}, gx_dtype, device);
        // dh from the next step's gates (dz_{t+1} W_hh, in the compute dtype) and the last h's
        // gradient; dc through two alternating buffers.
        Tensor dh_rec = Tensor::empty({1, b, n}, cdt, device);
        Tensor dh_add = g[1].defined() ? g[1].to(cdt).contiguous() : Tensor();
        Tensor dc_buf[2] = {Tensor::empty({b, n}, dt, device), Tensor::empty({b, n}, dt, device)};
        Tensor dc = g[2].defined() ? g[2].to(dt).contiguous() : Tensor();
        for (int64_t t = steps - 1; t >= 0; --t) {
          const Tensor c_prev = t == 0 ? c0v : cv.select(0, t - 1);
          Tensor dz = dgx.select(0, t);
          Tensor& dc_prev = dc_buf[t % 2];
          bk.lstm_cell_backward(av.select(0, t), cv.select(0, t), c_prev,
                                gy.defined() ? gy.select(0, t) : Tensor(), dh_add, dc, dz, dc_prev);
          dc = dc_prev;
          if (t > 0 || h0v.defined()) {
            gemm_into(dz, wv, dh_rec);
            dh_add = dh_rec.select(0, 0);
          }
        }
        // dW_hh = sum_t dz_t^T h_{t-1}, summed in the compute dtype and rounded to w's dtype once:
        // one GEMM per kDwSteps steps (their B rows each), h0's term apart. Not one GEMM over all
        // T steps: the GEMM copies a transposed operand whose rows are 4 KiB apart (4H = 1024
        // floats, dnnl_matmul.cpp's 4K-aliasing cure), and a copy of all of dz raised the step's
        // peak memory by its size (measured +32 MiB on the lstm model in fp32).
        constexpr int64_t kDwSteps = 8;
        Tensor dw = Tensor::zeros({4 * n, n}, cdt, device);
        Tensor part = Tensor::empty({1, 4 * n, n}, cdt, device);
        auto accumulate = [&](const Tensor& dz_rows, const Tensor& h_rows) {
          gemm_into(dz_rows.t(), h_rows, part);
          dw = add(dw, part.view({4 * n, n}));
        };
        for (int64_t t0 = 1; t0 < steps; t0 += kDwSteps) {
          const int64_t len = std::min(kDwSteps, steps - t0);
          accumulate(dgx.narrow(0, t0, len).reshape({-1, 4 * n}),
                     yv.narrow(0, t0 - 1, len).reshape({-1, n}));
        }
        if (h0v.defined()) accumulate(dgx.select(0, 0), h0v);
        return {dgx, dw.to(wv.dtype()), h0v.defined() ? dh_rec.view({b, n}).to(dt) : Tensor(),
                c0v.defined() ? dc : Tensor()};  // dc: one of this call's own buffers
      });
  return {y, h_last, c_last};
}

// ---- attention -------------------------------------------------------------------------------

namespace {

// attention.cu keeps a query row's slice of the head in registers, up to this head dim; larger
// heads take the composed path on CUDA.
constexpr int64_t kCudaFusedAttentionMaxHeadDim = 128;

// The leading dims (all but the last two) of t.
Shape batch_dims(const Tensor& t) {
  Shape s = t.shape();
  s.resize(s.size() - 2);
  return s;
}

// t (..., T, D) expanded to the batch dims `batch` and seen as a (B, H, T, D), through
// differentiable ops: autograd sums a broadcast's gradient back and undoes the reshape. A 4-D t
// that needs no broadcast is taken as it is, in any layout (the heads of a fused qkv projection:
// the backends read or copy them); otherwise it is made contiguous to be flattened.
Tensor as_bhtd(const Tensor& t, const Shape& batch) {
  Shape full = batch;
  full.push_back(t.size(-2));
  full.push_back(t.size(-1));
  if (t.dim() == 4 && t.shape() == full) return t;
  int64_t b = 1, h = 1;
  for (int i = 0; i < batch.size(); ++i)
    (i + 1 == batch.size() ? h : b) *= batch[i];
  return t.expand(full).contiguous().reshape({b, h, t.size(-2), t.size(-1)});
}

// The fused attention's output (B, H, T, D): on the CPU in the query's order of H and T, so that
// a multi-head layer's (B, T, H, D) query gives the (B, T, H, D) output its projection reads
// without a copy; contiguous otherwise.
Tensor attention_output(const Tensor& q) {
  if (q.device().is_cpu() && q.stride(2) > q.stride(1) && q.size(1) > 1 && q.size(2) > 1) {
    return Tensor::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.dtype(), q.device())
        .permute({0, 2, 1, 3});
  }
  return Tensor::empty(q.shape(), q.dtype(), q.device());
}

constexpr int64_t kCpuFusedAttentionMinQueries = 16;

// The common batch dims of q, k and v when the fused kernels can take them; nullopt sends the
// call down the composed path (explicit masks, a value head dim other than the query's, empty
// sequences, heads too large for the device's kernel, batch dims that do not broadcast — the
// composed path then reports them).
std::optional<Shape> fused_attention_batch(const Tensor& q, const Tensor& k, const Tensor& v,
                                           const Tensor& mask) {
  const AttentionPath path = get_attention_path();
  if (path == AttentionPath::Composed) return std::nullopt;
  if (mask.defined() || v.size(-1) != q.size(-1)) return std::nullopt;
  if (q.size(-2) == 0 || k.size(-2) == 0 || q.size(-1) == 0) return std::nullopt;
  if (q.device().is_cuda() && q.size(-1) > kCudaFusedAttentionMaxHeadDim) return std::nullopt;
  std::optional<Shape> batch;
  try {
    batch = broadcast_shapes(batch_dims(q), broadcast_shapes(batch_dims(k), batch_dims(v)));
  } catch (const Error&) {
    return std::nullopt;
  }
  if (path == AttentionPath::Auto && q.device().is_cpu()) {
    // See AttentionPath: the fused kernel where it is the vectorized one, its backward (one task
    // per (batch, head)) has a task for every thread, and there are queries enough to pay for
    // the contiguous copies of k and v it reads (a decode step's one query against a KV cache
    // would copy the whole cache; the composed GEMMs read it in place).
    const bool fast = backend::cpu_fused_attention_vectorized() && q.dtype() != DType::F64 &&
                      batch->numel() >= get_num_threads() &&
                      q.size(-2) >= kCpuFusedAttentionMinQueries;
    if (!fast) return std::nullopt;
  }
  return batch;
}

// The fused forward on (B, H, T, D) tensors; the backward recomputes the probabilities from
// the saved log-sum-exp, so nothing (Tq, Tk) is kept.
Tensor fused_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                       const backend::AttentionParams& params) {
  Tensor out = attention_output(q);
  Tensor lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, stats_dtype(q.dtype()), q.device());
  backend_of(q).attention(q.detach(), k.detach(), v.detach(), out, lse, params);
  if (autograd::needs_grad({&q, &k, &v})) {
    const autograd::SavedTensor sq(q), sk(k), sv(v), so(out), sl(lse);
    autograd::record("scaled_dot_product_attentionBackward", {q, k, v}, {out},
                     [=](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                       if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
                       const Tensor qs = sq.unpack(), ks = sk.unpack(), vs = sv.unpack();
                       Tensor gq = Tensor::empty(qs.shape(), qs.dtype(), qs.device());
                       Tensor gk = Tensor::empty(ks.shape(), ks.dtype(), ks.device());
                       Tensor gv = Tensor::empty(vs.shape(), vs.dtype(), vs.device());
                       backend::backend_for(qs.device())
                           .attention_backward(g[0].to(qs.dtype()), qs, ks, vs, so.unpack(),
                                               sl.unpack(), gq, gk, gv, params);
                       return {gq, gk, gv};
                     });
  }
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q_arg, const Tensor& k_arg, const Tensor& v_arg,
                                    const Tensor& mask, bool causal, std::optional<double> scale) {
  const amp::AutocastInputs cast_in(amp::OpId::ScaledDotProductAttention, q_arg, k_arg, v_arg);
  const Tensor &q = cast_in[0], &k = cast_in[1], &v = cast_in[2];
  const char* op = "scaled_dot_product_attention";
  check_floating(q, op, "the query");
  check_floating(k, op, "the key");
  check_floating(v, op, "the value");
  MT_CHECK(q.dim() >= 2 && k.dim() >= 2 && v.dim() >= 2, op,
           ": query, key and value need at least 2 dims (..., T, D), got ", q.describe(), ", ",
           k.describe(), " and ", v.describe());
  MT_CHECK(q.dtype() == k.dtype() && q.dtype() == v.dtype(), op,
           ": query, key and value must share a dtype, got ", q.describe(), ", ", k.describe(),
           " and ", v.describe());
  MT_CHECK(q.size(-1) == k.size(-1), op, ": the query's last dim (", q.size(-1),
           ") must equal the key's (", k.size(-1), "); got query ", q.describe(), ", key ",
           k.describe());
  MT_CHECK(k.size(-2) == v.size(-2), op, ": key and value need the same sequence length, got key ",
           k.describe(), " and value ", v.describe());
  const int64_t tq = q.size(-2), tk = k.size(-2);
  const double s = scale.value_or(1.0 / std::sqrt(double(q.size(-1))));

  if (const std::optional<Shape> batch = fused_attention_batch(q, k, v, mask)) {
    backend::AttentionParams params;
    params.scale = s;
    params.causal = causal;
    const Tensor out =
        fused_attention(as_bhtd(q, *batch), as_bhtd(k, *batch), as_bhtd(v, *batch), params);
    Shape out_shape = *batch;
    out_shape.push_back(tq);
    out_shape.push_back(q.size(-1));
    return out_shape == out.shape() ? out : out.reshape(out_shape);
  }

  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), s);  // (..., Tq, Tk)
  const Tensor neg_inf = Tensor::full({}, -INFINITY, scores.dtype(), scores.device());
  if (causal) {
    // Query i sees keys 0..i (top-left aligned, as PyTorch's is_causal).
    const Tensor rows = Tensor::arange(tq, DType::I64, q.device()).reshape({tq, 1});
    const Tensor cols = Tensor::arange(tk, DType::I64, q.device()).reshape({1, tk});
    scores = where(le(cols, rows), scores, neg_inf);
  }
  if (mask.defined()) {
    MT_CHECK(mask.device() == q.device(), op, ": the mask is on ", mask.device().str(),
             " but the query is on ", q.device().str());
    bool fits = mask.dim() <= scores.dim();
    if (fits) {
      try {
        fits = broadcast_shapes(mask.shape(), scores.shape()) == scores.shape();
      } catch (const Error&) {
        fits = false;
      }
    }
    MT_CHECK(fits, op, ": the mask ", mask.describe(), " does not broadcast to the scores ",
             scores.shape().str(), " (..., Tq, Tk)");
    if (mask.dtype() == DType::Bool) {
      scores = where(mask, scores, neg_inf);  // true = attend
    } else {
      MT_CHECK(mask.is_floating_point(), op,
               ": the mask must be bool (true = attend) or floating (added to the scores), got a ",
               mask.describe());
      scores = add(scores, mask.to(scores.dtype()));
    }
  }
  return matmul(softmax(scores, -1), v);
}

}  // namespace mantissa
