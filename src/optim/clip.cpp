// Global-norm gradient clipping through the backend's multi-tensor norm and scale kernels.
#include "mantissa/optim/clip.h"

#include <cmath>

#include "backend/backend.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::optim {
namespace {

// The defined gradients of params, contiguous, all on one device.
std::vector<Tensor> gradients_of(const std::vector<Tensor>& params, const char* what) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    MT_CHECK(params[i].defined(), what, ": parameter ", i, " is an undefined tensor");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    MT_CHECK(g.is_floating_point(), what, ": the gradient of parameter ", i, " is a ",
             g.describe());
    MT_CHECK(g.is_contiguous(), what, ": the gradient of parameter ", i, " (", g.describe(),
             ") is not contiguous; the fused pass scales contiguous gradients in place");
    MT_CHECK(grads.empty() || g.device() == grads[0].device(), what,
             ": gradients on different devices (", grads[0].device().str(), " and ",
             g.device().str(), ")");
    grads.push_back(std::move(g));
  }
  return grads;
}

Tensor norm_of(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               double norm_type, const NormCombiner& combine) {
  MT_CHECK(norm_type > 0, "a gradient norm needs norm_type > 0 (or inf), got ", norm_type);
  const Device device =
      grads.empty() ? (params.empty() ? Device::cpu() : params[0].device()) : grads[0].device();
  // The result lives where the gradients do (a device backend writes device memory).
  Tensor out = Tensor::zeros(Shape{}, DType::F64, device);
  if (!grads.empty()) backend::backend_for(device).multi_tensor_norm(grads, norm_type, out);
  if (!combine) return out;
  NoGrad ng;
  if (std::isinf(norm_type)) {
    combine(out, true);
    return out;
  }
  // The ranks' sums of |g|^p add up; the p-th root of the total is the norm of them all.
  Tensor partial = pow(out, norm_type).contiguous();
  combine(partial, false);
  return pow(partial, 1.0 / norm_type);
}

}  // namespace

Tensor grad_norm(const std::vector<Tensor>& params, double norm_type, const NormCombiner& combine) {
  return norm_of(params, gradients_of(params, "grad_norm"), norm_type, combine);
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type,
                      const NormCombiner& combine) {
  MT_CHECK(std::isfinite(max_norm) && max_norm >= 0,
           "clip_grad_norm: max_norm must be finite and >= 0, got ", max_norm);
  std::vector<Tensor> grads = gradients_of(params, "clip_grad_norm");
  const Tensor total = norm_of(params, grads, norm_type, combine);
  if (grads.empty()) return total;
  NoGrad ng;
  // min(1, max_norm / (norm + 1e-6)) in f64 on the device; where(ratio >= 1, 1, ratio) keeps a
  // NaN ratio (the comparison is false), which scales by NaN as PyTorch's clamp does.
  const Device device = total.device();
  const Tensor ratio = div(Tensor::scalar(max_norm, DType::F64, device), add(total, 1e-6));
  const Tensor one = Tensor::scalar(1.0, DType::F64, device);
  const Tensor factor = where(ge(ratio, one), one, ratio).contiguous();
  backend::backend_for(device).multi_tensor_scale(grads, factor);
  for (const Tensor& g : grads)
    g.bump_version();
  return total;
}

}  // namespace mantissa::optim
