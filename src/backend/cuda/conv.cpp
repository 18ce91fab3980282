// CUDA 2-D convolution (NCHW) through cuDNN 9's legacy convolution API: forward, backward data,
// backward filter and the bias gradient. Half inputs compute in fp32 on tensor cores; f32 uses
// TF32 tensor cores only when input_rounding is TF32 (CUDNN_FMA_MATH keeps it strict otherwise);
// f64 computes in f64. fp8 inputs and roundings cuDNN cannot express run as rounded f32 copies
// in strict fp32, rounded once into the output, as the CPU backend does.
//
// The bias is added by starting the output as the broadcast bias and running the convolution
// with beta = 1: cuDNN blends in the compute type, so a half output is rounded once, not twice.
// The bias gradient is the backend's own fp32-accumulating sum over N, H and W.
// Algorithms come from cuDNN's heuristics (no benchmarking runs), deterministic ones preferred,
// cached per shape; workspaces come from the caching allocator.
#include <cudnn.h>

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/dtype_map.h"
#include "mantissa/core/error.h"

#define MT_CUDNN_CHECK(expr)                                                                \
  do {                                                                                      \
    const cudnnStatus_t mt_cudnn_st_ = (expr);                                              \
    MT_CHECK(mt_cudnn_st_ == CUDNN_STATUS_SUCCESS, "cuDNN error in ", #expr, ": ",          \
             cudnnGetErrorString(mt_cudnn_st_), " (", static_cast<int>(mt_cudnn_st_), ")"); \
  } while (0)

namespace mantissa::backend::cuda {
namespace {

// Workspaces beyond this are skipped when a leaner algorithm exists (FFT variants can ask for
// gigabytes).
constexpr size_t kMaxWorkspaceBytes = size_t(1) << 30;

enum class Pass : int { Forward, BackwardData, BackwardFilter };

struct AlgoChoice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

// A cuDNN handle is not meant for concurrent use: every call holds its device's lock while it
// sets the stream and queues its work (host-side only; the GPU work runs asynchronously).
struct DeviceState {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
  std::map<std::vector<int64_t>, AlgoChoice> algos;
};

// Kept for the process: destroying handles at exit would race the driver's own teardown.
DeviceState& device_state(int device) {
  static std::mutex mu;
  static std::vector<DeviceState*> states;
  const std::lock_guard<std::mutex> lock(mu);
  if (size_t(device) >= states.size()) states.resize(device + 1, nullptr);
  if (!states[device]) states[device] = new DeviceState;
  return *states[device];
}

// ---- RAII descriptors -------------------------------------------------------------------------

int as_int(int64_t v, const char* what) {
  MT_CHECK(v <= std::numeric_limits<int>::max(), "conv2d on cuda: ", what, " = ", v,
           " exceeds cuDNN's 32-bit limit; split the batch");
  return static_cast<int>(v);
}

// cuDNN's type of each dtype; the others run on rounded f32 copies (see native below).
constexpr DTypeMapRow<cudnnDataType_t> kCudnnTypes[] = {
    {DType::F64, CUDNN_DATA_DOUBLE}, {DType::F32, CUDNN_DATA_FLOAT},
    {DType::F16, CUDNN_DATA_HALF},   {DType::BF16, CUDNN_DATA_BFLOAT16},
    {DType::FP8_E4M3, kUnsupported}, {DType::FP8_E5M2, kUnsupported},
    {DType::I64, kUnsupported},      {DType::I32, kUnsupported},
    {DType::U8, kUnsupported},       {DType::Bool, kUnsupported},
};
static_assert(dtype_map_complete<kCudnnTypes>());

cudnnDataType_t cudnn_type(DType d) {
  const std::optional<cudnnDataType_t> t = dtype_map_lookup(kCudnnTypes, d);
  MT_ASSERT(t.has_value(), "no cuDNN type for ", dtype_name(d));
  return *t;
}

struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(DType dtype, int64_t n, int64_t c, int64_t h, int64_t w) {
    MT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    MT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, cudnn_type(dtype),
                                              as_int(n, "N"), as_int(c, "C"), as_int(h, "H"),
                                              as_int(w, "W")));
  }
  TensorDesc(DType dtype, const Tensor& t)
      : TensorDesc(dtype, t.size(0), t.size(1), t.size(2), t.size(3)) {}
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(DType dtype, const Tensor& w) {
    MT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    MT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d, cudnn_type(dtype), CUDNN_TENSOR_NCHW,
                                              as_int(w.size(0), "out_channels"),
                                              as_int(w.size(1), "in_channels / groups"),
                                              as_int(w.size(2), "kH"), as_int(w.size(3), "kW")));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  ConvDesc(const Conv2dParams& p, DType dtype) {
    MT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    const cudnnDataType_t compute = dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    MT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        d, as_int(p.padding[0], "padding"), as_int(p.padding[1], "padding"),
        as_int(p.stride[0], "stride"), as_int(p.stride[1], "stride"),
        as_int(p.dilation[0], "dilation"), as_int(p.dilation[1], "dilation"),
        CUDNN_CROSS_CORRELATION, compute));
    MT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, as_int(p.groups, "groups")));
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// ---- one convolution problem ------------------------------------------------------------------

