// CUDA GEMM through cuBLASLt. cuBLASLt is column-major; a row-major out(M, N) = a(M, K) @ b(K, N)
// is computed as its transpose out^T(N, M) = b^T @ a^T, which is the same memory, so every
// operand is passed as-is with a transpose flag (row- or column-major views need no copy).
// Batches run as one strided-batched call; a broadcast batch is batch stride 0.
//
// Dtypes: f32 accumulates in fp32 (TF32 tensor cores when input_rounding is TF32, strict fp32
// otherwise), f16/bf16 in fp32 with a half output (one rounding), f64 in f64. What cuBLASLt
// cannot take directly (fp8 inputs, an input_rounding other than FP32/TF32) is widened to f32
// copies, rounded onto the format's grid, multiplied in strict fp32 and rounded once into the
// output, as the CPU backend does.
//
// One cuBLASLt handle per device (thread-safe, kept for the process: destroying it at exit would
// race the driver's own teardown); the chosen algorithm is cached per shape, layout, dtype and
// alignment, so a warm call only builds descriptors and launches.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/blas.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/dtype_map.h"
#include "backend/fp8_math.h"
#include "backend/shapes.h"
#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"

#define MT_CUBLAS_CHECK(expr)                                                                     \
  do {                                                                                            \
    const cublasStatus_t mt_cublas_st_ = (expr);                                                  \
    MT_CHECK(mt_cublas_st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt error in ", #expr, ": ",           \
             cublasLtGetStatusString(mt_cublas_st_), " (", static_cast<int>(mt_cublas_st_), ")"); \
  } while (0)

namespace mantissa::backend::cuda {
namespace {

// cuBLASLt picks faster split-K and stream-K kernels with room to work in.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cublasLtHandle_t lt_handle(int device) {
  static std::mutex mu;
  static std::vector<cublasLtHandle_t> handles;
  const std::lock_guard<std::mutex> lock(mu);
  if (size_t(device) >= handles.size()) handles.resize(device + 1, nullptr);
  if (!handles[device]) MT_CUBLAS_CHECK(cublasLtCreate(&handles[device]));
  return handles[device];
}

// ---- RAII for cuBLASLt descriptors ----------------------------------------------------------

struct OpDesc {
  cublasLtMatmulDesc_t d = nullptr;
  OpDesc(cublasComputeType_t compute, cudaDataType_t scale) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d, compute, scale));
  }
  ~OpDesc() { cublasLtMatmulDescDestroy(d); }
  OpDesc(const OpDesc&) = delete;
  OpDesc& operator=(const OpDesc&) = delete;
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& v) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
  }
};

struct Layout {
  cublasLtMatrixLayout_t d = nullptr;
  Layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld, int32_t batch,
         int64_t batch_stride) {
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, type, rows, cols, ld));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(d, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                                     sizeof(batch)));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(d, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                     &batch_stride, sizeof(batch_stride)));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(d); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct Preference {
  cublasLtMatmulPreference_t d = nullptr;
  Preference() { MT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(d); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d, attr, &v, sizeof(v)));
  }
};

// ---- operands -------------------------------------------------------------------------------

