// Data parallel on GPUs through NCCL: this program runs under `mpirun -n N` (CTest
// dist_nccl_1rank and dist_nccl_2ranks), one GPU per rank; every test skips itself on a machine
// with fewer GPUs than ranks (CI has none) or a build without NCCL.
//
// - the collectives on device tensors against values computed here (sums, maxima, broadcast,
//   reduce-scatter and all-gather with equal and unequal segments, gather), for any N;
// - a cnn on the GPUs with plain data parallel and with ZeRO-1: the same weights bit for bit,
//   the same on every rank, the sharded state gathered whole;
// - the Trainer with --distributed --device cuda: the NCCL communicator, weights alike.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "mantissa/amp/amp.h"
#include "mantissa/core/cuda.h"
#include "mantissa/dist/communicator.h"
#include "mantissa/dist/ddp.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/trainer.h"

namespace mantissa {
namespace {

// The NCCL communicator of this job, or nullptr (and the reason) where it cannot run.
std::shared_ptr<dist::Communicator> gpus(std::string* why) {
  if (!dist::nccl_built()) {
    *why = "this build has no NCCL";
    return nullptr;
  }
  const int ranks = dist::mpi_world()->world_size();
  const int have = cuda::is_available() ? cuda::device_count() : 0;
  if (have < ranks) {
    *why = std::to_string(ranks) + " ranks need as many GPUs; this machine has " +
           std::to_string(have);
    return nullptr;
  }
  static std::shared_ptr<dist::Communicator> world = dist::nccl_world(dist::local_rank());
  return world;
}

#define NEED_GPUS(comm)           \
  std::string why;                \
  const auto comm = gpus(&why);   \
  if (!comm) GTEST_SKIP() << why; \
  const Device gpu = Device::cuda(dist::local_rank())

std::vector<float> values(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::F32).to_vector<float>();
}

TEST(NcclRanks, CollectivesOnDeviceTensors) {
  NEED_GPUS(comm);
  const int n = comm->world_size(), r = comm->rank();
  EXPECT_EQ(comm->backend(), "nccl");
  const float tri = float(n * (n + 1) / 2);  // the sum of (rank + 1) over the ranks
  for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor t = Tensor::from_vector(std::vector<float>{1, 2, -4}, {3}).to(dt).to(gpu);
    t.mul_(double(r + 1));
    comm->all_reduce(t, dist::ReduceOp::Sum);
    EXPECT_EQ(values(t), (std::vector<float>{tri, 2 * tri, -4 * tri}));
    Tensor m = Tensor::full({2}, double(r), dt, gpu);
    comm->all_reduce(m, dist::ReduceOp::Max);
    EXPECT_EQ(values(m), (std::vector<float>(2, float(n - 1))));
  }
  Tensor b = Tensor::full({4}, double(r + 7), DType::F64, gpu);
  comm->broadcast(b, n - 1);
  EXPECT_EQ(values(b), (std::vector<float>(4, float(n + 6))));
  // Segments: equal (3 each) and unequal (rank q gets q + 1 elements).
  for (const bool even : {true, false}) {
    SCOPED_TRACE(even ? "equal segments" : "unequal segments");
    std::vector<int64_t> counts;
    int64_t total = 0, first = 0;
    for (int q = 0; q < n; ++q) {
      counts.push_back(even ? 3 : q + 1);
      if (q == r) first = total;
      total += counts.back();
    }
    const Tensor in = mul(Tensor::arange(total, DType::F32, gpu), double(r + 1));
    Tensor out = Tensor::zeros({counts[size_t(r)]}, DType::F32, gpu);
    comm->reduce_scatter(in, out, counts);
    std::vector<float> want;
    for (int64_t i = 0; i < counts[size_t(r)]; ++i)
      want.push_back(float(first + i) * tri);
    EXPECT_EQ(values(out), want);
    Tensor g = Tensor::full({total}, -1.0, DType::BF16, gpu);
    g.narrow(0, first, counts[size_t(r)]).fill_(double(r));
    comm->all_gather(g, counts);
    std::vector<float> gathered;
    for (int q = 0; q < n; ++q)
      gathered.insert(gathered.end(), size_t(counts[size_t(q)]), float(q));
    EXPECT_EQ(values(g), gathered);
    Tensor all = r == 0 ? Tensor::zeros({total}, DType::F32, gpu) : Tensor();
    comm->gather(out, all, counts, 0);
    if (r == 0) {
      std::vector<float> sums;
      for (int64_t i = 0; i < total; ++i)
        sums.push_back(float(i) * tri);
      EXPECT_EQ(values(all), sums);
    }
  }
  comm->barrier();
}

