// DistributedDataParallel: gradient buckets all-reduced on the communicator's thread while
// backward runs (include/mantissa/dist/ddp.h).
#include "mantissa/dist/ddp.h"
#include "mantissa/core/clock.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <unordered_map>

#include "dist/zero_state.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::dist {

namespace {

constexpr size_t kNotOptimized = SIZE_MAX;  // optimizer_index_ of a parameter no optimizer has

// t as one flat row (a view: t is contiguous).
Tensor flat_view(const Tensor& t) {
  return t.reshape({t.numel()});
}

// The tensors grouped by dtype, in order: one flat buffer and collective per dtype.
std::vector<std::vector<size_t>> by_dtype(const std::vector<Tensor>& ts,
                                          const std::vector<size_t>& which) {
  std::vector<std::vector<size_t>> groups;
  std::vector<DType> dtypes;
  for (size_t k : which) {
    const auto at = size_t(std::find(dtypes.begin(), dtypes.end(), ts[k].dtype()) - dtypes.begin());
    if (at == dtypes.size()) {
      dtypes.push_back(ts[k].dtype());
      groups.emplace_back();
    }
    groups[at].push_back(k);
  }
  return groups;
}

}  // namespace

optim::ElementRange zero_segment(int64_t n, int rank, int world_size) {
  MT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "zero_segment: rank ", rank,
           " of a world of ", world_size);
  return {n * rank / world_size, n * (rank + 1) / world_size};
}

std::vector<int64_t> zero_cuts(std::span<const int64_t> param_sizes, int world_size) {
  int64_t n = 0;
  for (int64_t size : param_sizes)
    n += size;
  std::vector<int64_t> cuts{0};
  for (int r = 1; r < world_size; ++r) {
    const int64_t target = zero_segment(n, r, world_size).begin;
    // The parameter the cut falls in, and the block boundary nearest to it there.
    int64_t off = 0;
    size_t k = 0;
    while (k < param_sizes.size() && off + param_sizes[k] <= target)
      off += param_sizes[k++];
    int64_t cut = target;
    if (k < param_sizes.size()) {
      constexpr int64_t b = optim::kMaxStateBlock;
      cut = off + std::min(param_sizes[k], (target - off + b / 2) / b * b);
    }
    cuts.push_back(std::max(cut, cuts.back()));
  }
  cuts.push_back(n);
  return cuts;
}

