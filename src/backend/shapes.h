// Internal: the host-side shape bookkeeping every backend's kernels share.
#pragma once

#include <cstdint>

#include "mantissa/core/error.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend {

// (outer, n, inner) of a tensor around `dim`: the view softmax, the norms and the index ops
// iterate in (a 0-d tensor is one element).
struct DimSplit {
  int64_t outer = 1, n = 1, inner = 1;
};

inline DimSplit split_around(const Tensor& t, int dim) {
  DimSplit s;
  if (t.dim() == 0) return s;
  for (int d = 0; d < dim; ++d)
    s.outer *= t.size(d);
  s.n = t.size(dim);
  for (int d = dim + 1; d < t.dim(); ++d)
    s.inner *= t.size(d);
  return s;
}

// A kernel's contiguous view of an input (a copy only when it is strided), outside autograd.
// (N, C, S) of a batch-norm input (N, C, ...), both backends' view of it.
struct ChannelShape {
  int64_t n = 0, c = 0, s = 0;
  int64_t rows() const { return n * c; }
};

inline ChannelShape channel_shape(const Tensor& x) {
  MT_ASSERT(x.dim() >= 2, "batch_norm kernels take (N, C, ...) inputs, got ", x.describe());
  ChannelShape cs{x.size(0), x.size(1), 1};
  for (int d = 2; d < x.dim(); ++d)
    cs.s *= x.size(d);
  return cs;
}

// Backend::batch_norm's contract: evaluation needs running statistics, and training more than
// one value per channel (the running variance is unbiased: it divides by N * S - 1).
inline ChannelShape check_batch_norm(const Tensor& x, bool training, bool has_running) {
  const ChannelShape cs = channel_shape(x);
  MT_ASSERT(training || has_running, "batch_norm in eval mode needs running statistics");
  MT_ASSERT(!training || cs.c == 0 || cs.n * cs.s > 1,
            "batch_norm: training with one value per channel (the op layer refuses it)");
  return cs;
}

// Whether a 4-D operand is channels-last and not also row-major (one channel, or 1x1 images, are
// both): the CPU's batch-norm and pooling kernels then run on rows of C channels, one per pixel,
// on the tensor's own memory.
inline bool channels_last_only(const Tensor& t) {
  return t.is_contiguous(MemoryFormat::ChannelsLast) && !t.is_contiguous();
}

inline Tensor contiguous_input(const Tensor& t) {
  return t.detach().contiguous();
}

// Which gradients a normalization backward computes (the defined outputs), after checking that
// the incoming gradient matches the input and grad_x (if wanted) can receive it.
struct WantedGrads {
  bool x, w, b;
};

inline WantedGrads wanted_grads(const char* op, const Tensor& g, const Tensor& x,
                                const Tensor* grad_x, const Tensor* grad_weight,
                                const Tensor* grad_bias) {
  MT_ASSERT(g.shape() == x.shape() && g.dtype() == x.dtype(), op, ": grad ", g.describe(),
            " for input ", x.describe());
  const WantedGrads w{grad_x && grad_x->defined(), grad_weight && grad_weight->defined(),
                      grad_bias && grad_bias->defined()};
  if (w.x) {
    MT_ASSERT((grad_x->is_contiguous() || grad_x->strides() == x.strides()) &&
                  grad_x->shape() == x.shape() && grad_x->dtype() == x.dtype(),
              op, " grad_x");
  }
  return w;
}

// ---- the batched GEMM's contract (Backend::matmul), checked by every backend -------------------
struct MatmulDims {
  int64_t batch, m, n, k;
};

// (B, M, K) @ (B, K, N) -> contiguous (B, M, N), a or b broadcast when its batch is 1, bias (N).
inline MatmulDims check_matmul(const Tensor& a, const Tensor& b, const Tensor* bias,
                               const Tensor& out) {
  MT_ASSERT(a.dim() == 3 && b.dim() == 3 && out.dim() == 3 && out.is_contiguous(),
            "matmul wants (B, M, K) @ (B, K, N) -> contiguous (B, M, N), got ", a.describe(), " @ ",
            b.describe(), " -> ", out.describe());
  const MatmulDims d{out.size(0), out.size(1), out.size(2), a.size(2)};
  MT_ASSERT(a.size(1) == d.m && b.size(1) == d.k && b.size(2) == d.n &&
                (a.size(0) == d.batch || a.size(0) == 1) &&
                (b.size(0) == d.batch || b.size(0) == 1) &&
                (!bias || (bias->dim() == 1 && bias->size(0) == d.n)),
            "matmul shapes ", a.describe(), " @ ", b.describe(), " -> ", out.describe());
  return d;
}

// ---- the fused attention's contract (Backend::attention), checked by every backend ----------
struct AttentionDims {
  int64_t bh, tq, tk, d;  // batch x heads, query and key lengths, head dim
};

// The dtype of lse: the compute type, so that an f64 backward recomputes exact probabilities.
inline DType attention_lse_dtype(DType d) {
  return d == DType::F64 ? DType::F64 : DType::F32;
}

inline AttentionDims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v) {
  MT_ASSERT(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "attention takes (B, H, T, D) tensors");
  MT_ASSERT(k.shape() == v.shape() && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                q.size(3) == k.size(3),
            "attention: q (B, H, Tq, D), k and v (B, H, Tk, D)");
  MT_ASSERT(q.dtype() == k.dtype() && q.dtype() == v.dtype(), "attention: one dtype");
  return {q.size(0) * q.size(1), q.size(2), k.size(2), q.size(3)};
}

// The forward's arguments; returns their dims.
inline AttentionDims check_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse) {
  const AttentionDims n = attention_dims(q, k, v);
  MT_ASSERT(out.shape() == q.shape() && out.dtype() == q.dtype() &&
                (out.size(3) <= 1 || out.stride(3) == 1),
            "attention output: (B, H, Tq, D) with adjacent head-dim elements");
  MT_ASSERT(lse.is_contiguous() && lse.numel() == n.bh * n.tq &&
                lse.dtype() == attention_lse_dtype(q.dtype()),
            "attention lse: (B, H, Tq) in the compute dtype");
  return n;
}

// The backward's arguments; returns their dims.
inline AttentionDims check_attention_backward(const Tensor& grad_out, const Tensor& q,
                                              const Tensor& k, const Tensor& v, const Tensor& out,
                                              const Tensor& lse, const Tensor& grad_q,
                                              const Tensor& grad_k, const Tensor& grad_v) {
  const AttentionDims n = attention_dims(q, k, v);
  MT_ASSERT(grad_out.shape() == q.shape() && out.shape() == q.shape() &&
                grad_out.dtype() == q.dtype() && out.dtype() == q.dtype(),
            "attention_backward: grad_out and out are (B, H, Tq, D) in the inputs' dtype");
  MT_ASSERT(lse.numel() == n.bh * n.tq && lse.dtype() == attention_lse_dtype(q.dtype()),
            "attention_backward lse");
  MT_ASSERT(grad_q.is_contiguous() && grad_q.shape() == q.shape() && grad_q.dtype() == q.dtype() &&
                grad_k.is_contiguous() && grad_k.shape() == k.shape() &&
                grad_k.dtype() == k.dtype() && grad_v.is_contiguous() &&
                grad_v.shape() == v.shape() && grad_v.dtype() == v.dtype(),
            "attention_backward gradients");
  return n;
}

}  // namespace mantissa::backend
