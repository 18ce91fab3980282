// Internal: the kernels a device provides. The op layer (src/tensor/) checks arguments, picks
// dtypes, allocates outputs and records autograd; a Backend only computes. Outputs are passed in
// allocated (and contiguous unless said otherwise); inputs may be any strided view, and all
// floating inputs of one call share one dtype unless said otherwise.
//
// Storage and compute types are separate: kernels load any float dtype to float (double for
// f64), compute, and round on store (RNE). Reductions and GEMM accumulate in fp32 (f64 in f64).
#pragma once

#include <cstdint>
#include <span>

#include "backend/op_tables.h"
#include "mantissa/core/device.h"
#include "mantissa/numerics/convert.h"
#include "mantissa/numerics/format.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend {

// UnaryOp, BinaryOp, ReduceOp and what each op is: backend/op_tables.h.

struct Scalars {
  double a = 0, b = 0;
};

struct MatmulOptions {
  // Round fp32 inputs to this format first (TF32 for set_matmul_precision("high")); FP32 = none.
  Format input_rounding = Format::FP32;
};

struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};

// The fused attention of scaled_dot_product_attention without a mask: q (B, H, Tq, D), k and v
// (B, H, Tk, D), out (B, H, Tq, D), all contiguous, one float dtype. lse (B, H, Tq), F32 (F64 for
// f64 inputs, like the norms' saved statistics), receives each query row's log-sum-exp of the
// scaled (and masked) scores, which the backward uses to recompute the probabilities instead of
// storing them (flash attention). Causal: query i sees keys 0..i (top-left aligned, as PyTorch's
// is_causal). Scores, softmax and the weighted sum are computed in fp32; out is rounded once.
struct AttentionParams {
  double scale = 1.0;
  bool causal = false;
};

struct Pool2dParams {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  bool count_include_pad = true;  // avg pool
};

// ---- multi-tensor optimizer kernels ------------------------------------------------------------
// One call updates every parameter in one pass (DESIGN.md §5): element i of each span belongs to
// tensor i. Parameters may mix float dtypes; each is loaded in its storage dtype, updated in fp32
// (f64 for f64) and rounded once on store (RNE). Optimizer state (momentum, exp_avg, exp_avg_sq)
// is kept in the compute type: F32 for f32/half/fp8 parameters, F64 for f64. Gradients may be any
// float dtype. Every tensor is contiguous and on this device; a gradient has its parameter's shape.
// `steps[i]` is the how-manieth update of tensor i this is (1 = its first): on a first update the
// state buffers are written, not read, so they may be passed uninitialized.
// Results do not depend on the thread count.
//
// The mixed-precision recipe (DESIGN.md §4) lives in MultiTensorOptions:
// - fp32 master weights: when `masters` is not empty it has one entry per parameter; a defined
//   masters[i] (F32, contiguous, the parameter's shape) is what the update reads and writes, and
//   the parameter then receives the updated master rounded to its own dtype. An undefined entry
//   updates the parameter itself.
// - the rounding of every store into a narrower parameter dtype: NearestEven, or Stochastic with
//   element j of tensor i drawing random_bits(seed, offset, (tensor_ids[i] << 40) + j) — the
//   optimizer passes its step count as offset, so every step draws fresh bits, and a parameter's
//   own index as tensor id, so the bits do not depend on which parameters have gradients.
//   Stores into f32/f64 parameters are exact: the rounding mode does not apply to them.
struct MultiTensorOptions {
  std::span<Tensor> masters;
  RoundingMode store_rounding = RoundingMode::NearestEven;  // NearestEven | Stochastic
  uint64_t seed = 0;
  uint64_t offset = 0;
  std::span<const uint64_t> tensor_ids;  // Stochastic: one per parameter
  // The loss scaler's device-side skip: when defined, a one-element F32 tensor on this device;
  // a non-zero value makes the whole call a no-op (parameters, masters, state untouched) without
  // the host reading it. The caller still advances its step counts (they are host state).
  const Tensor* found_inf = nullptr;
};

// PyTorch's torch.optim.SGD: g += wd * p; buf = momentum * buf + (1 - dampening) * g (buf = g on
// the first update); g = nesterov ? g + momentum * buf : buf; p -= lr * g.
struct SgdStep {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  MultiTensorOptions options;
};

// PyTorch's torch.optim.AdamW: p *= 1 - lr * wd; m = lerp(m, g, 1 - beta1);
// v = beta2 * v + (1 - beta2) * g^2; p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
// with t = steps[i] (eps added after the square root of the corrected second moment).
struct AdamWStep {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  MultiTensorOptions options;
};