DistributedDataParallel::DistributedDataParallel(nn::Module& model,
                                                 std::shared_ptr<Communicator> comm,
                                                 DdpOptions options)
    : comm_(std::move(comm)), options_(options) {
  MT_CHECK(comm_, "DistributedDataParallel: no communicator");
  MT_CHECK(options_.grad_comm == DType::F32 || options_.grad_comm == DType::BF16 ||
               options_.grad_comm == DType::F16,
           "DistributedDataParallel: gradients travel in f32, bf16 or f16, not ",
           dtype_name(options_.grad_comm));
  MT_CHECK(options_.bucket_mb > 0, "DistributedDataParallel: bucket_mb must be positive, got ",
           options_.bucket_mb);
  MT_CHECK(options_.zero_stage >= 0 && options_.zero_stage <= 3,
           "DistributedDataParallel: ZeRO stage ", options_.zero_stage,
           " is not there; stage 0 (none), 1 (optimizer state sharded), 2 (gradients too) or 3 "
           "(parameters too)");
  params_ = model.parameters();
  buffers_ = model.buffers();
  for (const Tensor& p : params_) {
    MT_CHECK(p.requires_grad(), "DistributedDataParallel: parameter ", p.describe(),
             " does not require grad; freeze parameters after wrapping, or leave them out");
    MT_CHECK(p.device() == params_[0].device(),
             "DistributedDataParallel: the parameters are on several devices (",
             params_[0].device().str(), ", ", p.device().str(), "); one device per rank");
  }
  broadcast_state();

  // Buckets in reverse parameter order, each up to bucket_mb of grad_comm values; ZeRO-3: the
  // units in reverse, a bucket holding one unit's parameters of one dtype.
  std::vector<std::vector<size_t>> runs;  // parameters that may share a bucket, in order
  if (options_.zero_stage < 3) {
    runs.emplace_back();
    for (size_t k = params_.size(); k-- > 0;)
      runs[0].push_back(k);
  } else {
    make_units(model);
    for (size_t u = units_.size(); u-- > 0;) {
      std::vector<size_t> mine;
      for (size_t k = params_.size(); k-- > 0;)
        if (unit_of_[k] == u) mine.push_back(k);
      for (std::vector<size_t>& group : by_dtype(params_, mine))
        runs.push_back(std::move(group));
    }
  }
  const auto cap = int64_t(options_.bucket_mb * 1024 * 1024);
  const int64_t elem = int64_t(dtype_size(options_.grad_comm));
  bucket_of_.assign(params_.size(), 0);
  for (const std::vector<size_t>& run : runs) {
    int64_t bytes = 0;
    for (size_t k : run) {
      const int64_t b = params_[k].numel() * elem;
      if (k == run.front() || (bytes > 0 && bytes + b > cap)) {
        buckets_.emplace_back();
        bytes = 0;
      }
      buckets_.back().push_back(k);
      bucket_of_[k] = buckets_.size() - 1;
      bytes += b;
    }
  }
  const Device device = params_.empty() ? Device::cpu() : params_[0].device();
  const int world = comm_->world_size();
  const bool zero = options_.zero_stage >= 1;
  if (zero) ranges_.assign(size_t(world), std::vector<optim::ElementRange>(params_.size()));
  offset_.assign(params_.size(), 0);
  for (const auto& bucket : buckets_) {
    int64_t n = 0;
    for (size_t k : bucket) {
      offset_[k] = n;
      n += params_[k].numel();
    }
    // ZeRO-2, 3 make each bucket's buffer when it goes out and free it once reduce-scattered.
    flat_.push_back(options_.zero_stage >= 2 ? Tensor()
                                             : Tensor::zeros({n}, options_.grad_comm, device));
    bucket_numel_.push_back(n);
    // ZeRO-1: rank r owns elements [cuts[r], cuts[r + 1]) of the bucket, whichever parameters
    // they fall in (without ZeRO, the segment it sums when half-precision terms are added in
    // fp32).
    std::vector<int64_t> sizes;
    for (size_t k : bucket)
      sizes.push_back(params_[k].numel());
    const std::vector<int64_t> cuts = zero_cuts(sizes, world);
    std::vector<int64_t> counts(size_t(world), 0);
    for (int r = 0; r < world; ++r) {
      const optim::ElementRange seg{cuts[size_t(r)], cuts[size_t(r) + 1]};
      counts[size_t(r)] = seg.size();
      for (size_t k : bucket) {
        const int64_t lo = std::max(seg.begin, offset_[k]);
        const int64_t hi = std::min(seg.end, offset_[k] + params_[k].numel());
        if (zero && lo < hi) ranges_[size_t(r)][k] = {lo - offset_[k], hi - offset_[k]};
      }
    }
    if (zero)
      shard_.push_back(Tensor::zeros({counts[size_t(comm_->rank())]}, options_.grad_comm, device));
    segment_start_.push_back(cuts[size_t(comm_->rank())]);
    segment_counts_.push_back(std::move(counts));
  }
  inflight_.resize(buckets_.size());
  comm_seconds_.assign(buckets_.size(), 0.0);
  if (options_.zero_stage == 3) {
    shard_parameters();
    hook_units();
  }
  start_step();
  for (size_t k = 0; k < params_.size(); ++k) {
    hooks_.push_back(params_[k].register_post_accumulate_grad_hook(
        [this, k](const Tensor&) { on_gradient(k); }));
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& f : inflight_) {
    if (f.valid()) f.wait();  // the buffers must outlive the collectives that use them
  }
  for (Unit& u : units_) {
    if (u.gather.valid()) u.gather.wait();
    if (u.hook >= 0) u.module->remove_forward_hooks(u.hook);
  }
  for (size_t k = 0; k < params_.size(); ++k)
    params_[k].remove_hook(hooks_[k]);
}

void DistributedDataParallel::broadcast_state() {
  NoGrad ng;
  const FullParameters whole = full_parameters();  // (ZeRO-3: resharded from rank 0's values)
  for (std::vector<Tensor>* list : {&params_, &buffers_}) {
    for (Tensor& t : *list) {
      MT_CHECK(t.is_contiguous(), "DistributedDataParallel: ", t.describe(),
               " is not contiguous; make the model's tensors contiguous before wrapping it");
      comm_->broadcast(t, 0);
      t.bump_version();
    }
  }
}

