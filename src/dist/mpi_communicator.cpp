// MPI_COMM_WORLD as a Communicator (OpenMPI from Debian; any MPI-3 library), and what a build
// without MPI says instead. Collectives run on the communicator's worker thread only, so MPI is
// initialized with MPI_THREAD_SERIALIZED (one thread in MPI at a time): after MPI_Init the main
// thread calls MPI only through submit(), or in abort_job when it stops the job.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mantissa/core/error.h"
#include "mantissa/dist/communicator.h"
#include "mantissa/numerics/convert.h"

#ifdef MANTISSA_HAS_MPI
#include <mpi.h>
#endif

namespace mantissa::dist {

bool mpi_built() {
#ifdef MANTISSA_HAS_MPI
  return true;
#else
  return false;
#endif
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    if (std::getenv(v)) return true;
  }
  return false;
}

int launched_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  }
  return 1;
}

int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* s = std::getenv(v)) return std::atoi(s);
  }
  return 0;
}

#ifdef MANTISSA_HAS_MPI

namespace {

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, size_t(len));
}

// Half-precision sums: each pairwise addition in fp32, rounded to nearest-even on store.
template <typename H>
void half_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  constexpr int kChunk = 1024;
  float a[kChunk], b[kChunk];
  auto* x = static_cast<const H*>(in);
  auto* y = static_cast<H*>(inout);
  for (int start = 0; start < *len; start += kChunk) {
    const size_t n = size_t(std::min(kChunk, *len - start));
    convert(x + start, a, n);
    convert(y + start, b, n);
    for (size_t i = 0; i < n; ++i)
      b[i] += a[i];
    convert(b, y + start, n);
  }
}

// Maxima where a NaN wins (MPI_MAX and fmax drop it): a NaN flag on one rank must reach all.
// Halves compare as floats, float and double as themselves.
template <typename T>
auto comparable(const T& v) {
  if constexpr (std::is_floating_point_v<T>) {
    return v;
  } else {
    float f;
    convert(&v, &f, 1);
    return f;
  }
}

template <typename T>
void nan_max(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* x = static_cast<const T*>(in);
  auto* y = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const auto a = comparable(x[i]), b = comparable(y[i]);
    if (a > b || a != a) y[i] = x[i];
  }
}