// A (B|1, R, C) tensor as cuBLASLt reads it (see lt_operand), with its batch stride.
struct Operand {
  const void* ptr = nullptr;
  cublasOperation_t op = CUBLAS_OP_N;
  uint64_t rows = 0, cols = 0;  // of the stored column-major matrix, before op
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

bool describe(const Tensor& t, int64_t nbatch, Operand& o) {
  LtOperand lo;
  if (!lt_operand(t.size(1), t.size(2), t.stride(1), t.stride(2), lo)) return false;
  o.ptr = t.data_ptr();
  o.op = lo.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  o.rows = uint64_t(lo.rows);
  o.cols = uint64_t(lo.cols);
  o.ld = lo.ld;
  o.batch_stride = (t.size(0) == 1 || nbatch == 1) ? 0 : t.stride(0);
  return true;
}

// cuBLASLt's type of each dtype. fp8 GEMMs need per-tensor scale factors and fp8-specific
// layouts this backend does not pass: they run on rounded f32 copies, as the integers would.
constexpr DTypeMapRow<cudaDataType_t> kCublasTypes[] = {
    {DType::F64, CUDA_R_64F},    {DType::F32, CUDA_R_32F},        {DType::F16, CUDA_R_16F},
    {DType::BF16, CUDA_R_16BF},  {DType::FP8_E4M3, kUnsupported}, {DType::FP8_E5M2, kUnsupported},
    {DType::I64, kUnsupported},  {DType::I32, kUnsupported},      {DType::U8, kUnsupported},
    {DType::Bool, kUnsupported},
};
static_assert(dtype_map_complete<kCublasTypes>());

cudaDataType_t cuda_type(DType d) {
  const std::optional<cudaDataType_t> t = dtype_map_lookup(kCublasTypes, d);
  MT_ASSERT(t.has_value(), "no cuBLASLt type for ", dtype_name(d));
  return *t;
}

// The largest power of two (at most 256) dividing the address: cuBLASLt's heuristic assumes
// 256-byte aligned buffers unless told otherwise, and views start anywhere.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0)
    al /= 2;
  return al;
}

// One cublasLtMatmul: D(N x M, column-major, ld N) = alpha * opA(A) @ opB(B) + beta * D, with
// A the operand of b and B the operand of a (the swapped product), D = out (contiguous).
struct Gemm {
  Operand A, B;
  void* d = nullptr;
  DType io_type = DType::F32;
  DType out_type = DType::F32;  // D's type: io_type, or F32 for f16/bf16 inputs (fp32 sums kept)
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  int64_t m = 0, n = 0, k = 0;  // D is m x n (m = N, n = M)
  int64_t nbatch = 1;
  bool accumulate = false;  // beta = 1: D already holds the bias
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  void* aux = nullptr;  // GELU_AUX: pre-activation output, ld m
};

// The heuristic's choice, cached per everything it depends on. Two threads asking for a new key
// at once both query cuBLASLt and store the same answer.
class AlgoCache {
 public:
  bool find(const std::vector<int64_t>& key, cublasLtMatmulAlgo_t& algo) {
    const std::lock_guard<std::mutex> lock(mu_);
    const auto it = cache_.find(key);
    if (it == cache_.end()) return false;
    algo = it->second;
    return true;
  }
  void put(const std::vector<int64_t>& key, const cublasLtMatmulAlgo_t& algo) {
    const std::lock_guard<std::mutex> lock(mu_);
    // Bounded: a workload with endlessly varying shapes re-queries instead of growing forever.
    if (cache_.size() >= 4096) cache_.clear();
    cache_[key] = algo;
  }

 private:
  std::mutex mu_;
  std::map<std::vector<int64_t>, cublasLtMatmulAlgo_t> cache_;
};

AlgoCache& algo_cache() {
  static AlgoCache cache;
  return cache;
}

// The heuristic's algorithm for `op` on these layouts and alignments, cached under `key`; false
// when cuBLASLt has none (an unsupported combination is NOT_SUPPORTED or INVALID_VALUE depending
// on the cuBLASLt version: either way the caller falls back or reports the shapes).
// `fp32_reduction`: only unsplit or fp32-reduced split-K algorithms, for outputs narrower than
// fp32 (split-K reducing "in place" or in the output type would round the output more than
// once; PyTorch's default for half GEMMs does the same).
bool find_algo(cublasLtHandle_t handle, const OpDesc& op, const Layout& la, const Layout& lb,
               const Layout& ld, const std::vector<int64_t>& key, uint32_t al_a, uint32_t al_b,
               uint32_t al_d, bool fp32_reduction, cublasLtMatmulAlgo_t& algo) {
  if (algo_cache().find(key, algo)) return true;
  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_d);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_d);
  if (fp32_reduction) {
    pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, op.d, la.d, lb.d, ld.d, ld.d,
                                                           pref.d, 1, &result, &count);
  if (st != CUBLAS_STATUS_SUCCESS || count == 0) return false;
  algo = result.algo;
  algo_cache().put(key, algo);
  return true;
}

