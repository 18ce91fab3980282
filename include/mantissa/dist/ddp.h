// Data-parallel training (PyTorch's DistributedDataParallel, Apex's apex.parallel): every rank
// holds the whole model, sees its own shard of each batch, and before the optimizer step every
// gradient is averaged over the ranks, so every rank takes the same step and the weights stay
// identical (bit for bit: the averaged gradient is the same bits everywhere).
//
//   auto world = dist::mpi_world();
//   dist::DistributedDataParallel ddp(*model, world);   // broadcasts rank 0's weights
//   for (batch : loader over a DistributedSampler) {
//     opt.zero_grad();
//     ddp.broadcast_buffers();                            // batch norm's running stats
//     scaler.scale(loss_of(model(x), y)).backward();      // buckets all-reduce during backward
//     ddp.finish_gradients();                             // wait; .grad = mean over ranks
//     scaler.step(opt); scaler.update();
//   }
//
// Buckets. Parameters are grouped, in reverse order of model.parameters() (roughly the order
// backward produces their gradients), into buckets of about bucket_mb. A hook on each
// parameter's gradient accumulation counts the bucket down; when a bucket is complete (and every
// earlier bucket has been launched: the buckets go out in one order on every rank) it is packed
// into one flat buffer, divided by the world size, and its all-reduce is submitted to the
// communicator's thread, where it runs while backward goes on. finish_gradients() launches what
// did not complete (parameters that got no gradient count as zeros), waits, and writes the means
// back.
//
// Mixed precision. The buffers travel in grad_comm (fp32, bf16 or fp16); dividing before the
// sum keeps fp16 from overflowing (PyTorch's compression hooks do the same). The mean is written
// back in the wider of the gradient's dtype and grad_comm: fp32 gradients stay fp32 whatever
// travelled, and bf16 gradients of an O2 model become fp32 when they travel in fp32, so the
// optimizer applies the fp32 mean to its fp32 master. Half-precision terms are added in fp32
// and rounded once (accumulate_in_f32, the default: PyTorch FSDP2's reduce_dtype=bf16 with an
// fp32 accumulation, not the library's half-precision sum): one rounding per element instead of
// N - 1, deterministic for a world size. An inf or NaN in any rank's gradient
// reaches every rank through the sum, so every rank's loss scaler skips the same step and backs
// off the same way. Clipping after finish_gradients() sees the same gradients everywhere, so a
// rank's norm is the global norm.
//
// ZeRO-1 (zero_stage = 1; DeepSpeed's stage 1, llm.c's sharded optimizer): the optimizer state —
// moments and fp32 masters, 8 to 12 bytes per parameter against the 2 to 4 of the parameter
// itself — is sharded by element: rank r owns segment r of every bucket (zero_cuts: N equal
// parts of the bucket's flat elements, whatever parameters they fall in, each cut moved onto a
// state block's boundary; a parameter may be split between ranks), so every rank holds 1/N of
// the state to within a block a bucket.
// Each bucket is reduce-scattered instead of all-reduced (half the traffic): a rank receives the
// mean gradient of its segment; a parameter's gradient then holds its owned elements' means and
// zeros elsewhere, and the gradients of parameters it owns nothing of are dropped. The optimizer,
// told what it owns (Optimizer::set_owned_ranges, with owned_ranges()), updates those elements
// alone and keeps state for them alone; all_gather_parameters() then sends every rank's updated
// elements to every rank, bucket by bucket. Clipping needs the norm over all ranks
// (norm_combiner()); the loss scaler's overflow flag must be all-reduced
// (GradScaler::set_overflow_reducer), since each rank now sees only its own gradients. A
// checkpoint takes gather_optimizer_state(): the unsharded optimizer's state dict, on rank 0.
//
//   DistributedDataParallel ddp(*model, world, {.zero_stage = 1});
//   ddp.set_optimizer(opt);  // opt.set_owned_ranges(ddp.owned_ranges(opt.params()))
//   ... backward; ddp.finish_gradients(); scaler.step(opt); scaler.update();
//   ddp.all_gather_parameters();
//
// ZeRO-2 (zero_stage = 2; DeepSpeed's stage 2): the gradients are sharded too. A bucket's
// buffer exists from the moment its last gradient arrives until its reduce-scatter is done, and
// the parameters' .grad are dropped as they go into it, so during backward a rank holds the
// gradients of the buckets not yet sent; afterwards it keeps its segment of each bucket alone,
// which finish_gradients() hands to the optimizer (set_optimizer, required) as the gradient
// shards of what it owns (Optimizer::set_gradient_shard): 1/N of the gradients' bytes. Clipping
// goes over Optimizer::gradients() (optim::clip_gradients), the loss scaler reads them through
// the optimizer. With gradient accumulation (set_require_sync(false)), the micro-batches'
// gradients add up in .grad as before and are sharded at the last one.
//
// ZeRO-3 (zero_stage = 3; DeepSpeed's stage 3, PyTorch's FSDP with FULL_SHARD): the parameters
// are sharded too. Units: every module the shard_unit option picks (each TransformerBlock by
// default), and the model itself as the root unit for what no unit holds (embeddings, the tied
// head, the last norm). The buckets follow the units (one per unit and parameter dtype, within
// bucket_mb), and a bucket's parameters become views of one flat storage (FSDP's flat
// parameter), which holds bytes only while its unit is gathered: a rank keeps its own segment
// of every bucket (the same segment ZeRO-1 gives it), which the optimizer steps in place
// (Optimizer::set_parameter_shard). A unit is all-gathered before its forward (the next one's
// gather submitted to the communicator's thread, so that it overlaps the forward), released
// after it, gathered again when the gradient of its output arrives (the previous unit's
// prefetched) and released when the last of its parameters has its gradient. The root stays
// gathered from the model's forward to finish_gradients(). The storage object stays the same,
// so what backward saved still refers to it; a gather for backward keeps the version forward
// saved, one for forward moves it on (the step changed the values). Activation checkpointing
// composes: the recomputation runs in the unit's backward, while it is gathered. Gradients are
// sharded as under ZeRO-2; all_gather_parameters() has nothing to do (each forward gathers).
// Whatever reads the parameters outside forward and backward (a checkpoint, weight histograms,
// generation with a cache, broadcast_state) does it inside a full_parameters() scope; reading a
// released parameter throws, saying so.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <vector>