// Whether t has the same bits on every rank (through the host communicator).
bool same_on_every_rank(const Tensor& t) {
  const Tensor mine = t.to(Device::cpu()).contiguous();
  Tensor root = mine.clone();
  dist::mpi_world()->broadcast(root, 0);
  Tensor differs = Tensor::from_vector(
      std::vector<int64_t>{std::memcmp(mine.data_ptr(), root.data_ptr(), mine.nbytes()) != 0}, {1});
  dist::mpi_world()->all_reduce(differs, dist::ReduceOp::Max);
  return differs.to_vector<int64_t>()[0] == 0;
}

TEST(NcclRanks, ZeroOneOnGpusTakesThePlainSteps) {
  NEED_GPUS(comm);
  struct Run {
    std::shared_ptr<nn::Module> model;
    std::unique_ptr<optim::AdamW> opt;
    std::unique_ptr<amp::Amp> amp;
    std::unique_ptr<dist::DistributedDataParallel> ddp;
  };
  auto make = [&](int stage) {
    Run run;
    run.model = nn::make_model("cnn", {.seed = 3 + uint64_t(comm->rank())});
    run.model->to(gpu);
    run.opt =
        std::make_unique<optim::AdamW>(run.model->parameters(), optim::AdamWOptions{.lr = 1e-3});
    run.amp = std::make_unique<amp::Amp>(
        amp::initialize(*run.model, *run.opt, amp::OptLevel::O2, DType::BF16));
    run.ddp = std::make_unique<dist::DistributedDataParallel>(
        *run.model, comm, dist::DdpOptions{.bucket_mb = 0.1, .zero_stage = stage});
    run.ddp->set_optimizer(*run.opt);
    return run;
  };
  Run plain = make(0), zero = make(1);
  for (int step = 0; step < 5; ++step) {
    const Tensor x =
        Tensor::uniform({16, 1, 28, 28}, 0, 1, 100 * uint64_t(step) + uint64_t(comm->rank()))
            .to(gpu);
    const Tensor y = Tensor::from_vector(
                         std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}, {16})
                         .to(gpu);
    for (Run* run : {&plain, &zero}) {
      run->opt->zero_grad();
      run->ddp->broadcast_buffers();
      cross_entropy(run->amp->forward(*run->model, x), y).backward();
      run->ddp->finish_gradients();
      run->opt->step();
      run->ddp->all_gather_parameters();
    }
  }
  const std::vector<Tensor> p = plain.model->parameters(), z = zero.model->parameters();
  for (size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(values(z[i]), values(p[i])) << "parameter " << i;
    EXPECT_TRUE(same_on_every_rank(z[i])) << "parameter " << i;
  }
  const NamedTensors gathered = zero.ddp->gather_optimizer_state(*zero.opt);
  if (comm->rank() == 0) {
    const NamedTensors expected = plain.opt->state_dict();
    ASSERT_EQ(gathered.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(gathered[i].first, expected[i].first);
      EXPECT_EQ(values(gathered[i].second), values(expected[i].second)) << expected[i].first;
    }
  }
}

TEST(NcclRanks, TheTrainerRunsOnTheGpus) {
  NEED_GPUS(comm);
  train::TrainConfig c;
  c.model = "cnn";
  c.set("data", "synthetic");
  c.synthetic_size = 512;
  c.batch_size = 16;
  c.max_steps = 6;
  c.epochs = 0;
  c.device = "cuda";
  c.set("precision", "bf16");
  c.distributed = true;
  c.zero = 1;
  c.progress = false;
  c.workers = 0;
  train::Trainer t(c);
  EXPECT_EQ(t.device(), gpu);
  const train::TrainResult r = t.fit();
  EXPECT_EQ(r.steps, 6);
  EXPECT_TRUE(std::isfinite(r.test.loss));
  for (const Tensor& p : t.model().parameters())
    EXPECT_TRUE(same_on_every_rank(p));
}

}  // namespace
}  // namespace mantissa