// Runs g on the current stream; false (nothing queued) when cuBLASLt has no algorithm for it.
bool run(const Gemm& g, int device) {
  const cudaDataType_t type = cuda_type(g.io_type);
  const cudaDataType_t scale = g.io_type == DType::F64 ? CUDA_R_64F : CUDA_R_32F;
  OpDesc op(g.compute, scale);
  op.set(CUBLASLT_MATMUL_DESC_TRANSA, g.A.op);
  op.set(CUBLASLT_MATMUL_DESC_TRANSB, g.B.op);
  if (g.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    op.set(CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
    if (g.bias) op.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
    if (g.aux) {
      op.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux);
      op.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.m);
    }
  }
  const auto batch = static_cast<int32_t>(g.nbatch);
  Layout la(type, g.A.rows, g.A.cols, g.A.ld, batch, g.A.batch_stride);
  Layout lb(type, g.B.rows, g.B.cols, g.B.ld, batch, g.B.batch_stride);
  Layout ld(cuda_type(g.out_type), uint64_t(g.m), uint64_t(g.n), g.m, batch, g.m * g.n);

  const uint32_t al_a = alignment(g.A.ptr), al_b = alignment(g.B.ptr), al_d = alignment(g.d);
  const std::vector<int64_t> key = {device,
                                    int64_t(g.io_type),
                                    int64_t(g.out_type),
                                    int64_t(g.compute),
                                    int64_t(g.A.op),
                                    int64_t(g.B.op),
                                    g.m,
                                    g.n,
                                    g.k,
                                    g.A.ld,
                                    g.B.ld,
                                    g.nbatch,
                                    g.A.batch_stride,
                                    g.B.batch_stride,
                                    int64_t(g.epilogue),
                                    al_a,
                                    al_b,
                                    al_d,
                                    g.bias ? int64_t(alignment(g.bias)) : 0,
                                    g.aux ? int64_t(alignment(g.aux)) : 0};
  cublasLtHandle_t handle = lt_handle(device);
  cublasLtMatmulAlgo_t algo{};
  if (!find_algo(handle, op, la, lb, ld, key, al_a, al_b, al_d,
                 dtype_size(g.io_type) < dtype_size(DType::F32), algo))
    return false;
  const Tensor workspace = scratch(int64_t(kWorkspaceBytes), device);
  cudaStream_t stream = stream_for(device);
  if (g.io_type == DType::F64) {
    const double alpha = 1.0, beta = g.accumulate ? 1.0 : 0.0;
    MT_CUBLAS_CHECK(cublasLtMatmul(handle, op.d, &alpha, g.A.ptr, la.d, g.B.ptr, lb.d, &beta, g.d,
                                   ld.d, g.d, ld.d, &algo, workspace.data_ptr(), kWorkspaceBytes,
                                   stream));
  } else {
    const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    MT_CUBLAS_CHECK(cublasLtMatmul(handle, op.d, &alpha, g.A.ptr, la.d, g.B.ptr, lb.d, &beta, g.d,
                                   ld.d, g.d, ld.d, &algo, workspace.data_ptr(), kWorkspaceBytes,
                                   stream));
  }
  return true;
}

// A contiguous copy of t in `dtype` (t itself when it already is one).
Tensor converted(CudaBackend& be, const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), dtype, t.device());
  be.copy(t, c);
  return c;
}

// Whether cuBLASLt takes this dtype and rounding directly (else: widened, rounded, strict f32).
bool native(DType d, Format rounding) {
  return dtype_map_lookup(kCublasTypes, d).has_value() && takes_rounding(d, rounding);
}

cublasComputeType_t compute_type(DType d, Format rounding) {
  if (d == DType::F64) return CUBLAS_COMPUTE_64F;
  if (d == DType::F32 && rounding == Format::TF32) return CUBLAS_COMPUTE_32F_FAST_TF32;
  return CUBLAS_COMPUTE_32F;
}