#include "mantissa/dist/communicator.h"
#include "mantissa/nn/module.h"
#include "mantissa/optim/clip.h"
#include "mantissa/optim/optimizer.h"

namespace mantissa::dist {

struct DdpOptions {
  double bucket_mb = 25;         // PyTorch's bucket_cap_mb; a parameter larger than it is alone
  DType grad_comm = DType::F32;  // F32, BF16 or F16: FSDP's reduce_dtype
  // With grad_comm BF16 or F16: each element's terms travel in it but are added in fp32, in
  // rank order, and rounded once (Communicator::reduce_scatter_accumulate; without ZeRO, an
  // all-reduce made of it and an all-gather), so the mean depends on the world size alone.
  // False: the library's half-precision sum, rounded after each addition in its own order.
  bool accumulate_in_f32 = true;
  int zero_stage = 0;  // 0: every rank gets every mean gradient; 1, 2, 3: ZeRO-1, 2, 3 (above)
  // ZeRO-3: whether a module is a unit (gathered for its forward and backward alone). Unset:
  // nn::TransformerBlock. A unit inside a unit is part of the outer one.
  std::function<bool(const nn::Module&)> shard_unit = nullptr;
};

// The elements of a bucket of n that ZeRO-1 gives `rank`: [n * rank / N, n * (rank + 1) / N).
optim::ElementRange zero_segment(int64_t n, int rank, int world_size);
// Where ZeRO cuts a bucket of parameters of these sizes (in bucket order) between ranks: rank r
// owns elements [cuts[r], cuts[r + 1]) (N + 1 cuts, the first 0, the last the bucket's size).
// Each inner cut is zero_segment's moved to the nearest parameter boundary or multiple of
// optim::kMaxStateBlock elements into a parameter, so that no block of a block-scaled state
// (state_format.h) is split between ranks: a shard quantizes its state as the whole optimizer
// would. Shares differ from equal by at most half a block a cut.
std::vector<int64_t> zero_cuts(std::span<const int64_t> param_sizes, int world_size);

// What the last finish_gradients() measured.
struct DdpStepStats {
  int64_t buckets = 0;
  int64_t bytes = 0;                 // sent per rank (the buffers' size)
  double comm_seconds = 0;           // inside the all-reduces, on the communicator's thread
  double exposed_seconds = 0;        // what finish_gradients() waited for: not overlapped
  int64_t launched_in_backward = 0;  // buckets that went out before finish_gradients()
  // ZeRO-3, since the previous finish_gradients(): the units' all-gathers and the seconds
  // forward and backward waited for them (not overlapped with compute).
  int64_t gathers = 0;
  double gather_wait_seconds = 0;
  DdpStepStats& operator+=(const DdpStepStats& o) {
    gathers += o.gathers;
    gather_wait_seconds += o.gather_wait_seconds;
    buckets += o.buckets;
    bytes += o.bytes;
    comm_seconds += o.comm_seconds;
    exposed_seconds += o.exposed_seconds;
    launched_in_backward += o.launched_in_backward;
    return *this;
  }
};

class DistributedDataParallel {
 public:
  // Broadcasts rank 0's parameters and buffers to every rank, then hooks the parameters.
  DistributedDataParallel(nn::Module& model, std::shared_ptr<Communicator> comm,
                          DdpOptions options = {});
  ~DistributedDataParallel();  // waits for buckets in flight, removes the hooks
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Rank 0's parameters and buffers on every rank (the constructor does it; again after loading
  // a checkpoint on rank 0 only, say).
  void broadcast_state();
  // Rank 0's buffers (batch norm's running statistics) on every rank: call before each forward,
  // as PyTorch's broadcast_buffers=True does; nothing when the model has none.
  void broadcast_buffers();
  // Whether the next backward's gradients are communicated: false on the micro-batches of an
  // accumulated step (their gradients add up locally), true (the default) on its last one.
  void set_require_sync(bool on) { require_sync_ = on; }
  bool require_sync() const { return require_sync_; }
  // Waits for every bucket; afterwards each parameter's .grad is the mean over the ranks (ZeRO-1:
  // of the parameters this rank owns; the others' gradients are dropped; ZeRO-2: every .grad is
  // dropped and the optimizer holds the means of what it owns as gradient shards).
  void finish_gradients();