// The math cuDNN may use: tensor cores for halves and for f32 under TF32, FMA (strict) for f32
// otherwise; f64 as cuDNN sees fit (its tensor-core paths are full f64).
cudnnMathType_t wanted_math(DType d, Format rounding) {
  const bool narrow = dtype_map_lookup(kCudnnTypes, d) && dtype_size(d) < dtype_size(DType::F32);
  if (narrow) return CUDNN_TENSOR_OP_MATH;
  if (d == DType::F32) return rounding == Format::TF32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  return CUDNN_DEFAULT_MATH;
}

// x (N, C, H, W), w (K, C/g, kH, kW), y (N, K, OH, OW), all of dtype dt: the descriptors of
// every pass (only shapes are read from the tensors).
struct Problem {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  cudnnMathType_t math;
  std::vector<int64_t> key;
  Problem(DType dt, const Tensor& xs, const Tensor& ws, const Tensor& ys, const Conv2dParams& p,
          Format rounding)
      : x(dt, xs), y(dt, ys), w(dt, ws), conv(p, dt), math(wanted_math(dt, rounding)) {
    key = {int64_t(dt),  int64_t(math), p.stride[0],   p.stride[1], p.padding[0],
           p.padding[1], p.dilation[0], p.dilation[1], p.groups};
    for (const Tensor* t : {&xs, &ws, &ys}) {
      for (int d = 0; d < 4; ++d)
        key.push_back(t->size(d));
    }
  }
};

// Picks the first algorithm of cuDNN's ranked heuristic list that succeeds and fits, preferring
// (in this order) one reported with exactly the strict math when strict fp32 is wanted, a
// deterministic one, one within the workspace cap. Never a down-conversion of f32 data; under
// FMA the descriptor stays FMA whatever the entry reports, so strict fp32 stays strict.
template <typename Perf>
AlgoChoice pick(const Perf* perf, int count, cudnnMathType_t wanted, const char* pass) {
  const bool strict = wanted == CUDNN_FMA_MATH;
  for (const bool need_exact_math : {strict, false}) {
    for (const bool need_deterministic : {true, false}) {
      for (const bool need_small : {true, false}) {
        for (int i = 0; i < count; ++i) {
          const Perf& r = perf[i];
          if (r.status != CUDNN_STATUS_SUCCESS) continue;
          if (r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
          if (need_exact_math && r.mathType != CUDNN_FMA_MATH) continue;
          if (need_deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
          if (need_small && r.memory > kMaxWorkspaceBytes) continue;
          return {static_cast<int>(r.algo), strict ? CUDNN_FMA_MATH : r.mathType, r.memory};
        }
      }
    }
  }
  MT_CHECK(false, "cuDNN has no ", pass, " algorithm for this convolution");
  return {};
}

AlgoChoice choose(DeviceState& st, Problem& pr, Pass pass) {
  std::vector<int64_t> key = pr.key;
  key.push_back(int64_t(pass));
  auto it = st.algos.find(key);
  if (it == st.algos.end()) {
    AlgoChoice c;
    int count = 0;
    // The math type on the descriptor bounds what the heuristic proposes.
    MT_CUDNN_CHECK(cudnnSetConvolutionMathType(pr.conv.d, pr.math));
    if (pass == Pass::Forward) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      MT_CUDNN_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(st.handle, pr.x.d, pr.w.d, pr.conv.d, pr.y.d,
                                                 CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf));
      c = pick(perf, count, pr.math, "forward");
    } else if (pass == Pass::BackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      MT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          st.handle, pr.w.d, pr.y.d, pr.conv.d, pr.x.d, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
          &count, perf));
      c = pick(perf, count, pr.math, "backward data");
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      MT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          st.handle, pr.x.d, pr.y.d, pr.conv.d, pr.w.d, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
          &count, perf));
      c = pick(perf, count, pr.math, "backward filter");
    }
    MT_CUDNN_CHECK(cudnnSetConvolutionMathType(pr.conv.d, c.math));
    // The size for this descriptor and algorithm, which the perf entry only estimates.
    if (pass == Pass::Forward) {
      MT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
          st.handle, pr.x.d, pr.w.d, pr.conv.d, pr.y.d,
          static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), &c.workspace));
    } else if (pass == Pass::BackwardData) {
      MT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
          st.handle, pr.w.d, pr.y.d, pr.conv.d, pr.x.d,
          static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), &c.workspace));
    } else {
      MT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
          st.handle, pr.x.d, pr.y.d, pr.conv.d, pr.w.d,
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), &c.workspace));
    }
    if (st.algos.size() >= 4096) st.algos.clear();  // bounded, as the GEMM cache
    it = st.algos.emplace(key, c).first;
  }
  MT_CUDNN_CHECK(cudnnSetConvolutionMathType(pr.conv.d, it->second.math));
  return it->second;
}

