// Row-sparse AdamW for embedding tables (lazy_embeddings.h).
#include "train/lazy_embeddings.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/dtype.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::train {

namespace {

// Element j of a table stored as `dt`, as a float.
float load(const void* data, DType dt, int64_t j) {
  if (dt == DType::F32) return static_cast<const float*>(data)[j];
  return decode(*dtype_format(dt), static_cast<const uint16_t*>(data)[j]);
}

}  // namespace

LazyEmbeddingAdam::LazyEmbeddingAdam(std::vector<Tensor> tables, LazyAdamOptions options)
    : tables_(std::move(tables)), options_(options) {
  NoGrad ng;
  for (const Tensor& t : tables_) {
    MT_CHECK(t.dim() == 2 && t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous(),
             "lazy embedding updates need f32 (rows, dim) tables in host memory (the CPU "
             "device), got a ",
             t.describe(), "; use --embedding-update dense");
    exp_avg_.push_back(Tensor::zeros(t.shape(), DType::F32));
    exp_avg_sq_.push_back(Tensor::zeros(t.shape(), DType::F32));
    steps_.push_back(Tensor::zeros({t.size(0)}, DType::I64));
    masters_.push_back(t.detach().clone());
    slot_.emplace_back(size_t(t.size(0)), -1);
  }
}

void LazyEmbeddingAdam::set_precision(bool masters, RoundingMode rounding, uint64_t seed) {
  rounding_ = rounding;
  seed_ = seed;
  for (size_t i = 0; i < tables_.size(); ++i) {
    const DType dt = tables_[i].dtype();
    MT_CHECK(dt == DType::F32 || dt == DType::BF16 || dt == DType::F16,
             "lazy embedding updates store into f32, bf16 or f16 tables, not ", dtype_name(dt));
    if (dt == DType::F32 || !masters) masters_[i] = Tensor();
  }
}

LazyEmbeddingAdam::Batch LazyEmbeddingAdam::gather(const Tensor& categorical) {
  const auto n = int64_t(tables_.size());
  MT_CHECK(categorical.dim() == 2 && categorical.size(1) == n &&
               categorical.dtype() == DType::I64 && categorical.device().is_cpu(),
           "lazy embedding updates: the categorical ids must be I64 (B, ", n,
           ") in host memory, got a ", categorical.describe());
  const Tensor ids = categorical.contiguous();
  const int64_t b = ids.size(0);
  const int64_t* in = ids.data<int64_t>();
  Batch out;
  out.rows.resize(size_t(n));
  std::vector<int64_t> local(static_cast<size_t>(b * n));
  NoGrad ng;
  for (int64_t f = 0; f < n; ++f) {
    std::vector<int32_t>& slot = slot_[size_t(f)];
    std::vector<int64_t>& rows = out.rows[size_t(f)];
    const auto table_rows = int64_t(slot.size());
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
    for (const int64_t id : rows)
      slot[size_t(id)] = -1;
    const Tensor index = Tensor::from_vector(rows, {int64_t(rows.size())});
    Tensor leaf = index_select(tables_[size_t(f)].detach(), 0, index);
    leaf.set_requires_grad(true);
    out.leaves.push_back(std::move(leaf));
  }
  out.local = Tensor::from_vector(local, {b, n});
  return out;
}

bool LazyEmbeddingAdam::finite(const Batch& batch, float inv_scale) const {
  NoGrad ng;
  for (const Tensor& leaf : batch.leaves) {
    const Tensor& g = leaf.grad();
    if (!g.defined()) continue;
    const Tensor g32 = g.to(DType::F32).contiguous();
    const float* p = g32.data<float>();
    for (int64_t j = 0; j < g32.numel(); ++j) {
      if (!std::isfinite(p[j] * inv_scale)) return false;
    }
  }
  return true;
}

