// The CPU's 2-D convolution, forward and backward, through oneDNN's convolution primitives
// (dnnl_support.h says which dtypes they compute and how the others are emulated), f64 and the
// lone bias gradient on the plain loops below.
#include <omp.h>

#include <algorithm>
#include <array>
#include <initializer_list>
#include <utility>

#include "backend/cpu/dnnl_support.h"

namespace mantissa::backend::cpu {
namespace {

using namespace onednn;

// ---- convolution through oneDNN -----------------------------------------------------------------

// Layouts: the convolution primitives are created with format_tag::any, so oneDNN picks its
// blocked layouts (nChw16c / OIhw16i16o on AVX-512) where its fastest kernels want them, and
// the user's NCHW tensors (any strides) are reordered in and out. Where oneDNN picks the user's
// own layout no reorder runs. The reorders are memory-bound: cheap next to the convolution on
// AVX-512, where plain nchw/oihw descriptors instead of `any` made a 32x64x32x32 3x3 layer 3x
// slower forward and 20x slower in the weight gradient (oneDNN falls back to its im2col GEMM
// there), and a 3-channel first layer 10x slower (2 threads). On AVX2 (nChw8c) they measured a
// fifth of a ResNet step: the backward reorders grad_out once for both primitives
// (dnnl_conv_backward), and few-channel weight gradients run channels-last
// (weight_grad_channels_last).
struct ConvGeometry {
  int64_t groups = 1;
  memory::dims src, wei, dst, bias, strides, dilates, pad_l, pad_r;
};

ConvGeometry conv_geometry(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  ConvGeometry g;
  g.groups = p.groups;
  g.src = {x[0], x[1], x[2], x[3]};
  g.wei = p.groups > 1 ? memory::dims{p.groups, w[0] / p.groups, w[1], w[2], w[3]}
                       : memory::dims{w[0], w[1], w[2], w[3]};
  g.dst = {y[0], y[1], y[2], y[3]};
  g.bias = {w[0]};
  g.strides = {p.stride[0], p.stride[1]};
  g.dilates = {p.dilation[0] - 1, p.dilation[1] - 1};  // oneDNN counts the gaps
  g.pad_l = {p.padding[0], p.padding[1]};
  g.pad_r = g.pad_l;  // with floor division this reproduces (H + 2p - d(k-1) - 1) / s + 1
  return g;
}

// The user's memory: the tensor's own dims and strides (weights split into groups).
memory::desc user_md(const Tensor& t, int64_t groups = 1) {
  const Shape st = t.is_contiguous() ? contiguous_strides(t.shape()) : t.strides();
  memory::dims dims(t.shape().begin(), t.shape().end()), strides(st.begin(), st.end());
  if (groups > 1) {
    dims = {groups, t.size(0) / groups, t.size(1), t.size(2), t.size(3)};
    strides = {st[0] * (t.size(0) / groups), st[0], st[1], st[2], st[3]};
  }
  return memory::desc(dims, dnnl_type(t.dtype()), strides);
}

// A cached primitive's key: the pass ('F'orward, 'D'ata or 'W'eight gradient), the geometry and
// the operands' descriptors (dims, dtype, strides).
Key conv_key(char pass, const ConvGeometry& g, std::initializer_list<const memory::desc*> mds) {
  Key key;
  key.add(pass);
  key.add(g.groups).add(g.src).add(g.wei).add(g.dst).add(g.strides).add(g.dilates).add(g.pad_l);
  for (const memory::desc* md : mds) {
    key.add(md->dims()).add(int64_t(md->data_type()));
    key.add(memory::dims(md->data.format_desc.blocking.strides,
                         md->data.format_desc.blocking.strides + md->data.ndims));
  }
  return key;
}

memory::desc any_md(const memory::dims& dims, DType d) {
  return memory::desc(dims, dnnl_type(d), tag::any);
}

// An activation's descriptor for a primitive: channels-last (oneDNN's nhwc kernels, reading and
// writing a channels-last tensor's own memory), else format_tag::any.
memory::desc act_md(const memory::dims& dims, DType d, bool nhwc) {
  return nhwc ? memory::desc(dims, dnnl_type(d), tag::nhwc) : any_md(dims, d);
}

bool is_channels_last(const Tensor& t) {
  return t.is_contiguous(MemoryFormat::ChannelsLast);
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvGeometry& g, DType kd,
                                                     DType out_dtype, const memory::desc& bias_md,
                                                     const dnnl::primitive_attr& attr,
                                                     bool nhwc = false) {
  const dnnl::convolution_forward::desc desc(
      dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
      act_md(g.src, kd, nhwc), any_md(g.wei, kd), bias_md, act_md(g.dst, out_dtype, nhwc),
      g.strides, g.dilates, g.pad_l, g.pad_r);
  return dnnl::convolution_forward::primitive_desc(desc, attr, engine());
}

// out = conv(x, w) + bias with x, w in the kernel dtype, out in a native output dtype.
void dnnl_conv_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                       const Conv2dParams& p) {
  const ConvGeometry g = conv_geometry(x.shape(), w.shape(), out.shape(), p);
  const memory::desc x_md = user_md(x), w_md = user_md(w, g.groups), y_md = user_md(out);
  const memory::desc b_md = bias ? user_md(*bias) : memory::desc();
  Key key = conv_key('F', g, {&x_md, &w_md, &y_md});
  key.add(bias ? int64_t(bias->dtype()) : -1);
  auto entry = cached(key, [&] {
    Entry e;
    const bool nhwc = is_channels_last(x) && is_channels_last(out);
    auto pd = forward_pd(g, x.dtype(), out.dtype(), b_md, user_scratchpad(), nhwc);
    // Where oneDNN has no channels-last kernel for a layer, its blocked one with reorders.
    if (nhwc && is_reference(pd))
      pd = forward_pd(g, x.dtype(), out.dtype(), b_md, user_scratchpad());
    e.prim = dnnl::convolution_forward(pd);
    e.scratch_md = pd.scratchpad_desc();
    e.args.push_back(plan_arg(DNNL_ARG_SRC, false, x_md, pd.src_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_WEIGHTS, false, w_md, pd.weights_desc()));
    if (bias) e.args.push_back(plan_arg(DNNL_ARG_BIAS, false, b_md, pd.bias_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_DST, true, y_md, pd.dst_desc()));
    finish_entry(e);
    return e;
  });
  if (bias) {
    execute(*entry, {x.data_ptr(), w.data_ptr(), bias->data_ptr(), out.data_ptr()});
  } else {
    execute(*entry, {x.data_ptr(), w.data_ptr(), out.data_ptr()});
  }
}

// The primitive of grad_x = conv_transpose(grad_out, w); grad_x contiguous in a native dtype.
std::shared_ptr<const Entry> conv_backward_data_entry(const Tensor& go, const Tensor& w,
                                                      const Tensor& gx, const Conv2dParams& p) {
  const ConvGeometry g = conv_geometry(gx.shape(), w.shape(), go.shape(), p);
  const memory::desc go_md = user_md(go), w_md = user_md(w, g.groups), gx_md = user_md(gx);
  const Key key = conv_key('D', g, {&go_md, &w_md, &gx_md});
  return cached(key, [&] {
    Entry e;
    const DType kd = go.dtype();
    auto make_pd = [&](bool nhwc) {
      const auto hint = forward_pd(g, kd, kd, memory::desc(), dnnl::primitive_attr(), nhwc);
      const dnnl::convolution_backward_data::desc desc(
          dnnl::algorithm::convolution_direct, act_md(g.src, gx.dtype(), nhwc), any_md(g.wei, kd),
          act_md(g.dst, kd, nhwc), g.strides, g.dilates, g.pad_l, g.pad_r);
      return dnnl::convolution_backward_data::primitive_desc(desc, user_scratchpad(), engine(),
                                                             hint);
    };
    const bool nhwc = is_channels_last(gx);
    auto pd = make_pd(nhwc);
    if (nhwc && is_reference(pd)) pd = make_pd(false);
    e.prim = dnnl::convolution_backward_data(pd);
    e.scratch_md = pd.scratchpad_desc();
    e.args.push_back(plan_arg(DNNL_ARG_DIFF_DST, false, go_md, pd.diff_dst_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_WEIGHTS, false, w_md, pd.weights_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_DIFF_SRC, true, gx_md, pd.diff_src_desc()));
    finish_entry(e);
    return e;
  });
}

// Below one channel block of input channels, the weight gradient runs channels-last. oneDNN's
// blocked kernel pads the channels to the block (8 on AVX2) and measured up to 8x slower on this
// machine (AVX2, one thread, batch 128, 28x28): a 1->32 5x5 layer 20.6 ms blocked against
// 2.9 ms nhwc, 1->16 3x3 5.3 against 0.7 ms, 3->32 3x3 on 32x32 4.6 against 3.0 ms; at 8
// channels the two were equal. A single-channel image is its own nhwc layout, so the first
// layer of a grey-image network reorders only grad_out.
bool weight_grad_channels_last(const ConvGeometry& g) {
  return g.groups == 1 && g.src[1] < 8;
}

// The primitive of grad_w (and grad_bias when given) from x and grad_out; outputs contiguous.
std::shared_ptr<const Entry> conv_backward_weights_entry(const Tensor& go, const Tensor& x,
                                                         const Tensor& gw, const Tensor* gb,
                                                         const Conv2dParams& p) {
  const ConvGeometry g = conv_geometry(x.shape(), gw.shape(), go.shape(), p);
  const bool nhwc = weight_grad_channels_last(g) || is_channels_last(x);
  const memory::desc x_md =
      nhwc && x.size(1) == 1 && x.is_contiguous()
          ? memory::desc(g.src, dnnl_type(x.dtype()), tag::nhwc)  // same bytes
          : user_md(x);
  const memory::desc go_md = user_md(go), gw_md = user_md(gw, g.groups);
  const memory::desc gb_md = gb ? user_md(*gb) : memory::desc();
  Key key = conv_key('W', g, {&go_md, &x_md, &gw_md});
  key.add(gb ? int64_t(gb->dtype()) : -1);
  return cached(key, [&] {
    Entry e;
    const DType kd = x.dtype();
    auto make_pd = [&](bool channels_last) {
      const auto hint =
          forward_pd(g, kd, kd, memory::desc(), dnnl::primitive_attr(), channels_last);
      const dnnl::convolution_backward_weights::desc desc(
          dnnl::algorithm::convolution_direct, act_md(g.src, kd, channels_last),
          any_md(g.wei, gw.dtype()), gb_md, act_md(g.dst, kd, channels_last), g.strides, g.dilates,
          g.pad_l, g.pad_r);
      return dnnl::convolution_backward_weights::primitive_desc(desc, user_scratchpad(), engine(),
                                                                hint);
    };
    auto pd = make_pd(nhwc);
    // Where oneDNN has no channels-last kernel for it on this CPU (or this dtype) it would run
    // its reference loops: the blocked layouts instead.
    if (nhwc && is_reference(pd)) pd = make_pd(false);
    e.prim = dnnl::convolution_backward_weights(pd);
    e.scratch_md = pd.scratchpad_desc();
    e.args.push_back(plan_arg(DNNL_ARG_SRC, false, x_md, pd.src_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_DIFF_DST, false, go_md, pd.diff_dst_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_DIFF_WEIGHTS, true, gw_md, pd.diff_weights_desc()));
    if (gb) e.args.push_back(plan_arg(DNNL_ARG_DIFF_BIAS, true, gb_md, pd.diff_bias_desc()));
    finish_entry(e);
    return e;
  });
}

// Both gradients of a convolution (either may be absent). grad_out is reordered once when both
// primitives want it in the same layout: of a ResNet step's ~190 reorders (a fifth of its time
// on AVX2), one per convolution was this second copy.
void dnnl_conv_backward(const Tensor& go, const Tensor& x, const Tensor& w, Tensor* gx, Tensor* gw,
                        Tensor* gb, const Conv2dParams& p) {
  const auto data = gx ? conv_backward_data_entry(go, w, *gx, p) : nullptr;
  const auto weights = gw ? conv_backward_weights_entry(go, x, *gw, gb, p) : nullptr;
  Tensor shared_go;
  Staged staged;
  if (data && weights) {
    const ArgPlan* d = find_arg(*data, DNNL_ARG_DIFF_DST);
    const ArgPlan* wt = find_arg(*weights, DNNL_ARG_DIFF_DST);
    if (d->reorder && wt->reorder && d->prim_md == wt->prim_md) {
      shared_go = stage(*data, DNNL_ARG_DIFF_DST, go.data_ptr());
      staged = {DNNL_ARG_DIFF_DST, shared_go.data_ptr()};
    }
  }
  if (data) execute(*data, {go.data_ptr(), w.data_ptr(), gx->data_ptr()}, staged);
  if (weights && gb) {
    execute(*weights, {x.data_ptr(), go.data_ptr(), gw->data_ptr(), gb->data_ptr()}, staged);
  } else if (weights) {
    execute(*weights, {x.data_ptr(), go.data_ptr(), gw->data_ptr()}, staged);
  }
}

// ---- float64 (and the bias reduction oneDNN does not cover)
// --------------------------------------

struct ConvDims {
  int64_t N, C, H, W, O, KH, KW, OH, OW, Cg, Og;
  int64_t sh, sw, ph, pw, dh, dw;
};

ConvDims conv_dims(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  return {x[0],
          x[1],
          x[2],
          x[3],
          w[0],
          w[2],
          w[3],
          y[2],
          y[3],
          w[1],
          w[0] / p.groups,
          p.stride[0],
          p.stride[1],
          p.padding[0],
          p.padding[1],
          p.dilation[0],
          p.dilation[1]};
}

void conv_forward_f64(const double* x, const double* w, const double* bias, double* y,
                      const ConvDims& d) {
#pragma omp parallel for schedule( \
    static) if (worth_threads(d.N * d.O * d.OH * d.OW * d.Cg * d.KH * d.KW))
  for (int64_t no = 0; no < d.N * d.O; ++no) {
    const int64_t n = no / d.O, o = no % d.O, g = o / d.Og;
    const double* wo = w + o * d.Cg * d.KH * d.KW;
    double* yo = y + no * d.OH * d.OW;
    for (int64_t oh = 0; oh < d.OH; ++oh) {
      for (int64_t ow = 0; ow < d.OW; ++ow) {
        double acc = bias ? bias[o] : 0.0;
        for (int64_t c = 0; c < d.Cg; ++c) {
          const double* xc = x + (n * d.C + g * d.Cg + c) * d.H * d.W;
          const double* wc = wo + c * d.KH * d.KW;
          for (int64_t kh = 0; kh < d.KH; ++kh) {
            const int64_t ih = oh * d.sh - d.ph + kh * d.dh;
            if (ih < 0 || ih >= d.H) continue;
            for (int64_t kw = 0; kw < d.KW; ++kw) {
              const int64_t iw = ow * d.sw - d.pw + kw * d.dw;
              if (iw < 0 || iw >= d.W) continue;
              acc += xc[ih * d.W + iw] * wc[kh * d.KW + kw];
            }
          }
        }
        yo[oh * d.OW + ow] = acc;
      }
    }
  }
}

