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
  MT_ASSERT(o.compensations.empty() || o.compensations.size() == params.size(), kernel,
            ": one compensation entry per parameter");
  MT_ASSERT(o.state_scales.empty() || o.state_scales.size() == states.size() * params.size(),
            kernel, ": one scale entry per state and parameter");
  MT_ASSERT(o.state_block >= 1 && kMaxStateBlockElements % o.state_block == 0, kernel,
            ": a state block of ", o.state_block, " elements");
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
    size_t k = 0;
    for (const auto& s : states) {
      const Tensor& b = s[i];
      const DType d = b.dtype();
      MT_ASSERT(
          (d == optimizer_state_dtype(p.dtype()) || d == DType::BF16 || block_scaled_state(d)) &&
              b.is_contiguous() && b.shape() == p.shape() && b.device() == device,
          kernel, ": state ", b.describe(), " of parameter ", p.describe());
      const Tensor* scale =
          o.state_scales.empty() ? nullptr : &o.state_scales[k * params.size() + i];
      if (block_scaled_state(d)) {
        const int64_t blocks = (p.numel() + o.state_block - 1) / o.state_block;
        MT_ASSERT(scale != nullptr && scale->defined() && scale->dtype() == DType::F32 &&
                      scale->is_contiguous() && scale->numel() == blocks &&
                      scale->device() == device,
                  kernel, ": the block scales of state ", b.describe(), " (", blocks, " blocks of ",
                  o.state_block, ")");
        MT_ASSERT(o.element_offsets.empty() || o.element_offsets[i] % uint64_t(o.state_block) == 0,
                  kernel, ": a block-scaled state's slice starts inside a block");
      } else {
        MT_ASSERT(scale == nullptr || !scale->defined(), kernel, ": block scales for state ",
                  b.describe());
      }
      ++k;
    }
    if (i < o.compensations.size() && o.compensations[i].defined()) {
      const Tensor& c = o.compensations[i];
      MT_ASSERT(c.dtype() == p.dtype() && c.is_contiguous() && c.shape() == p.shape() &&
                    c.device() == device && p.dtype() != DType::F32 && p.dtype() != DType::F64 &&
                    (i >= o.masters.size() || !o.masters[i].defined()),
                kernel, ": compensation ", c.describe(), " of parameter ", p.describe());
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

bool plain_step_state(std::span<const Tensor> params,
                      std::initializer_list<std::span<Tensor>> states,
                      const MultiTensorOptions& o) {
  for (const Tensor& c : o.compensations) {
    if (c.defined()) return false;
  }
  for (const auto& s : states) {
    for (size_t i = 0; i < s.size() && i < params.size(); ++i) {
      if (s[i].dtype() != optimizer_state_dtype(params[i].dtype())) return false;
    }
  }
  return true;
}

void check_sparse_step_call(const char* kernel, Device device, std::span<const Tensor> tables,
                            std::span<const Tensor> rows, std::span<const Tensor> grads,
                            std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                            std::span<const Tensor> row_steps, const MultiTensorOptions& o) {
  const size_t n = tables.size();
  MT_ASSERT(rows.size() == n && grads.size() == n && exp_avgs.size() == n &&
                exp_avg_sqs.size() == n && row_steps.size() == n && o.ids.size() == n,
            kernel, ": rows, gradients, two moments, row counts and an id per table");
  MT_ASSERT(o.masters.empty() || o.masters.size() == n, kernel, ": one master entry per table");
  MT_ASSERT(o.element_offsets.empty(), kernel, ": tables are whole, without element offsets");
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = tables[i];
    MT_ASSERT(t.is_floating_point() && t.dim() == 2 && t.is_contiguous() && t.device() == device,
              kernel, ": table ", i, " is ", t.describe());
    const Tensor& r = rows[i];
    MT_ASSERT(r.dtype() == DType::I64 && r.dim() == 1 && r.is_contiguous() &&
                  r.device() == device && r.numel() <= t.size(0),
              kernel, ": the rows of table ", i, " are ", r.describe());
    const Tensor& g = grads[i];
    MT_ASSERT(g.is_floating_point() && g.is_contiguous() && g.device() == device && g.dim() == 2 &&
                  g.size(0) == r.numel() && g.size(1) == t.size(1),
              kernel, ": gradient ", i, " is ", g.describe(), " for ", r.numel(), " rows of ",
              t.describe());
    for (const Tensor* s : {&exp_avgs[i], &exp_avg_sqs[i]}) {
      MT_ASSERT(s->dtype() == optimizer_state_dtype(t.dtype()) && s->is_contiguous() &&
                    s->shape() == t.shape() && s->device() == device,
                kernel, ": state ", s->describe(), " of table ", t.describe());
    }
    const Tensor& c = row_steps[i];
    MT_ASSERT(c.dtype() == DType::I64 && c.is_contiguous() && c.dim() == 1 &&
                  c.size(0) == t.size(0) && c.device() == device,
              kernel, ": the row counts of table ", i, " are ", c.describe());
    if (i < o.masters.size() && o.masters[i].defined()) {
      const Tensor& m = o.masters[i];
      MT_ASSERT(m.dtype() == DType::F32 && m.is_contiguous() && m.shape() == t.shape() &&
                    m.device() == device && t.dtype() != DType::F32 && t.dtype() != DType::F64,
                kernel, ": master ", m.describe(), " of table ", t.describe());
    }
    if (device.is_cpu()) {
      const int64_t* ids = static_cast<const int64_t*>(r.data_ptr());
      for (int64_t u = 0; u < r.numel(); ++u)
        MT_ASSERT(ids[u] >= 0 && ids[u] < t.size(0), kernel, ": row ", ids[u], " of table ", i,
                  " (", t.size(0), " rows)");
    }
  }
  if (o.found_inf != nullptr) check_found_inf(kernel, device, *o.found_inf);
}

}  // namespace mantissa::backend
