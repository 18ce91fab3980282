// Linear algebra and convolution ops: matmul (torch.matmul semantics), linear, conv2d,
// conv_transpose2d. Each checks its arguments, promotes dtypes, runs the backend kernel on views
// (no copies for transposed or broadcast operands) and records one autograd node whose gradients
// are GEMMs of transposed views (matmul, linear) or the backend's convolution kernels.
#include <algorithm>

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

using detail::matmul_options;

void check_defined(const Tensor& t, const char* op, const char* what) {
  MT_CHECK(t.defined(), op, ": ", what, " is undefined");
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  MT_CHECK(a.device() == b.device(), op, ": inputs are on different devices (", a.device().str(),
           " and ", b.device().str(), "); move one with to(device)");
}

// The dtype an op computes in; GEMMs and convolutions need floating values.
DType floating_dtype(DType d, const char* op, const Tensor& a, const Tensor& b) {
  MT_CHECK(is_floating(d), op, " needs floating tensors, got ", a.describe(), " and ", b.describe(),
           "; cast with to(DType::F32)");
  return d;
}

// out(B, M, N) = a(B|1, M, K) @ b(B|1, K, N) [+ bias(N)], a new contiguous tensor.
Tensor bmm(const Tensor& a, const Tensor& b, const Tensor* bias = nullptr) {
  const int64_t nbatch = std::max(a.size(0), b.size(0));
  Tensor out = Tensor::empty({nbatch, a.size(1), b.size(2)}, a.dtype(), a.device());
  backend_of(a).matmul(a, b, bias, out, matmul_options());
  return out;
}

Shape batch_dims(const Tensor& t) {
  Shape s;
  for (int i = 0; i + 2 < t.dim(); ++i)
    s.push_back(t.size(i));
  return s;
}

Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

// (..., M, K) -> a (B|1, M, K) view over `batch` (a copy only when the broadcast batch dims
// cannot be merged into one stride).
Tensor as_batched(const Tensor& t, const Shape& batch) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  if (t.dim() == 2 || batch_dims(t).numel() == 1) return t.reshape({1, rows, cols});
  return t.expand(with_matrix(batch, rows, cols)).reshape({-1, rows, cols});
}

// t itself, or t copied when its batch dims (all but the last two) do not merge into one stride,
// e.g. attention's heads split from one projection. The batched GEMM would copy such a view in
// forward, and backward would copy the saved view again; copied here, once, the copy is also
// what backward saves. Broadcast (stride 0) batch dims are left to the GEMM.
Tensor gemm_ready(const Tensor& t) {
  int64_t inner = -1;  // the next inner batch dim (size 1 dims skipped): its stride * size
  bool merge = true;
  for (int i = t.dim() - 3; i >= 0; --i) {
    if (t.size(i) == 1) continue;
    if (t.stride(i) == 0) return t;
    merge = merge && (inner < 0 || t.stride(i) == inner);
    inner = t.stride(i) * t.size(i);
  }
  return merge ? t : t.contiguous();
}

// torch.matmul on arguments already checked and of one floating dtype. No autograd.
Tensor matmul_impl(const Tensor& a, const Tensor& b) {
  NoGrad ng;
  const Tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;  // (..., M, K)
  const Tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;  // (..., K, N)
  const int64_t M = a2.size(-2), K = a2.size(-1), N = b2.size(-1);
  Shape full;  // the result before 1-D operands' dims are squeezed away
  Tensor r;    // (B, M, N) or (1, rows, N)
  if (b2.dim() == 2) {
    // (..., M, K) @ (K, N): every row of a in one GEMM.
    r = bmm(a2.reshape({1, -1, K}), b2.unsqueeze(0));
    full = with_matrix(batch_dims(a2), M, N);
  } else {
    const Shape batch = broadcast_shapes(batch_dims(a2), batch_dims(b2));
    r = bmm(as_batched(a2, batch), as_batched(b2, batch));
    full = with_matrix(batch, M, N);
  }
  Shape final_shape;
  for (int i = 0; i < full.size(); ++i) {
    const bool squeezed =
        (a.dim() == 1 && i == full.size() - 2) || (b.dim() == 1 && i == full.size() - 1);
    if (!squeezed) final_shape.push_back(full[i]);
  }
  return r.view(final_shape);
}

}  // namespace

