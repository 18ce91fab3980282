// Data parallel in one process: the post-accumulate hook DDP rides on, the communicator's job
// queue, and DistributedDataParallel over the one-process communicator (the code path of N ranks
// with N = 1: buckets, dtypes, accumulation, unused parameters). The N-rank behaviour is tested
// under mpirun (tests/dist/mpi_ranks_test.cpp, CTest dist_mpi_2ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/config/train_config.h"
#include "mantissa/core/error.h"
#include "mantissa/dist/communicator.h"
#include "mantissa/dist/ddp.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

std::vector<float> values(const Tensor& t) {
  return t.to(DType::F32).to_vector<float>();
}

TEST(PostAccumulateGradHook, RunsOnceAfterTheWholeGradientIsAccumulated) {
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3});
  w.set_requires_grad(true);
  std::vector<std::vector<float>> seen;
  const int h = w.register_post_accumulate_grad_hook(
      [&](const Tensor& leaf) { seen.push_back(values(leaf.grad())); });
  // w used twice: the hook sees the sum of both uses, once.
  sum(add(mul(w, 2.0), mul(w, w))).backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<float>{4, 6, 8}));
  // A second backward accumulates into .grad before the hook runs.
  sum(w).backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<float>{5, 7, 9}));
  w.remove_hook(h);
  sum(w).backward();
  EXPECT_EQ(seen.size(), 2u);
  // Only leaves accumulate.
  EXPECT_THROW(mul(w, 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}), Error);
}

TEST(Communicator, JobsRunInSubmitOrderAndRethrow) {
  auto comm = dist::single_process();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  std::vector<int> order;
  std::vector<std::future<void>> done;
  for (int i = 0; i < 50; ++i)
    done.push_back(comm->submit([&order, i] { order.push_back(i); }));
  auto failing = comm->submit([] { throw std::runtime_error("peer stopped"); });
  for (auto& f : done)
    f.get();
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(order[size_t(i)], i);
  EXPECT_THROW(failing.get(), std::runtime_error);
  Tensor t = Tensor::from_vector(std::vector<float>{1.5f, -2}, {2});
  comm->all_reduce(t, dist::ReduceOp::Sum);  // one rank: the sum is itself
  EXPECT_EQ(values(t), (std::vector<float>{1.5f, -2}));
  EXPECT_THROW(comm->broadcast(t, 1), Error);
  // The segment collectives of one rank: its segment is the whole.
  Tensor out = Tensor::zeros({2});
  const std::vector<int64_t> two = {2};
  comm->reduce_scatter(t, out, two);
  EXPECT_EQ(values(out), (std::vector<float>{1.5f, -2}));
  comm->all_gather(t, two);
  Tensor all = Tensor::zeros({2});
  comm->gather(t, all, two, 0);
  EXPECT_EQ(values(all), (std::vector<float>{1.5f, -2}));
  const std::vector<int64_t> wrong = {3}, many = {1, 1};
  EXPECT_THROW(comm->reduce_scatter(t, out, wrong), Error);
  EXPECT_THROW(comm->all_gather(t, many), Error);
}

// A small MLP's gradients for a fixed batch, with and without DDP.
struct MlpCase {
  std::shared_ptr<nn::Module> model = nn::make_model("mlp", {.seed = 3});
  Tensor x = Tensor::uniform({8, 1, 28, 28}, 0, 1, 11);
  Tensor y = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}, {8});
  void backward() { cross_entropy((*model)(x), y).backward(); }
  std::vector<std::vector<float>> grads() {
    std::vector<std::vector<float>> g;
    for (const Tensor& p : model->parameters())
      g.push_back(p.grad().defined() ? values(p.grad()) : std::vector<float>());
    return g;
  }
};

