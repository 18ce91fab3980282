// The communicator's worker thread (one per communicator: its collectives run there in the order
// they were submitted) and the one-process communicator.
#include "mantissa/dist/communicator.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "mantissa/core/error.h"

namespace mantissa::dist {

struct Communicator::Worker {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::packaged_task<void()>> jobs;
  bool stopping = false;
  std::thread thread;

  void run() {
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
  std::packaged_task<void()> task(std::move(job));
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
  void barrier_now() override {}
};

}  // namespace

std::shared_ptr<Communicator> single_process() {
  return std::make_shared<SingleProcess>();
}

}  // namespace mantissa::dist