// ---- matmul
// --------------------------------------------------------------------------------------

Tensor matmul(const Tensor& a_arg, const Tensor& b_arg) {
  const amp::AutocastInputs cast_in(amp::OpId::Matmul, a_arg, b_arg);
  const Tensor &a_in = cast_in[0], &b_in = cast_in[1];
  check_defined(a_in, "matmul", "a");
  check_defined(b_in, "matmul", "b");
  check_same_device(a_in, b_in, "matmul");
  MT_CHECK(a_in.dim() >= 1 && b_in.dim() >= 1,
           "matmul: both arguments need at least one dimension, got a ", a_in.shape().str(),
           " and b ", b_in.shape().str(), "; use mul() for scalars");
  const int64_t k_b = b_in.dim() == 1 ? b_in.size(0) : b_in.size(-2);
  MT_CHECK(a_in.size(-1) == k_b, "matmul: inner dimensions differ: a ", a_in.shape().str(),
           " and b ", b_in.shape().str(), " (", a_in.size(-1), " vs ", k_b, ")");
  if (a_in.dim() > 2 && b_in.dim() > 2) {
    const Shape ba = batch_dims(a_in), bb = batch_dims(b_in);
    bool ok = true;
    for (int i = 1; i <= std::min(ba.size(), bb.size()); ++i) {
      const int64_t x = ba[ba.size() - i], y = bb[bb.size() - i];
      ok = ok && (x == y || x == 1 || y == 1);
    }
    MT_CHECK(ok, "matmul: batch dimensions do not broadcast: a ", a_in.shape().str(), " and b ",
             b_in.shape().str());
  }
  const DType dt = floating_dtype(promote_types(a_in.dtype(), b_in.dtype()), "matmul", a_in, b_in);
  const Tensor a = gemm_ready(a_in.to(dt)), b = gemm_ready(b_in.to(dt));
  Tensor out = matmul_impl(a, b);
  if (!autograd::needs_grad({&a, &b})) return out;

  const bool ga = a.requires_grad(), gb = b.requires_grad();
  autograd::SavedTensor saved_a(gb ? a : Tensor()), saved_b(ga ? b : Tensor());
  const Shape sa = a.shape(), sb = b.shape();
  autograd::record("matmulBackward", {a, b}, {out},
                   [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     const Tensor& g = grads[0];
                     if (!g.defined()) return {Tensor(), Tensor()};
                     const Tensor av = saved_a.unpack(), bv = saved_b.unpack();
                     // The 2-D-or-more forms of a and b, and g with the squeezed dims put back.
                     const Shape a2s = sa.size() == 1 ? Shape{1, sa[0]} : sa;
                     const Shape b2s = sb.size() == 1 ? Shape{sb[0], 1} : sb;
                     const int64_t K = a2s.back(), N = b2s.back();
                     Shape g2s = g.shape();
                     if (sa.size() == 1) g2s.insert(g2s.size() - (sb.size() == 1 ? 0 : 1), 1);
                     if (sb.size() == 1) g2s.push_back(1);
                     const Tensor g2 = g.reshape(g2s);
                     Tensor da, db;
                     if (ga) {
                       const Tensor b2 = bv.reshape(b2s);
                       da = sum_to_shape(matmul_impl(g2, b2.transpose(-1, -2)), a2s).reshape(sa);
                     }
                     if (gb) {
                       const Tensor a2 = av.reshape(a2s);
                       if (b2s.size() == 2 && a2s.size() > 2) {
                         // Every batch shares b: one GEMM over all rows, (K, rows) @ (rows, N).
                         db = matmul_impl(a2.reshape({-1, K}).t(), g2.reshape({-1, N}));
                       } else {
                         db = sum_to_shape(matmul_impl(a2.transpose(-1, -2), g2), b2s);
                       }
                       db = db.reshape(sb);
                     }
                     return {da, db};
                   });
  return out;
}

// ---- linear
// --------------------------------------------------------------------------------------

