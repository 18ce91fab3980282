// ZeRO-3: the parameters sharded across the ranks, each unit gathered around its forward and
// its backward (include/mantissa/dist/ddp.h).
#include <atomic>
#include <string>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/clock.h"
#include "mantissa/core/error.h"
#include "mantissa/dist/ddp.h"
#include "mantissa/nn/layers.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::dist {

namespace {

bool is_block(const nn::Module& m) {
  return dynamic_cast<const nn::TransformerBlock*>(&m) != nullptr;
}

// A storage's version set directly: a gather for backward puts back the version forward saved
// (the bytes are the same again), so that backward accepts what it saved.
void set_version(const Tensor& t, uint32_t v) {
  t.storage()->version.store(v, std::memory_order_relaxed);
}

}  // namespace

void DistributedDataParallel::make_units(nn::Module& model) {
  const std::function<bool(const nn::Module&)> is_unit =
      options_.shard_unit ? options_.shard_unit : is_block;
  unit_of_.assign(params_.size(), 0);
  units_.clear();
  units_.emplace_back();
  units_[0].module = &model;
  std::vector<std::string> taken;  // the units' paths: a module below one is part of it
  for (const auto& [path, m] : model.named_modules()) {
    if (path.empty() || !is_unit(*m)) continue;
    bool inside = false;
    for (const std::string& t : taken)
      inside = inside || path.starts_with(t + ".");
    if (inside) continue;
    taken.push_back(path);
    const size_t u = units_.size();
    bool any = false;
    for (const Tensor& p : m->parameters()) {
      const size_t k = index_of(p, 0);
      if (unit_of_[k] != 0) continue;  // (tied with a unit before: stays where it was first)
      unit_of_[k] = u;
      any = true;
    }
    if (!any) continue;
    units_.emplace_back();
    units_.back().module = m;
  }
  for (size_t k = 0; k < params_.size(); ++k)
    ++units_[unit_of_[k]].params;
}

void DistributedDataParallel::shard_parameters() {
  NoGrad ng;
  const auto me = size_t(comm_->rank());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Tensor& first = params_[buckets_[b][0]];
    // The bucket's parameters become views of one storage (in bucket order, so that the
    // gathered segments are the parameters, in place).
    Tensor flat = Tensor::empty({bucket_numel_[b]}, first.dtype(), first.device());
    for (size_t k : buckets_[b]) {
      Tensor& p = params_[k];
      Tensor view = flat.narrow(0, offset_[k], p.numel());
      view.copy_(p.reshape({p.numel()}));
      p.set_data(view.reshape(p.shape()));
    }
    param_shard_.push_back(flat.narrow(0, segment_start_[b], segment_counts_[b][me]).clone());
    param_flat_.push_back(flat);
    units_[unit_of_[buckets_[b][0]]].buckets.push_back(b);
  }
  flat_version_.assign(buckets_.size(), 0);
  full_version_.assign(buckets_.size(), 0);
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].resident = true;
    release_unit(u);
  }
}

void DistributedDataParallel::hook_units() {
  for (size_t u = 0; u < units_.size(); ++u) {
    nn::Module::ForwardHooks hooks;
    hooks.before = [this, u](nn::Module&) { before_forward(u); };
    hooks.after = [this, u](nn::Module&, const nn::TensorList& out) { after_forward(u, out); };
    units_[u].hook = units_[u].module->add_forward_hooks(std::move(hooks));
  }
}

void DistributedDataParallel::fetch(size_t u) {
  Unit& unit = units_[u];
  if (unit.resident) return;
  unit.resident = true;
  std::vector<Tensor> flats, shards;
  std::vector<int64_t> starts;
  std::vector<const std::vector<int64_t>*> counts;
  for (size_t b : unit.buckets) {
    param_flat_[b].storage()->restore();
    flats.push_back(param_flat_[b]);
    shards.push_back(param_shard_[b]);
    starts.push_back(segment_start_[b]);
    counts.push_back(&segment_counts_[b]);
  }
  Communicator* comm = comm_.get();
  ++gathers_;
  unit.gather = comm_->submit([comm, flats, shards, starts, counts]() mutable {
    for (size_t i = 0; i < flats.size(); ++i) {
      flats[i].narrow(0, starts[i], shards[i].numel()).copy_(shards[i]);
      comm->all_gather_now(flats[i], *counts[i]);
    }
  });
}

