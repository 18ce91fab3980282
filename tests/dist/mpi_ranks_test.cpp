// Data parallel across real processes: this program runs under `mpirun -n 2` (CTest
// dist_mpi_2ranks), every rank runs every test in the same order, so the collectives match.
//
// - the collectives against values computed here;
// - 2 ranks x batch 32 against 1 process x batch 64 (computed on each rank), 20 SGD and 20 AdamW
//   steps, to 1e-5 relative; the weights bitwise identical on both ranks;
// - fp16 O2 with an inf in one rank's gradient: both ranks skip, weights untouched, the scale
//   backs off once;
// - the Trainer with --grad-comm bf16 against fp32 over 200 mlp steps: within 1 %;
// - the segment collectives (reduce-scatter, all-gather, gather) against values computed here;
// - half-precision sums accumulated in fp32 and rounded once, on 2 ranks and (CTest
//   dist_mpi_3ranks, the RanksAnyWorld tests alone) on 3;
// - ZeRO-1 against plain data parallel over 8 steps: the same weights bit for bit (SGD fp32,
//   fp16 O2 with loss scaling, AdamW bf16 O2) or within 1e-4 (SGD bf16 O2 clipped: the global
//   norm summed from partial norms), the state split in halves without overlap and gathered into
//   the unsharded optimizer's state dict; an inf reaching one owner skips the step on both ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <vector>

#include "mantissa/amp/amp.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/dist/communicator.h"
#include "mantissa/dist/ddp.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/clip.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/trainer.h"

namespace mantissa {
namespace {

dist::Communicator& world() {
  static std::shared_ptr<dist::Communicator> w = dist::mpi_world();
  return *w;
}

std::vector<float> values(const Tensor& t) {
  return t.to(DType::F32).to_vector<float>();
}

// Whether t has the same bits on every rank.
bool same_on_every_rank(const Tensor& t) {
  const Tensor mine = t.contiguous().clone();
  Tensor root = mine.clone();
  world().broadcast(root, 0);
  const int64_t differs = std::memcmp(mine.data_ptr(), root.data_ptr(), mine.nbytes()) != 0;
  Tensor flag = Tensor::from_vector(std::vector<int64_t>{differs}, {1});
  world().all_reduce(flag, dist::ReduceOp::Max);
  return flag.to_vector<int64_t>()[0] == 0;
}

TEST(Ranks, CollectivesGiveTheSumsMaximaAndTheRootsValues) {
  ASSERT_EQ(world().world_size(), 2) << "run under mpirun -n 2";
  const auto r = float(world().rank());
  for (const DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor t = Tensor::from_vector(std::vector<float>{r + 1, 0.5f * (r + 1), -r}, {3}).to(dt);
    world().all_reduce(t, dist::ReduceOp::Sum);
    EXPECT_EQ(values(t), (std::vector<float>{3, 1.5f, -1}));
    Tensor m = Tensor::from_vector(std::vector<float>{r, -r, 2}, {3}).to(dt);
    world().all_reduce(m, dist::ReduceOp::Max);
    EXPECT_EQ(values(m), (std::vector<float>{1, 0, 2}));
  }
  Tensor i = Tensor::from_vector(std::vector<int64_t>{int64_t(r) << 40, 7}, {2});
  world().all_reduce(i, dist::ReduceOp::Sum);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{int64_t(1) << 40, 14}));
  // A NaN on one rank reaches the other through Max too (MPI_MAX would drop it).
  for (const DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    const float q = std::numeric_limits<float>::quiet_NaN();
    Tensor nan =
        Tensor::from_vector(std::vector<float>{r == 1 ? q : 1.0f, r == 0 ? q : 1.0f}, {2}).to(dt);
    world().all_reduce(nan, dist::ReduceOp::Max);
    EXPECT_TRUE(std::isnan(values(nan)[0]) && std::isnan(values(nan)[1])) << dtype_name(dt);
  }
  Tensor b = Tensor::uniform({5, 7}, -1, 1, 40 + uint64_t(r)).to(DType::BF16);
  world().broadcast(b, 1);
  EXPECT_EQ(values(b), values(Tensor::uniform({5, 7}, -1, 1, 41).to(DType::BF16)));
  world().barrier();
}

// One batch of 64 for step s, the same on every rank; rank r's shard is rows r, r + 2, ...
struct Batch {
  Tensor x, y;
};
Batch full_batch(int64_t step) {
  std::vector<int64_t> labels(64);
  for (int64_t i = 0; i < 64; ++i)
    labels[size_t(i)] = (i * 7 + step) % 10;
  return {Tensor::uniform({64, 1, 28, 28}, 0, 1, 1000 + uint64_t(step)),
          Tensor::from_vector(labels, {64})};
}
Batch my_shard(const Batch& b) {
  const int64_t r = world().rank();
  return {b.x.reshape({32, 2, 1, 28, 28}).select(1, r).contiguous(),
          b.y.reshape({32, 2}).select(1, r).contiguous()};
}

