// Row-sparse AdamW for embedding tables (optim/sparse_adamw.h): the batch's rows on the host,
// the update in the backend (sparse_adamw_step).
#include "mantissa/optim/sparse_adamw.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "backend/backend.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"

namespace mantissa::optim {

SparseAdamW::SparseAdamW(std::vector<Tensor> tables, SparseAdamWOptions options)
    : tables_(std::move(tables)), options_(options) {
  MT_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1 &&
               options.eps > 0 && options.weight_decay >= 0,
           "sparse AdamW: beta1 and beta2 must be in [0, 1), eps positive and weight decay >= 0");
  NoGrad ng;
  for (const Tensor& t : tables_) {
    MT_CHECK(t.defined() && t.dim() == 2 && t.dtype() == DType::F32 && t.is_contiguous(),
             "sparse AdamW updates f32 (rows, dim) tables (cast them after building it), got ",
             t.defined() ? t.describe() : std::string("an undefined tensor"));
    exp_avg_.push_back(Tensor::zeros(t.shape(), DType::F32, t.device()));
    exp_avg_sq_.push_back(Tensor::zeros(t.shape(), DType::F32, t.device()));
    steps_.push_back(Tensor::zeros({t.size(0)}, DType::I64, t.device()));
    masters_.push_back(t.detach().clone());
  }
}

void SparseAdamW::set_precision(bool masters, RoundingMode rounding, uint64_t seed) {
  rounding_ = rounding;
  seed_ = seed;
  for (size_t i = 0; i < tables_.size(); ++i) {
    const DType dt = tables_[i].dtype();
    MT_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16,
             "sparse AdamW stores into f32, bf16 or f16 tables, not ", dtype_name(dt));
    if (dt == DType::F32 || !masters) masters_[i] = Tensor();
  }
}

SparseAdamW::Batch SparseAdamW::gather(const Tensor& categorical) const {
  const auto n = int64_t(tables_.size());
  MT_CHECK(categorical.dim() == 2 && categorical.size(1) == n && categorical.dtype() == DType::I64,
           "sparse AdamW: the categorical ids must be I64 (B, ", n, "), got a ",
           categorical.describe());
  const Tensor ids = categorical.to(Device::cpu()).contiguous();
  const int64_t b = ids.size(0);
  const int64_t* in = ids.data<int64_t>();
  const Device device = n > 0 ? tables_[0].device() : categorical.device();
  Batch out;
  std::vector<int64_t> local(static_cast<size_t>(b * n));
  std::vector<int32_t> slot;
  NoGrad ng;
  for (int64_t f = 0; f < n; ++f) {
    const int64_t table_rows = tables_[size_t(f)].size(0);
    slot.assign(size_t(table_rows), -1);
    std::vector<int64_t> rows;
    for (int64_t r = 0; r < b; ++r) {
      const int64_t id = in[r * n + f];
      MT_CHECK(id >= 0 && id < table_rows, "embedding table ", f, " has ", table_rows,
               " rows; example ", r, " of the batch asks for row ", id);
      if (slot[size_t(id)] < 0) {
        slot[size_t(id)] = int32_t(rows.size());
        rows.push_back(id);
      }
      local[size_t(r * n + f)] = slot[size_t(id)];
    }
    const Tensor index = Tensor::from_vector(rows, {int64_t(rows.size())}).to(device);
    Tensor leaf = index_select(tables_[size_t(f)].detach(), 0, index);
    leaf.set_requires_grad(true);
    out.rows.push_back(index);
    out.leaves.push_back(std::move(leaf));
  }
  out.local = Tensor::from_vector(local, {b, n}).to(device);
  return out;
}

bool SparseAdamW::unscale(Batch& batch, double inv_scale) const {
  NoGrad ng;
  batch.grads.assign(batch.leaves.size(), Tensor());
  std::vector<Tensor> present;
  for (size_t f = 0; f < batch.leaves.size(); ++f) {
    const Tensor& g = batch.leaves[f].grad();
    if (!g.defined()) continue;
    // Unscaled in fp32, not in the table's dtype: an fp16 gradient divided by the scale would
    // lose what the scale kept from underflowing.
    batch.grads[f] = inv_scale == 1 ? g.contiguous() : g.to(DType::F32).contiguous().clone();
    present.push_back(batch.grads[f]);
  }
  if (present.empty()) return true;
  return !backend::backend_for(present[0].device()).unscale_and_check(present, inv_scale, nullptr);
}

void SparseAdamW::step(const Batch& batch, double lr) {
  NoGrad ng;
  MT_CHECK(batch.grads.size() == tables_.size(),
           "sparse AdamW: step() takes a batch unscale() has seen");
  std::vector<Tensor> tables, rows, grads, m, v, steps, masters;
  std::vector<uint64_t> ids;
  for (size_t f = 0; f < tables_.size(); ++f) {
    if (!batch.grads[f].defined()) continue;
    tables.push_back(tables_[f]);
    rows.push_back(batch.rows[f]);
    grads.push_back(batch.grads[f]);
    m.push_back(exp_avg_[f]);
    v.push_back(exp_avg_sq_[f]);
    steps.push_back(steps_[f]);
    masters.push_back(masters_[f]);
    ids.push_back(uint64_t(f));  // the table's index: its stochastic bits' stream
  }
  if (tables.empty()) return;
  backend::AdamWStep h{.lr = lr,
                       .beta1 = options_.beta1,
                       .beta2 = options_.beta2,
                       .eps = options_.eps,
                       .weight_decay = options_.weight_decay,
                       .options = {}};
  h.options.ids = ids;
  h.options.masters = masters;
  h.options.store_rounding = rounding_;
  h.options.seed = seed_;
  backend::backend_for(tables[0].device()).sparse_adamw_step(tables, rows, grads, m, v, steps, h);
  for (Tensor& t : tables)
    t.bump_version();
}

NamedTensors SparseAdamW::state_dict() const {
  NamedTensors out;
  for (size_t f = 0; f < tables_.size(); ++f) {
    const std::string p = "tables." + std::to_string(f) + ".";
    out.emplace_back(p + "exp_avg", exp_avg_[f]);
    out.emplace_back(p + "exp_avg_sq", exp_avg_sq_[f]);
    out.emplace_back(p + "steps", steps_[f]);
    if (masters_[f].defined()) out.emplace_back(p + "master", masters_[f]);
  }
  return out;
}

void SparseAdamW::load_state_dict(const NamedTensors& state) {
  const NamedTensors mine = state_dict();
  MT_CHECK(state.size() == mine.size(), "the sparse AdamW state has ", state.size(),
           " tensors, this run's ", mine.size(), " (a checkpoint of another configuration)");
  NoGrad ng;
  for (const auto& [name, dst] : mine) {
    const auto it =
        std::find_if(state.begin(), state.end(), [&](const auto& e) { return e.first == name; });
    MT_CHECK(
        it != state.end() && it->second.shape() == dst.shape() && it->second.dtype() == dst.dtype(),
        "the sparse AdamW state lacks '", name, "' or holds it in another shape");
    Tensor(dst).copy_(it->second.to(dst.device()));
  }
}

int64_t SparseAdamW::state_nbytes() const {
  int64_t n = 0;
  for (size_t f = 0; f < tables_.size(); ++f) {
    n += int64_t(exp_avg_[f].nbytes() + exp_avg_sq_[f].nbytes() + steps_[f].nbytes());
    if (masters_[f].defined()) n += int64_t(masters_[f].nbytes());
  }
  return n;
}

}  // namespace mantissa::optim