// alpha and beta as cuDNN reads them: double for double data, float otherwise.
struct Scale {
  double d;
  float f;
  explicit Scale(double v) : d(v), f(static_cast<float>(v)) {}
  const void* for_dtype(DType t) const {
    return t == DType::F64 ? static_cast<const void*>(&d) : &f;
  }
};

Tensor contiguous_copy(CudaBackend& be, const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor c = Tensor::empty(t.shape(), dtype, t.device());
  be.copy(t, c);
  return c;
}

// Whether cuDNN computes this dtype and rounding as the CPU does (else: rounded f32 copies).
bool native(DType d, Format rounding) {
  return dtype_map_lookup(kCudnnTypes, d).has_value() && takes_rounding(d, rounding);
}

// An f32 copy of t rounded onto `rounding`'s grid (for the emulated dtypes).
Tensor rounded_f32(CudaBackend& be, const Tensor& t, Format rounding) {
  Tensor c = Tensor::empty(t.shape(), DType::F32, t.device());
  be.copy(t, c);
  if (rounding != Format::FP32) be.round_to_format(c, rounding);
  return c;
}

}  // namespace

void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                         const Conv2dParams& p, const MatmulOptions& options) {
  DeviceGuard guard(device_);
  MT_ASSERT(x.dim() == 4 && w.dim() == 4 && out.dim() == 4 && out.is_contiguous(),
            "conv2d wants NCHW tensors, got ", x.describe(), ", ", w.describe(), " -> ",
            out.describe());
  MT_ASSERT(x.dtype() == w.dtype() && out.dtype() == x.dtype() &&
                (!bias || (bias->dim() == 1 && bias->size(0) == out.size(1))),
            "conv2d dtypes and bias: ", x.describe(), ", ", w.describe(), " -> ", out.describe());
  if (out.numel() == 0) return;
  const int64_t K = out.size(1);
  if (!native(x.dtype(), options.input_rounding)) {
    const Tensor xf = rounded_f32(*this, x, options.input_rounding);
    const Tensor wf = rounded_f32(*this, w, options.input_rounding);
    Tensor bf;
    if (bias) bf = contiguous_copy(*this, *bias, DType::F32);
    Tensor y =
        out.dtype() == DType::F32 ? out : Tensor::empty(out.shape(), DType::F32, out.device());
    conv2d(xf, wf, bias ? &bf : nullptr, y, p, MatmulOptions{Format::FP32});
    if (!y.is_same(out)) copy(y, out);  // the one rounding into the output dtype
    return;
  }
  bool accumulate = false;
  if (bias) {
    copy(bias->view({1, K, 1, 1}).expand(out.shape()), out);
    accumulate = true;
  }
  if (x.numel() == 0 || w.numel() == 0) {  // an empty sum: the bias alone
    if (!bias) fill(out, 0.0);
    return;
  }
  const Tensor xc = contiguous_copy(*this, x, x.dtype());
  const Tensor wc = contiguous_copy(*this, w, w.dtype());
  Problem pr(x.dtype(), xc, wc, out, p, options.input_rounding);
  DeviceState& st = device_state(device_);
  const std::lock_guard<std::mutex> lock(st.mu);
  if (!st.handle) MT_CUDNN_CHECK(cudnnCreate(&st.handle));
  MT_CUDNN_CHECK(cudnnSetStream(st.handle, stream_for(device_)));
  const AlgoChoice c = choose(st, pr, Pass::Forward);
  const Tensor ws = scratch(int64_t(std::max<size_t>(c.workspace, 1)), device_);
  const Scale one(1.0), beta(accumulate ? 1.0 : 0.0);
  MT_CUDNN_CHECK(cudnnConvolutionForward(
      st.handle, one.for_dtype(x.dtype()), pr.x.d, xc.data_ptr(), pr.w.d, wc.data_ptr(), pr.conv.d,
      static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), ws.data_ptr(), c.workspace,
      beta.for_dtype(x.dtype()), pr.y.d, out.data_ptr()));
}