std::unique_ptr<optim::Optimizer> make_opt(const std::string& kind, nn::Module& m) {
  if (kind == "sgd") {
    return std::make_unique<optim::SGD>(m.parameters(),
                                        optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  }
  // "adamw-eps1e-5": the same with a larger eps, which damps elements whose gradient is near 0.
  const double eps = kind == "adamw" ? 1e-8 : 1e-5;
  return std::make_unique<optim::AdamW>(
      m.parameters(), optim::AdamWOptions{.lr = 1e-3, .eps = eps, .weight_decay = 0.01});
}

// ||a - b|| / ||b|| over the whole tensor.
double relative_gap(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = values(a), y = values(b);
  double gap = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    gap += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    norm += double(y[i]) * y[i];
  }
  return norm > 0 ? std::sqrt(gap / norm) : std::sqrt(gap);
}

// Three trajectories from the same initial weights over the same 20 batches of 64:
//   whole — one process, batch 64;
//   split — one process, the two shards of each batch one after the other, each loss halved,
//           the gradients accumulated (the same arithmetic as 2 ranks, no communication);
//   ddp   — 2 ranks, each its shard of 32, gradients averaged by DistributedDataParallel.
// ddp must equal split bit for bit, and stay within 1e-5 of whole under SGD and under AdamW with
// eps 1e-5. With AdamW's default eps 1e-8 the split itself moves away from whole (2.7e-3 in the
// Release build): an element whose gradient is near zero, summed over the batch in another
// order, is amplified to a step of up to lr by the division by sqrt(v) + eps, even flipped in
// sign; that is the optimizer's sensitivity to summation order, not communication (eps 1e-5
// damps those elements and the gap falls to 1e-7), and ddp shows exactly the split's gap.
TEST(Ranks, TwoRanksOfHalfTheBatchMatchOneProcessWithTheWholeBatch) {
  for (const std::string kind : {"sgd", "adamw", "adamw-eps1e-5"}) {
    SCOPED_TRACE(kind);
    auto whole = nn::make_model("mlp", {.seed = 5});
    auto split = nn::make_model("mlp", {.seed = 5});
    auto whole_opt = make_opt(kind, *whole), split_opt = make_opt(kind, *split);
    // Rank 1 starts from other weights, which the wrapper replaces by rank 0's.
    auto model = nn::make_model("mlp", {.seed = 5 + uint64_t(world().rank())});
    dist::DistributedDataParallel ddp(*model, dist::mpi_world(), {.bucket_mb = 0.5});
    auto opt = make_opt(kind, *model);
    for (int64_t step = 0; step < 20; ++step) {
      const Batch b = full_batch(step);
      whole_opt->zero_grad();
      cross_entropy((*whole)(b.x), b.y).backward();
      whole_opt->step();
      split_opt->zero_grad();
      for (int64_t r = 0; r < 2; ++r) {
        const Tensor x = b.x.reshape({32, 2, 1, 28, 28}).select(1, r).contiguous();
        const Tensor y = b.y.reshape({32, 2}).select(1, r).contiguous();
        mul(cross_entropy((*split)(x), y), 0.5).backward();
      }
      split_opt->step();
      const Batch mine = my_shard(b);
      opt->zero_grad();
      cross_entropy((*model)(mine.x), mine.y).backward();
      ddp.finish_gradients();
      opt->step();
    }
    EXPECT_GE(ddp.last_step().launched_in_backward, 1);
    const std::vector<Tensor> p = model->parameters(), s = split->parameters(),
                              w = whole->parameters();
    double worst = 0;
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(values(p[i]), values(s[i])) << "parameter " << i << ": 2 ranks != split batch";
      EXPECT_TRUE(same_on_every_rank(p[i])) << "parameter " << i << " differs between ranks";
      worst = std::max(worst, relative_gap(p[i], w[i]));
    }
    if (kind != "adamw") {
      EXPECT_LE(worst, 1e-5);
    }
    if (world().rank() == 0) {
      std::printf("%s: 20 steps, 2 ranks x 32 vs 1 process x 64: largest relative gap %.3g\n",
                  kind.c_str(), worst);
    }
  }
}

std::vector<std::vector<float>> snapshot(const std::vector<Tensor>& params) {
  std::vector<std::vector<float>> v;
  for (const Tensor& p : params)
    v.push_back(values(p));
  return v;
}