void DistributedDataParallel::broadcast_buffers() {
  if (comm_->world_size() == 1 || buffers_.empty()) return;
  NoGrad ng;
  // One collective per dtype (a resnet has 60 buffers: running statistics and counts), through
  // one flat buffer each, on whatever device they live.
  std::vector<size_t> all(buffers_.size());
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = i;
  for (const std::vector<size_t>& group : by_dtype(buffers_, all)) {
    int64_t n = 0;
    for (size_t i : group)
      n += buffers_[i].numel();
    Tensor flat = Tensor::empty({n}, buffers_[group[0]].dtype(), buffers_[group[0]].device());
    int64_t off = 0;
    for (size_t i : group) {
      if (comm_->rank() == 0)
        flat.narrow(0, off, buffers_[i].numel()).copy_(flat_view(buffers_[i]));
      off += buffers_[i].numel();
    }
    comm_->broadcast(flat, 0);
    off = 0;
    for (size_t i : group) {
      Tensor dst = flat_view(buffers_[i]);
      if (comm_->rank() != 0) dst.copy_(flat.narrow(0, off, buffers_[i].numel()));
      off += buffers_[i].numel();
      buffers_[i].bump_version();
    }
  }
}

void DistributedDataParallel::on_gradient(size_t param) {
  if (options_.zero_stage == 3) unit_gradient(param);
  if (!require_sync_) return;
  // Its bucket may already be on its way: a second gradient would not be in the sum.
  MT_CHECK(!marked_[param], "DistributedDataParallel: parameter ", param,
           " got a gradient twice before finish_gradients(); for several backward passes per "
           "step, call set_require_sync(false) before all but the last");
  marked_[param] = true;
  const size_t b = bucket_of_[param];
  --pending_[b];
  launched_early_ += launch_ready();
}

int64_t DistributedDataParallel::launch_ready() {
  int64_t launched = 0;
  for (; next_launch_ < buckets_.size() && pending_[next_launch_] == 0; ++next_launch_, ++launched)
    launch(next_launch_);
  return launched;
}

void DistributedDataParallel::launch(size_t b) {
  NoGrad ng;
  const bool stage2 = options_.zero_stage >= 2;
  Tensor flat = stage2 ? Tensor::empty({bucket_numel_[b]}, options_.grad_comm,
                                       params_[buckets_[b][0]].device())
                       : flat_[b];
  const double inv = 1.0 / double(comm_->world_size());
  int64_t off = 0;
  for (size_t k : buckets_[b]) {
    const Tensor& p = params_[k];
    const int64_t n = p.numel();
    Tensor dst = flat.narrow(0, off, n);
    const Tensor g = p.grad();
    if (!g.defined()) {
      dst.zero_();  // no gradient on this rank: it adds nothing to the others'
    } else if (dtype_size(g.dtype()) >= dtype_size(flat.dtype())) {
      // Divided before it is narrowed: an fp16 buffer never holds the undivided sum's terms.
      dst.copy_(mul(g.reshape({n}), inv));
    } else {
      dst.copy_(g.reshape({n}));
      dst.mul_(inv);
    }
    // ZeRO-2: the bucket holds it now; the rank keeps only its shard of the sum.
    if (stage2) p.set_grad(Tensor());
    off += n;
  }
  double* seconds = &comm_seconds_[b];
  Communicator* comm = comm_.get();
  // Half-precision terms added in fp32 and rounded once (reduce_scatter_accumulate), or by the
  // library's half-precision sum.
  const bool wide = options_.accumulate_in_f32 && flat.dtype() != DType::F32;
  if (options_.zero_stage >= 1) {
    // Half an all-reduce's traffic: each rank receives the sum of its own segment only.
    Tensor shard = shard_[b];
    const std::vector<int64_t>* counts = &segment_counts_[b];
    inflight_[b] = comm_->submit([comm, flat, shard, counts, seconds, wide]() mutable {
      const auto t0 = Clock::now();
      if (wide) {
        comm->reduce_scatter_accumulate_now(flat, shard, *counts);
      } else {
        comm->reduce_scatter_now(flat, shard, *counts);
      }
      flat = Tensor();  // ZeRO-2's buffer is free from here (ZeRO-1 keeps its own)
      *seconds = seconds_since(t0);
    });
    return;
  }
  if (wide) {
    // An all-reduce as its two halves: each rank sums its segment in fp32, in place (sent
    // before written), then every rank receives every segment (bit for bit: the ranks stay
    // identical).
    Tensor sum = flat.narrow(0, segment_start_[b], segment_counts_[b][size_t(comm_->rank())]);
    const std::vector<int64_t>* counts = &segment_counts_[b];
    inflight_[b] = comm_->submit([comm, flat, sum, counts, seconds]() mutable {
      const auto t0 = Clock::now();
      comm->reduce_scatter_accumulate_now(flat, sum, *counts);
      comm->all_gather_now(flat, *counts);
      *seconds = seconds_since(t0);
    });
    return;
  }
  inflight_[b] = comm_->submit([comm, flat, seconds]() mutable {
    const auto t0 = Clock::now();
    comm->all_reduce_now(flat, ReduceOp::Sum);
    *seconds = seconds_since(t0);
  });
}

