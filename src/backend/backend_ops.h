// Internal: the kernels a device backend provides, one table (docs/design.md §7: one table per
// concept), grouped in families. Each row is _(Family, return type, name, (parameters),
// (arguments)) with its contract in the comment above it. The table declares the Backend
// interface (backend.h), the overrides of a backend that implements every op (the CPU and CUDA
// backends), the CPU fallback of an op a backend lacks (fallback.cpp) and the check that the CPU
// backend, the fallback's target, lacks none.
//
// An op a backend does not override runs on the CPU backend, its tensors copied there and back,
// with a counted warning (mantissa::warn, key "fallback:<backend>:<op>"): correct, slow, visible.
// Only copy and fill are outside the table: every backend must have them (the fallback moves
// tensors with them).
#pragma once

// clang-format off
#define MT_FORALL_BACKEND_OPS(_)                                                                  \
  /* ---- data movement (copy and fill, which every backend has, are in backend.h) ---------- */  \
  /* Uniform in [a, b) or normal(a, b), from Philox(seed) element by element. */                  \
  _(Data, void, uniform,                                                                          \
    (Tensor& dst, double a, double b, uint64_t seed, uint64_t offset),                            \
    (dst, a, b, seed, offset))                                                                    \
  _(Data, void, normal,                                                                           \
    (Tensor& dst, double mean, double stddev, uint64_t seed, uint64_t offset),                    \
    (dst, mean, stddev, seed, offset))                                                            \
  /* Round every value of a float tensor onto `format`'s grid, in place. */                       \
  _(Data, void, round_to_format, (Tensor& t, Format format), (t, format))                         \
  /* dst = src converted with a rounding mode (any strides on both sides, any dtypes): element */ \
  /* i of the flattened (row-major) src draws its stochastic bits at stream position */           \
  /* rounding.index + i, so the result does not depend on how the work is split. Widening and */  \
  /* same-dtype copies are exact; stores into integer dtypes truncate as copy() does. */          \
  _(Data, void, copy_rounded,                                                                     \
    (const Tensor& src, Tensor& dst, const RoundingOptions& rounding),                            \
    (src, dst, rounding))                                                                         \
  /* fp8 quantization (autocast/fp8.h). x (R, C) contiguous float, cut in blocks of p.block_rows x */  \
  /* p.block_cols (0: the whole dimension; the last block may be short). Per block: amax = max */  \
  /* |x| (F32, (nbr, nbc)); scale by p.rule (Amax: 1 where amax is 0 or not finite; AmaxPow2: */    \
  /* 1 where amax is 0, NaN where not finite); codes (R, C, FP8_E4M3 or FP8_E5M2) = x * scale */   \
  /* in fp32 rounded to nearest even, finite overflow saturated to +-max, inf and NaN to NaN; */   \
  /* scale_inv = 1 / scale (F32, (nbr, nbc)). Given takes one block (per tensor). values, if */ \
  /* given (BF16, (R, C)): each code's value (exact in bf16), times its block's scale_inv when */ \
  /* p.rule is AmaxPow2 (exact too: a power of two), what the emulated GEMM multiplies. With */   \
  /* p.values_only (CPU), the values only: codes then just names the fp8 dtype. */                 \
  _(Data, void, fp8_quantize,                                                                     \
    (const Tensor& x, const Fp8QuantizeParams& p, Tensor& codes, Tensor& scale_inv, Tensor&      \
    amax, Tensor* values),                                                                        \
    (x, p, codes, scale_inv, amax, values))                                                       \
  /* FP4 block quantization (docs/fp4.md; the arithmetic: fp4_math.h). x (R, C) contiguous */    \
  /* f32/bf16/f16, in blocks of p.block_rows x fp4_block_cols(p.rule) (the last ones may be */     \
  /* short). amax (F32, 1) = max |x| (NaN winning), or *p.amax for NVFP4 when given; scale_inv */ \
  /* (F32, 1) = NVFP4's tensor decode scale (1 for MX); block_scales (U8, (nbr, nbc)) the */       \
  /* blocks' E4M3 (NVFP4) or E8M0 (MX) codes; codes (U8, (R, C)) one fp4_e2m1 code per byte, */    \
  /* the scaled value clamped to +-6 and rounded to nearest even or, with p.stochastic, by */      \
  /* Philox's bits; values, if given (BF16, (R, C)): each code's value times its block scale */    \
  /* (exact in bf16), NaN where x is not finite: what the emulated GEMM multiplies (times */       \
  /* scale_inv). With p.columns, x^T is quantized (RHT first with p.rht) and stored in x's */      \
  /* layout, rows padded (backend.h); with p.values_only (CPU) codes is not written. */            \
  _(Data, void, fp4_quantize,                                                                     \
    (const Tensor& x, const Fp4QuantizeParams& p, Tensor& codes, Tensor& block_scales, Tensor&   \
    scale_inv, Tensor& amax, Tensor* values),                                                     \
    (x, p, codes, block_scales, scale_inv, amax, values))                                         \
  /* The 16-point Random Hadamard Transform along rows (docs/fp4.md): x (R, C) contiguous */       \
  /* float, C a multiple of 16; out (R, C, contiguous, any float dtype): out[r, 16g + j] = */       \
  /* sum over i = 0..15 in order of x[r, 16g + i] * hadamard16_coefficient(signs, i, j), each */   \
  /* product and sum in fp32, rounded once into out. */                                            \
  _(Data, void, hadamard16, (const Tensor& x, uint32_t signs, Tensor& out), (x, signs, out))      \
  /* fp8 scaling's bookkeeping of one quantization, where its tensors live (autocast/fp8.h): */   \
  /* amax and scale_inv its blocks' (F32); stats (F32, 3) = {the max amax (NaN winning), 1 / the */\
  /* max scale_inv, stats[2] + 1 when that amax is not finite}; history (F32, len), when given */  \
  /* and the amax finite: history[0] = max(history[0], amax). */                                   \
  _(Data, void, fp8_observe,                                                                      \
    (const Tensor& amax, const Tensor& scale_inv, Tensor& stats, Tensor* history),                \
    (amax, scale_inv, stats, history))                                                            \
  /* Delayed scaling's update of tensor i (once a step): amax = the max of histories[i] (NaN */     \
  /* ignored: use_max) or its slot 0; where amax > 0 and finite, s = fp8_max[i] / amax / 2^margin */\
  /* in fp32 and, when finite, scales[i] (F32, 1) = s; then the history rolls one slot left, */    \
  /* slot 0 (moved to the end) then zeroed. Transformer Engine's DelayedScaling. */                \
  _(Data, void, fp8_update_scales,                                                                \
    (std::span<Tensor> histories, std::span<Tensor> scales, std::span<const float> fp8_max, bool \
    use_max, int margin),                                                                         \
    (histories, scales, fp8_max, use_max, margin))                                                \
  /* ---- elementwise (inputs broadcast to out's shape) --------------------------------------- */\
  _(Elementwise, void, unary,                                                                     \
    (UnaryOp op, const Tensor& x, Tensor& out, Scalars s),                                        \
    (op, x, out, s))                                                                              \
  /* gx = grad * d op(x)/dx, given x and y = op(x). */                                            \
  _(Elementwise, void, unary_backward,                                                            \
    (UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, Tensor& gx, Scalars s),    \
    (op, grad, x, y, gx, s))                                                                      \
  _(Elementwise, void, binary,                                                                    \
    (BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out),                                 \
    (op, a, b, out))                                                                              \
  /* out = a + alpha * b (b broadcast; out may be a): the optimizer's axpy in one pass. */        \
  _(Elementwise, void, add_scaled,                                                                \
    (const Tensor& a, const Tensor& b, double alpha, Tensor& out),                                \
    (a, b, alpha, out))                                                                           \
  /* out = cond ? a : b (cond is Bool) */                                                         \
  _(Elementwise, void, where,                                                                     \
    (const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out),                          \
    (cond, a, b, out))                                                                            \
  /* out = x * mask * scale, mask ~ Bernoulli(1 - p) drawn from Philox; mask written as Bool. */  \
  _(Elementwise, void, dropout,                                                                   \
    (const Tensor& x, double p, uint64_t seed, uint64_t offset, Tensor& out, Tensor& mask),       \
    (x, p, seed, offset, out, mask))                                                              \
  /* One LSTM step's pointwise math (backend/lstm_math.h): gates (B, 4H) before their */         \
  /* activations, order i, f, g, o, plus gates_add (B, 4H) when defined (the recurrent GEMM's */  \
  /* output in the compute dtype, F32 or F64: summed in it, not rounded to the gates' dtype); */  \
  /* c_prev (B, H), or undefined for a zero state. Writes acts (B, 4H) after the activations, */  \
  /* c = f c_prev + i g and h = o tanh(c) (B, H). Contiguous; c_prev, acts, c and h share one */  \
  /* float dtype, the gates may be stored in another of the same compute type (bf16 gates from */ \
  /* an autocast GEMM with an fp32 state: no conversion pass). */                               \
  _(Elementwise, void, lstm_cell,                                                                 \
    (const Tensor& gates, const Tensor& gates_add, const Tensor& c_prev, Tensor& acts, Tensor& c, \
    Tensor& h),                                                                                   \
    (gates, gates_add, c_prev, acts, c, h))                                                       \
  /* Its derivative: dh (+ dh_add, in the compute dtype, when defined) and dc (undefined = 0) */  \
  /* to dgates (B, 4H) and dc_prev (B, H); dgates in the gates' dtype, the rest in the state's. */ \
  /* dh may have any row stride (a step of a (B, T, H) gradient), the rest is contiguous. */      \
  _(Elementwise, void, lstm_cell_backward,                                                        \
    (const Tensor& acts, const Tensor& c, const Tensor& c_prev, const Tensor& dh, const Tensor&   \
    dh_add, const Tensor& dc, Tensor& dgates, Tensor& dc_prev),                                   \
    (acts, c, c_prev, dh, dh_add, dc, dgates, dc_prev))                                           \
  /* ---- reductions over `dims` (sorted, unique); out has the kept dims (keepdim shape) ------ */\
  /* Var uses `correction` (1 = unbiased). ArgMax/ArgMin write I64. Max/Min may also write the */ \
  /* I64 index of the winner into `indices` when it is defined. */                                \
  _(Reduction, void, reduce,                                                                      \
    (ReduceOp op, const Tensor& x, std::span<const int> dims, Tensor& out, Tensor* indices,       \
    int64_t correction),                                                                          \
    (op, x, dims, out, indices, correction))                                                      \
  /* ---- linear algebra ---------------------------------------------------------------------- */\
  /* out(B, M, N) = a(B, M, K) @ b(B, K, N) [+ bias(N)]; any strides; B may be 1. */             \
  _(Linalg, void, matmul,                                                                         \
    (const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out, const MatmulOptions&      \
    options),                                                                                     \
    (a, b, bias, out, options))                                                                   \
  /* The fp8 GEMM of per-tensor scaled operands (autocast/fp8.h): out (M, N) = (a (M, K) . b (N, */   \
  /* K)^T) * a_scale_inv * b_scale_inv, a and b fp8 codes (E4M3 or E5M2, not both E5M2) with */   \
  /* K innermost (unit stride), the scales one-element F32 tensors on their device; products */   \
  /* exact, sums in fp32 (any order), the scales applied in fp32, out (contiguous F32, BF16 or */ \
  /* F16) rounded once. CUDA: cuBLASLt's fp8 GEMM on compute capability 8.9+, else emulated. */   \
  /* With fast_accumulate, the sums are the device's fast accumulation instead: cuBLASLt's */      \
  /* FAST_ACCUM on fp8 tensor cores (unmodelled), else fast_accumulate_gemm's model (promote 0). */\
  _(Linalg, void, fp8_gemm,                                                                       \
    (const Tensor& a, const Tensor& a_scale_inv, const Tensor& b, const Tensor& b_scale_inv,     \
    bool fast_accumulate, Tensor& out),                                                           \
    (a, a_scale_inv, b, b_scale_inv, fast_accumulate, out))                                       \
  /* The emulated GEMM of block-scaled fp8 operands (autocast/fp8.h), given their values: out */   \
  /* (M, N) = sum over the K slices s of width bk (the last may be short; bk >= K: one slice) */   \
  /* of (a[:, s] . b[:, s]^T) * (sa[m / a_rows, s] * sb[n / b_rows, s]), + bias. a (M, K) and b */ \
  /* (N, K) are BF16 (fp8 codes' values, exact in bf16; any strides), sa (ceil(M / a_rows), S) */  \
  /* and sb (ceil(N / b_rows), S) F32. Each slice's sums in fp32 (any order), times its factor, */ \
  /* the slices added in order, the bias (widened) added: each an fp32 operation, one rounding */  \
  /* into out (contiguous F32, BF16 or F16). Per tensor it is fp8_gemm's emulation. */             \
  _(Linalg, void, block_scaled_gemm,                                                              \
    (const Tensor& a, const Tensor& a_scales, int64_t a_rows, const Tensor& b, const Tensor&     \
    b_scales, int64_t b_rows, int64_t bk, const Tensor* bias, Tensor& out),                       \
    (a, a_scales, a_rows, b, b_scales, b_rows, bk, bias, out))                                    \
  /* block_scaled_gemm with fp8 tensor cores' fast accumulation modelled (fp8_math.h): each */     \
  /* slice's sum is fast_accumulate_dot's, its products in order of k through the e8m13 */         \
  /* accumulator, promoted to an fp32 sum every `promote` products (0: at the slice's end); the */ \
  /* slices' factors, their sum and the bias as block_scaled_gemm's, operation for operation. */   \
  _(Linalg, void, fast_accumulate_gemm,                                                           \
    (const Tensor& a, const Tensor& a_scales, int64_t a_rows, const Tensor& b, const Tensor&     \
    b_scales, int64_t b_rows, int64_t bk, int64_t promote, const Tensor* bias, Tensor& out),     \
    (a, a_scales, a_rows, b, b_scales, b_rows, bk, promote, bias, out))                           \
  /* The FP4 GEMM on FP4 tensor cores (compute capability 10.0+; docs/fp4.md), of fp4_quantize's */\
  /* outputs: out (M, N) = a_scale_inv * b_scale_inv * sum over k of a(m, k) * b(n, k), each */     \
  /* operand's element its fp4 code's value times its block's scale (a_codes (M, K), b_codes */    \
  /* (N, K): U8 codes, any strides; a_scales, b_scales: U8 block scales, any strides, blocks of */  \
  /* *_block_rows (1 or 16) by fp4_block_cols(rule) along K: E4M3 for NVFP4, E8M0 for MX; the */    \
  /* scale_inv and amax one-element F32 on the device), sums in fp32, all of out NaN where an */     \
  /* amax is not finite; out contiguous F32 or BF16. Returns false, having done nothing, where */    \
  /* the device has no FP4 tensor cores, cuBLASLt no such GEMM or the shape does not qualify (K */  \
  /* a multiple of 32, N of 16): the CPU always; the caller then emulates. */                      \
  _(Linalg, bool, fp4_gemm,                                                                       \
    (const Tensor& a_codes, const Tensor& a_scales, int64_t a_block_rows,                         \
    const Tensor& a_scale_inv, const Tensor& a_amax, const Tensor& b_codes,                       \
    const Tensor& b_scales, int64_t b_block_rows, const Tensor& b_scale_inv,                      \
    const Tensor& b_amax, Fp4ScaleRule rule, Tensor& out),                                        \
    (a_codes, a_scales, a_block_rows, a_scale_inv, a_amax, b_codes, b_scales, b_block_rows,      \
    b_scale_inv, b_amax, rule, out))                                                              \
  /* ---- convolution and pooling (NCHW) ------------------------------------------------------ */\
  _(Convolution, void, conv2d,                                                                    \
    (const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out, const Conv2dParams& p,    \
    const MatmulOptions& options),                                                                \
    (x, w, bias, out, p, options))                                                                \
  _(Convolution, void, conv2d_backward,                                                           \
    (const Tensor& grad_out, const Tensor& x, const Tensor& w, Tensor* grad_x, Tensor* grad_w,    \
    Tensor* grad_bias, const Conv2dParams& p, const MatmulOptions& options),                      \
    (grad_out, x, w, grad_x, grad_w, grad_bias, p, options))                                      \
  _(Convolution, void, max_pool2d,                                                                \
    (const Tensor& x, Tensor& out, Tensor& indices, const Pool2dParams& p),                       \
    (x, out, indices, p))                                                                         \
  _(Convolution, void, max_pool2d_backward,                                                       \
    (const Tensor& grad_out, const Tensor& indices, Tensor& grad_x),                              \
    (grad_out, indices, grad_x))                                                                  \
  _(Convolution, void, avg_pool2d,                                                                \
    (const Tensor& x, Tensor& out, const Pool2dParams& p),                                        \
    (x, out, p))                                                                                  \
  _(Convolution, void, avg_pool2d_backward,                                                       \
    (const Tensor& grad_out, Tensor& grad_x, const Pool2dParams& p),                              \
    (grad_out, grad_x, p))                                                                        \
  /* Adaptive average pooling to out's (OH, OW). */                                               \
  _(Convolution, void, adaptive_avg_pool2d, (const Tensor& x, Tensor& out), (x, out))             \
  _(Convolution, void, adaptive_avg_pool2d_backward,                                              \
    (const Tensor& grad_out, Tensor& grad_x),                                                     \
    (grad_out, grad_x))                                                                           \
  /* ---- normalization (statistics in fp32; mean/rstd are F32, or F64 for f64 inputs) -------- */\
  /* x viewed as (N, C, S): per-channel statistics over N and S. Training (N * S > 1: the */      \
  /* running variance is the unbiased one, as PyTorch's): batch statistics, written to */         \
  /* save_mean/save_rstd, running stats updated with momentum (if defined). Eval: running stats */\
  /* used. */                                                                                     \
  _(Normalization, void, batch_norm,                                                              \
    (const Tensor& x, const Tensor* weight, const Tensor* bias, Tensor* running_mean, Tensor*     \
    running_var, bool training, double momentum, double eps, Tensor& out, Tensor& save_mean,      \
    Tensor& save_rstd),                                                                           \
    (x, weight, bias, running_mean, running_var, training, momentum, eps, out, save_mean, save_rstd))\
  _(Normalization, void, batch_norm_backward,                                                     \
    (const Tensor& grad_out, const Tensor& x, const Tensor* weight, const Tensor& save_mean,      \
    const Tensor& save_rstd, bool training, Tensor* grad_x, Tensor* grad_weight, Tensor*          \
    grad_bias),                                                                                   \
    (grad_out, x, weight, save_mean, save_rstd, training, grad_x, grad_weight, grad_bias))        \
  /* x viewed as (M, N): statistics over the last N elements of each row. */                      \
  _(Normalization, void, layer_norm,                                                              \
    (const Tensor& x, const Tensor* weight, const Tensor* bias, double eps, Tensor& out, Tensor&  \
    mean, Tensor& rstd),                                                                          \
    (x, weight, bias, eps, out, mean, rstd))                                                      \
  _(Normalization, void, layer_norm_backward,                                                     \
    (const Tensor& grad_out, const Tensor& x, const Tensor* weight, const Tensor& mean, const     \
    Tensor& rstd, Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias),                        \
    (grad_out, x, weight, mean, rstd, grad_x, grad_weight, grad_bias))                            \
  /* ---- softmax and losses ------------------------------------------------------------------ */\
  _(Softmax, void, softmax, (const Tensor& x, int dim, bool log, Tensor& out), (x, dim, log, out))\
  /* y is the forward output (softmax or log_softmax). */                                         \
  _(Softmax, void, softmax_backward,                                                              \
    (const Tensor& grad_y, const Tensor& y, int dim, bool log, Tensor& grad_x),                   \
    (grad_y, y, dim, log, grad_x))                                                                \
  /* Per-sample loss of logits (N, C) against I64 targets (N): label-smoothed NLL of */           \
  /* log_softmax. Writes loss (N) in F32 (F64 for f64) — 0 where target == ignore_index — and */  \
  /* log-probs. */                                                                                \
  _(Softmax, void, cross_entropy,                                                                 \
    (const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,    \
    Tensor& loss, Tensor& log_probs),                                                             \
    (logits, target, ignore_index, label_smoothing, loss, log_probs))                             \
  /* grad_logits = scale_n * (softmax - smoothed one-hot), scale_n = grad_loss[n] (0 if */        \
  /* ignored). */                                                                                 \
  _(Softmax, void, cross_entropy_backward,                                                        \
    (const Tensor& grad_loss, const Tensor& log_probs, const Tensor& target, int64_t              \
    ignore_index, double label_smoothing, Tensor& grad_logits),                                   \
    (grad_loss, log_probs, target, ignore_index, label_smoothing, grad_logits))                   \
  /* ---- attention (see AttentionParams) ----------------------------------------------------- */\
  _(Attention, void, attention,                                                                   \
    (const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse, const           \
    AttentionParams& p),                                                                          \
    (q, k, v, out, lse, p))                                                                       \
  /* Given the forward's out and lse: grad_q, grad_k, grad_v (each the shape of its input, */     \
  /* contiguous, the inputs' dtype). */                                                           \
  _(Attention, void, attention_backward,                                                          \
    (const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&     \
    out, const Tensor& lse, Tensor& grad_q, Tensor& grad_k, Tensor& grad_v, const                 \
    AttentionParams& p),                                                                          \
    (grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v, p))                                     \
  /* ---- indexing ---------------------------------------------------------------------------- */\
  /* out = x.index_select(dim, index) (index I64 1-D) */                                          \
  _(Indexing, void, index_select,                                                                 \
    (const Tensor& x, int dim, const Tensor& index, Tensor& out),                                 \
    (x, dim, index, out))                                                                         \
  /* grad_x (zeroed by the caller) += scatter of grad_out along dim at index */                   \
  _(Indexing, void, index_add,                                                                    \
    (Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out),                       \
    (grad_x, dim, index, grad_out))                                                               \
  _(Indexing, void, gather,                                                                       \
    (const Tensor& x, int dim, const Tensor& index, Tensor& out),                                 \
    (x, dim, index, out))                                                                         \
  _(Indexing, void, scatter_add,                                                                  \
    (Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out),                       \
    (grad_x, dim, index, grad_out))                                                               \
  /* ---- multi-tensor (optimizers, clipping): one pass over all tensors, see above ----------- */\
  /* momentum_bufs is empty when hyper.momentum == 0. */                                          \
  _(MultiTensor, void, sgd_step,                                                                  \
    (std::span<Tensor> params, std::span<const Tensor> grads, std::span<Tensor> momentum_bufs,    \
    const SgdStep& hyper),                                                                        \
    (params, grads, momentum_bufs, hyper))                                                        \
  _(MultiTensor, void, adamw_step,                                                                \
    (std::span<Tensor> params, std::span<const Tensor> grads, std::span<Tensor> exp_avgs,         \
    std::span<Tensor> exp_avg_sqs, const AdamWStep& hyper),                                       \
    (params, grads, exp_avgs, exp_avg_sqs, hyper))                                                \
  /* Row-sparse AdamW over whole tables (LazyAdam; PyTorch's SparseAdam with a count per row): */ \
  /* tables[i] (rows, dim), rows[i] I64 (U) distinct row ids, grads[i] (U, dim) those rows' */     \
  /* gradients, exp_avgs/exp_avg_sqs[i] the tables' moments (rows, dim, the state dtype), */      \
  /* row_steps[i] I64 (rows) each row's update count. Each listed row advances its count and */   \
  /* takes adamw_step's update at that count; the other rows keep weight, moments and count. */   \
  /* hyper.options as adamw_step's but for step_counts (unused: the counts are per row); element */\
  /* j of row r draws its stochastic bits at the row's count and element offset r * dim + j, so */ \
  /* a call that lists every row is adamw_step's, bit for bit. */                                  \
  _(MultiTensor, void, sparse_adamw_step,                                                         \
    (std::span<Tensor> tables, std::span<const Tensor> rows, std::span<const Tensor> grads,       \
    std::span<Tensor> exp_avgs, std::span<Tensor> exp_avg_sqs, std::span<Tensor> row_steps,      \
    const AdamWStep& hyper),                                                                      \
    (tables, rows, grads, exp_avgs, exp_avg_sqs, row_steps, hyper))                               \
  /* out (one element, F64) = the norm_type-norm of all elements of all tensors together: (sum */ \
  /* |x|^p)^(1/p) for p > 0, max |x| for p = inf (NaN propagates). Accumulates in fp32 per */     \
  /* chunk (f64 for f64), chunks combined in f64 in a fixed order. */                             \
  _(MultiTensor, void, multi_tensor_norm,                                                         \
    (std::span<const Tensor> tensors, double norm_type, Tensor& out),                             \
    (tensors, norm_type, out))                                                                    \
  /* Every tensor *= factor in place (compute type, one rounding); factor is one F64 element on */\
  /* this device, read there (clipping computes it on the device: no host wait). A factor of */   \
  /* exactly 1 leaves every value as it is. */                                                    \
  _(MultiTensor, void, multi_tensor_scale,                                                        \
    (std::span<Tensor> tensors, const Tensor& factor),                                            \
    (tensors, factor))                                                                            \
  /* The loss scaler's fused pass (docs/design.md §4): every gradient *= inv_scale in place */    \
  /* (loaded in its dtype, multiplied in the compute type, fp32 for f32/half, one rounding on */  \
  /* store; left untouched when inv_scale == 1) and, in the same pass, a check for inf/NaN, as */ \
  /* PyTorch's _amp_foreach_non_finite_check_and_unscale_ (the values are written even when */    \
  /* non-finite ones are found). Returns whether any element of any tensor is inf or NaN. */      \
  /* found_inf, when given, is a one-element F32 tensor on this device that is set to 1 when */   \
  /* this call found one and otherwise left as it is, so that calls accumulate into it: a */      \
  /* device backend can keep the flag there (the optimizer kernels read it and no-op) and only */ \
  /* a host that must decide reads it back: when found_inf is given, a device backend may leave */\
  /* the answer in the flag and return false without waiting (the CUDA backend does); without */  \
  /* it, the return value is exact and a device backend waits for it. Every tensor is floating, */\
  /* contiguous and on this device. */                                                            \
  _(MultiTensor, bool, unscale_and_check,                                                         \
    (std::span<Tensor> grads, double inv_scale, Tensor* found_inf),                               \
    (grads, inv_scale, found_inf))                                                                \
  /* The same with the factor taken where the scale lives: inv_scale = 1 / scale_state[0] (the */ \
  /* F64 state of update_scale) rounded to fp32, as PyTorch's inv_scale = */                      \
  /* scale.double().reciprocal().float(); found_inf (one F32 element) is set to 1 when a */       \
  /* gradient holds inf/NaN. Never waits: how GradScaler unscales on every device. */             \
  _(MultiTensor, void, unscale_with_state,                                                        \
    (std::span<Tensor> grads, const Tensor& scale_state, Tensor& found_inf),                      \
    (grads, scale_state, found_inf))                                                              \
  /* The dynamic loss scale's update where the scale lives (PyTorch's _amp_update_scale_, plus */ \
  /* hysteresis and the min/max clamp of GradScalerOptions): state is an F64 tensor of 4 */       \
  /* elements on this device {scale, growth_tracker, hysteresis_tracker, min_scale_overflows}; */ \
  /* found_inf the one-element F32 flag of unscale_and_check. Follows next_scale_state */         \
  /* (step_math.h, the one definition every backend runs), so trajectories agree across */        \
  /* devices. */                                                                                  \
  _(MultiTensor, void, update_scale,                                                              \
    (Tensor& state, const Tensor& found_inf, const ScaleUpdate& rule),                            \
    (state, found_inf, rule))
// clang-format on