// One mixed-precision forward and backward of rank r's shard, the gradients averaged.
void scaled_backward(amp::Amp& amp, nn::Module& model, dist::DistributedDataParallel& ddp,
                     optim::Optimizer& opt, const Batch& b) {
  opt.zero_grad();
  amp.scaler().scale(cross_entropy(amp.forward(model, b.x), b.y)).backward();
  ddp.finish_gradients();
}

// A gradient hook (before accumulation, so before the bucket is packed): the gradient with an
// inf in its first element.
Tensor inf_in_first_element(const Tensor& g) {
  Tensor bad = g.clone();
  bad.reshape({bad.numel()}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
  return bad;
}

TEST(Ranks, AnInfOnOneRankMakesEveryRankSkipTheStep) {
  auto model = nn::make_model("mlp", {.seed = 9});
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  amp::Amp amp = amp::initialize(*model, opt, amp::OptLevel::O2, DType::F16);
  dist::DistributedDataParallel ddp(*model, dist::mpi_world());
  const std::vector<Tensor> params = model->parameters();
  int hook = -1;
  if (world().rank() == 1) {
    hook = params[0].register_hook(inf_in_first_element);
  }
  const std::vector<std::vector<float>> before = snapshot(params);
  const double scale = amp.scaler().get_scale();
  const Batch b = my_shard(full_batch(0));
  scaled_backward(amp, *model, ddp, opt, b);
  const amp::StepResult r = amp.scaler().step(opt);
  amp.scaler().update();
  EXPECT_TRUE(r.skipped());
  EXPECT_EQ(amp.scaler().get_scale(), scale * 0.5);
  EXPECT_EQ(snapshot(params), before) << "a parameter moved on a skipped step";
  if (hook >= 0) params[0].remove_hook(hook);
  // The next step is clean on both ranks and keeps them identical.
  scaled_backward(amp, *model, ddp, opt, b);
  EXPECT_FALSE(amp.scaler().step(opt).skipped());
  amp.scaler().update();
  for (const Tensor& p : params)
    EXPECT_TRUE(same_on_every_rank(p));
}

// An overflow that only one rank sees (after the averaging: what a rank that unscales only its
// shard meets): with the scaler's overflow reducer every rank skips and backs off alike.
TEST(Ranks, TheOverflowReducerMakesARankLocalInfSkipEverywhere) {
  auto model = nn::make_model("mlp", {.seed = 4});
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  amp::Amp amp = amp::initialize(*model, opt, amp::OptLevel::O2, DType::F16);
  dist::DistributedDataParallel ddp(*model, dist::mpi_world());
  amp.scaler().set_overflow_reducer(
      [](Tensor& flag) { world().all_reduce(flag, dist::ReduceOp::Max); });
  const std::vector<Tensor> params = model->parameters();
  const std::vector<std::vector<float>> before = snapshot(params);
  const double scale = amp.scaler().get_scale();
  scaled_backward(amp, *model, ddp, opt, my_shard(full_batch(1)));
  if (world().rank() == 1) {
    Tensor g = params[1].grad();
    g.reshape({g.numel()}).narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());
  }
  EXPECT_TRUE(amp.scaler().step(opt).skipped());
  amp.scaler().update();
  EXPECT_EQ(amp.scaler().get_scale(), scale * 0.5);
  EXPECT_EQ(snapshot(params), before) << "a parameter moved on a skipped step";
}

TEST(Ranks, BatchNormStatisticsComeFromRankZero) {
  auto model = nn::make_model("cnn", {.seed = 2});
  dist::DistributedDataParallel ddp(*model, dist::mpi_world());
  // Each rank's own batch moves its running statistics its own way ...
  const Tensor x = Tensor::uniform({8, 1, 28, 28}, -1, 1, 70 + uint64_t(world().rank()));
  (*model)(x);
  std::vector<Tensor> buffers = model->buffers();
  ASSERT_FALSE(buffers.empty());
  bool differ = false;
  for (const Tensor& b : buffers)
    differ = differ || !same_on_every_rank(b);
  EXPECT_TRUE(differ) << "the ranks' batches should have moved the statistics apart";
  // ... until the next step starts from rank 0's.
  ddp.broadcast_buffers();
  for (const Tensor& b : buffers)
    EXPECT_TRUE(same_on_every_rank(b)) << b.describe();
}