void DistributedDataParallel::set_optimizer(optim::Optimizer& opt) {
  if (options_.zero_stage == 0) return;
  {
    // (ZeRO-3: the masters are cut from the whole parameters.)
    const FullParameters whole = full_parameters();
    opt.set_owned_ranges(owned_ranges(opt.params()));
  }
  optimizer_ = &opt;
  optimizer_index_.assign(params_.size(), kNotOptimized);
  for (size_t i = 0; i < opt.params().size(); ++i)
    optimizer_index_[index_of(opt.params()[i], i)] = i;
  if (options_.zero_stage < 3) return;
  // ZeRO-3: the optimizer steps this rank's segments, where they are kept.
  for (size_t k = 0; k < params_.size(); ++k) {
    const size_t i = optimizer_index_[k];
    const optim::ElementRange mine = owned_range(comm_->rank(), k);
    if (i == kNotOptimized || mine.size() == 0) continue;
    const Tensor part = owned_slice(param_shard_[bucket_of_[k]], k);
    opt.set_parameter_shard(
        i, mine.size() == params_[k].numel() ? part.reshape(params_[k].shape()) : part);
  }
}

void DistributedDataParallel::finish_gradients() {
  MT_CHECK(
      options_.zero_stage < 2 || optimizer_ != nullptr,
      "DistributedDataParallel: ZeRO-2 and 3 hand each rank's gradient shards to its optimizer; "
      "call set_optimizer(opt) after making it");
  MT_CHECK(require_sync_,
           "DistributedDataParallel::finish_gradients() after a backward without sync: call "
           "set_require_sync(true) before the last micro-batch's backward");
  const int64_t early = launched_early_;
  launched_early_ = 0;
  // What backward did not complete (parameters without a gradient on this rank) goes out now,
  // in the same bucket order as on every other rank.
  for (size_t b = next_launch_; b < buckets_.size(); ++b)
    pending_[b] = 0;
  launch_ready();
  double waited = 0;
  double comm_total = 0;
  int64_t bytes = 0;
  NoGrad ng;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto w0 = Clock::now();
    inflight_[b].get();  // rethrows a failed collective (a peer stopped, MPI failed)
    waited += seconds_since(w0);
    comm_total += comm_seconds_[b];
    bytes += bucket_numel_[b] * int64_t(dtype_size(options_.grad_comm));
    // The means: the whole bucket, or (ZeRO-1, 2) this rank's segment of it.
    const bool zero = options_.zero_stage >= 1;
    const Tensor& means = zero ? shard_[b] : flat_[b];
    for (size_t k : buckets_[b]) {
      Tensor& p = params_[k];
      const int64_t n = p.numel();
      const optim::ElementRange mine = owned_range(comm_->rank(), k);
      if (mine.size() == 0) {
        p.set_grad(Tensor());  // other ranks update it: its sums went there
        continue;
      }
      const Tensor mean = zero ? owned_slice(means, k) : means.narrow(0, offset_[k], n);
      if (options_.zero_stage >= 2) {
        // The shard itself (a copy only to widen it, as below): no whole gradient anywhere.
        p.set_grad(Tensor());
        const size_t i = optimizer_index_[k];
        if (i == kNotOptimized) continue;  // not optimized
        const DType want = promote_types(p.dtype(), means.dtype());
        optimizer_->set_gradient_shard(i, want == means.dtype() ? mean : mean.to(want));
        continue;
      }
      Tensor g = p.grad();
      const DType want = promote_types(g.defined() ? g.dtype() : p.dtype(), means.dtype());
      const bool reuse = g.defined() && g.dtype() == want && g.is_contiguous();
      if (mine.size() < n) {
        // Part of it: the mean there, zeros elsewhere (no norm or overflow from what this rank
        // does not own; the optimizer reads the owned slice alone).
        if (reuse) {
          g.zero_();
        } else {
          g = Tensor::zeros(p.shape(), want, p.device());
          p.set_grad(g);
        }
        g.reshape({n}).narrow(0, mine.begin, mine.size()).copy_(mean);
      } else if (reuse) {
        g.copy_(mean.reshape(p.shape()));
      } else {
        // A copy either way: the buffer is reused next step.
        p.set_grad(want == mean.dtype() ? mean.reshape(p.shape()).clone()
                                        : mean.reshape(p.shape()).to(want));
      }
    }
  }
  stats_ = DdpStepStats{.buckets = int64_t(buckets_.size()),
                        .bytes = bytes,
                        .comm_seconds = comm_total,
                        .exposed_seconds = waited,
                        .launched_in_backward = early,
                        .gathers = gathers_,
                        .gather_wait_seconds = gather_wait_};
  gathers_ = 0;
  gather_wait_ = 0;
  totals_ += stats_;
  ++steps_;
  start_step();
  // ZeRO-3: backward is over; what it left gathered (the root, a unit with a parameter that got
  // no gradient) is released.
  for (size_t u = 0; u < units_.size(); ++u)
    release_unit(u);
}

