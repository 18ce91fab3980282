#include "backend/multi_tensor_check.h"

#include "mantissa/core/error.h"

namespace mantissa::backend {

void check_plain_tensors(const char* kernel, Device device, std::span<const Tensor> tensors) {
  for (const Tensor& t : tensors) {
    MT_ASSERT(t.is_floating_point() && t.is_contiguous() && t.device() == device, kernel, " of ",
              t.describe(), " on ", device.str());
  }
}

void check_found_inf(const char* kernel, Device device, const Tensor& flag) {
  MT_ASSERT(flag.dtype() == DType::F32 && flag.numel() == 1 && flag.is_contiguous() &&
                flag.device() == device,
            kernel, ": the found-inf flag is one f32 element on ", device.str(), ", got ",
            flag.describe());
}

void check_scale_state(const char* kernel, Device device, const Tensor& state) {
  MT_ASSERT(state.dtype() == DType::F64 && state.numel() == 4 && state.is_contiguous() &&
                state.device() == device,
            kernel, ": the scaler state is 4 f64 elements on ", device.str(), ", got ",
            state.describe());
}

void check_step_call(const char* kernel, Device device, std::span<const Tensor> params,
                     std::span<const Tensor> grads, std::initializer_list<std::span<Tensor>> states,
                     const MultiTensorOptions& o) {
  MT_ASSERT(grads.size() == params.size() && o.ids.size() == params.size(), kernel,
            ": one gradient and one id per parameter");
  MT_ASSERT(o.masters.empty() || o.masters.size() == params.size(), kernel,
            ": one master entry per parameter");
  MT_ASSERT(o.element_offsets.empty() || o.element_offsets.size() == params.size(), kernel,
            ": one element offset per parameter");
  MT_ASSERT(o.step_counts != nullptr, kernel, ": no step counts");
  const Tensor& counts = *o.step_counts;
  MT_ASSERT(counts.dtype() == DType::I64 && counts.dim() == 1 && counts.is_contiguous() &&
                counts.device() == device,
            kernel, ": the step counts are an i64 vector on ", device.str(), ", got ",
            counts.describe());
  for (const auto& s : states)
    MT_ASSERT(s.size() == params.size(), kernel, ": one state tensor per parameter");
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const Tensor& g = grads[i];
    MT_ASSERT(p.is_floating_point() && p.is_contiguous() && p.device() == device, kernel,
              ": parameter ", i, " is ", p.describe());
    MT_ASSERT(g.is_floating_point() && g.is_contiguous() && g.shape() == p.shape() &&
                  g.device() == device,
              kernel, ": gradient ", i, " is ", g.describe(), " for a parameter ", p.describe());
    MT_ASSERT(int64_t(o.ids[i]) < counts.numel(), kernel, ": id ", o.ids[i], " of tensor ", i,
              " has no step count (", counts.numel(), ")");
    for (const auto& s : states) {
      const Tensor& b = s[i];
      MT_ASSERT(b.dtype() == optimizer_state_dtype(p.dtype()) && b.is_contiguous() &&
                    b.shape() == p.shape() && b.device() == device,
                kernel, ": state ", b.describe(), " of parameter ", p.describe());
    }
    if (i < o.masters.size() && o.masters[i].defined()) {
      const Tensor& m = o.masters[i];
      MT_ASSERT(m.dtype() == DType::F32 && m.is_contiguous() && m.shape() == p.shape() &&
                    m.device() == device && p.dtype() != DType::F32 && p.dtype() != DType::F64,
                kernel, ": master ", m.describe(), " of parameter ", p.describe());
    }
  }
  if (o.found_inf != nullptr) check_found_inf(kernel, device, *o.found_inf);
}

}  // namespace mantissa::backend