// Gathers every contribution to one input element: no two threads write the same place.
void conv_backward_data_f64(const double* go, const double* w, double* gx, const ConvDims& d) {
#pragma omp parallel for schedule( \
    static) if (worth_threads(d.N * d.O * d.OH * d.OW * d.Cg * d.KH * d.KW))
  for (int64_t nc = 0; nc < d.N * d.C; ++nc) {
    const int64_t n = nc / d.C, ci = nc % d.C, g = ci / d.Cg, c = ci % d.Cg;
    for (int64_t ih = 0; ih < d.H; ++ih) {
      for (int64_t iw = 0; iw < d.W; ++iw) {
        double acc = 0;
        for (int64_t o = g * d.Og; o < (g + 1) * d.Og; ++o) {
          const double* goo = go + (n * d.O + o) * d.OH * d.OW;
          const double* wc = w + (o * d.Cg + c) * d.KH * d.KW;
          for (int64_t kh = 0; kh < d.KH; ++kh) {
            const int64_t th = ih + d.ph - kh * d.dh;
            if (th < 0 || th % d.sh != 0 || th / d.sh >= d.OH) continue;
            for (int64_t kw = 0; kw < d.KW; ++kw) {
              const int64_t tw = iw + d.pw - kw * d.dw;
              if (tw < 0 || tw % d.sw != 0 || tw / d.sw >= d.OW) continue;
              acc += goo[(th / d.sh) * d.OW + tw / d.sw] * wc[kh * d.KW + kw];
            }
          }
        }
        gx[nc * d.H * d.W + ih * d.W + iw] = acc;
      }
    }
  }
}

