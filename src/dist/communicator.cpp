// The communicator's worker thread (one per communicator: its collectives run there in the order
// they were submitted) and the one-process communicator.
#include "mantissa/dist/communicator.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/error.h"
#include "mantissa/core/stop_signals.h"

namespace mantissa::dist {

struct Communicator::Worker {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::packaged_task<void()>> jobs;
  bool stopping = false;
  std::thread thread;

  void run() {
    block_stop_signals_on_this_thread();  // Ctrl-C is the main thread's (stop_signals.h)
    for (;;) {
      std::packaged_task<void()> job;
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return stopping || !jobs.empty(); });
        if (jobs.empty()) return;  // stopping, and every job ran
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      job();  // an exception lands in the job's future
    }
  }
};

Communicator::Communicator() : worker_(std::make_shared<Worker>()) {}

void Communicator::stop_worker() {
  if (!worker_) return;
  {
    std::lock_guard lock(worker_->mu);
    worker_->stopping = true;
  }
  worker_->cv.notify_all();
  if (worker_->thread.joinable()) worker_->thread.join();
  worker_.reset();
}

std::future<void> Communicator::submit(std::function<void()> job) {
  MT_ASSERT(worker_, "submit() on a stopped communicator");
  std::packaged_task<void()> task(bind_job(std::move(job)));
  std::future<void> done = task.get_future();
  {
    std::lock_guard lock(worker_->mu);
    MT_ASSERT(!worker_->stopping, "submit() on a stopping communicator");
    worker_->jobs.push_back(std::move(task));
    if (!worker_->thread.joinable())
      worker_->thread = std::thread([w = worker_.get()] { w->run(); });
  }
  worker_->cv.notify_one();
  return done;
}

void Communicator::all_reduce(Tensor& t, ReduceOp op) {
  submit([&] { all_reduce_now(t, op); }).get();
}

void Communicator::broadcast(Tensor& t, int root) {
  submit([&] { broadcast_now(t, root); }).get();
}

void Communicator::reduce_scatter(const Tensor& in, Tensor& out, std::span<const int64_t> counts) {
  submit([&] { reduce_scatter_now(in, out, counts); }).get();
}

void Communicator::reduce_scatter_accumulate(const Tensor& in, Tensor& out,
                                             std::span<const int64_t> counts) {
  submit([&] { reduce_scatter_accumulate_now(in, out, counts); }).get();
}

void Communicator::reduce_scatter_accumulate_now(const Tensor& in, Tensor& out,
                                                 std::span<const int64_t> counts) {
  check_segments("reduce_scatter_accumulate", counts, in, nullptr);
  // `out` may be wider than the wire (an fp32 mean of bf16 terms).
  MT_CHECK(out.defined() && out.is_contiguous() && out.device() == in.device() &&
               out.numel() == counts[size_t(rank())] && in.is_floating_point() &&
               out.is_floating_point(),
           "reduce_scatter_accumulate: rank ", rank(), "'s segment must be a contiguous float ",
           "tensor of ", counts[size_t(rank())], " elements on ", in.device().str(),
           " for the float sum of ", in.describe(), ", got ",
           out.defined() ? out.describe() : std::string("an undefined tensor"));
  NoGrad ng;
  const int me = rank(), world = world_size();
  // Rank r receives every rank's segment r, side by side in rank order.
  Tensor received;
  int64_t off = 0;
  for (int r = 0; r < world; ++r) {
    const int64_t n = counts[size_t(r)];
    const std::vector<int64_t> each(size_t(world), n);
    Tensor all = r == me ? Tensor::empty({n * world}, in.dtype(), in.device()) : Tensor();
    gather_now(in.narrow(0, off, n), all, each, r);
    if (r == me) received = all;
    off += n;
  }
  const int64_t n = counts[size_t(me)];
  if (n == 0) return;
  Tensor sum = received.narrow(0, 0, n).to(DType::F32);
  for (int r = 1; r < world; ++r)
    sum.add_(received.narrow(0, n * r, n).to(DType::F32));
  out.copy_(sum);  // the one rounding
  // A GPU's additions were queued on this thread's stream: done before the job is.
  if (in.device().is_cuda()) cuda::current_stream(in.device().index).synchronize();
}

void Communicator::all_gather(Tensor& t, std::span<const int64_t> counts) {
  submit([&] { all_gather_now(t, counts); }).get();
}

void Communicator::gather(const Tensor& mine, Tensor& all, std::span<const int64_t> counts,
                          int root) {
  submit([&] { gather_now(mine, all, counts, root); }).get();
}

void Communicator::check_segments(const char* what, std::span<const int64_t> counts,
                                  const Tensor& whole, const Tensor* part) const {
  MT_CHECK(int(counts.size()) == world_size(), what, ": ", counts.size(),
           " segment counts for a world of ", world_size(), " ranks; give one per rank");
  int64_t total = 0;
  for (const int64_t c : counts) {
    MT_CHECK(c >= 0, what, ": a segment count is negative (", c, ")");
    total += c;
  }
  MT_CHECK(whole.defined() && whole.is_contiguous() && whole.numel() == total, what,
           ": the whole tensor must be contiguous with the ", total,
           " elements the counts add up to, got ",
           whole.defined() ? whole.describe() : std::string("an undefined tensor"));
  if (part == nullptr) return;
  MT_CHECK(part->defined() && part->is_contiguous() && part->dtype() == whole.dtype() &&
               part->device() == whole.device() && part->numel() == counts[size_t(rank())],
           what, ": rank ", rank(), "'s segment must be a contiguous ", dtype_name(whole.dtype()),
           " tensor of ", counts[size_t(rank())], " elements on ", whole.device().str(), ", got ",
           part->defined() ? part->describe() : std::string("an undefined tensor"));
}

void Communicator::barrier() {
  submit([&] { barrier_now(); }).get();
}

namespace {

class SingleProcess final : public Communicator {
 public:
  ~SingleProcess() override { stop_worker(); }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void all_reduce_now(Tensor& t, ReduceOp) override {
    MT_CHECK(t.is_contiguous(), "all_reduce: the tensor must be contiguous, got ", t.describe());
  }
  void broadcast_now(Tensor& t, int root) override {
    MT_CHECK(root == 0, "broadcast: root ", root, " is not a rank of a one-process run");
    (void)t;
  }
  void reduce_scatter_now(const Tensor& in, Tensor& out, std::span<const int64_t> counts) override {
    check_segments("reduce_scatter", counts, in, &out);
    out.copy_(in.reshape(out.shape()));
  }
  void all_gather_now(Tensor& t, std::span<const int64_t> counts) override {
    check_segments("all_gather", counts, t, nullptr);
  }
  void gather_now(const Tensor& mine, Tensor& all, std::span<const int64_t> counts,
                  int root) override {
    MT_CHECK(root == 0, "gather: root ", root, " is not a rank of a one-process run");
    check_segments("gather", counts, all, &mine);
    all.copy_(mine.reshape(all.shape()));
  }
  void barrier_now() override {}
};

}  // namespace

std::shared_ptr<Communicator> single_process() {
  return std::make_shared<SingleProcess>();
}

}  // namespace mantissa::dist