Tensor DistributedDataParallel::owned_slice(const Tensor& segment, size_t k) const {
  const optim::ElementRange mine = owned_range(comm_->rank(), k);
  return segment.narrow(0, offset_[k] + mine.begin - segment_start_[bucket_of_[k]], mine.size());
}

optim::ElementRange DistributedDataParallel::owned_range(int rank, size_t k) const {
  MT_CHECK(k < params_.size() && rank >= 0 && rank < comm_->world_size(),
           "DistributedDataParallel::owned_range: parameter ", k, " of rank ", rank, " (",
           params_.size(), " parameters, ", comm_->world_size(), " ranks)");
  if (options_.zero_stage == 0) return {0, params_[k].numel()};
  return ranges_[size_t(rank)][k];
}

size_t DistributedDataParallel::index_of(const Tensor& p, size_t position) const {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (params_[k].is_same(p)) return k;
  }
  MT_CHECK(false, "DistributedDataParallel: optimizer parameter ", position, " (", p.describe(),
           ") is not a parameter of the wrapped model; make the optimizer over the model's "
           "parameters (after amp::initialize, which may replace them)");
}

std::vector<optim::ElementRange> DistributedDataParallel::owned_ranges(
    const std::vector<Tensor>& optimizer_params) const {
  std::vector<optim::ElementRange> out;
  for (size_t i = 0; i < optimizer_params.size(); ++i)
    out.push_back(owned_range(comm_->rank(), index_of(optimizer_params[i], i)));
  return out;
}