TEST(DistributedDataParallel, OneRankLeavesTheGradientsAsTheyAre) {
  MlpCase plain, wrapped;
  plain.backward();
  dist::DistributedDataParallel ddp(*wrapped.model, dist::single_process(), {.bucket_mb = 0.25});
  wrapped.backward();
  ddp.finish_gradients();
  EXPECT_EQ(plain.grads(), wrapped.grads());
  const dist::DdpStepStats& s = ddp.last_step();
  EXPECT_EQ(s.buckets, int64_t(ddp.buckets().size()));
  EXPECT_EQ(s.launched_in_backward, s.buckets);  // every bucket went out during backward
  // 784*256 f32 (784 KiB) is above 0.25 MiB: alone; buckets in reverse parameter order.
  const std::vector<Tensor> params = wrapped.model->parameters();
  ASSERT_GE(ddp.buckets().size(), 2u);
  EXPECT_EQ(ddp.buckets().front().front(), params.size() - 1);
  EXPECT_EQ(ddp.buckets().back().back(), 0u);
  size_t listed = 0;
  for (const auto& b : ddp.buckets())
    listed += b.size();
  EXPECT_EQ(listed, params.size());
}

TEST(DistributedDataParallel, HalfPrecisionCommunicationRoundsAndKeepsTheGradientDtype) {
  for (const DType comm : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(comm));
    MlpCase plain, wrapped;
    plain.backward();
    dist::DistributedDataParallel ddp(*wrapped.model, dist::single_process(), {.grad_comm = comm});
    wrapped.backward();
    ddp.finish_gradients();
    const std::vector<Tensor> pp = plain.model->parameters(), wp = wrapped.model->parameters();
    for (size_t i = 0; i < pp.size(); ++i) {
      EXPECT_EQ(wp[i].grad().dtype(), DType::F32);  // applied in fp32
      EXPECT_EQ(values(wp[i].grad()), values(pp[i].grad().to(comm)));
    }
  }
}

TEST(DistributedDataParallel, HalfParametersGetFp32MeansWhenTheyTravelInFp32) {
  MlpCase s;
  {
    NoGrad ng;
    s.model->to(DType::BF16);
  }
  dist::DistributedDataParallel ddp(*s.model, dist::single_process());
  cross_entropy((*s.model)(s.x.to(DType::BF16)), s.y).backward();
  std::vector<std::vector<float>> before;
  for (const Tensor& p : s.model->parameters())
    before.push_back(values(p.grad()));
  ddp.finish_gradients();
  const std::vector<Tensor> params = s.model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].grad().dtype(), DType::F32);
    EXPECT_EQ(values(params[i].grad()), before[i]);  // bf16 values are exact in fp32
  }
}

TEST(DistributedDataParallel, AccumulationCommunicatesOnlyOnTheLastMicroBatch) {
  MlpCase plain, wrapped;
  plain.backward();
  plain.backward();  // two micro-batches: the gradients add up
  dist::DistributedDataParallel ddp(*wrapped.model, dist::single_process());
  ddp.set_require_sync(false);
  wrapped.backward();
  EXPECT_THROW(ddp.finish_gradients(), Error);  // nothing to finish without a synced backward
  ddp.set_require_sync(true);
  wrapped.backward();
  ddp.finish_gradients();
  EXPECT_EQ(plain.grads(), wrapped.grads());
  EXPECT_EQ(ddp.last_step().launched_in_backward, ddp.last_step().buckets);
  // Two synced backward passes in one step: the second would miss the buckets already sent.
  wrapped.backward();
  EXPECT_THROW(wrapped.backward(), Error);
}

TEST(DistributedDataParallel, ParametersWithoutAGradientCountAsZeros) {
  nn::Sequential model;
  auto used = model.push_back(std::make_shared<nn::Linear>(4, 3, 1));
  auto unused = model.push_back(std::make_shared<nn::Linear>(4, 3, 2));
  dist::DistributedDataParallel ddp(model, dist::single_process(), {.bucket_mb = 1e-5});
  sum((*used)(Tensor::ones({2, 4}))).backward();
  ddp.finish_gradients();  // does not wait for the unused parameters' hooks forever
  EXPECT_LT(ddp.last_step().launched_in_backward, ddp.last_step().buckets);
  for (const Tensor& p : unused->parameters())
    for (float v : values(p.grad()))
      EXPECT_EQ(v, 0.0f);
}

TEST(Zero, SegmentsTileABucketInEqualParts) {
  for (const int64_t n : {int64_t(1), int64_t(7), int64_t(1000), int64_t(200704)}) {
    for (const int world : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const optim::ElementRange seg = dist::zero_segment(n, r, world);
        EXPECT_EQ(seg.begin, next);
        EXPECT_LE(std::abs(seg.size() - n / world), 1) << n << " over " << world;
        next = seg.end;
      }
      EXPECT_EQ(next, n);
    }
  }
  EXPECT_THROW(dist::zero_segment(10, 2, 2), Error);
}