// Any world size (CTest runs it on 2 ranks and, alone, on 3): rank 0 sends 1 and every other
// rank half an ulp of 1 (bf16: 2^-8, f16: 2^-11) for each element. The exact sum, 1 + (N - 1)
// half-ulps, is what the fp32 accumulation rounds once; a sum rounded after each addition can
// lose every half-ulp to ties-to-even (1 + half-ulp rounds to 1), and from 3 ranks on differs.
TEST(RanksAnyWorld, HalfSumsAccumulateInF32AndRoundOnce) {
  const int r = world().rank(), n = world().world_size();
  for (const auto& [dt, half_ulp] :
       {std::pair{DType::BF16, std::ldexp(1.0, -8)}, std::pair{DType::F16, std::ldexp(1.0, -11)}}) {
    SCOPED_TRACE(dtype_name(dt));
    const double exact = 1.0 + double(n - 1) * half_ulp;
    const float want = values(Tensor::full({1}, exact, dt))[0];
    std::vector<int64_t> counts;
    for (int k = 0; k < n; ++k)
      counts.push_back(3 + k);  // unequal segments
    int64_t total = 0;
    for (int64_t c : counts)
      total += c;
    const Tensor in = Tensor::full({total}, r == 0 ? 1.0 : half_ulp, dt);
    // Into the wire's dtype and into fp32 (a wider mean: no rounding to the half at all).
    for (const DType out_dtype : {dt, DType::F32}) {
      Tensor out = Tensor::zeros({counts[size_t(r)]}, out_dtype);
      world().reduce_scatter_accumulate(in, out, counts);
      for (const float v : values(out))
        EXPECT_EQ(v, out_dtype == dt ? want : float(exact)) << "rank " << r;
    }
    // Data parallel's buckets take the same sum: every gradient element is the mean.
    for (const int zero : {0, 1}) {
      SCOPED_TRACE("zero " + std::to_string(zero));
      auto model = std::make_shared<nn::Linear>(4, 5);
      dist::DistributedDataParallel ddp(*model, dist::mpi_world(),
                                        {.grad_comm = dt, .zero_stage = zero});
      optim::SGD opt(model->parameters(), {.lr = 0.1});
      ddp.set_optimizer(opt);
      for (const Tensor& p : model->parameters())
        p.set_grad(Tensor::full(p.shape(), double(n) * (r == 0 ? 1.0 : half_ulp)));
      ddp.finish_gradients();
      for (const Tensor& p : model->parameters()) {
        const Tensor g = p.grad();
        if (!g.defined()) continue;  // ZeRO-1: another rank owns it
        // Each term is divided by N before it travels (exactly 1 and half-ulps here), summed
        // in fp32, and rounded once into the bucket's dtype (ZeRO-1: zeros where not owned).
        for (const float v : values(g)) {
          if (v != 0) {
            EXPECT_EQ(v, want) << p.describe();
          }
        }
      }
    }
  }
}

TEST(Ranks, SegmentCollectivesMoveEachRanksPart) {
  const int r = world().rank();
  const std::vector<int64_t> counts = {3, 2};
  for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    // Rank r contributes (r + 1) * [1 .. 5]: the sums are 3 * [1 .. 5].
    const auto f = float(r + 1);
    const Tensor in =
        Tensor::from_vector(std::vector<float>{f, 2 * f, 3 * f, 4 * f, 5 * f}, {5}).to(dt);
    Tensor out = Tensor::zeros({counts[size_t(r)]}, dt);
    world().reduce_scatter(in, out, counts);
    EXPECT_EQ(values(out), r == 0 ? (std::vector<float>{3, 6, 9}) : (std::vector<float>{12, 15}));
  }
  // All-gather in place: each rank fills its own segment.
  Tensor t = Tensor::zeros({5}, DType::F64);
  for (int64_t i = 0; i < counts[size_t(r)]; ++i)
    t.data<double>()[(r == 0 ? 0 : 3) + i] = 10.0 * (r + 1) + double(i);
  world().all_gather(t, counts);
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{10, 11, 12, 20, 21}));
  // Gather on rank 1 only, segments of unequal length (rank 0 sends none).
  const std::vector<int64_t> uneven = {0, 4};
  const Tensor mine = Tensor::full({uneven[size_t(r)]}, 7.0 + r, DType::I32);
  Tensor all = r == 1 ? Tensor::zeros({4}, DType::I32) : Tensor();
  world().gather(mine, all, uneven, 1);
  if (r == 1) {
    EXPECT_EQ(all.to_vector<int32_t>(), (std::vector<int32_t>{8, 8, 8, 8}));
  }
}

// A model trained data parallel: what the ZeRO tests run side by side.
struct DdpRun {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<amp::Amp> amp;
  std::unique_ptr<dist::DistributedDataParallel> ddp;
};