Tensor linear(const Tensor& x_arg, const Tensor& w_arg, const Tensor& b_arg) {
  const amp::AutocastInputs cast_in(amp::OpId::Linear, x_arg, w_arg, b_arg);
  const Tensor &x_in = cast_in[0], &w_in = cast_in[1], &b_in = cast_in[2];
  check_defined(x_in, "linear", "x");
  check_defined(w_in, "linear", "weight");
  check_same_device(x_in, w_in, "linear");
  MT_CHECK(w_in.dim() == 2, "linear: weight must be 2-D (out_features, in_features), got ",
           w_in.describe());
  MT_CHECK(x_in.dim() >= 1, "linear: x must have at least one dimension, got ", x_in.describe());
  MT_CHECK(x_in.size(-1) == w_in.size(1), "linear: x ", x_in.shape().str(), " has ", x_in.size(-1),
           " features but weight ", w_in.shape().str(), " expects ", w_in.size(1),
           " (weight is (out_features, in_features))");
  DType dt = promote_types(x_in.dtype(), w_in.dtype());
  if (b_in.defined()) {
    check_same_device(x_in, b_in, "linear");
    MT_CHECK(b_in.dim() == 1 && b_in.size(0) == w_in.size(0), "linear: bias ", b_in.shape().str(),
             " does not match weight ", w_in.shape().str(), "; it must be (", w_in.size(0), ")");
    dt = promote_types(dt, b_in.dtype());
  }
  floating_dtype(dt, "linear", x_in, w_in);
  const Tensor x = x_in.to(dt), w = w_in.to(dt);
  const Tensor bias = b_in.defined() ? b_in.to(dt) : Tensor();
  const int64_t in = w.size(1), out_features = w.size(0);
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out_features;
  Tensor out;
  {
    NoGrad ng;
    // x (rows, in) @ weight^T (in, out): the transposed view goes to the GEMM as it is.
    const Tensor x3 = x.reshape({1, -1, in});
    out = bmm(x3, w.t().unsqueeze(0), bias.defined() ? &bias : nullptr).view(out_shape);
  }
  if (!autograd::needs_grad({&x, &w, &bias})) return out;

  const bool gx = x.requires_grad(), gw = w.requires_grad();
  const bool gb = bias.defined() && bias.requires_grad();
  autograd::SavedTensor saved_x(gw ? x : Tensor()), saved_w(gx ? w : Tensor());
  const Shape xs = x.shape();
  autograd::record("linearBackward", {x, w, bias}, {out},
                   [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     const Tensor& g = grads[0];
                     if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
                     const Tensor g2 = g.reshape({-1, out_features});  // (rows, out)
                     Tensor dx, dw, db;
                     if (gx) dx = bmm(g2.unsqueeze(0), saved_w.unpack().unsqueeze(0)).view(xs);
                     if (gw) {
                       const Tensor x2 = saved_x.unpack().reshape({-1, in});
                       dw = bmm(g2.t().unsqueeze(0), x2.unsqueeze(0)).view({out_features, in});
                     }
                     if (gb) db = sum(g2, {0});
                     return {dx, dw, db};
                   });
  return out;
}

// ---- conv2d
// --------------------------------------------------------------------------------------

namespace {

// A 1- or 2-element option as (height, width).
void pair_option(const std::vector<int64_t>& v, const char* name, int64_t out[2],
                 const char* op = "conv2d") {
  MT_CHECK(v.size() == 1 || v.size() == 2, op, ": ", name, " needs 1 or 2 values, got ", v.size());
  out[0] = v[0];
  out[1] = v.size() == 2 ? v[1] : v[0];
}

}  // namespace

