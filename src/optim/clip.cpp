// Global-norm gradient clipping through the backend's multi-tensor norm and scale kernels.
#include "mantissa/optim/clip.h"

#include <cmath>

#include "backend/backend.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::optim {
namespace {

// The defined gradients of params.
std::vector<Tensor> gradients_of(const std::vector<Tensor>& params, const char* what) {
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    MT_CHECK(params[i].defined(), what, ": parameter ", i, " is an undefined tensor");
    Tensor g = params[i].grad();
    if (g.defined()) grads.push_back(std::move(g));
  }
  return grads;
}

// Gradients the fused passes take: floating, contiguous, all on one device.
void check_gradients(const std::vector<Tensor>& grads, const char* what) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    MT_CHECK(g.defined() && g.is_floating_point(), what, ": gradient ", i, " is ",
             g.defined() ? "a " + g.describe() : std::string("an undefined tensor"));
    MT_CHECK(g.is_contiguous(), what, ": gradient ", i, " (", g.describe(),
             ") is not contiguous; the fused pass scales contiguous gradients in place");
    MT_CHECK(g.device() == grads[0].device(), what, ": gradients on different devices (",
             grads[0].device().str(), " and ", g.device().str(), ")");
  }
}

Tensor norm_of(Device fallback, const std::vector<Tensor>& grads, double norm_type,
               const NormCombiner& combine) {
  MT_CHECK(norm_type > 0, "a gradient norm needs norm_type > 0 (or inf), got ", norm_type);
  const Device device = grads.empty() ? fallback : grads[0].device();
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

Device first_device(const std::vector<Tensor>& params) {
  return params.empty() || !params[0].defined() ? Device::cpu() : params[0].device();
}

}  // namespace

Tensor grad_norm(const std::vector<Tensor>& params, double norm_type, const NormCombiner& combine) {
  return gradients_norm(gradients_of(params, "grad_norm"), norm_type, combine,
                        first_device(params));
}

Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type,
                      const NormCombiner& combine) {
  return clip_gradients(gradients_of(params, "clip_grad_norm"), max_norm, norm_type, combine,
                        first_device(params));
}

Tensor gradients_norm(const std::vector<Tensor>& grads, double norm_type,
                      const NormCombiner& combine, Device device) {
  check_gradients(grads, "grad_norm");
  return norm_of(device, grads, norm_type, combine);
}

Tensor clip_gradients(const std::vector<Tensor>& grads, double max_norm, double norm_type,
                      const NormCombiner& combine, Device device) {
  MT_CHECK(std::isfinite(max_norm) && max_norm >= 0,
           "clip_grad_norm: max_norm must be finite and >= 0, got ", max_norm);
  check_gradients(grads, "clip_grad_norm");
  const Tensor total = norm_of(device, grads, norm_type, combine);
  if (grads.empty()) return total;
  NoGrad ng;
  // min(1, max_norm / (norm + 1e-6)) in f64 on the device; where(ratio >= 1, 1, ratio) keeps a
  // NaN ratio (the comparison is false), which scales by NaN as PyTorch's clamp does.
  const Device where_norm = total.device();
  const Tensor ratio = div(Tensor::scalar(max_norm, DType::F64, where_norm), add(total, 1e-6));
  const Tensor one = Tensor::scalar(1.0, DType::F64, where_norm);
  const Tensor factor = where(ge(ratio, one), one, ratio).contiguous();
  std::vector<Tensor> scaled(grads);  // handles of the same storage, scaled in place
  backend::backend_for(where_norm).multi_tensor_scale(scaled, factor);
  for (const Tensor& g : scaled)
    g.bump_version();
  return total;
}

}  // namespace mantissa::optim