void conv_backward_weights_f64(const double* go, const double* x, double* gw, const ConvDims& d) {
#pragma omp parallel for schedule( \
    static) if (worth_threads(d.N * d.O * d.OH * d.OW * d.Cg * d.KH * d.KW))
  for (int64_t oc = 0; oc < d.O * d.Cg; ++oc) {
    const int64_t o = oc / d.Cg, c = oc % d.Cg, g = o / d.Og;
    for (int64_t kh = 0; kh < d.KH; ++kh) {
      for (int64_t kw = 0; kw < d.KW; ++kw) {
        double acc = 0;
        for (int64_t n = 0; n < d.N; ++n) {
          const double* goo = go + (n * d.O + o) * d.OH * d.OW;
          const double* xc = x + (n * d.C + g * d.Cg + c) * d.H * d.W;
          for (int64_t oh = 0; oh < d.OH; ++oh) {
            const int64_t ih = oh * d.sh - d.ph + kh * d.dh;
            if (ih < 0 || ih >= d.H) continue;
            for (int64_t ow = 0; ow < d.OW; ++ow) {
              const int64_t iw = ow * d.sw - d.pw + kw * d.dw;
              if (iw < 0 || iw >= d.W) continue;
              acc += goo[oh * d.OW + ow] * xc[ih * d.W + iw];
            }
          }
        }
        gw[(oc * d.KH + kh) * d.KW + kw] = acc;
      }
    }
  }
}