  // ---- ZeRO-1, 2 and 3 -----------------------------------------------------------------------
  int zero_stage() const { return options_.zero_stage; }
  // The optimizer over the model's parameters that steps this rank's share: its owned ranges
  // are set (owned_ranges()), and under ZeRO-2 finish_gradients() gives it the gradient shards.
  // It must outlive this object's use of it (or be replaced). Nothing to do without ZeRO.
  void set_optimizer(optim::Optimizer& opt);
  // The elements of model parameter k (its index in model.parameters()) that `rank` updates:
  // all of them without ZeRO.
  optim::ElementRange owned_range(int rank, size_t k) const;
  // For an optimizer over (some of) the model's parameters, in its order: the elements this rank
  // owns of each (Optimizer::set_owned_ranges's argument). A parameter not of the model is
  // refused.
  std::vector<optim::ElementRange> owned_ranges(const std::vector<Tensor>& optimizer_params) const;
  // After the optimizer step: every element receives its owner's value (bit for bit), one
  // collective per bucket. Nothing to do without ZeRO (every rank took the same step).
  void all_gather_parameters();
  // For a checkpoint: the state dict of `opt` (an optimizer over the model's parameters,
  // sharded with owned_ranges()) as the unsharded optimizer writes it — every rank's slices of
  // "state.<i>.*" and "master.<i>" assembled into whole tensors, in state_dict()'s order — on
  // `root`, and an empty dict elsewhere. It loads at any world size, sharded or not. Every rank
  // calls it (one gather). Without ZeRO: opt.state_dict() on root.
  NamedTensors gather_optimizer_state(const optim::Optimizer& opt, int root = 0) const;
  // What clip_grad_norm / grad_norm need to make a rank's partial norm global: an all-reduce
  // over the ranks (sum, or max for the inf-norm). Unset without ZeRO (every rank has every
  // gradient, so its norm is already the global one).
  optim::NormCombiner norm_combiner() const;

  // ZeRO-3: every parameter whole on every rank while the returned object lives (scopes nest;
  // the outermost gathers and releases), for whatever reads or writes the model outside its
  // forward and backward: a write there (load_state_dict) becomes the owners' shards at its
  // end. A forward inside runs on the gathered parameters without collectives. Every rank opens
  // and closes it at the same point (a collective). Without ZeRO-3: nothing happens.
  class FullParameters {
   public:
    explicit FullParameters(DistributedDataParallel* ddp);
    ~FullParameters();
    FullParameters(const FullParameters&) = delete;
    FullParameters& operator=(const FullParameters&) = delete;