Tensor conv2d(const Tensor& x_arg, const Tensor& w_arg, const Tensor& b_arg,
              const Conv2dOptions& options) {
  const amp::AutocastInputs cast_in(amp::OpId::Conv2d, x_arg, w_arg, b_arg);
  const Tensor &x_in = cast_in[0], &w_in = cast_in[1], &b_in = cast_in[2];
  check_defined(x_in, "conv2d", "x");
  check_defined(w_in, "conv2d", "weight");
  check_same_device(x_in, w_in, "conv2d");
  MT_CHECK(x_in.dim() == 4 || x_in.dim() == 3, "conv2d: x must be (N, C, H, W) or (C, H, W), got ",
           x_in.describe());
  MT_CHECK(w_in.dim() == 4,
           "conv2d: weight must be (out_channels, in_channels / groups, kH, kW), got ",
           w_in.describe());
  backend::Conv2dParams p;
  pair_option(options.stride, "stride", p.stride);
  pair_option(options.padding, "padding", p.padding);
  pair_option(options.dilation, "dilation", p.dilation);
  p.groups = options.groups;
  for (int i = 0; i < 2; ++i) {
    MT_CHECK(p.stride[i] > 0 && p.dilation[i] > 0 && p.padding[i] >= 0,
             "conv2d: stride and dilation must be positive and padding non-negative, got stride (",
             p.stride[0], ", ", p.stride[1], "), padding (", p.padding[0], ", ", p.padding[1],
             "), dilation (", p.dilation[0], ", ", p.dilation[1], ")");
  }
  const bool batched = x_in.dim() == 4;
  const Shape xs4 = batched ? x_in.shape() : Shape{1, x_in.size(0), x_in.size(1), x_in.size(2)};
  const int64_t C = xs4[1], O = w_in.size(0);
  MT_CHECK(p.groups >= 1 && C % p.groups == 0 && O % p.groups == 0, "conv2d: groups=", p.groups,
           " must divide the ", C, " input channels of x ", x_in.shape().str(), " and the ", O,
           " output channels of weight ", w_in.shape().str());
  MT_CHECK(w_in.size(1) * p.groups == C, "conv2d: weight ", w_in.shape().str(), " expects ",
           w_in.size(1) * p.groups, " input channels (", w_in.size(1), " x groups=", p.groups,
           ") but x ", x_in.shape().str(), " has ", C);
  int64_t out_hw[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t padded = xs4[2 + i] + 2 * p.padding[i];
    const int64_t span = p.dilation[i] * (w_in.size(2 + i) - 1) + 1;
    MT_CHECK(padded >= span, "conv2d: the padded input (", xs4[2] + 2 * p.padding[0], " x ",
             xs4[3] + 2 * p.padding[1], ") of x ", x_in.shape().str(),
             " is smaller than the dilated kernel of weight ", w_in.shape().str(), " (",
             p.dilation[0] * (w_in.size(2) - 1) + 1, " x ", p.dilation[1] * (w_in.size(3) - 1) + 1,
             ")");
    out_hw[i] = (padded - span) / p.stride[i] + 1;
  }
  DType dt = promote_types(x_in.dtype(), w_in.dtype());
  if (b_in.defined()) {
    check_same_device(x_in, b_in, "conv2d");
    MT_CHECK(b_in.dim() == 1 && b_in.size(0) == O, "conv2d: bias ", b_in.shape().str(),
             " does not match the ", O, " output channels of weight ", w_in.shape().str());
    dt = promote_types(dt, b_in.dtype());
  }
  floating_dtype(dt, "conv2d", x_in, w_in);
  const Tensor x = x_in.to(dt), w = w_in.to(dt);
  const Tensor bias = b_in.defined() ? b_in.to(dt) : Tensor();
  const Shape ys4{xs4[0], O, out_hw[0], out_hw[1]};
  // A channels-last input gives a channels-last output (and gradient) where the backend runs
  // convolutions in that layout: the CPU's, with no reorder in or out.
  const bool channels_last =
      batched && x.device().is_cpu() && x.is_contiguous(MemoryFormat::ChannelsLast);
  const Device device = x.device();  // not x: the backward closure keeps this lambda
  auto empty_activation = [channels_last, dt, device](const Shape& s) {
    return channels_last ? layout::empty_channels_last(s, dt, device)
                         : Tensor::empty(s, dt, device);
  };
  Tensor out;
  {
    NoGrad ng;
    const Tensor x4 = batched ? x : x.unsqueeze(0);
    Tensor y = empty_activation(ys4);
    backend_of(x).conv2d(x4, w, bias.defined() ? &bias : nullptr, y, p, matmul_options());
    out = batched ? y : y.view({O, out_hw[0], out_hw[1]});
  }
  if (!autograd::needs_grad({&x, &w, &bias})) return out;

  const bool gx = x.requires_grad(), gw = w.requires_grad();
  const bool gb = bias.defined() && bias.requires_grad();
  autograd::SavedTensor saved_x(gw ? x : Tensor()), saved_w(gx ? w : Tensor());
  const Shape xs = x.shape(), ws = w.shape();
  autograd::record("conv2dBackward", {x, w, bias}, {out},
                   [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     const Tensor& g = grads[0];
                     if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
                     // The kernel reads x only for the weight gradient and w only for the data
                     // gradient; otherwise a broadcast scalar of the right shape stands in.
                     auto shape_only = [&](const Shape& s) {
                       return Tensor::zeros({}, dt, g.device()).expand(s);
                     };
                     const Tensor x4 = gw ? saved_x.unpack().reshape(xs4) : shape_only(xs4);
                     const Tensor wv = gx ? saved_w.unpack() : shape_only(ws);
                     Tensor dx = gx ? empty_activation(xs4) : Tensor();
                     Tensor dw = gw ? Tensor::empty(ws, dt, g.device()) : Tensor();
                     Tensor db = gb ? Tensor::empty({O}, dt, g.device()) : Tensor();
                     backend_of(g).conv2d_backward(g.reshape(ys4), x4, wv, gx ? &dx : nullptr,
                                                   gw ? &dw : nullptr, gb ? &db : nullptr, p,
                                                   matmul_options());
                     return {gx ? (batched ? dx : dx.view(xs)) : Tensor(), dw, db};
                   });
  return out;
}