// Plain data parallel and ZeRO-1 side by side on the same batches: cnn (convolutions, batch
// norm, a large linear layer), buckets of 0.1 MiB so that several mix owners.
struct ZeroCase {
  const char* name;
  amp::OptLevel level;
  DType half;
  bool adamw;
  double clip;
  // Block-scaled moments: their blocks never straddle two ranks (zero_cuts), so the shards
  // quantize as the whole optimizer does, bit for bit.
  optim::StateFormat state = optim::StateFormat::F32;
};

TEST(Ranks, ZeroOneTwoAndThreeTakeTheStepsOfPlainDataParallel) {
  for (const ZeroCase c :
       {ZeroCase{"sgd fp32", amp::OptLevel::O0, DType::F32, false, 0},
        ZeroCase{"adamw bf16 O2", amp::OptLevel::O2, DType::BF16, true, 0},
        ZeroCase{"sgd fp16 O2, loss scaling", amp::OptLevel::O2, DType::F16, false, 0},
        ZeroCase{"sgd bf16 O2, clipped", amp::OptLevel::O2, DType::BF16, false, 0.5},
        ZeroCase{"adamw bf16 O2, 8-bit moments", amp::OptLevel::O2, DType::BF16, true, 0,
                 optim::StateFormat::Q8},
        ZeroCase{"sgd fp32, fp8 momentum", amp::OptLevel::O0, DType::F32, false, 0,
                 optim::StateFormat::FP8}}) {
    SCOPED_TRACE(c.name);
    auto make = [&](int stage) {
      DdpRun run;
      run.model = nn::make_model("cnn", {.seed = 21});
      if (c.adamw) {
        run.opt = std::make_unique<optim::AdamW>(
            run.model->parameters(),
            optim::AdamWOptions{
                .lr = 2e-3, .exp_avg_format = c.state, .exp_avg_sq_format = c.state});
      } else {
        run.opt = std::make_unique<optim::SGD>(
            run.model->parameters(),
            optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .momentum_format = c.state});
      }
      run.amp = std::make_unique<amp::Amp>(amp::initialize(*run.model, *run.opt, c.level, c.half));
      run.ddp = std::make_unique<dist::DistributedDataParallel>(
          *run.model, dist::mpi_world(), dist::DdpOptions{.bucket_mb = 0.1, .zero_stage = stage});
      run.ddp->set_optimizer(*run.opt);
      if (run.amp->scaler().options().mode != amp::ScaleMode::Disabled) {
        run.amp->scaler().set_overflow_reducer(
            [](Tensor& flag) { world().all_reduce(flag, dist::ReduceOp::Max); });
      }
      return run;
    };
    for (const int stage : {1, 2, 3}) {
      SCOPED_TRACE("ZeRO-" + std::to_string(stage));
      DdpRun plain = make(0), zero = make(stage);
      for (int64_t step = 0; step < 8; ++step) {
        const Batch b = my_shard(full_batch(step));
        for (DdpRun* run : {&plain, &zero}) {
          amp::GradScaler& sc = run->amp->scaler();
          run->opt->zero_grad();
          run->ddp->broadcast_buffers();
          sc.scale(cross_entropy(run->amp->forward(*run->model, b.x), b.y)).backward();
          run->ddp->finish_gradients();
          if (c.clip > 0) {
            sc.unscale_(*run->opt);
            optim::clip_gradients(run->opt->gradients(), c.clip, 2.0, run->ddp->norm_combiner());
          }
          sc.step(*run->opt);
          sc.update();
          run->ddp->all_gather_parameters();
        }
      }
      // ZeRO-2 keeps the gradients of its half alone, and no .grad at all.
      auto grad_bytes = [](const DdpRun& r) {
        int64_t n = 0;
        for (const Tensor& g : r.opt->gradients())
          n += int64_t(g.nbytes());
        return n;
      };
      if (stage >= 2) {
        for (const Tensor& q : zero.model->parameters())
          EXPECT_FALSE(q.grad().defined());
        EXPECT_LT(double(grad_bytes(zero)), 0.6 * double(grad_bytes(plain)));
      }
      // Unclipped, bit for bit. Clipped, the norm is summed from the ranks' partial norms (each
      // rank's gradient holds its own elements, zeros elsewhere, in fp32 chunk sums) instead of in
      // one pass: its last bits differ and some clipped gradients move by one ulp — within 1e-4
      // after 8 SGD steps. (Not AdamW: a convolution's bias before batch norm has a gradient of
      // pure rounding noise, which AdamW turns into steps of lr whatever its size, so one ulp there
      // moves that bias by lr; the Release and sanitizer builds differed by 1.6e-6 and 2.7e-2.)
      const bool exact = c.clip == 0;
      const auto whole = zero.ddp->full_parameters();  // (ZeRO-3: gathered to be read)
      const std::vector<Tensor> p = plain.model->parameters(), z = zero.model->parameters();
      double worst = 0;
      for (size_t i = 0; i < p.size(); ++i) {
        if (exact) {
          EXPECT_EQ(values(z[i]), values(p[i])) << "parameter " << i << ": ZeRO-1 != plain";
        }
        worst = std::max(worst, relative_gap(z[i], p[i]));
        EXPECT_TRUE(same_on_every_rank(z[i])) << "parameter " << i << " differs between ranks";
      }
      EXPECT_LE(worst, 1e-4);
      // The state is split without overlap, in halves to within an element per bucket, ...
      Tensor bytes = Tensor::from_vector(std::vector<int64_t>{zero.opt->state_nbytes()}, {1});
      world().all_reduce(bytes, dist::ReduceOp::Sum);
      EXPECT_EQ(bytes.to_vector<int64_t>()[0], plain.opt->state_nbytes());
      // (each cut moved by at most half a state block: 1024 elements of up to 12 bytes of state)
      EXPECT_NEAR(double(zero.opt->state_nbytes()), 0.5 * double(plain.opt->state_nbytes()),
                  double(zero.ddp->last_step().buckets * optim::kMaxStateBlock / 2 * 12));
      // ... and gathered, it is the unsharded optimizer's, key for key (unclipped, bit for bit).
      const NamedTensors gathered = zero.ddp->gather_optimizer_state(*zero.opt);
      if (world().rank() == 0) {
        const NamedTensors expected = plain.opt->state_dict();
        ASSERT_EQ(gathered.size(), expected.size());
        for (size_t i = 0; i < expected.size(); ++i) {
          ASSERT_EQ(gathered[i].first, expected[i].first);
          EXPECT_EQ(gathered[i].second.shape(), expected[i].second.shape()) << expected[i].first;
          if (exact) {
            EXPECT_EQ(0, std::memcmp(gathered[i].second.data_ptr(), expected[i].second.data_ptr(),
                                     expected[i].second.nbytes()))
                << expected[i].first;
          } else if (expected[i].first.starts_with("master.")) {
            // The masters follow the weights; the momentum of that bias's noise does not.
            EXPECT_LE(relative_gap(gathered[i].second, expected[i].second), 1e-4)
                << expected[i].first;
          }
        }
        std::printf(
            "%s: 8 steps, ZeRO-%d vs plain data parallel: largest relative gap %.3g; optimizer "
            "state on rank 0: %lld of %lld bytes, gradients %lld of %lld\n",
            c.name, stage, worst, (long long)zero.opt->state_nbytes(),
            (long long)plain.opt->state_nbytes(), (long long)grad_bytes(zero),
            (long long)grad_bytes(plain));
      } else {
        EXPECT_TRUE(gathered.empty());
      }
    }
  }
}

