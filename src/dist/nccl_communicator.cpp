// The ranks of an MPI job on their GPUs through NCCL (include/mantissa/dist/communicator.h): one
// NCCL communicator over all ranks, set up with rank 0's unique id sent over MPI, and a stream of
// its own on which every collective runs after the submitting thread's queued work.
#include "mantissa/core/error.h"
#include "mantissa/dist/communicator.h"

#ifdef MANTISSA_HAS_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <vector>

#include "mantissa/core/cuda.h"
#endif

namespace mantissa::dist {

bool nccl_built() {
#ifdef MANTISSA_HAS_NCCL
  return true;
#else
  return false;
#endif
}

#ifdef MANTISSA_HAS_NCCL

namespace {

class NcclWorld final : public Communicator {
 public:
  explicit NcclWorld(int device) : device_(device) {
    MT_CHECK(cuda::is_available() && device >= 0 && device < cuda::device_count(),
             "NCCL: no CUDA device ", device, " here (",
             cuda::is_available() ? cuda::device_count() : 0,
             " visible); data parallel on GPUs needs one GPU per rank");
    const std::shared_ptr<Communicator> mpi = mpi_world();
    rank_ = mpi->rank();
    size_ = mpi->world_size();
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    Tensor bytes = Tensor::empty({int64_t(sizeof id)}, DType::U8);
    std::memcpy(bytes.data_ptr(), &id, sizeof id);
    mpi->broadcast(bytes, 0);
    std::memcpy(&id, bytes.data_ptr(), sizeof id);
    check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    stream_ = cuda::Stream::create(device_);
    scratch_ = Tensor::zeros({1}, DType::F32, Device::cuda(device_));
  }

  ~NcclWorld() override {
    stop_worker();
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string backend() const override { return "nccl"; }

  void all_reduce_now(Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    if (t.numel() == 0) return;
    check(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), type_of(t, "all_reduce"),
                        op == ReduceOp::Sum ? ncclSum : ncclMax, comm_, stream()),
          "all_reduce");
    finish("all_reduce");
  }

  void broadcast_now(Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    MT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of ", size_);
    check(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, comm_, stream()),
          "broadcast");
    finish("broadcast");
  }