void DistributedDataParallel::gather_unit(size_t u, bool forward) {
  fetch(u);
  Unit& unit = units_[u];
  if (!unit.gather.valid()) return;  // gathered before, and not written since
  const auto t0 = Clock::now();
  unit.gather.get();  // rethrows a failed collective
  gather_wait_ += seconds_since(t0);
  for (size_t b : unit.buckets) {
    const Tensor& flat = param_flat_[b];
    // Forward: a version never seen with other bytes (what the step changed is new to every
    // cache); backward: the one forward saved.
    if (forward) flat_version_[b] = flat.version() + 1;
    set_version(flat, flat_version_[b]);
  }
}

void DistributedDataParallel::release_unit(size_t u) {
  Unit& unit = units_[u];
  if (full_scopes_ > 0 || !unit.resident) return;
  if (unit.gather.valid()) unit.gather.get();
  for (size_t b : unit.buckets)
    param_flat_[b].storage()->release();
  unit.resident = false;
}

void DistributedDataParallel::before_forward(size_t u) {
  if (full_scopes_ > 0) return;  // everything is gathered
  units_[u].pending = units_[u].params;
  gather_unit(u, /*forward=*/true);
  if (u + 1 < units_.size()) fetch(u + 1);  // overlaps this unit's forward
}

void DistributedDataParallel::after_forward(size_t u, const nn::TensorList& outputs) {
  if (full_scopes_ > 0) return;
  bool backward = false;
  if (autograd::grad_enabled()) {
    for (const Tensor& y : outputs)
      backward = backward || (y.defined() && y.requires_grad());
  }
  if (u == 0) {
    // The root: kept for backward (the tied head's gradient comes last) until
    // finish_gradients(); an evaluation's is released now.
    if (!backward) release_unit(0);
    return;
  }
  if (backward) {
    // Before the unit's backward runs (its outputs' gradients are complete): gathered again,
    // and the unit before it (whose backward comes next) prefetched.
    for (const Tensor& y : outputs) {
      if (!y.defined() || !y.requires_grad()) continue;
      y.register_hook([this, u](const Tensor&) {
        gather_unit(u, /*forward=*/false);
        if (u > 1) fetch(u - 1);
        return Tensor();
      });
    }
  }
  release_unit(u);
}

void DistributedDataParallel::unit_gradient(size_t param) {
  const size_t u = unit_of_[param];
  // The last of a unit's gradients: its backward is done with its parameters.
  if (u != 0 && --units_[u].pending == 0) release_unit(u);
}

void DistributedDataParallel::begin_full() {
  if (param_flat_.empty() || full_scopes_++ > 0) return;
  for (size_t u = 0; u < units_.size(); ++u) {
    units_[u].kept = units_[u].resident;
    fetch(u);  // every gather submitted before the first wait
  }
  for (size_t u = 0; u < units_.size(); ++u)
    gather_unit(u, /*forward=*/true);
  for (size_t b = 0; b < buckets_.size(); ++b)
    full_version_[b] = param_flat_[b].version();
}

void DistributedDataParallel::end_full() {
  if (param_flat_.empty() || --full_scopes_ > 0) return;
  NoGrad ng;
  const auto me = size_t(comm_->rank());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // Written inside the scope (every rank wrote the same): the new values are the shards'.
    if (param_flat_[b].version() == full_version_[b]) continue;
    param_shard_[b].copy_(param_flat_[b].narrow(0, segment_start_[b], segment_counts_[b][me]));
  }
  // What was gathered before the scope stays (the root, kept from the model's forward to
  // finish_gradients()).
  for (size_t u = 0; u < units_.size(); ++u)
    if (!units_[u].kept) release_unit(u);
}

DistributedDataParallel::FullParameters::FullParameters(DistributedDataParallel* ddp) : ddp_(ddp) {
  ddp_->begin_full();
}

DistributedDataParallel::FullParameters::~FullParameters() {
  ddp_->end_full();
}

int64_t DistributedDataParallel::resident_parameter_bytes() const {
  int64_t bytes = 0;
  if (param_flat_.empty()) {
    for (const Tensor& p : params_)
      bytes += int64_t(p.nbytes());
    return bytes;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    bytes += int64_t(param_shard_[b].nbytes());
    if (param_flat_[b].storage()->resident()) bytes += int64_t(param_flat_[b].nbytes());
  }
  return bytes;
}

std::vector<std::vector<size_t>> DistributedDataParallel::units() const {
  std::vector<std::vector<size_t>> out(units_.size());
  for (size_t k = 0; k < unit_of_.size(); ++k)
    out[unit_of_[k]].push_back(k);
  return out;
}

}  // namespace mantissa::dist