// ZeRO-3 on a transformer (gpt2_tiny: 4 blocks, the units, and the root: embeddings, tied
// head, last norm) against plain data parallel over 6 steps of 2 micro-batches, with an
// evaluation forward (no grad) after each step: the same weights and evaluation losses bit for
// bit, with and without activation checkpointing; between steps a rank holds its half of the
// parameters' bytes, and during forward the root and at most two blocks whole besides.
struct Zero3Case {
  const char* name;
  amp::OptLevel level;
  bool adamw;
  nn::ActivationCheckpointing checkpointing;
};

TEST(Ranks, ZeroThreeGathersEachBlockAroundItsForwardAndBackward) {
  for (const Zero3Case c :
       {Zero3Case{"sgd fp32", amp::OptLevel::O0, false, nn::ActivationCheckpointing::Off},
        Zero3Case{"adamw bf16 O2", amp::OptLevel::O2, true, nn::ActivationCheckpointing::Off},
        Zero3Case{"adamw bf16 O2, checkpointed blocks", amp::OptLevel::O2, true,
                  nn::ActivationCheckpointing::PerBlock}}) {
    SCOPED_TRACE(c.name);
    auto make = [&](int stage) {
      DdpRun run;
      run.model = nn::make_model("gpt2_tiny", {.vocab_size = 64,
                                               .max_seq_len = 16,
                                               .seed = 5,
                                               .activation_checkpointing = c.checkpointing});
      run.opt = make_opt(c.adamw ? "adamw" : "sgd", *run.model);
      run.amp =
          std::make_unique<amp::Amp>(amp::initialize(*run.model, *run.opt, c.level, DType::BF16));
      run.ddp = std::make_unique<dist::DistributedDataParallel>(
          *run.model, dist::mpi_world(), dist::DdpOptions{.bucket_mb = 0.05, .zero_stage = stage});
      run.ddp->set_optimizer(*run.opt);
      return run;
    };
    DdpRun plain = make(0), zero = make(3);
    const std::vector<std::vector<size_t>> units = zero.ddp->units();
    ASSERT_EQ(units.size(), 5u);  // the root and 4 blocks
    int64_t whole = 0, largest_block = 0;
    for (const Tensor& p : zero.model->parameters())
      whole += int64_t(p.nbytes());
    int64_t root = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      int64_t bytes = 0;
      for (size_t k : units[u])
        bytes += int64_t(zero.model->parameters()[k].nbytes());
      (u == 0 ? root : largest_block) = std::max(u == 0 ? root : largest_block, bytes);
    }
    const int64_t shards = zero.ddp->resident_parameter_bytes();
    EXPECT_NEAR(double(shards), 0.5 * double(whole), 0.02 * double(whole));
    // What a rank holds while each block runs (after the gather and the next one's prefetch).
    int64_t most = 0;
    auto blocks = std::dynamic_pointer_cast<nn::Sequential>(zero.model->child("blocks"));
    ASSERT_TRUE(blocks);
    for (size_t i = 0; i < blocks->size(); ++i) {
      (*blocks)[i]->add_forward_hooks(
          {[&](nn::Module&) { most = std::max(most, zero.ddp->resident_parameter_bytes()); },
           nullptr});
    }
    auto loss_of = [](DdpRun& r, const Tensor& tokens) {
      const Tensor logits = r.amp->forward(*r.model, tokens.narrow(1, 0, 15));
      return cross_entropy(logits.reshape({-1, 64}),
                           tokens.narrow(1, 1, 15).contiguous().reshape({-1}));
    };
    double eval_gap = 0;
    for (int64_t step = 0; step < 6; ++step) {
      for (DdpRun* run : {&plain, &zero}) {
        run->opt->zero_grad();
        for (int64_t micro = 0; micro < 2; ++micro) {
          // 8 sequences a micro-batch, rank r's the rows r, r + 2, ...
          const Tensor all = Tensor::uniform({4, 2, 16}, 0, 64, 300 + uint64_t(step * 2 + micro))
                                 .to(DType::I64)
                                 .select(1, world().rank())
                                 .contiguous();
          run->ddp->set_require_sync(micro == 1);
          mul(loss_of(*run, all), 0.5).backward();
        }
        run->ddp->finish_gradients();
        run->opt->step();
        run->ddp->all_gather_parameters();
      }
      EXPECT_EQ(zero.ddp->resident_parameter_bytes(), shards) << "step " << step;
      NoGrad ng;
      const Tensor probe = Tensor::uniform({2, 16}, 0, 64, 77).to(DType::I64);
      const double a = loss_of(plain, probe).item(), b = loss_of(zero, probe).item();
      eval_gap = std::max(eval_gap, std::abs(a - b));
      EXPECT_EQ(zero.ddp->resident_parameter_bytes(), shards) << "after the evaluation";
    }
    EXPECT_EQ(eval_gap, 0.0);
    // (A block and the next one's prefetch: with 4 blocks over 2 ranks that is about the whole
    // model's bytes; the share gathered falls as 2 / blocks, the shards' as 1 / ranks.)
    EXPECT_GE(most, shards + largest_block);
    EXPECT_LE(most, shards + root + 2 * largest_block);
    const auto gathered = zero.ddp->full_parameters();
    const std::vector<Tensor> p = plain.model->parameters(), z = zero.model->parameters();
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_EQ(values(z[i]), values(p[i])) << "parameter " << i << ": ZeRO-3 != plain";
      EXPECT_TRUE(same_on_every_rank(z[i])) << "parameter " << i << " differs between ranks";
    }
    if (world().rank() == 0) {
      std::printf(
          "%s: 6 steps x 2 micro-batches, ZeRO-3 = plain data parallel bit for bit; "
          "parameter bytes on rank 0: %lld of %lld between steps, at most %lld in "
          "forward\n",
          c.name, (long long)shards, (long long)whole, (long long)most);
    }
  }
}