class MpiWorld final : public Communicator {
 public:
  MpiWorld() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      MT_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: ", mpi_error(rc));
      MT_CHECK(provided >= MPI_THREAD_SERIALIZED, "this MPI library provides thread level ",
               provided,
               " but Mantissa needs MPI_THREAD_SERIALIZED (its collectives run on a worker "
               "thread); use an MPI built with thread support (OpenMPI from Debian has it)");
      owns_mpi_ = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    // Errors come back as codes (turned into mantissa::Error naming the rank), not aborts.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Op_create(&half_sum<bfloat16>, 1, &bf16_sum_);
    MPI_Op_create(&half_sum<half>, 1, &f16_sum_);
    MPI_Op_create(&nan_max<bfloat16>, 1, &bf16_max_);
    MPI_Op_create(&nan_max<half>, 1, &f16_max_);
    MPI_Op_create(&nan_max<float>, 1, &f32_max_);
    MPI_Op_create(&nan_max<double>, 1, &f64_max_);
  }

  ~MpiWorld() override {
    stop_worker();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (MPI_Op* op : {&bf16_sum_, &f16_sum_, &bf16_max_, &f16_max_, &f32_max_, &f64_max_})
      MPI_Op_free(op);
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce_now(Tensor& t, ReduceOp op) override {
    check_tensor(t, "all_reduce");
    if (t.numel() == 0) return;
    const auto [type, mop] = reduction(t, op, "all_reduce");
    for_chunks(
        t, [&](void* p, int n) { return MPI_Allreduce(MPI_IN_PLACE, p, n, type, mop, comm_); },
        "all_reduce");
  }

  void reduce_scatter_now(const Tensor& in, Tensor& out, std::span<const int64_t> counts) override {
    check_segments("reduce_scatter", counts, in, &out);
    check_tensor(in, "reduce_scatter");
    const std::vector<int> n = int_counts(counts, 1, "reduce_scatter");
    const auto [type, mop] = reduction(in, ReduceOp::Sum, "reduce_scatter");
    // MPI reads `in` (const in MPI-3) and writes only `out`.
    check(MPI_Reduce_scatter(in.data_ptr(), out.data_ptr(), n.data(), type, mop, comm_),
          "reduce_scatter");
  }

  void all_gather_now(Tensor& t, std::span<const int64_t> counts) override {
    check_segments("all_gather", counts, t, nullptr);
    check_tensor(t, "all_gather");
    // Bytes: any dtype, bit for bit; each rank's segment is already in place.
    const std::vector<int> n = int_counts(counts, int64_t(t.element_size()), "all_gather");
    const std::vector<int> displs = displacements(n, "all_gather");
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, t.data_ptr(), n.data(), displs.data(),
                         MPI_BYTE, comm_),
          "all_gather");
  }

  void broadcast_now(Tensor& t, int root) override {
    check_tensor(t, "broadcast");
    MT_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of ", size_);
    // Bytes: any dtype, bit for bit.
    for_chunks(
        t, [&](void* p, int n) { return MPI_Bcast(p, n, MPI_BYTE, root, comm_); }, "broadcast",
        /*bytes=*/true);
  }

  void gather_now(const Tensor& mine, Tensor& all, std::span<const int64_t> counts,
                  int root) override {
    MT_CHECK(root >= 0 && root < size_, "gather: root ", root, " is not a rank of ", size_);
    check_tensor(mine, "gather");
    MT_CHECK(mine.numel() == counts[size_t(rank_)], "gather: rank ", rank_, " sends ", mine.numel(),
             " elements but its count is ", counts[size_t(rank_)]);
    const int64_t unit = int64_t(mine.element_size());
    const std::vector<int> n = int_counts(counts, unit, "gather");
    const std::vector<int> displs = displacements(n, "gather");
    void* out = nullptr;
    if (rank_ == root) {
      check_segments("gather", counts, all, &mine);
      check_tensor(all, "gather");
      out = all.data_ptr();
    }
    check(MPI_Gatherv(mine.data_ptr(), n[size_t(rank_)], MPI_BYTE, out, n.data(), displs.data(),
                      MPI_BYTE, root, comm_),
          "gather");
  }

  void barrier_now() override { check(MPI_Barrier(comm_), "barrier"); }

 private:
  static constexpr int64_t kMaxCount = (int64_t(1) << 31) - 1;

  // The MPI type and operation of a reduction over t's dtype.
  std::pair<MPI_Datatype, MPI_Op> reduction(const Tensor& t, ReduceOp op, const char* what) const {
    const bool sum = op == ReduceOp::Sum;
    switch (t.dtype()) {
      case DType::F32:
        return {MPI_FLOAT, sum ? MPI_SUM : f32_max_};
      case DType::F64:
        return {MPI_DOUBLE, sum ? MPI_SUM : f64_max_};
      case DType::I32:
        return {MPI_INT32_T, sum ? MPI_SUM : MPI_MAX};
      case DType::I64:
        return {MPI_INT64_T, sum ? MPI_SUM : MPI_MAX};
      case DType::BF16:
        return {MPI_UINT16_T, sum ? bf16_sum_ : bf16_max_};
      case DType::F16:
        return {MPI_UINT16_T, sum ? f16_sum_ : f16_max_};
      default:
        MT_CHECK(false, what, ": ", t.describe(),
                 " has no reduction here; use f32, f64, i32, i64, bf16 or f16");
    }
  }

  // Segment counts in MPI's ints, in units of `unit` bytes each (1: elements as they are).
  static std::vector<int> int_counts(std::span<const int64_t> counts, int64_t unit,
                                     const char* what) {
    std::vector<int> out;
    for (const int64_t c : counts) {
      MT_CHECK(c * unit <= kMaxCount, what, ": a segment of ", c * unit,
               " units is more than an MPI count reaches (2^31 - 1); use smaller buckets");
      out.push_back(int(c * unit));
    }
    return out;
  }

  // Where each segment starts (MPI's int displacements).
  static std::vector<int> displacements(const std::vector<int>& n, const char* what) {
    std::vector<int> displs;
    int64_t at = 0;
    for (const int c : n) {
      displs.push_back(int(at));
      at += c;
    }
    MT_CHECK(at <= kMaxCount, what, ": ", at,
             " units at once is more than MPI's int offsets reach; use smaller buckets");
    return displs;
  }

  void check_tensor(const Tensor& t, const char* what) const {
    MT_CHECK(t.defined() && t.is_contiguous() && t.device().is_cpu(), what,
             ": the MPI communicator takes contiguous CPU tensors, got ",
             t.defined() ? t.describe() : std::string("an undefined tensor"),
             " (CUDA tensors go through NCCL)");
  }

  void check(int rc, const char* what) const {
    MT_CHECK(rc == MPI_SUCCESS, "rank ", rank_, " of ", size_, ": MPI ", what,
             " failed: ", mpi_error(rc), " (another rank may have stopped; see its output)");
  }

  // MPI counts are ints: a tensor of more than 2^30 units (elements, or bytes) goes in pieces.
  template <typename F>
  void for_chunks(Tensor& t, F f, const char* what, bool bytes = false) const {
    const int64_t unit = bytes ? 1 : int64_t(t.element_size());  // bytes per counted unit
    const int64_t total = int64_t(t.nbytes()) / unit;
    constexpr int64_t kMax = int64_t(1) << 30;
    auto* base = static_cast<char*>(t.data_ptr());
    for (int64_t start = 0; start < total; start += kMax)
      check(f(base + start * unit, int(std::min(kMax, total - start))), what);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
  MPI_Op bf16_sum_ = MPI_OP_NULL, f16_sum_ = MPI_OP_NULL;
  MPI_Op bf16_max_ = MPI_OP_NULL, f16_max_ = MPI_OP_NULL;
  MPI_Op f32_max_ = MPI_OP_NULL, f64_max_ = MPI_OP_NULL;
};

}  // namespace