void DistributedDataParallel::all_gather_parameters() {
  // ZeRO-3: each unit's next forward gathers its owners' values.
  if (options_.zero_stage == 0 || options_.zero_stage == 3 || comm_->world_size() == 1) return;
  NoGrad ng;
  const int me = comm_->rank(), world = comm_->world_size();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // One flat buffer and collective per parameter dtype of the bucket (bf16 weights and fp32
    // norm parameters under O2): rank r's segment holds its elements of those parameters, in
    // bucket order; this rank fills its own, the collective the others'.
    for (const std::vector<size_t>& group : by_dtype(params_, buckets_[b])) {
      std::vector<int64_t> counts(size_t(world), 0);
      for (int r = 0; r < world; ++r) {
        for (size_t k : group)
          counts[size_t(r)] += ranges_[size_t(r)][k].size();
      }
      int64_t total = 0, off = 0;
      for (int r = 0; r < world; ++r) {
        if (r == me) off = total;
        total += counts[size_t(r)];
      }
      Tensor flat = Tensor::empty({total}, params_[group[0]].dtype(), params_[group[0]].device());
      for (size_t k : group) {
        const optim::ElementRange mine = ranges_[size_t(me)][k];
        flat.narrow(0, off, mine.size())
            .copy_(flat_view(params_[k]).narrow(0, mine.begin, mine.size()));
        off += mine.size();
      }
      comm_->all_gather(flat, counts);
      // The others' elements into place (a copy bumps the parameter's version); this rank's
      // own stay as its optimizer left them.
      off = 0;
      for (int r = 0; r < world; ++r) {
        for (size_t k : group) {
          const optim::ElementRange theirs = ranges_[size_t(r)][k];
          if (r != me && theirs.size() > 0) {
            flat_view(params_[k])
                .narrow(0, theirs.begin, theirs.size())
                .copy_(flat.narrow(0, off, theirs.size()));
          }
          off += theirs.size();
        }
      }
    }
  }
}

NamedTensors DistributedDataParallel::gather_optimizer_state(const optim::Optimizer& opt,
                                                             int root) const {
  const NamedTensors mine = opt.state_dict();
  if (options_.zero_stage == 0) return comm_->rank() == root ? mine : NamedTensors{};
  const Device device = params_.empty() ? Device::cpu() : params_[0].device();
  std::vector<NamedTensors> parts = gather_named_tensors(mine, *comm_, root, device);
  if (comm_->rank() != root) return {};
  std::vector<size_t> model_index;
  for (size_t i = 0; i < opt.params().size(); ++i)
    model_index.push_back(index_of(opt.params()[i], i));
  // The whole tensors, assembled from the ranks' slices: "state.<i>.*" and "master.<i>" of a
  // parameter split between ranks come from each in its range ("state.<i>.step" is the same).
  NamedTensors merged;
  std::unordered_map<std::string, size_t> where;  // name -> position in merged
  for (int r = 0; r < int(parts.size()); ++r) {
    for (auto& [key, t] : parts[size_t(r)]) {
      const auto [kind, i] = state_key_place(key);
      if (kind == 0) {
        if (r == root) merged.emplace_back(key, t);  // "step", "lr", "group.<g>.lr": root's
        continue;
      }
      MT_CHECK(i < model_index.size(), "gather_optimizer_state: '", key, "' names no parameter");
      const Tensor& p = params_[model_index[i]];
      optim::ElementRange range = ranges_[size_t(r)][model_index[i]];
      const bool slice = !key.ends_with(".step") && range.size() < p.numel();
      // A block-scaled state's scales: one per block, and a slice starts on a block boundary.
      const bool blocks = key.ends_with(".absmax");
      Shape shape = p.shape();
      if (blocks) {
        const int64_t b = opt.block_options().block;
        range = optim::blocks_of(range, b);
        shape = Shape{optim::blocks_of({0, p.numel()}, b).end};
      }
      const auto [at, fresh] = where.try_emplace(key, merged.size());
      if (fresh) merged.emplace_back(key, slice ? Tensor::zeros(shape, t.dtype()) : t);
      if (slice) {
        Tensor whole = merged[at->second].second;
        whole.reshape({whole.numel()}).narrow(0, range.begin, range.size()).copy_(t);
      }
    }
  }
  std::stable_sort(merged.begin(), merged.end(), [](const auto& a, const auto& b) {
    return state_key_place(a.first) < state_key_place(b.first);
  });
  return merged;
}

optim::NormCombiner DistributedDataParallel::norm_combiner() const {
  if (options_.zero_stage == 0) return {};
  return [comm = comm_](Tensor& partial, bool max) {
    comm->all_reduce(partial, max ? ReduceOp::Max : ReduceOp::Sum);
  };
}

void DistributedDataParallel::start_step() {
  marked_.assign(params_.size(), false);
  pending_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    pending_[b] = int64_t(buckets_[b].size());
  next_launch_ = 0;
}

}  // namespace mantissa::dist