// The operands of out = a @ b, contiguous copies made where a layout is not plain.
void set_operands(CudaBackend& be, const Tensor& a, const Tensor& b, int64_t nbatch, Gemm& g,
                  Tensor& a_keep, Tensor& b_keep) {
  a_keep = a;
  b_keep = b;
  if (!describe(b, nbatch, g.A)) {
    b_keep = converted(be, b, b.dtype());
    const bool plain = describe(b_keep, nbatch, g.A);
    MT_ASSERT(plain, "a contiguous operand has a plain layout");
  }
  if (!describe(a, nbatch, g.B)) {
    a_keep = converted(be, a, a.dtype());
    const bool plain = describe(a_keep, nbatch, g.B);
    MT_ASSERT(plain, "a contiguous operand has a plain layout");
  }
}

void check_shapes(const Tensor& a, const Tensor& b, const Tensor* bias, const Tensor& out) {
  check_matmul(a, b, bias, out);
  MT_ASSERT(a.dtype() == b.dtype(), "matmul dtypes ", a.describe(), " @ ", b.describe(), " -> ",
            out.describe());
}

// Whether cuBLASLt writes `out` from inputs of dtype `in`: the inputs' dtype, or f32 sums of
// f16/bf16 products (the fp8 emulation's GEMM, autocast/fp8.cpp).
bool writes(DType in, DType out) {
  return out == in || (out == DType::F32 && (in == DType::F16 || in == DType::BF16));
}

// matmul for dtypes and roundings cuBLASLt takes natively; out has the inputs' dtype, or F32.
void native_matmul(CudaBackend& be, const Tensor& a, const Tensor& b, const Tensor* bias,
                   Tensor& out, Format rounding) {
  const int device = be.device();
  const int64_t nbatch = out.size(0), M = out.size(1), N = out.size(2), K = a.size(2);
  MT_ASSERT(writes(a.dtype(), out.dtype()), "cuBLASLt writes the inputs' dtype or f32, got ",
            a.describe(), " -> ", out.describe());
  Gemm g;
  Tensor a_keep, b_keep;
  set_operands(be, a, b, nbatch, g, a_keep, b_keep);
  g.d = out.data_ptr();
  g.io_type = a.dtype();
  g.out_type = out.dtype();
  g.compute = compute_type(a.dtype(), rounding);
  g.m = N;
  g.n = M;
  g.k = K;
  g.nbatch = nbatch;
  if (bias) {
    // The epilogue adds the bias before the one rounding of the output; for batches and f64,
    // where cuBLASLt has no bias epilogue, D starts as the broadcast bias and beta = 1 adds the
    // product to it (also before the one rounding).
    const Tensor bias_c = converted(be, *bias, out.dtype());
    if (nbatch == 1 && out.dtype() != DType::F64 && out.dtype() == a.dtype()) {
      Gemm ge = g;
      ge.epilogue = CUBLASLT_EPILOGUE_BIAS;
      ge.bias = bias_c.data_ptr();
      if (run(ge, device)) return;
    }
    be.copy(bias_c.view({1, 1, N}).expand({nbatch, M, N}), out);
    g.accumulate = true;
  }
  MT_CHECK(run(g, device), "cuBLASLt has no matmul for ", a.describe(), " @ ", b.describe(), " -> ",
           out.describe());
}

// ---- fp8 -------------------------------------------------------------------------------------

// The device's compute capability as major * 10 + minor (9.0: 90), asked once per device.
int compute_capability(int device) {
  static std::mutex mu;
  static std::map<int, int> known;
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = known.find(device);
  if (it != known.end()) return it->second;
  int major = 0, minor = 0;
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return known[device] = major * 10 + minor;
}

// Whether the device has fp8 tensor cores (compute capability 8.9: Ada; 9.0: Hopper; later).
bool has_fp8_tensor_cores(int device) {
  return compute_capability(device) >= 89;
}