// ---- conv_transpose2d
// ----------------------------------------------------------------------------
//
// conv_transpose2d is conv2d's adjoint, so it runs on conv2d's backend kernels (no row of its
// own in the op table: every backend with conv2d has it, with the same dtypes, tf32 rounding and
// cuDNN/oneDNN algorithms). With the weight (C_in, C_out / groups, kH, kW) read as a conv2d
// weight (O = C_in, C = C_out) from the output y (N, C_out, OH, OW) to x (N, C_in, H, W):
//   forward          y  = conv2d_backward's data gradient of "grad_out" x   (oneDNN backward-data)
//   gradient of x    dx = conv2d(dy, w)                                       (convolution forward)
//   gradient of w    dw = conv2d_backward's weight gradient, grad_out x, input dy
//   gradient of bias db = sum of dy over (N, OH, OW)
// This is how PyTorch runs it on cuDNN. The bias is added after the kernel (the kernel has no
// bias), so a bf16/f16 output with a bias is rounded twice, as PyTorch's cuDNN path does.
// output_padding < stride keeps conv2d's size rule (OH + 2p - span) / s + 1 = H exact.

Tensor conv_transpose2d(const Tensor& x_arg, const Tensor& w_arg, const Tensor& b_arg,
                        const ConvTranspose2dOptions& options) {
  const char* op = "conv_transpose2d";
  const amp::AutocastInputs cast_in(amp::OpId::ConvTranspose2d, x_arg, w_arg, b_arg);
  const Tensor &x_in = cast_in[0], &w_in = cast_in[1], &b_in = cast_in[2];
  check_defined(x_in, op, "x");
  check_defined(w_in, op, "weight");
  check_same_device(x_in, w_in, op);
  MT_CHECK(x_in.dim() == 4 || x_in.dim() == 3, op, ": x must be (N, C, H, W) or (C, H, W), got ",
           x_in.describe());
  MT_CHECK(w_in.dim() == 4, op,
           ": weight must be (in_channels, out_channels / groups, kH, kW), got ", w_in.describe());
  backend::Conv2dParams p;
  int64_t out_pad[2];
  pair_option(options.stride, "stride", p.stride, op);
  pair_option(options.padding, "padding", p.padding, op);
  pair_option(options.dilation, "dilation", p.dilation, op);
  pair_option(options.output_padding, "output_padding", out_pad, op);
  p.groups = options.groups;
  for (int i = 0; i < 2; ++i) {
    MT_CHECK(p.stride[i] > 0 && p.dilation[i] > 0 && p.padding[i] >= 0, op,
             ": stride and dilation must be positive and padding non-negative, got stride (",
             p.stride[0], ", ", p.stride[1], "), padding (", p.padding[0], ", ", p.padding[1],
             "), dilation (", p.dilation[0], ", ", p.dilation[1], ")");
    MT_CHECK(out_pad[i] >= 0 && out_pad[i] < p.stride[i], op, ": output_padding (", out_pad[0],
             ", ", out_pad[1], ") must be non-negative and smaller than the stride (", p.stride[0],
             ", ", p.stride[1], ")");
  }
  const bool batched = x_in.dim() == 4;
  const Shape xs4 = batched ? x_in.shape() : Shape{1, x_in.size(0), x_in.size(1), x_in.size(2)};
  const int64_t C = xs4[1];
  MT_CHECK(w_in.size(0) == C, op, ": weight ", w_in.shape().str(), " expects ", w_in.size(0),
           " input channels (its first dim) but x ", x_in.shape().str(), " has ", C);
  MT_CHECK(p.groups >= 1 && C % p.groups == 0, op, ": groups=", p.groups, " must divide the ", C,
           " input channels of x ", x_in.shape().str());
  const int64_t O = w_in.size(1) * p.groups;
  int64_t out_hw[2];
  for (int i = 0; i < 2; ++i) {
    out_hw[i] = (xs4[2 + i] - 1) * p.stride[i] - 2 * p.padding[i] +
                p.dilation[i] * (w_in.size(2 + i) - 1) + out_pad[i] + 1;
  }
  MT_CHECK(out_hw[0] > 0 && out_hw[1] > 0, op, ": x ", x_in.shape().str(), " and weight ",
           w_in.shape().str(), " with padding (", p.padding[0], ", ", p.padding[1],
           ") give an empty output (", out_hw[0], " x ", out_hw[1], "); reduce the padding");
  DType dt = promote_types(x_in.dtype(), w_in.dtype());
  if (b_in.defined()) {
    check_same_device(x_in, b_in, op);
    MT_CHECK(b_in.dim() == 1 && b_in.size(0) == O, op, ": bias ", b_in.shape().str(),
             " does not match the ", O, " output channels of weight ", w_in.shape().str(),
             " (its second dim x groups=", p.groups, ")");
    dt = promote_types(dt, b_in.dtype());
  }
  floating_dtype(dt, op, x_in, w_in);
  const Tensor x = x_in.to(dt), w = w_in.to(dt);
  const Tensor bias = b_in.defined() ? b_in.to(dt) : Tensor();
  const Shape ys4{xs4[0], O, out_hw[0], out_hw[1]};
  const Shape ws = w.shape();
  // A broadcast zero of the right shape stands in for the operand a kernel does not read.
  auto shape_only = [dt](const Shape& s, const Device& d) {
    return Tensor::zeros({}, dt, d).expand(s);
  };
  Tensor out;
  {
    NoGrad ng;
    const Tensor x4 = batched ? x : x.unsqueeze(0);
    Tensor y = Tensor::empty(ys4, dt, x.device());
    backend_of(x).conv2d_backward(x4, shape_only(ys4, x.device()), w, &y, nullptr, nullptr, p,
                                  matmul_options());
    if (bias.defined()) y.add_(bias.view({1, O, 1, 1}));
    out = batched ? y : y.view({O, out_hw[0], out_hw[1]});
  }
  if (!autograd::needs_grad({&x, &w, &bias})) return out;

  const bool gx = x.requires_grad(), gw = w.requires_grad();
  const bool gb = bias.defined() && bias.requires_grad();
  autograd::SavedTensor saved_x(gw ? x : Tensor()), saved_w(gx ? w : Tensor());
  const Shape xs = x.shape();
  autograd::record("conv_transpose2dBackward", {x, w, bias}, {out},
                   [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     const Tensor& g = grads[0];
                     if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
                     const Tensor g4 = g.reshape(ys4);
                     Tensor dx, dw, db;
                     if (gx) {
                       dx = Tensor::empty(xs4, dt, g.device());
                       backend_of(g).conv2d(g4, saved_w.unpack(), nullptr, dx, p, matmul_options());
                       dx = dx.view(xs);
                     }
                     if (gw) {
                       dw = Tensor::empty(ws, dt, g.device());
                       const Tensor x4 = saved_x.unpack().reshape(xs4);
                       backend_of(g).conv2d_backward(x4, g4, shape_only(ws, g.device()), nullptr,
                                                     &dw, nullptr, p, matmul_options());
                     }
                     if (gb) db = sum(g4, {0, 2, 3});
                     return {dx, dw, db};
                   });
  return out;
}

}  // namespace mantissa