std::shared_ptr<Communicator> mpi_world() {
  static std::mutex mu;
  static std::shared_ptr<Communicator> world;
  std::lock_guard lock(mu);
  if (!world) world = std::make_shared<MpiWorld>();
  return world;
}

[[noreturn]] void abort_job(const std::string& why, int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool live = initialized && !finalized;
  // Before MPI is up (a bad flag), the launcher's environment still names the rank.
  std::string rank;
  if (live) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    rank = std::to_string(r);
  } else if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) {
    rank = r;
  } else if (const char* p = std::getenv("PMI_RANK")) {
    rank = p;
  }
  const std::string who = rank.empty() ? "" : "rank " + rank + ": ";
  std::fprintf(stderr, "mantissa: %s%s\n", who.c_str(), why.c_str());
  std::fflush(stderr);
  if (live) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

#else  // no MPI in this build

std::shared_ptr<Communicator> mpi_world() {
  MT_CHECK(false,
           "this build of Mantissa has no MPI, so it cannot run distributed: install OpenMPI "
           "(Debian: apt-get install openmpi-bin libopenmpi-dev; scripts/setup does it) and "
           "rebuild with -DMANTISSA_MPI=AUTO or ON");
}

[[noreturn]] void abort_job(const std::string& why, int code) {
  std::fprintf(stderr, "mantissa: %s\n", why.c_str());
  std::exit(code);
}

#endif

}  // namespace mantissa::dist