// The loss scaler's update rule (see update_scale and src/amp/scale_update.h).
struct ScaleUpdate {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 1;
  double min_scale = 1.0;
  double max_scale = 16777216.0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- data movement -----------------------------------------------------------------------
  // dst = src, any strides on both sides, converting dtype (RNE into narrower floats).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  virtual void fill(Tensor& dst, double value) = 0;
  // Uniform in [a, b) or normal(a, b), from Philox(seed) element by element.
  virtual void uniform(Tensor& dst, double a, double b, uint64_t seed, uint64_t offset) = 0;
  virtual void normal(Tensor& dst, double mean, double stddev, uint64_t seed, uint64_t offset) = 0;
  // Round every value of a float tensor onto `format`'s grid, in place.
  virtual void round_to_format(Tensor& t, Format format) = 0;
  // dst = src converted with a rounding mode (any strides on both sides, any dtypes): element i
  // of the flattened (row-major) src draws its stochastic bits at stream position
  // rounding.index + i, so the result does not depend on how the work is split. Widening and
  // same-dtype copies are exact; stores into integer dtypes truncate as copy() does.
  virtual void copy_rounded(const Tensor& src, Tensor& dst, const RoundingOptions& rounding) = 0;

  // ---- elementwise (inputs broadcast to out's shape) -----------------------------------------
  virtual void unary(UnaryOp op, const Tensor& x, Tensor& out, Scalars s) = 0;
  // gx = grad * d op(x)/dx, given x and y = op(x).
  virtual void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y,
                              Tensor& gx, Scalars s) = 0;
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // out = a + alpha * b (b broadcast; out may be a): the optimizer's axpy in one pass.
  virtual void add_scaled(const Tensor& a, const Tensor& b, double alpha, Tensor& out) = 0;
  // out = cond ? a : b (cond is Bool)
  virtual void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // out = x * mask * scale, mask ~ Bernoulli(1 - p) drawn from Philox; mask written as Bool.
  virtual void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, Tensor& out,
                       Tensor& mask) = 0;

  // ---- reductions over `dims` (sorted, unique); out has the kept dims (keepdim shape) --------
  // Var uses `correction` (1 = unbiased). ArgMax/ArgMin write I64. Max/Min may also write the
  // I64 index of the winner into `indices` when it is defined.
  virtual void reduce(ReduceOp op, const Tensor& x, std::span<const int> dims, Tensor& out,
                      Tensor* indices, int64_t correction) = 0;

  // ---- linear algebra ------------------------------------------------------------------------
  // out(B, M, N) = a(B, M, K) @ b(B, K, N) [+ bias(N)]; any strides; B may be 1.
  virtual void matmul(const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out,
                      const MatmulOptions& options) = 0;

  // ---- convolution and pooling (NCHW) --------------------------------------------------------
  virtual void conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                      const Conv2dParams& p, const MatmulOptions& options) = 0;
  virtual void conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& w,
                               Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias,
                               const Conv2dParams& p, const MatmulOptions& options) = 0;
  virtual void max_pool2d(const Tensor& x, Tensor& out, Tensor& indices, const Pool2dParams& p) = 0;
  virtual void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices,
                                   Tensor& grad_x) = 0;
  virtual void avg_pool2d(const Tensor& x, Tensor& out, const Pool2dParams& p) = 0;
  virtual void avg_pool2d_backward(const Tensor& grad_out, Tensor& grad_x,
                                   const Pool2dParams& p) = 0;
  // Adaptive average pooling to out's (OH, OW).
  virtual void adaptive_avg_pool2d(const Tensor& x, Tensor& out) = 0;
  virtual void adaptive_avg_pool2d_backward(const Tensor& grad_out, Tensor& grad_x) = 0;

  // ---- normalization (statistics in fp32; mean/rstd are F32, or F64 for f64 inputs) ----------
  // x viewed as (N, C, S): per-channel statistics over N and S. Training: batch statistics,
  // written to save_mean/save_rstd, running stats updated with momentum (if defined).
  // Eval: running stats used.
  virtual void batch_norm(const Tensor& x, const Tensor* weight, const Tensor* bias,
                          Tensor* running_mean, Tensor* running_var, bool training, double momentum,
                          double eps, Tensor& out, Tensor& save_mean, Tensor& save_rstd) = 0;
  virtual void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor* weight,
                                   const Tensor& save_mean, const Tensor& save_rstd, bool training,
                                   Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) = 0;
  // x viewed as (M, N): statistics over the last N elements of each row.
  virtual void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, double eps,
                          Tensor& out, Tensor& mean, Tensor& rstd) = 0;
  virtual void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor* weight,
                                   const Tensor& mean, const Tensor& rstd, Tensor* grad_x,
                                   Tensor* grad_weight, Tensor* grad_bias) = 0;

  // ---- softmax and losses --------------------------------------------------------------------
  virtual void softmax(const Tensor& x, int dim, bool log, Tensor& out) = 0;
  // y is the forward output (softmax or log_softmax).
  virtual void softmax_backward(const Tensor& grad_y, const Tensor& y, int dim, bool log,
                                Tensor& grad_x) = 0;
  // Per-sample loss of logits (N, C) against I64 targets (N): label-smoothed NLL of log_softmax.
  // Writes loss (N) in F32 (F64 for f64) — 0 where target == ignore_index — and log-probs.
  virtual void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                             double label_smoothing, Tensor& loss, Tensor& log_probs) = 0;
  // grad_logits = scale_n * (softmax - smoothed one-hot), scale_n = grad_loss[n] (0 if ignored).
  virtual void cross_entropy_backward(const Tensor& grad_loss, const Tensor& log_probs,
                                      const Tensor& target, int64_t ignore_index,
                                      double label_smoothing, Tensor& grad_logits) = 0;

  // ---- attention (see AttentionParams) -------------------------------------------------------
  virtual void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                         Tensor& lse, const AttentionParams& p) = 0;
  // Given the forward's out and lse: grad_q, grad_k, grad_v (each the shape of its input,
  // contiguous, the inputs' dtype).
  virtual void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  Tensor& grad_q, Tensor& grad_k, Tensor& grad_v,
                                  const AttentionParams& p) = 0;

  // ---- indexing ------------------------------------------------------------------------------
  // out = x.index_select(dim, index) (index I64 1-D)
  virtual void index_select(const Tensor& x, int dim, const Tensor& index, Tensor& out) = 0;
  // grad_x (zeroed by the caller) += scatter of grad_out along dim at index
  virtual void index_add(Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out) = 0;
  virtual void gather(const Tensor& x, int dim, const Tensor& index, Tensor& out) = 0;
  virtual void scatter_add(Tensor& grad_x, int dim, const Tensor& index,
                           const Tensor& grad_out) = 0;

  // ---- multi-tensor (optimizers, clipping): one pass over all tensors, see above -------------
  // momentum_bufs is empty when hyper.momentum == 0.
  virtual void sgd_step(std::span<Tensor> params, std::span<const Tensor> grads,
                        std::span<Tensor> momentum_bufs, std::span<const int64_t> steps,
                        const SgdStep& hyper) = 0;
  virtual void adamw_step(std::span<Tensor> params, std::span<const Tensor> grads,
                          std::span<Tensor> exp_avgs, std::span<Tensor> exp_avg_sqs,
                          std::span<const int64_t> steps, const AdamWStep& hyper) = 0;
  // out (one element, F64) = the norm_type-norm of all elements of all tensors together:
  // (sum |x|^p)^(1/p) for p > 0, max |x| for p = inf (NaN propagates). Accumulates in fp32
  // per chunk (f64 for f64), chunks combined in f64 in a fixed order.
  virtual void multi_tensor_norm(std::span<const Tensor> tensors, double norm_type,
                                 Tensor& out) = 0;
  // Every tensor *= factor in place (compute type, one rounding).
  virtual void multi_tensor_scale(std::span<Tensor> tensors, double factor) = 0;
  // The loss scaler's fused pass (DESIGN.md §4): every gradient *= inv_scale in place (loaded in
  // its dtype, multiplied in the compute type, fp32 for f32/half, one rounding on store; left
  // untouched when inv_scale == 1) and, in the same pass, a check for inf/NaN, as PyTorch's
  // _amp_foreach_non_finite_check_and_unscale_ (the values are written even when non-finite ones
  // are found). Returns whether any element of any tensor is inf or NaN. found_inf, when given,
  // is a one-element F32 tensor on this device that is set to 1 when this call found one and
  // otherwise left as it is, so that calls accumulate into it: a device backend can keep the
  // flag there (the optimizer kernels read it and no-op) and only a host that must decide reads
  // it back: when found_inf is given, a device backend may leave the answer in the flag and
  // return false without waiting (the CUDA backend does); without it, the return value is exact
  // and a device backend waits for it. Every tensor is floating, contiguous and on this device.
  virtual bool unscale_and_check(std::span<Tensor> grads, double inv_scale, Tensor* found_inf) = 0;
  // The dynamic loss scale's update where the scale lives (PyTorch's _amp_update_scale_, plus
  // hysteresis and the min/max clamp of GradScalerOptions): state is an F64 tensor of 4 elements
  // on this device {scale, growth_tracker, hysteresis_tracker, min_scale_overflows}; found_inf
  // the one-element F32 flag of unscale_and_check. Follows amp::detail::next_scale_state (the
  // one definition, shared with the host GradScaler), so device and host trajectories agree.
  virtual void update_scale(Tensor& state, const Tensor& found_inf, const ScaleUpdate& rule) = 0;
};

Backend& backend_for(Device device);
Backend& cpu_backend();

}  // namespace mantissa::backend