   private:
    DistributedDataParallel* ddp_;
  };
  [[nodiscard]] FullParameters full_parameters() { return FullParameters(this); }
  // ZeRO-3: the parameters' bytes this rank holds now (gathered units and its own segments).
  int64_t resident_parameter_bytes() const;
  // ZeRO-3's units: the parameters' indices (into model.parameters()) of each, the root first.
  std::vector<std::vector<size_t>> units() const;

  const DdpStepStats& last_step() const { return stats_; }
  // Summed over every finish_gradients() so far, and their number.
  const DdpStepStats& totals() const { return totals_; }
  int64_t steps() const { return steps_; }
  // The parameters' indices (into model.parameters()) of each bucket, in launch order.
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  Communicator& communicator() { return *comm_; }

 private:
  void on_gradient(size_t param);
  int64_t launch_ready();  // the buckets it launched
  // The index in params_ of an optimizer's parameter (its `position` there, for the message).
  size_t index_of(const Tensor& p, size_t position) const;
  void start_step();  // every bucket waits for all its gradients again
  // This rank's elements of parameter k in `segment`, a tensor laid out as this rank's segment
  // of the parameter's bucket (the reduced gradients, ZeRO-3's parameter shard).
  Tensor owned_slice(const Tensor& segment, size_t k) const;
  void launch(size_t bucket);
  // ZeRO-3 (zero3.cpp).
  struct Unit {
    nn::Module* module = nullptr;  // the root: the model
    std::vector<size_t> buckets;
    int64_t params = 0;   // the parameters it holds
    int64_t pending = 0;  // of them, still without a gradient in this backward
    bool resident = false;
    bool kept = false;         // resident when the outermost full_parameters() scope opened
    std::future<void> gather;  // in flight on the communicator's thread
    int hook = -1;             // its module's forward hooks
  };
  void make_units(nn::Module& model);  // units_ and unit_of_ (before the buckets)
  void shard_parameters();             // every bucket's flat storage and this rank's segment
  void hook_units();
  void fetch(size_t unit);                      // submits its gather (nothing when resident)
  void gather_unit(size_t unit, bool forward);  // fetched and waited for
  void release_unit(size_t unit);
  void before_forward(size_t unit);
  void after_forward(size_t unit, const nn::TensorList& outputs);
  void unit_gradient(size_t param);  // its unit is released at the last
  void begin_full();
  void end_full();

  std::shared_ptr<Communicator> comm_;
  DdpOptions options_;
  std::vector<Tensor> params_, buffers_;
  std::vector<int> hooks_;
  std::vector<std::vector<size_t>> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<Tensor> flat_;  // each bucket's buffer, in grad_comm (ZeRO-2: none kept)
  std::vector<int64_t> bucket_numel_;
  optim::Optimizer* optimizer_ = nullptr;  // set_optimizer()
  std::vector<size_t> optimizer_index_;    // [parameter]: its index there (npos: none)
  std::vector<int64_t> offset_;            // each parameter's first element in its bucket
  // ZeRO-1: [rank][parameter] the elements each rank owns; each bucket's elements per rank and
  // where this rank's segment starts (every stage: fp32-accumulated half sums use them too);
  // ZeRO-1: its segment of the reduced sum.
  std::vector<std::vector<optim::ElementRange>> ranges_;
  std::vector<std::vector<int64_t>> segment_counts_;
  std::vector<int64_t> segment_start_;
  std::vector<Tensor> shard_;
  // ZeRO-3: the units (the root first) and each parameter's; each bucket's flat parameter
  // storage, this rank's segment of it (kept), the storage version forward saved and the
  // version seen when a full_parameters() scope gathered it.
  std::vector<Unit> units_;
  std::vector<size_t> unit_of_;
  std::vector<Tensor> param_flat_, param_shard_;
  std::vector<uint32_t> flat_version_, full_version_;
  int full_scopes_ = 0;
  int64_t gathers_ = 0;  // this step's, for stats_
  double gather_wait_ = 0;
  std::vector<int64_t> pending_;  // parameters of each bucket still without a gradient
  std::vector<bool> marked_;      // parameters whose gradient this step has counted
  std::vector<std::future<void>> inflight_;
  std::vector<double> comm_seconds_;
  size_t next_launch_ = 0;
  int64_t launched_early_ = 0;  // buckets launched by backward's hooks this step
  bool require_sync_ = true;
  DdpStepStats stats_, totals_;
  int64_t steps_ = 0;
};

}  // namespace mantissa::dist