cudaDataType_t fp8_type(DType d) {
  return d == DType::FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// cuBLASLt's fp8 GEMM: out^T (N x M, column-major) = b (stored K x N, op T) @ a (stored K x M,
// op N) -- the "TN" layout its fp8 kernels require -- with the scales as device pointers (A's
// is b's, B's is a's) and fp32 accumulation (FAST_ACCUM off: partial sums are promoted to fp32
// registers, as Transformer Engine does for its gradient GEMMs) or, with `fast`, the tensor cores'
// own narrower accumulation (FAST_ACCUM on, as TE's forward GEMMs). False, with nothing queued,
// where the device or the shapes do not qualify (leading dimensions and K multiples of 16,
// 16-byte aligned pointers) or cuBLASLt has no algorithm.
bool native_fp8_gemm(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                     const Tensor& b_scale_inv, bool fast, Tensor& out, int device) {
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  const int64_t lda = a.stride(0), ldb = b.stride(0);
  if (!has_fp8_tensor_cores(device)) return false;
  if (K % 16 != 0 || N % 16 != 0 || lda % 16 != 0 || ldb % 16 != 0 || lda < K || ldb < K)
    return false;
  if (alignment(a.data_ptr()) < 16 || alignment(b.data_ptr()) < 16 ||
      alignment(out.data_ptr()) < 16)
    return false;
  OpDesc op(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  op.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  op.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  op.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scale_inv.data_ptr());
  op.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scale_inv.data_ptr());
  const int8_t fast_accum = fast ? 1 : 0;
  op.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum);
  Layout la(fp8_type(b.dtype()), uint64_t(K), uint64_t(N), ldb, 1, 0);
  Layout lb(fp8_type(a.dtype()), uint64_t(K), uint64_t(M), lda, 1, 0);
  Layout ld(cuda_type(out.dtype()), uint64_t(N), uint64_t(M), N, 1, 0);
  const uint32_t al_a = alignment(b.data_ptr()), al_b = alignment(a.data_ptr()),
                 al_d = alignment(out.data_ptr());
  // Slot 1 is the other GEMMs' io dtype (>= 0): -1 and -2 are fp8's, fp32 and fast sums.
  const std::vector<int64_t> key = {device,
                                    fast ? -2 : -1,
                                    int64_t(a.dtype()),
                                    int64_t(b.dtype()),
                                    int64_t(out.dtype()),
                                    M,
                                    N,
                                    K,
                                    lda,
                                    ldb,
                                    al_a,
                                    al_b,
                                    al_d};
  cublasLtHandle_t handle = lt_handle(device);
  cublasLtMatmulAlgo_t algo{};
  // Partial sums reduced in fp32 only (no split-K reduced in the output type).
  if (!find_algo(handle, op, la, lb, ld, key, al_a, al_b, al_d, true, algo)) return false;
  const Tensor workspace = scratch(int64_t(kWorkspaceBytes), device);
  const float alpha = 1.0f, beta = 0.0f;
  MT_CUBLAS_CHECK(cublasLtMatmul(handle, op.d, &alpha, b.data_ptr(), la.d, a.data_ptr(), lb.d,
                                 &beta, out.data_ptr(), ld.d, out.data_ptr(), ld.d, &algo,
                                 workspace.data_ptr(), kWorkspaceBytes, stream_for(device)));
  return true;
}

// Whether the device has FP4 tensor cores (compute capability 10.0+: Blackwell).
bool has_fp4_tensor_cores(int device) {
  return compute_capability(device) >= 100;
}

}  // namespace

// ---- FP4 (compute capability 10.0+) ----------------------------------------------------------

// cuBLASLt's FP4 types and block-scale modes arrived in CUDA 12.8: an older toolkit builds the
// emulation only.
#if CUDART_VERSION >= 12080
#define MT_CUBLASLT_FP4 1
#else
#define MT_CUBLASLT_FP4 0
#endif

