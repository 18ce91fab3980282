// Global-norm gradient clipping through the backend's multi-tensor norm and scale kernels.
#include "mantissa/optim/clip.h"

#include <cmath>

#include "backend/backend.h"
#include "mantissa/core/error.h"

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

double norm_of(const std::vector<Tensor>& grads, double norm_type) {
  MT_CHECK(norm_type > 0, "a gradient norm needs norm_type > 0 (or inf), got ", norm_type);
  if (grads.empty()) return 0.0;
  // The result lives where the gradients do (a device backend writes device memory); item()
  // reads it back, the one host wait clipping needs per step.
  Tensor out = Tensor::empty(Shape{}, DType::F64, grads[0].device());
  backend::backend_for(grads[0].device()).multi_tensor_norm(grads, norm_type, out);
  return out.item();
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  return norm_of(gradients_of(params, "grad_norm"), norm_type);
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  MT_CHECK(std::isfinite(max_norm) && max_norm >= 0,
           "clip_grad_norm: max_norm must be finite and >= 0, got ", max_norm);
  std::vector<Tensor> grads = gradients_of(params, "clip_grad_norm");
  const double total = norm_of(grads, norm_type);
  const double coef = max_norm / (total + 1e-6);
  if (!(coef >= 1.0) && !grads.empty()) {  // NaN scales too, as in PyTorch
    backend::backend_for(grads[0].device()).multi_tensor_scale(grads, coef);
    for (const Tensor& g : grads)
      g.bump_version();
  }
  return total;
}

}  // namespace mantissa::optim