TEST(Zero, OneRankOwnsEverythingAndStepsAsWithoutIt) {
  MlpCase plain, wrapped;
  optim::AdamW plain_opt(plain.model->parameters(), {.lr = 0.01});
  optim::AdamW opt(wrapped.model->parameters(), {.lr = 0.01});
  dist::DistributedDataParallel ddp(*wrapped.model, dist::single_process(),
                                    {.bucket_mb = 0.25, .zero_stage = 1});
  opt.set_owned_ranges(ddp.owned_ranges(opt.params()));
  for (int step = 0; step < 3; ++step) {
    plain_opt.zero_grad();
    plain.backward();
    plain_opt.step();
    opt.zero_grad();
    wrapped.backward();
    ddp.finish_gradients();
    opt.step();
    ddp.all_gather_parameters();
  }
  EXPECT_EQ(ddp.zero_stage(), 1);
  EXPECT_FALSE(ddp.norm_combiner() == nullptr);
  EXPECT_EQ(plain.grads(), wrapped.grads());
  const std::vector<Tensor> pp = plain.model->parameters(), wp = wrapped.model->parameters();
  for (size_t i = 0; i < pp.size(); ++i)
    EXPECT_EQ(values(wp[i]), values(pp[i])) << i;
  EXPECT_EQ(opt.state_nbytes(), plain_opt.state_nbytes());
  // The checkpoint's state is what the unsharded optimizer writes.
  const NamedTensors gathered = ddp.gather_optimizer_state(opt);
  const NamedTensors expected = plain_opt.state_dict();
  ASSERT_EQ(gathered.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(gathered[i].first, expected[i].first);
    EXPECT_EQ(gathered[i].second.shape(), expected[i].second.shape()) << expected[i].first;
    EXPECT_EQ(gathered[i].second.dtype(), expected[i].second.dtype()) << expected[i].first;
    EXPECT_EQ(values(gathered[i].second), values(expected[i].second)) << expected[i].first;
  }
  // A parameter the model does not have cannot be owned.
  Tensor stranger = Tensor::zeros({3});
  stranger.set_requires_grad();
  EXPECT_THROW(ddp.owned_ranges({stranger}), Error);
  EXPECT_EQ(ddp.owned_range(0, 0), (optim::ElementRange{0, wp[0].numel()}));
}

TEST(DistributedDataParallel, MistakesAreNamed) {
  MlpCase s;
  EXPECT_THROW(
      dist::DistributedDataParallel(*s.model, dist::single_process(), {.grad_comm = DType::F64}),
      Error);
  EXPECT_THROW(dist::DistributedDataParallel(*s.model, dist::single_process(), {.bucket_mb = 0}),
               Error);
  config::TrainConfig c;
  c.set("grad-comm", "bf16");
  EXPECT_THROW(c.validate(), Error);  // --grad-comm without --distributed
  c.distributed = true;
  EXPECT_NO_THROW(c.validate());
  EXPECT_THROW(c.set("grad-comm", "fp8"), Error);  // not a word of --grad-comm
  c.set("grad-comm", "fp32");
  c.zero = 4;
  EXPECT_THROW(c.validate(), Error);  // no ZeRO-4
  c.zero = 3;
  c.underflow_every = 10;
  c.precision = amp::Precision::FP16;
  EXPECT_THROW(c.validate(), Error);  // --underflow-every needs the whole weights
  c.underflow_every = 0;
  c.precision = config::TrainConfig{}.precision;
  c.zero = 2;
  EXPECT_NO_THROW(c.validate());
  c.distributed = false;
  EXPECT_THROW(c.validate(), Error);  // --zero without --distributed
  EXPECT_THROW(dist::DistributedDataParallel(*s.model, dist::single_process(), {.zero_stage = 4}),
               Error);
  if (!dist::mpi_built()) {
    try {
      dist::mpi_world();
      ADD_FAILURE() << "mpi_world() in a build without MPI";
    } catch (const Error& e) {
      EXPECT_NE(e.message().find("apt-get install openmpi-bin"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace mantissa