bool fp4_gemm_qualifies(int64_t M, int64_t N, int64_t K, int device) {
  // K a multiple of 32: whole bytes and 16-byte rows of packed codes, whole MX blocks; N of 16:
  // the output rows 16-byte aligned.
  return MT_CUBLASLT_FP4 && M > 0 && K > 0 && K % 32 == 0 && N % 16 == 0 &&
         has_fp4_tensor_cores(device);
}

// The "TN" product as for fp8: out^T (N x M, column-major) = b (stored K x N, op T) @ a (stored
// K x M, op N), each operand's block scales (A's are b's, B's are a's) in the mode of the rule
// (16-wide E4M3 for NVFP4, 32-wide E8M0 for MX), alpha and beta read from the device.
bool native_fp4_gemm(const Tensor& a_packed, const Tensor& a_scales, const Tensor& b_packed,
                     const Tensor& b_scales, const Tensor& alpha_beta, Fp4ScaleRule rule,
                     Tensor& out, int device) {
#if MT_CUBLASLT_FP4
  const int64_t M = a_packed.size(0), N = b_packed.size(0), K = 2 * a_packed.size(1);
  const cublasLtMatmulMatrixScale_t mode = rule == Fp4ScaleRule::Nvfp4
                                               ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3
                                               : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
  OpDesc op(CUBLAS_COMPUTE_32F, CUDA_R_32F);
  op.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  op.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  op.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode);
  op.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode);
  op.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scales.data_ptr());
  op.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scales.data_ptr());
  op.set(CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_DEVICE);
  Layout la(CUDA_R_4F_E2M1, uint64_t(K), uint64_t(N), K, 1, 0);
  Layout lb(CUDA_R_4F_E2M1, uint64_t(K), uint64_t(M), K, 1, 0);
  Layout ld(cuda_type(out.dtype()), uint64_t(N), uint64_t(M), N, 1, 0);
  const uint32_t al_a = alignment(b_packed.data_ptr()), al_b = alignment(a_packed.data_ptr()),
                 al_d = alignment(out.data_ptr());
  // Slot 1: -3 and -4 are FP4's two scale modes (fp8's are -1 and -2, other GEMMs' dtypes >= 0).
  const std::vector<int64_t> key = {
      device, rule == Fp4ScaleRule::Nvfp4 ? -3 : -4, int64_t(out.dtype()), M, N, K, al_a, al_b,
      al_d};
  cublasLtHandle_t handle = lt_handle(device);
  cublasLtMatmulAlgo_t algo{};
  if (!find_algo(handle, op, la, lb, ld, key, al_a, al_b, al_d, true, algo)) return false;
  const Tensor workspace = scratch(int64_t(kWorkspaceBytes), device);
  const float* alpha = static_cast<const float*>(alpha_beta.data_ptr());
  MT_CUBLAS_CHECK(cublasLtMatmul(handle, op.d, alpha, b_packed.data_ptr(), la.d,
                                 a_packed.data_ptr(), lb.d, alpha + 1, out.data_ptr(), ld.d,
                                 out.data_ptr(), ld.d, &algo, workspace.data_ptr(), kWorkspaceBytes,
                                 stream_for(device)));
  return true;
#else
  (void)a_packed, (void)a_scales, (void)b_packed, (void)b_scales, (void)alpha_beta, (void)rule,
      (void)out, (void)device;
  return false;
#endif
}

void CudaBackend::matmul(const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out,
                         const MatmulOptions& options) {
  DeviceGuard guard(device_);
  check_shapes(a, b, bias, out);
  if (out.numel() == 0) return;
  if (a.size(2) == 0) {  // an empty sum: the bias alone
    if (bias) {
      copy(bias->view({1, 1, out.size(2)}).expand(out.shape()), out);
    } else {
      fill(out, 0.0);
    }
    return;
  }
  const Format rounding = options.input_rounding;
  if (native(a.dtype(), rounding) && writes(a.dtype(), out.dtype())) {
    native_matmul(*this, a, b, bias, out, rounding);
    return;
  }
  // fp8, or a rounding onto a grid coarser than the inputs': rounded f32 copies, strict fp32.
  Tensor af = Tensor::empty(a.shape(), DType::F32, a.device());
  Tensor bf = Tensor::empty(b.shape(), DType::F32, b.device());
  copy(a, af);
  copy(b, bf);
  if (rounding != Format::FP32) {
    round_to_format(af, rounding);
    round_to_format(bf, rounding);
  }
  Tensor bias_f;
  if (bias) bias_f = converted(*this, *bias, DType::F32);
  Tensor dst =
      out.dtype() == DType::F32 ? out : Tensor::empty(out.shape(), DType::F32, out.device());
  native_matmul(*this, af, bf, bias ? &bias_f : nullptr, dst, Format::FP32);
  if (!dst.is_same(out)) copy(dst, out);  // the one rounding into the output dtype
}