TEST(Ranks, ZeroOneSkipsOnBothRanksWhenAnInfReachesOneOwner) {
  auto model = nn::make_model("mlp", {.seed = 9});
  optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  amp::Amp amp = amp::initialize(*model, opt, amp::OptLevel::O2, DType::F16);
  dist::DistributedDataParallel ddp(*model, dist::mpi_world(), {.zero_stage = 1});
  opt.set_owned_ranges(ddp.owned_ranges(opt.params()));
  amp.scaler().set_overflow_reducer(
      [](Tensor& flag) { world().all_reduce(flag, dist::ReduceOp::Max); });
  const std::vector<Tensor> params = model->parameters();
  // The rank that does not own the first element of parameter 0 puts an inf there: only the
  // owner sees it after the reduction.
  const int owner = ddp.owned_range(0, 0).begin == 0 && ddp.owned_range(0, 0).size() > 0 ? 0 : 1;
  int hook = -1;
  if (world().rank() != owner) {
    hook = params[0].register_hook(inf_in_first_element);
  }
  const std::vector<std::vector<float>> before = snapshot(params);
  const double scale = amp.scaler().get_scale();
  const Batch b = my_shard(full_batch(2));
  scaled_backward(amp, *model, ddp, opt, b);
  const std::vector<float> g0 =
      params[0].grad().defined() ? values(params[0].grad()) : std::vector<float>();
  EXPECT_EQ(!g0.empty() && std::isinf(g0[0]), world().rank() == owner);
  EXPECT_TRUE(amp.scaler().step(opt).skipped());
  amp.scaler().update();
  ddp.all_gather_parameters();
  EXPECT_EQ(amp.scaler().get_scale(), scale * 0.5);
  EXPECT_EQ(snapshot(params), before) << "a parameter moved on a skipped step";
  if (hook >= 0) params[0].remove_hook(hook);
  scaled_backward(amp, *model, ddp, opt, b);
  EXPECT_FALSE(amp.scaler().step(opt).skipped());
  amp.scaler().update();
  ddp.all_gather_parameters();
  for (const Tensor& p : params)
    EXPECT_TRUE(same_on_every_rank(p));
  EXPECT_NE(snapshot(params), before);
}

