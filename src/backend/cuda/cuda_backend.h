// Internal: the CUDA backend (one per device). Every kernel is queued on the device's current
// stream (mantissa/core/cuda.h) and never waits for the host, except where a result must come
// back to it (unscale_and_check's return value, only when no found_inf flag is given). Inputs may
// be strided; the files named below hold each family.
#pragma once

#include "backend/backend.h"

namespace mantissa::backend::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {}
  int device() const { return device_; }

  // elementwise.cu
  void copy(const Tensor& src, Tensor& dst) override;
  void fill(Tensor& dst, double value) override;
  void copy_rounded(const Tensor& src, Tensor& dst, const RoundingOptions& rounding) override;
  void uniform(Tensor& dst, double a, double b, uint64_t seed, uint64_t offset) override;
  void normal(Tensor& dst, double mean, double stddev, uint64_t seed, uint64_t offset) override;
  void round_to_format(Tensor& t, Format format) override;

  void unary(UnaryOp op, const Tensor& x, Tensor& out, Scalars s) override;
  void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, Tensor& gx,
                      Scalars s) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) override;
  void add_scaled(const Tensor& a, const Tensor& b, double alpha, Tensor& out) override;
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, Tensor& out) override;
  void dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, Tensor& out,
               Tensor& mask) override;

  // reduce.cu
  void reduce(ReduceOp op, const Tensor& x, std::span<const int> dims, Tensor& out, Tensor* indices,
              int64_t correction) override;

  // blas.cpp
  void matmul(const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out,
              const MatmulOptions& options) override;

  // conv.cpp
  void conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
              const Conv2dParams& p, const MatmulOptions& options) override;
  void conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& w, Tensor* grad_x,
                       Tensor* grad_w, Tensor* grad_bias, const Conv2dParams& p,
                       const MatmulOptions& options) override;

  // pool.cu
  void max_pool2d(const Tensor& x, Tensor& out, Tensor& indices, const Pool2dParams& p) override;
  void max_pool2d_backward(const Tensor& grad_out, const Tensor& indices, Tensor& grad_x) override;
  void avg_pool2d(const Tensor& x, Tensor& out, const Pool2dParams& p) override;
  void avg_pool2d_backward(const Tensor& grad_out, Tensor& grad_x, const Pool2dParams& p) override;
  void adaptive_avg_pool2d(const Tensor& x, Tensor& out) override;
  void adaptive_avg_pool2d_backward(const Tensor& grad_out, Tensor& grad_x) override;

  // norm.cu
  void batch_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, Tensor* running_mean,
                  Tensor* running_var, bool training, double momentum, double eps, Tensor& out,
                  Tensor& save_mean, Tensor& save_rstd) override;
  void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor* weight,
                           const Tensor& save_mean, const Tensor& save_rstd, bool training,
                           Tensor* grad_x, Tensor* grad_weight, Tensor* grad_bias) override;
  void layer_norm(const Tensor& x, const Tensor* weight, const Tensor* bias, double eps,
                  Tensor& out, Tensor& mean, Tensor& rstd) override;
  void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor* weight,
                           const Tensor& mean, const Tensor& rstd, Tensor* grad_x,
                           Tensor* grad_weight, Tensor* grad_bias) override;

  // softmax.cu
  void softmax(const Tensor& x, int dim, bool log, Tensor& out) override;
  void softmax_backward(const Tensor& grad_y, const Tensor& y, int dim, bool log,
                        Tensor& grad_x) override;
  void cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                     double label_smoothing, Tensor& loss, Tensor& log_probs) override;
  void cross_entropy_backward(const Tensor& grad_loss, const Tensor& log_probs,
                              const Tensor& target, int64_t ignore_index, double label_smoothing,
                              Tensor& grad_logits) override;

  // index.cu
  void index_select(const Tensor& x, int dim, const Tensor& index, Tensor& out) override;
  void index_add(Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out) override;
  void gather(const Tensor& x, int dim, const Tensor& index, Tensor& out) override;
  void scatter_add(Tensor& grad_x, int dim, const Tensor& index, const Tensor& grad_out) override;

  // multi_tensor.cu
  void sgd_step(std::span<Tensor> params, std::span<const Tensor> grads,
                std::span<Tensor> momentum_bufs, const SgdStep& hyper) override;
  void adamw_step(std::span<Tensor> params, std::span<const Tensor> grads,
                  std::span<Tensor> exp_avgs, std::span<Tensor> exp_avg_sqs,
                  const AdamWStep& hyper) override;
  void multi_tensor_norm(std::span<const Tensor> tensors, double norm_type, Tensor& out) override;
  void multi_tensor_scale(std::span<Tensor> tensors, const Tensor& factor) override;

  bool unscale_and_check(std::span<Tensor> grads, double inv_scale, Tensor* found_inf) override;
  void unscale_and_check(std::span<Tensor> grads, const Tensor& scale_state,
                         Tensor& found_inf) override;
  void update_scale(Tensor& state, const Tensor& found_inf, const ScaleUpdate& rule) override;

  // attention.cu
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                 const AttentionParams& p) override;
  void attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, Tensor& grad_q, Tensor& grad_k,
                          Tensor& grad_v, const AttentionParams& p) override;

 private:
  int device_;
};

}  // namespace mantissa::backend::cuda