bool matmul_bias_gelu(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
                      Tensor* pre_gelu, const MatmulOptions& options) {
  check_shapes(a, b, &bias, out);
  MT_CHECK(out.device().is_cuda() && a.device() == out.device() && b.device() == out.device() &&
               bias.device() == out.device(),
           "matmul_bias_gelu: every tensor must be on one cuda device, got ", a.describe(), ", ",
           b.describe(), ", ", bias.describe(), " -> ", out.describe());
  const DType dt = out.dtype();
  const int64_t M = out.size(1), N = out.size(2), K = a.size(2);
  if (out.size(0) != 1 || K == 0 || out.numel() == 0) return false;
  // cuBLASLt's GELU epilogues: every type of its map but f64.
  if (dt == DType::F64 || !dtype_map_lookup(kCublasTypes, dt)) return false;
  if (a.dtype() != dt || !native(dt, options.input_rounding)) return false;
  if (pre_gelu) {
    MT_CHECK(pre_gelu->shape() == out.shape() && pre_gelu->dtype() == dt &&
                 pre_gelu->is_contiguous() && pre_gelu->device() == out.device(),
             "matmul_bias_gelu: pre_gelu must be a contiguous ", out.describe(), ", got ",
             pre_gelu->describe());
    if (N % 8 != 0) return false;  // cuBLASLt's rule for the aux leading dimension
  }
  const int device = out.device().index;
  DeviceGuard guard(device);
  auto& be = static_cast<CudaBackend&>(backend_for(out.device()));
  Gemm g;
  Tensor a_keep, b_keep;
  set_operands(be, a, b, 1, g, a_keep, b_keep);
  const Tensor bias_c = converted(be, bias, dt);
  g.d = out.data_ptr();
  g.io_type = dt;
  g.out_type = dt;
  g.compute = compute_type(dt, options.input_rounding);
  g.m = N;
  g.n = M;
  g.k = K;
  g.epilogue = pre_gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
  g.bias = bias_c.data_ptr();
  g.aux = pre_gelu ? pre_gelu->data_ptr() : nullptr;
  return run(g, device);
}

void CudaBackend::fp8_gemm(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                           const Tensor& b_scale_inv, bool fast_accumulate, Tensor& out) {
  DeviceGuard guard(device_);
  check_fp8_gemm(a, a_scale_inv, b, b_scale_inv, out);
  const int64_t K = a.size(1);
  if (out.numel() == 0) return;
  if (K == 0) {
    fill(out, 0.0);
    return;
  }
  if (native_fp8_gemm(a, a_scale_inv, b, b_scale_inv, fast_accumulate, out, device_)) return;
  warn("fp8:emulated:cuda",
       "fp8 GEMMs on cuda:" + std::to_string(device_) +
           " run emulated (the codes through a bf16 GEMM with fp32 sums, the CPU's numbers): " +
           (has_fp8_tensor_cores(device_)
                ? "cuBLASLt's fp8 GEMM needs K and the output width to be multiples of 16 "
                  "and 16-byte aligned buffers"
                : "this GPU has no fp8 tensor cores (compute capability 8.9 or later)"));
  emulated_fp8_gemm(*this, a, a_scale_inv, b, b_scale_inv, fast_accumulate, out);
}

}  // namespace mantissa::backend::cuda
