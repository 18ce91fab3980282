// Communicators: collective operations across the processes (ranks) of a data-parallel run, on
// a proven library — MPI (OpenMPI) for CPU tensors and as the launcher (mpirun), NCCL for CUDA
// tensors. Every collective is called by every rank in the same order (MPI's rule).
//
//   auto world = mantissa::dist::mpi_world();   // under `mpirun -n 2 ...`
//   Tensor g = ...;                               // the same shape on every rank
//   world->all_reduce(g, dist::ReduceOp::Sum);    // g = the sum over the ranks
//
// All collectives of one communicator run on its own thread, one after the other in the order
// they were submitted (`submit`), so a caller can overlap them with its own work (the DDP
// buckets, during backward) and still issue them in one order on every rank; the blocking
// methods submit and wait. A rank whose collective fails (a peer died, MPI reported an error)
// gets a mantissa::Error naming the operation, the rank and the cause.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>

#include "mantissa/tensor/tensor.h"

namespace mantissa::dist {

enum class ReduceOp { Sum, Max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "single" (one process, no library), "mpi", "nccl".
  virtual std::string backend() const = 0;

  // In place over a contiguous tensor (the same shape and dtype on every rank): f32, f64, i32,
  // i64 natively; bf16 and f16 summed pairwise in fp32 and rounded to nearest-even after each
  // addition (what a half-precision reduction does; the order is the library's). A float Max
  // keeps a NaN (a NaN flag on one rank reaches every rank).
  void all_reduce(Tensor& t, ReduceOp op);
  // Root's values into t on every rank.
  void broadcast(Tensor& t, int root);
  // The sum over the ranks of `in` (counts[0] + ... + counts[N-1] elements, the same on every
  // rank), of which this rank keeps its segment: `out` (counts[rank] elements) receives elements
  // counts[0] + ... + counts[rank-1] onwards. What ZeRO-1 does with gradients: each rank gets
  // the mean of the part it updates. Dtypes and the half-precision sums as all_reduce's Sum.
  void reduce_scatter(const Tensor& in, Tensor& out, std::span<const int64_t> counts);
  // reduce_scatter's sum with its terms sent in `in`'s dtype (bf16 or f16 on the wire) but added
  // in fp32, in rank order, and rounded once into `out` (any float dtype): FSDP's bf16
  // reduce_dtype with fp32 accumulation. The result depends on the world size alone, never on
  // the library's reduction order, and has one rounding instead of one per addition. The same
  // bytes travel as reduce_scatter's (each rank sends segment r to rank r: one gather per rank).
  // `out` may be this rank's own segment of `in`: it is written after everything is sent.
  void reduce_scatter_accumulate(const Tensor& in, Tensor& out, std::span<const int64_t> counts);
  // In place: segment r of t (counts[r] elements at counts[0] + ... + counts[r-1]) is rank r's
  // on every rank afterwards; each rank's own segment is what it contributes. Any dtype, bit
  // for bit. What ZeRO-1 does with the updated parameters.
  void all_gather(Tensor& t, std::span<const int64_t> counts);
  // Every rank's `mine` (counts[rank] elements) into `all` on `root` only, segment r from rank
  // r (counts[0] + ... elements; other ranks may pass an undefined `all`). Any dtype, bit for
  // bit: how a ZeRO-1 checkpoint collects the sharded optimizer state on rank 0.
  void gather(const Tensor& mine, Tensor& all, std::span<const int64_t> counts, int root);
  void barrier();

  // Runs `job` on the communicator's thread after every job submitted before it; the future
  // rethrows what the job threw. Jobs call the *_now methods below.
  std::future<void> submit(std::function<void()> job);

  // The collectives themselves, on the calling thread: only for jobs (or single-threaded use
  // before any submit).
  virtual void all_reduce_now(Tensor& t, ReduceOp op) = 0;
  virtual void broadcast_now(Tensor& t, int root) = 0;
  virtual void reduce_scatter_now(const Tensor& in, Tensor& out,
                                  std::span<const int64_t> counts) = 0;
  // Built from gather_now and the tensor ops: the same on every backend.
  void reduce_scatter_accumulate_now(const Tensor& in, Tensor& out,
                                     std::span<const int64_t> counts);
  virtual void all_gather_now(Tensor& t, std::span<const int64_t> counts) = 0;
  virtual void gather_now(const Tensor& mine, Tensor& all, std::span<const int64_t> counts,
                          int root) = 0;
  virtual void barrier_now() = 0;

 protected:
  Communicator();
  // Stops the thread after the jobs already submitted; derived destructors call it first.
  void stop_worker();
  // Called by submit() on the submitting thread: what the job needs from there (a GPU
  // communicator records an event on the caller's stream and makes the job wait for it).
  virtual std::function<void()> bind_job(std::function<void()> job) { return job; }
  // The arguments of a reduce_scatter / all_gather checked (one count per rank, none negative,
  // sizes matching, contiguous): a mantissa::Error naming what is wrong.
  void check_segments(const char* what, std::span<const int64_t> counts, const Tensor& whole,
                      const Tensor* part) const;

 private:
  struct Worker;
  std::shared_ptr<Worker> worker_;
};

// One process alone: rank 0 of 1; every collective leaves its tensor as it is. What a run
// without --distributed uses, so the data-parallel code path is the same for one process.
std::shared_ptr<Communicator> single_process();

// Whether this build has MPI (MANTISSA_MPI), and whether this process was started by an MPI
// launcher (mpirun sets OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK).
bool mpi_built();
bool launched_by_mpi();
// The number of processes the launcher started (OMPI_COMM_WORLD_SIZE, PMI_SIZE); 1 without one.
int launched_world_size();

// MPI_COMM_WORLD, initialized on the first call (MPI_Init_thread; finalized at exit). Throws a
// mantissa::Error that says what to do when the build has no MPI.
std::shared_ptr<Communicator> mpi_world();

// Whether this build has NCCL (the CUDA backend, MPI and the NCCL library).
bool nccl_built();
// This process's rank among the ranks on its machine, from the launcher (OpenMPI's
// OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID, Slurm's SLURM_LOCALID); 0 without one.
int local_rank();
// The ranks of the MPI job through NCCL, each on its own GPU `device` (by convention
// local_rank() of the machine's GPUs): rank 0's NCCL id reaches the others over mpi_world(). Its
// collectives take contiguous CUDA tensors on that device and run on a stream of their own,
// after the work the submitting thread had queued on its current stream (an event), and return
// when done. Sums of bf16/f16 and the order of additions are NCCL's. Throws a mantissa::Error
// that says what is missing when the build has no NCCL.
std::shared_ptr<Communicator> nccl_world(int device);

// Stops every rank of the MPI job (MPI_Abort) after printing `why` with this rank's number:
// what a rank does when it cannot go on, so the others do not wait for it forever.
[[noreturn]] void abort_job(const std::string& why, int code = 1);

}  // namespace mantissa::dist