void LazyEmbeddingAdam::step(const Batch& batch, double lr, float inv_scale) {
  NoGrad ng;
  const auto b1 = float(options_.beta1), b2 = float(options_.beta2);
  const auto eps = float(options_.eps);
  for (size_t f = 0; f < tables_.size(); ++f) {
    const Tensor& g_any = batch.leaves[f].grad();
    if (!g_any.defined()) continue;
    const Tensor g32 = g_any.to(DType::F32).contiguous();
    const float* grad = g32.data<float>();
    Tensor& table = tables_[f];
    const int64_t dim = table.size(1);
    const DType dt = table.dtype();
    void* data = table.data_ptr();
    float* m = exp_avg_[f].data<float>();
    float* v = exp_avg_sq_[f].data<float>();
    int64_t* steps = steps_[f].data<int64_t>();
    float* master = masters_[f].defined() ? masters_[f].data<float>() : nullptr;
    const std::vector<int64_t>& rows = batch.rows[f];
    for (size_t u = 0; u < rows.size(); ++u) {
      const int64_t row = rows[u];
      const int64_t t = ++steps[row];
      // PyTorch's AdamW (weight decay 0): bias corrections in double, the update in float.
      const double bc1 = 1.0 - std::pow(options_.beta1, double(t));
      const double bc2 = 1.0 - std::pow(options_.beta2, double(t));
      const auto step_size = float(lr / bc1);
      const auto bc2_sqrt = float(std::sqrt(bc2));
      const int64_t at = row * dim;
      for (int64_t j = 0; j < dim; ++j) {
        const float g = grad[int64_t(u) * dim + j] * inv_scale;
        float& mj = m[at + j];
        float& vj = v[at + j];
        mj = b1 * mj + (1.f - b1) * g;
        vj = b2 * vj + (1.f - b2) * g * g;
        const float denom = std::sqrt(vj) / bc2_sqrt + eps;
        const float old = master ? master[at + j] : load(data, dt, at + j);
        const float now = old - step_size * (mj / denom);
        if (master) master[at + j] = now;
        if (dt == DType::F32) {
          static_cast<float*>(data)[at + j] = now;
        } else {
          // Stochastic bits drawn at (the row's update count, the element's place in its
          // table, tagged with the table's index).
          const uint32_t bits =
              rounding_ == RoundingMode::Stochastic
                  ? random_bits(seed_, uint64_t(t), (uint64_t(f) << 40) + uint64_t(at + j))
                  : 0;
          static_cast<uint16_t*>(data)[at + j] =
              uint16_t(encode(*dtype_format(dt), now, rounding_, Overflow::Infinity, bits));
        }
      }
    }
  }
}

NamedTensors LazyEmbeddingAdam::state_dict() const {
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

void LazyEmbeddingAdam::load_state_dict(const NamedTensors& state) {
  const NamedTensors mine = state_dict();
  MT_CHECK(state.size() == mine.size(), "the lazy embedding update's state has ", state.size(),
           " tensors, this run's ", mine.size(), " (a checkpoint of another configuration)");
  NoGrad ng;
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& [name, dst] = mine[i];
    const auto it =
        std::find_if(state.begin(), state.end(), [&](const auto& e) { return e.first == name; });
    MT_CHECK(
        it != state.end() && it->second.shape() == dst.shape() && it->second.dtype() == dst.dtype(),
        "the lazy embedding update's state lacks '", name, "' or holds it in another shape");
    Tensor(dst).copy_(it->second.to(Device::cpu()));
  }
}

int64_t LazyEmbeddingAdam::state_nbytes() const {
  int64_t n = 0;
  for (size_t f = 0; f < tables_.size(); ++f) {
    n += int64_t(exp_avg_[f].nbytes() + exp_avg_sq_[f].nbytes() + steps_[f].nbytes());
    if (masters_[f].defined()) n += int64_t(masters_[f].nbytes());
  }
  return n;
}

}  // namespace mantissa::train