  void reduce_scatter_now(const Tensor& in, Tensor& out, std::span<const int64_t> counts) override {
    check_segments("reduce_scatter", counts, in, &out);
    check_tensor(in, "reduce_scatter");
    const ncclDataType_t type = type_of(in, "reduce_scatter");
    const auto* base = static_cast<const char*>(in.data_ptr());
    const size_t unit = in.element_size();
    if (equal(counts)) {
      check(ncclReduceScatter(in.data_ptr(), out.data_ptr(), size_t(counts[0]), type, ncclSum,
                              comm_, stream()),
            "reduce_scatter");
    } else {
      // Unequal segments: one reduce to each segment's rank, in one group.
      check(ncclGroupStart(), "reduce_scatter");
      size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        const auto n = size_t(counts[size_t(r)]);
        check(ncclReduce(base + off * unit, out.data_ptr(), n, type, ncclSum, r, comm_, stream()),
              "reduce_scatter");
        off += n;
      }
      check(ncclGroupEnd(), "reduce_scatter");
    }
    finish("reduce_scatter");
  }

  void all_gather_now(Tensor& t, std::span<const int64_t> counts) override {
    check_segments("all_gather", counts, t, nullptr);
    check_tensor(t, "all_gather");
    auto* base = static_cast<char*>(t.data_ptr());
    const size_t unit = t.element_size();
    if (equal(counts)) {
      const size_t n = size_t(counts[0]) * unit;
      check(ncclAllGather(base + size_t(rank_) * n, base, n, ncclUint8, comm_, stream()),
            "all_gather");
    } else {
      // Unequal segments: each rank broadcasts its own, in one group (bytes: any dtype).
      check(ncclGroupStart(), "all_gather");
      size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        const size_t n = size_t(counts[size_t(r)]) * unit;
        check(ncclBroadcast(base + off, base + off, n, ncclUint8, r, comm_, stream()),
              "all_gather");
        off += n;
      }
      check(ncclGroupEnd(), "all_gather");
    }
    finish("all_gather");
  }

  void gather_now(const Tensor& mine, Tensor& all, std::span<const int64_t> counts,
                  int root) override {
    MT_CHECK(root >= 0 && root < size_, "gather: root ", root, " is not a rank of ", size_);
    check_tensor(mine, "gather");
    const size_t unit = mine.element_size();
    check(ncclGroupStart(), "gather");
    if (rank_ == root) {
      check_segments("gather", counts, all, &mine);
      check_tensor(all, "gather");
      auto* base = static_cast<char*>(all.data_ptr());
      size_t off = 0;
      for (int r = 0; r < size_; ++r) {
        const size_t n = size_t(counts[size_t(r)]) * unit;
        if (r == root) {
          check_cuda(
              cudaMemcpyAsync(base + off, mine.data_ptr(), n, cudaMemcpyDeviceToDevice, stream()),
              "cudaMemcpyAsync");
        } else if (n > 0) {
          check(ncclRecv(base + off, n, ncclUint8, r, comm_, stream()), "gather");
        }
        off += n;
      }
    } else if (mine.numel() > 0) {
      check(ncclSend(mine.data_ptr(), mine.nbytes(), ncclUint8, root, comm_, stream()), "gather");
    }
    check(ncclGroupEnd(), "gather");
    finish("gather");
  }

  void barrier_now() override {
    check(ncclAllReduce(scratch_.data_ptr(), scratch_.data_ptr(), 1, ncclFloat32, ncclSum, comm_,
                        stream()),
          "barrier");
    finish("barrier");
  }

 protected:
  std::function<void()> bind_job(std::function<void()> job) override {
    // The tensors of the job are written by kernels the caller queued on its current stream:
    // the collective waits for them there, not for everything queued by the time it starts.
    auto ready = std::make_shared<cuda::Event>();
    ready->record(cuda::current_stream(device_));
    return [this, ready, job = std::move(job)] {
      check_cuda(cudaSetDevice(device_), "cudaSetDevice");
      ready->wait(stream_);
      job();
    };
  }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(stream_.handle()); }

  static bool equal(std::span<const int64_t> counts) {
    for (const int64_t c : counts) {
      if (c != counts[0]) return false;
    }
    return true;
  }

  ncclDataType_t type_of(const Tensor& t, const char* what) const {
    switch (t.dtype()) {
      case DType::F32:
        return ncclFloat32;
      case DType::F64:
        return ncclFloat64;
      case DType::I32:
        return ncclInt32;
      case DType::I64:
        return ncclInt64;
      case DType::BF16:
        return ncclBfloat16;
      case DType::F16:
        return ncclFloat16;
      default:
        MT_CHECK(false, what, ": ", t.describe(),
                 " has no reduction here; use f32, f64, i32, i64, bf16 or f16");
    }
  }

  void check_tensor(const Tensor& t, const char* what) const {
    MT_CHECK(t.defined() && t.is_contiguous() && t.device() == Device::cuda(device_), what,
             ": the NCCL communicator takes contiguous tensors on cuda:", device_, ", got ",
             t.defined() ? t.describe() : std::string("an undefined tensor"));
  }

  void check(ncclResult_t rc, const char* what) const {
    MT_CHECK(rc == ncclSuccess, "rank ", rank_, " of ", size_, ": NCCL ", what,
             " failed: ", ncclGetErrorString(rc),
             " (another rank may have stopped; see its output)");
  }

  void check_cuda(cudaError_t rc, const char* what) const {
    MT_CHECK(rc == cudaSuccess, "rank ", rank_, ": ", what, " failed: ", cudaGetErrorString(rc));
  }

  // Waits for the collective: the caller's future then means it is done.
  void finish(const char* what) const { check_cuda(cudaStreamSynchronize(stream()), what); }

  int device_ = 0;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cuda::Stream stream_;
  Tensor scratch_;
};

}  // namespace

std::shared_ptr<Communicator> nccl_world(int device) {
  return std::make_shared<NcclWorld>(device);
}

#else  // no NCCL in this build

std::shared_ptr<Communicator> nccl_world(int device) {
  (void)device;
  MT_CHECK(false,
           "this build of Mantissa has no NCCL, so it cannot run data parallel on GPUs: it needs "
           "the CUDA backend, MPI (apt-get install openmpi-bin libopenmpi-dev) and NCCL (in the "
           "CUDA toolkit, or apt-get install libnccl-dev), then a rebuild");
}

#endif

}  // namespace mantissa::dist