// grad_bias[o] = sum of grad_out over (N, OH, OW), accumulated in double.
template <typename T>
void bias_grad(const T* go, double* gb, int64_t N, int64_t O, int64_t S) {
  for (int64_t o = 0; o < O; ++o)
    gb[o] = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < O; ++o) {
      const T* p = go + (n * O + o) * S;
      double acc = 0;
      for (int64_t s = 0; s < S; ++s)
        acc += double(p[s]);
      gb[o] += acc;
    }
  }
}

void conv_bias_grad(CpuBackend& be, const Tensor& go, Tensor& gb) {
  const DType wide = go.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const Tensor g = go.is_contiguous() && go.dtype() == wide ? go : converted(be, go, wide);
  Tensor acc = Tensor::empty(gb.shape(), DType::F64, gb.device());
  const int64_t S = go.size(2) * go.size(3);
  if (wide == DType::F64) {
    bias_grad(g.data<double>(), acc.data<double>(), go.size(0), go.size(1), S);
  } else {
    bias_grad(g.data<float>(), acc.data<double>(), go.size(0), go.size(1), S);
  }
  be.copy(acc, gb);
}

// A contiguous f64 copy of t (t itself when it already is one).

}  // namespace

// ---- the backend entry points -------------------------------------------------------------------

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                        const Conv2dParams& p, const MatmulOptions& options) {
  MT_ASSERT(x.dim() == 4 && w.dim() == 4 && out.dim() == 4 &&
                (out.is_contiguous() || is_channels_last(out)),
            "conv2d wants NCHW tensors, got ", x.describe(), ", ", w.describe(), " -> ",
            out.describe());
  if (out.numel() == 0) return;
  if (x.dtype() == DType::F64) {
    const Tensor xd = as_f64(*this, x), wd = as_f64(*this, w);
    const Tensor bd = bias ? as_f64(*this, *bias) : Tensor();
    Tensor y = out.dtype() == DType::F64 ? out : Tensor::empty(out.shape(), DType::F64);
    conv_forward_f64(xd.data<double>(), wd.data<double>(), bias ? bd.data<double>() : nullptr,
                     y.data<double>(), conv_dims(x.shape(), w.shape(), out.shape(), p));
    if (!y.is_same(out)) copy(y, out);
    return;
  }
  const DType kd = kernel_dtype(x.dtype(), options.input_rounding);
  const Tensor xk = prepare(*this, x, kd, options.input_rounding);
  const Tensor wk = prepare(*this, w, kd, options.input_rounding);
  Tensor bias_k;
  if (bias) {
    const bool ok = bias->is_contiguous() && (bias->dtype() == DType::F32 || bias->dtype() == kd);
    bias_k = ok ? *bias : converted(*this, *bias, DType::F32);
  }
  Tensor dst = native_output(out.dtype(), kd) ? out : Tensor::empty(out.shape(), DType::F32);
  with_dnnl("convolution", [&] { dnnl_conv_forward(xk, wk, bias ? &bias_k : nullptr, dst, p); });
  if (!dst.is_same(out)) copy(dst, out);
}