void CudaBackend::conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& w,
                                  Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias,
                                  const Conv2dParams& p, const MatmulOptions& options) {
  DeviceGuard guard(device_);
  MT_ASSERT(grad_out.dim() == 4 && x.dim() == 4 && w.dim() == 4, "conv2d_backward shapes");
  for (Tensor* g : {grad_x, grad_w, grad_bias}) {
    MT_ASSERT(!g || (g->is_contiguous() && g->dtype() == grad_out.dtype()),
              "conv2d_backward writes contiguous gradients of grad_out's dtype");
  }
  if (grad_out.numel() == 0) {
    for (Tensor* g : {grad_x, grad_w, grad_bias}) {
      if (g) fill(*g, 0.0);
    }
    return;
  }
  if (x.numel() == 0 || w.numel() == 0) {
    // Every input value is padding (or there are none): the weight gradient is zero, the data
    // gradient empty; only the bias gradient has something to sum. (An empty kernel window, kH or
    // kW = 0, leaves x non-empty: its gradient is then zero, not left unwritten.)
    if (grad_w) fill(*grad_w, 0.0);
    if (grad_x) fill(*grad_x, 0.0);
    grad_x = nullptr;
    grad_w = nullptr;
  }
  const Format rounding = options.input_rounding;
  if (!native(grad_out.dtype(), rounding)) {
    // Only what each gradient reads is converted: an unneeded x or w may be a broadcast stand-in.
    const Tensor gof = rounded_f32(*this, grad_out, rounding);
    const Tensor xf = grad_w ? rounded_f32(*this, x, rounding) : x;
    const Tensor wf = grad_x ? rounded_f32(*this, w, rounding) : w;
    auto f32_of = [&](Tensor* g) {
      if (!g) return Tensor();
      return g->dtype() == DType::F32 ? *g : Tensor::empty(g->shape(), DType::F32, g->device());
    };
    Tensor gx = f32_of(grad_x), gw = f32_of(grad_w), gb = f32_of(grad_bias);
    conv2d_backward(gof, xf, wf, grad_x ? &gx : nullptr, grad_w ? &gw : nullptr,
                    grad_bias ? &gb : nullptr, p, MatmulOptions{Format::FP32});
    if (grad_x && !gx.is_same(*grad_x)) copy(gx, *grad_x);
    if (grad_w && !gw.is_same(*grad_w)) copy(gw, *grad_w);
    if (grad_bias && !gb.is_same(*grad_bias)) copy(gb, *grad_bias);
    return;
  }
  const DType dt = grad_out.dtype();
  const Tensor go = contiguous_copy(*this, grad_out, dt);
  DeviceState& st = device_state(device_);
  const Scale one(1.0), zero(0.0);
  if (grad_bias) {
    // The per-channel sum over N, H and W, accumulated in fp32 by the reduction kernels.
    Tensor gb = grad_bias->view({1, go.size(1), 1, 1});
    const int dims[] = {0, 2, 3};
    reduce(ReduceOp::Sum, go, dims, gb, nullptr, 0);
  }
  if (!grad_x && !grad_w) return;
  // The problem's x and w descriptors need only shapes and the dtype: an unneeded operand stays
  // the (possibly broadcast) view it came as and is never read.
  const Tensor xc = grad_w ? contiguous_copy(*this, x, dt) : x;
  const Tensor wc = grad_x ? contiguous_copy(*this, w, dt) : w;
  Problem pr(dt, xc, wc, go, p, rounding);
  const std::lock_guard<std::mutex> lock(st.mu);
  if (!st.handle) MT_CUDNN_CHECK(cudnnCreate(&st.handle));
  MT_CUDNN_CHECK(cudnnSetStream(st.handle, stream_for(device_)));
  if (grad_x) {
    const AlgoChoice c = choose(st, pr, Pass::BackwardData);
    const Tensor ws = scratch(int64_t(std::max<size_t>(c.workspace, 1)), device_);
    MT_CUDNN_CHECK(cudnnConvolutionBackwardData(
        st.handle, one.for_dtype(dt), pr.w.d, wc.data_ptr(), pr.y.d, go.data_ptr(), pr.conv.d,
        static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws.data_ptr(), c.workspace,
        zero.for_dtype(dt), pr.x.d, grad_x->data_ptr()));
  }
  if (grad_w) {
    const AlgoChoice c = choose(st, pr, Pass::BackwardFilter);
    const Tensor ws = scratch(int64_t(std::max<size_t>(c.workspace, 1)), device_);
    MT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        st.handle, one.for_dtype(dt), pr.x.d, xc.data_ptr(), pr.y.d, go.data_ptr(), pr.conv.d,
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws.data_ptr(), c.workspace,
        zero.for_dtype(dt), pr.w.d, grad_w->data_ptr()));
  }
}

}  // namespace mantissa::backend::cuda