// fp8 with delayed scaling across ranks: each rank's activations and gradients differ, so their
// amaxes do; update() takes their maximum over the ranks, so every rank quantizes with the same
// scales and rank 0's checkpoint holds every rank's state. Without the reduction the same run's
// scales differ (checked first, so the test can see the difference it guards).
TEST(Ranks, Fp8DelayedScalesAreTheSameOnEveryRank) {
  amp::Fp8Context local({.recipe = amp::Fp8Recipe::Delayed});
  auto st = local.add_layer("l");
  std::vector<float> h = (*st)[amp::Fp8Role::Input].history();
  h[0] = 1.0f + float(world().rank());
  (*st)[amp::Fp8Role::Input].set_history(h);
  local.update();
  EXPECT_FALSE(same_on_every_rank(local.state_dict().at("fp8.l.input.scale")));

  train::TrainConfig c;
  c.model = "mlp";
  c.set("data", "synthetic");
  c.synthetic_size = 512;
  c.batch_size = 16;
  c.max_steps = 6;
  c.epochs = 0;
  c.set("precision", "fp8");
  c.set("fp8-recipe", "delayed");
  c.set("fp8-layers", "all");
  c.distributed = true;
  c.progress = false;
  c.workers = 0;
  c.threads = 1;
  train::Trainer t(c);
  t.fit();
  ASSERT_NE(t.fp8(), nullptr);
  const std::map<std::string, Tensor> state = t.fp8()->state_dict();
  ASSERT_FALSE(state.empty());
  for (const auto& [name, tensor] : state)
    EXPECT_TRUE(same_on_every_rank(tensor)) << name << " differs between the ranks";
}

train::TrainResult train_mlp(const std::string& grad_comm) {
  train::TrainConfig c;
  c.model = "mlp";
  c.set("data", "fashion-mnist");  // synthetic images are learnt perfectly within 200 steps
  c.batch_size = 32;
  c.max_steps = 200;
  c.epochs = 0;
  c.lr = 0.02;
  c.distributed = true;
  c.set("grad-comm", grad_comm);
  c.progress = false;
  c.workers = 0;
  c.threads = 1;
  return train::Trainer(c).fit();
}

TEST(Ranks, Bf16GradientCommunicationConvergesLikeFp32) {
  if (!std::filesystem::exists(std::string(train::kDefaultFashionMnistDir) +
                               "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  }
  const train::TrainResult f32 = train_mlp("fp32"), bf16 = train_mlp("bf16");
  if (world().rank() == 0) {
    std::printf(
        "mlp, 200 steps of 2 x 32 on Fashion-MNIST: test loss %.5f (fp32 communication), "
        "%.5f (bf16)\n",
        f32.test.loss, bf16.test.loss);
  }
  EXPECT_EQ(f32.steps, 200);
  EXPECT_LE(std::fabs(bf16.test.loss - f32.test.loss), 0.01 * f32.test.loss)
      << "fp32 communication " << f32.test.loss << ", bf16 " << bf16.test.loss;
}

}  // namespace
}  // namespace mantissa