void CpuBackend::conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& w,
                                 Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias,
                                 const Conv2dParams& p, const MatmulOptions& options) {
  MT_ASSERT(grad_out.dim() == 4 && x.dim() == 4 && w.dim() == 4, "conv2d_backward shapes");
  for (Tensor* g : {grad_x, grad_w, grad_bias}) {
    MT_ASSERT(!g || g->is_contiguous() || is_channels_last(*g),
              "conv2d_backward writes row-major or channels-last gradients");
  }
  if (grad_out.numel() == 0) {
    for (Tensor* g : {grad_x, grad_w, grad_bias}) {
      if (g) fill(*g, 0.0);
    }
    return;
  }
  if (grad_bias && !grad_w) conv_bias_grad(*this, grad_out, *grad_bias);
  // The fused bias gradient comes with the weight gradient; alone it is the reduction above.
  Tensor* fused_bias = grad_w ? grad_bias : nullptr;
  if (x.dtype() == DType::F64) {
    const ConvDims d = conv_dims(x.shape(), w.shape(), grad_out.shape(), p);
    const Tensor go = as_f64(*this, grad_out);
    auto into = [&](Tensor& g, auto kernel) {
      Tensor r = g.dtype() == DType::F64 ? g : Tensor::empty(g.shape(), DType::F64);
      kernel(r.data<double>());
      if (!r.is_same(g)) copy(r, g);
    };
    if (grad_x) {
      const Tensor wd = as_f64(*this, w);
      into(*grad_x, [&](double* p_gx) {
        conv_backward_data_f64(go.data<double>(), wd.data<double>(), p_gx, d);
      });
    }
    if (grad_w) {
      const Tensor xd = as_f64(*this, x);
      into(*grad_w, [&](double* p_gw) {
        conv_backward_weights_f64(go.data<double>(), xd.data<double>(), p_gw, d);
      });
    }
    if (fused_bias) conv_bias_grad(*this, go, *fused_bias);
    return;
  }
  const DType kd = kernel_dtype(x.dtype(), options.input_rounding);
  // grad_out is rounded too: its products with w (or x) are the GEMMs the tensor core would run.
  const Tensor gok = prepare(*this, grad_out, kd, options.input_rounding);
  auto native = [&](Tensor* g) {
    if (!g) return Tensor();
    return native_output(g->dtype(), kd) ? *g : Tensor::empty(g->shape(), DType::F32);
  };
  Tensor gx = native(grad_x), gw = native(grad_w), gb = native(fused_bias);
  const Tensor wk = grad_x ? prepare(*this, w, kd, options.input_rounding) : Tensor();
  const Tensor xk = grad_w ? prepare(*this, x, kd, options.input_rounding) : Tensor();
  with_dnnl("convolution backward", [&] {
    dnnl_conv_backward(gok, xk, wk, grad_x ? &gx : nullptr, grad_w ? &gw : nullptr,
                       fused_bias ? &gb : nullptr, p);
  });
  for (auto [native_g, g] : {std::pair{&gx, grad_x}, {&gw, grad_w}, {&gb, fused_bias}}) {
    if (g && !native_g->is_same(*g)) copy(*native_g, *g);
  }
}

}  // namespace mantissa::backend::cpu
