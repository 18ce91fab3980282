// CUDA multi-tensor kernels (docs/design.md §5): the fused optimizer steps (SGD, AdamW, row-sparse
// AdamW), the global norm and the in-place scale of clipping, the loss scaler's fused unscale +
// inf/NaN check and its scale update. Each call is one kernel over all its tensors: the host cuts
// every tensor into chunks of kChunk elements and passes the (tensor, chunk) table with the
// tensors' pointers as the kernel's parameters (no metadata copy, no host wait); block b works on
// chunk b. A call with more tensors or chunks than one parameter block holds is launched in
// batches of kMaxTensors / kMaxBlocks, in order on the same stream.
//
// The arithmetic is the CPU backend's (src/backend/cpu/optim_kernels.cpp, amp_kernels.cpp),
// operation for operation, in fp32 (f64 for f64 tensors), with the _rn intrinsics so that nvcc
// fuses no multiply-add the CPU does not (the CPU build has no FMA contraction): results are
// bit-identical to the CPU, stochastic rounding included (round.h's encode and philox.h's
// random_bits, the very same functions). multi_tensor_norm is deterministic (fixed block sizes,
// per-chunk fp32 partials combined in f64 in chunk order) but sums in another order than the
// CPU, and powf for a general p is not correctly rounded: it agrees with the CPU to rounding.
//
// Host reads: unscale_and_check returns its result through the host only when no found_inf
// tensor is given (it then waits for the kernel). With found_inf given, the flag is the answer
// and stays on the device: the call returns false without waiting (GradScaler hands it to the
// optimizer kernels). The optimizer steps read and advance the step counts on the device, in a
// small kernel launched before each batch's update (so that no block of the update reads a count
// another block is writing).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernel_utils.cuh"
#include "backend/multi_tensor_check.h"
#include "backend/step_math.h"

namespace mantissa::backend::cuda {
namespace {

constexpr int64_t kChunk = 16384;  // elements per block
constexpr int kMaxTensors = 64;    // tensors in one launch's parameters
constexpr int kMaxBlocks = 512;    // chunks in one launch's parameters
constexpr int kBlockThreads = 256;

// One tensor of a launch. `data` is what the kernel updates (the parameter, or the tensor to
// scale / check / measure); the rest is for the optimizer steps.
struct TensorArg {
  void* data = nullptr;
  const void* grad = nullptr;
  void* state0 = nullptr;  // momentum buffer / exp_avg (compute type)
  void* state1 = nullptr;  // exp_avg_sq
  float* master = nullptr;
  int64_t* step_count = nullptr;  // the tensor's row of the step counts (optimizer steps)
  int64_t numel = 0;
  uint64_t id = 0;     // the parameter's index: stochastic rounding's stream id
  uint64_t first = 0;  // where this tensor starts in its parameter (a ZeRO-1 slice)
  DType dtype = DType::F32;
  DType grad_dtype = DType::F32;
  bool advance = false;  // this batch holds the tensor's first chunk: it advances the count
};

struct Batch {
  TensorArg tensors[kMaxTensors];
  int32_t block_chunk[kMaxBlocks];   // chunk of its tensor
  uint8_t block_tensor[kMaxBlocks];  // index into tensors
  int64_t first_block = 0;           // the call-wide number of block 0 (norm partials)
  int32_t num_tensors = 0;
};
static_assert(kMaxTensors <= 256, "block_tensor is a byte");
// Kernel parameters beyond 4 KB need CUDA 12.1 (this build's toolkit is newer); 32764 at most.
static_assert(sizeof(Batch) <= 32000, "the launch table must fit the kernel parameters");

// Cuts tensors 0..count-1 (numel(i) elements each) into chunks and launches
// launch(batch, blocks) for each parameter block's worth, in order. make_arg(i) describes
// tensor i. Empty tensors own no chunk.
template <typename Numel, typename MakeArg, typename Launch>
void for_each_batch(size_t count, Numel numel, MakeArg make_arg, Launch launch) {
  Batch b;
  int nt = 0, nb = 0;
  int64_t launched = 0;
  for (size_t i = 0; i < count; ++i) {
    const int64_t n = numel(i);
    if (n == 0) continue;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      if (c == 0 || nb == 0) {  // the tensor enters this batch
        b.tensors[nt] = make_arg(i);
        b.tensors[nt].advance = c == 0;
        b.num_tensors = ++nt;
      }
      b.block_tensor[nb] = uint8_t(nt - 1);
      b.block_chunk[nb] = int32_t(c);
      ++nb;
      const bool tensors_full = nt == kMaxTensors && c == chunks - 1;
      if (nb == kMaxBlocks || tensors_full) {
        launch(b, nb);
        launched += nb;
        nb = 0;
        nt = 0;
        b.num_tensors = 0;
        b.first_block = launched;
      }
    }
  }
  if (nb > 0) launch(b, nb);
}

int64_t total_chunks(std::span<const Tensor> tensors) {
  int64_t c = 0;
  for (const Tensor& t : tensors)
    c += (t.numel() + kChunk - 1) / kChunk;
  return c;
}

// ---- loads and stores by runtime dtype (one tensor's dtype is uniform over a block) ----------
// The cases come from the dtype list (device_dispatch_float): a new float dtype needs no line
// here.
template <typename C>
__device__ __forceinline__ C load_c(const void* p, DType dtype, int64_t i) {
  C v = C(0);
  device_dispatch_float(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    v = C(load(static_cast<const S*>(p) + i));  // f64 to float: RNE, as the CPU's cast
  });
  return v;
}

// Stores v (the compute type) into element i of a float tensor, rounding to nearest even.
template <typename C>
__device__ __forceinline__ void store_c(void* p, DType dtype, int64_t i, C v) {
  device_dispatch_float(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    store(static_cast<S*>(p) + i, v);
  });
}

// How an optimizer step writes parameters (MultiTensorOptions).
struct StoreRounding {
  RoundingMode mode = RoundingMode::NearestEven;  // nearest even, truncation or stochastic
  uint64_t seed = 0;
};

// Element j of the parameter of `a` after its update number `step` to v: the master (when there
// is one) keeps v, the parameter receives v rounded as `r` says (exact for f32/f64 parameters).
template <typename C>
__device__ __forceinline__ void store_param(const TensorArg& a, int64_t j, C v,
                                            const StoreRounding& r, int64_t step) {
  if (a.master != nullptr) a.master[j] = float(v);
  device_dispatch_float(a.dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    if constexpr (is_narrow_v<S>) {
      if (r.mode != RoundingMode::NearestEven) {
        // The format from the dtype list, as a constant: no default a new dtype falls into.
        const uint32_t rnd =
            r.mode == RoundingMode::Stochastic
                ? random_bits(r.seed, uint64_t(step), (a.id << 40) + a.first + uint64_t(j))
                : 0u;
        const uint32_t bits = encode_as<format_of<S>()>(float(v), r.mode, Overflow::Infinity, rnd);
        using Bits = std::conditional_t<sizeof(S) == 2, uint16_t, uint8_t>;
        static_assert(sizeof(S) == sizeof(Bits), "a narrow float of 1 or 2 bytes");
        static_cast<Bits*>(a.data)[j] = Bits(bits);
        return;
      }
    }
    store(static_cast<S*>(a.data) + j, v);  // exact for f32/f64, else to nearest even
  });
}

// The value an update starts from: the master when there is one, else the parameter.
template <typename C>
__device__ __forceinline__ C load_param(const TensorArg& a, int64_t j) {
  return a.master != nullptr ? C(a.master[j]) : load_c<C>(a.data, a.dtype, j);
}

// ---- the one kernel shape --------------------------------------------------------------------
template <typename Op>
__global__ void __launch_bounds__(kBlockThreads) multi_tensor_kernel(Batch batch, Op op) {
  const TensorArg& a = batch.tensors[batch.block_tensor[blockIdx.x]];
  const int64_t start = int64_t(batch.block_chunk[blockIdx.x]) * kChunk;
  const int64_t n = a.numel - start < kChunk ? a.numel - start : kChunk;
  op(a, start, n, batch.first_block + blockIdx.x);
}

template <typename Op>
void launch_batch(const Batch& b, int blocks, const Op& op, cudaStream_t stream) {
  multi_tensor_kernel<Op><<<unsigned(blocks), kBlockThreads, 0, stream>>>(b, op);
  MT_CUDA_CHECK_LAUNCH();
}

// A skipped optimizer step: the loss scaler's device flag is set.
__device__ __forceinline__ bool skipped(const float* found_inf) {
  return found_inf != nullptr && *found_inf != 0.0f;
}

// Advances the step count of every tensor whose first chunk is in the batch, unless skipped.
__global__ void advance_steps_kernel(Batch batch, const float* found_inf) {
  const int i = int(threadIdx.x);
  if (i >= batch.num_tensors || skipped(found_inf)) return;
  const TensorArg& a = batch.tensors[i];
  if (a.advance) ++*a.step_count;
}

// An optimizer step's launch: the counts first, then the update, on one stream.
template <typename Op>
void launch_step_batch(const Batch& b, int blocks, const Op& op, cudaStream_t stream) {
  advance_steps_kernel<<<1, kMaxTensors, 0, stream>>>(b, op.found_inf);
  MT_CUDA_CHECK_LAUNCH();
  launch_batch(b, blocks, op, stream);
}

// ---- SGD ---------------------------------------------------------------------------------------
struct SgdOp {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  StoreRounding rounding;
  const float* found_inf;

  template <typename C>
  __device__ void chunk(const TensorArg& a, int64_t start, int64_t n) const {
    const C lr_c = C(lr), wd = C(weight_decay), mom = C(momentum);
    const C keep = C(1.0 - dampening);
    C* buf = static_cast<C*>(a.state0);
    const int64_t t = *a.step_count;
    const bool first = t == 1;  // PyTorch: buf = clone(grad) on the first update
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const int64_t j = start + k;
      C p = load_param<C>(a, j);
      C g = load_c<C>(a.grad, a.grad_dtype, j);
      if (weight_decay != 0) g = add_rn(g, mul_rn(wd, p));
      C d = g;
      if (momentum != 0) {
        C b;
        if (first) {
          b = g;  // no dampening on the first step
        } else {
          b = add_rn(mul_rn(buf[j], mom), mul_rn(keep, g));
        }
        buf[j] = b;
        d = nesterov ? add_rn(g, mul_rn(mom, b)) : b;
      }
      p = sub_rn(p, mul_rn(lr_c, d));
      store_param<C>(a, j, p, rounding, t);
    }
  }

  __device__ void operator()(const TensorArg& a, int64_t start, int64_t n, int64_t) const {
    if (skipped(found_inf)) return;
    if (a.dtype == DType::F64) {
      chunk<double>(a, start, n);
    } else {
      chunk<float>(a, start, n);
    }
  }
};

// ---- AdamW -------------------------------------------------------------------------------------
struct AdamWOp {
  double lr, beta1, beta2, eps, weight_decay;
  StoreRounding rounding;
  const float* found_inf;

  // Element j of the parameter of `a` (gradient element gj, moments at j) at update t: the one
  // element formula of the dense and the row-sparse step.
  template <typename C>
  __device__ __forceinline__ void element(const TensorArg& a, int64_t j, int64_t gj, int64_t t,
                                          const AdamWBiasCorrection& bc) const {
    // Not `1.0 - lr * weight_decay`: nvcc contracts that into one fma (rounded once), the CPU
    // rounds the product and then the difference; in f64 parameters the decay would differ.
    const C decay = C(sub_rn(1.0, mul_rn(lr, weight_decay)));
    const C w = C(1.0 - beta1);  // lerp weight
    const C one_minus_w = C(1) - w;
    const C b2 = C(beta2), omb2 = C(1.0 - beta2), eps_c = C(eps);
    const C neg_step = C(-bc.step_size), bc2_sqrt = C(bc.bc2_sqrt);
    const bool lerp_low = w < C(0.5);  // torch.lerp's choice of formula
    const bool first = t == 1;
    C* m = static_cast<C*>(a.state0);
    C* v = static_cast<C*>(a.state1);
    const C g = load_c<C>(a.grad, a.grad_dtype, gj);
    // The state starts at zero (PyTorch's zeros_like): on a first update it was never written.
    const C mo = first ? C(0) : m[j];
    const C vo = first ? C(0) : v[j];
    const C mn = lerp_low ? add_rn(mo, mul_rn(w, sub_rn(g, mo)))
                          : sub_rn(g, mul_rn(sub_rn(g, mo), one_minus_w));
    const C vn = add_rn(mul_rn(vo, b2), mul_rn(mul_rn(omb2, g), g));
    m[j] = mn;
    v[j] = vn;
    const C denom = add_rn(div_rn(sqrt_rn(vn), bc2_sqrt), eps_c);
    C p = load_param<C>(a, j);
    p = add_rn(mul_rn(p, decay), div_rn(mul_rn(neg_step, mn), denom));
    store_param<C>(a, j, p, rounding, t);
  }

  __device__ AdamWBiasCorrection correction(int64_t t) const {
    // The bias corrections in double from the device's step count (step_math.h, as the CPU).
    return adamw_bias_correction(lr, beta1, beta2, t, [](double x) { return __dsqrt_rn(x); });
  }

  template <typename C>
  __device__ void chunk(const TensorArg& a, int64_t start, int64_t n) const {
    const int64_t t = *a.step_count;
    const AdamWBiasCorrection bc = correction(t);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
      element<C>(a, start + k, start + k, t, bc);
  }

  __device__ void operator()(const TensorArg& a, int64_t start, int64_t n, int64_t) const {
    if (skipped(found_inf)) return;
    if (a.dtype == DType::F64) {
      chunk<double>(a, start, n);
    } else {
      chunk<float>(a, start, n);
    }
  }
};

// Row-sparse AdamW (Backend::sparse_adamw_step) on one table: `a` is the table (state0/1 its
// moments), rows its U listed rows and steps their counts, read here (the update of a row's t-th
// count is its t-th update) and advanced by sparse_advance_kernel after it. Element (u, j) is
// element rows[u] * dim + j of the table and element u * dim + j of the gradient.
__global__ void sparse_adamw_kernel(TensorArg a, const int64_t* rows, const int64_t* steps,
                                    int64_t num_rows, int64_t dim, AdamWOp op) {
  if (skipped(op.found_inf)) return;
  const int64_t total = num_rows * dim;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t u = i / dim, j = i - u * dim, row = rows[u];
    const int64_t t = steps[row] + 1;
    const AdamWBiasCorrection bc = op.correction(t);
    if (a.dtype == DType::F64) {
      op.element<double>(a, row * dim + j, i, t, bc);
    } else {
      op.element<float>(a, row * dim + j, i, t, bc);
    }
  }
}

__global__ void sparse_advance_kernel(const int64_t* rows, int64_t* steps, int64_t num_rows,
                                      const float* found_inf) {
  if (skipped(found_inf)) return;
  for (int64_t u = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; u < num_rows;
       u += int64_t(gridDim.x) * blockDim.x)
    ++steps[rows[u]];
}

// ---- norm and scale ----------------------------------------------------------------------------
enum class NormKind { Two, One, Inf, P };

struct NormPartialOp {
  NormKind kind;
  double p;
  double* partials;  // one per call-wide block

  template <typename C>
  __device__ void chunk(const TensorArg& a, int64_t start, int64_t n, int64_t block) const {
    C acc = 0;
    bool nan = false;
    const C pc = C(p);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const C x = fabs(load_c<C>(a.data, a.dtype, start + k));
      switch (kind) {
        case NormKind::Two:
          acc = add_rn(acc, mul_rn(x, x));
          break;
        case NormKind::One:
          acc = add_rn(acc, x);
          break;
        case NormKind::Inf:
          nan = nan || x != x;
          acc = x > acc ? x : acc;
          break;
        case NormKind::P:
          acc = add_rn(acc, pow(x, pc));
          break;
      }
    }
    if (kind == NormKind::Inf) {
      const bool any_nan = __syncthreads_or(nan) != 0;
      const C best = block_max(acc);
      if (threadIdx.x == 0) partials[block] = any_nan ? double(NAN) : double(best);
    } else {
      const C total = block_sum(acc);
      if (threadIdx.x == 0) partials[block] = double(total);
    }
  }

  __device__ void operator()(const TensorArg& a, int64_t start, int64_t n, int64_t block) const {
    if (a.dtype == DType::F64) {
      chunk<double>(a, start, n, block);
    } else {
      chunk<float>(a, start, n, block);
    }
  }
};

// Combines the partials in chunk order, as the CPU.
__global__ void norm_combine_kernel(const double* partials, int64_t count, NormKind kind, double p,
                                    double* out) {
  double total = 0;
  if (kind == NormKind::Inf) {
    for (int64_t i = 0; i < count; ++i) {
      const double v = partials[i];
      if (v != v) {
        total = v;
        break;
      }
      total = v > total ? v : total;
    }
  } else {
    for (int64_t i = 0; i < count; ++i)
      total = __dadd_rn(total, partials[i]);
    if (kind == NormKind::Two) total = __dsqrt_rn(total);
    if (kind == NormKind::P) total = pow(total, 1.0 / p);
  }
  *out = total;
}

struct ScaleOp {
  const double* factor;  // on the device (clipping's coefficient)

  template <typename C>
  __device__ void chunk(const TensorArg& a, int64_t start, int64_t n) const {
    if (*factor == 1.0) return;  // x * 1 == x for every x: nothing to write
    const C f = C(*factor);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const int64_t j = start + k;
      store_c<C>(a.data, a.dtype, j, mul_rn(load_c<C>(a.data, a.dtype, j), f));
    }
  }

  __device__ void operator()(const TensorArg& a, int64_t start, int64_t n, int64_t) const {
    if (a.dtype == DType::F64) {
      chunk<double>(a, start, n);
    } else {
      chunk<float>(a, start, n);
    }
  }
};

// ---- the loss scaler ---------------------------------------------------------------------------
// The factor is inv_scale, or 1 / state[0] rounded to fp32 when `state` is given (the scaler's
// device state: PyTorch's inv_scale = scale.double().reciprocal().float()).
struct UnscaleOp {
  double inv_scale;
  const double* state;
  float* found_inf;

  template <typename C>
  __device__ void chunk(const TensorArg& a, int64_t start, int64_t n) const {
    const double inv = state != nullptr ? round_to_f32(1.0 / state[0]) : inv_scale;
    const C f = C(inv);
    constexpr C kMax = std::numeric_limits<C>::max();
    bool bad = false;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const int64_t j = start + k;
      const C x = load_c<C>(a.data, a.dtype, j);
      // |x| <= max is false exactly for inf and NaN.
      bad = bad || !(fabs(x) <= kMax);
      // f == 1 leaves the values bit-identical (NaN payloads included), as PyTorch. A NaN is
      // stored as it came (x86's multiply returns its NaN operand, quieted; the GPU's would
      // return the canonical NaN), so the bits follow the CPU's.
      if (f != C(1)) store_c<C>(a.data, a.dtype, j, x != x ? x : mul_rn(x, f));
    }
    if (__syncthreads_or(bad) != 0 && threadIdx.x == 0) *found_inf = 1.0f;
  }

  __device__ void operator()(const TensorArg& a, int64_t start, int64_t n, int64_t) const {
    if (a.dtype == DType::F64) {
      chunk<double>(a, start, n);
    } else {
      chunk<float>(a, start, n);
    }
  }
};

__global__ void update_scale_kernel(double* state, const float* found_inf, ScaleUpdate rule) {
  const ScaleState next =
      next_scale_state({state[0], int64_t(state[1]), int64_t(state[2]), int64_t(state[3])},
                       *found_inf != 0.0f, rule);
  state[0] = next.scale;
  state[1] = double(next.growth_tracker);
  state[2] = double(next.hysteresis_tracker);
  state[3] = double(next.min_scale_overflows);
}

// ---- host side ---------------------------------------------------------------------------------
StoreRounding rounding_of(const MultiTensorOptions& o) {
  return {o.store_rounding, o.seed};
}

// The parts of tensor i's launch entry that both optimizer steps share.
TensorArg step_arg(std::span<Tensor> params, std::span<const Tensor> grads,
                   const MultiTensorOptions& o, size_t i) {
  TensorArg a;
  a.data = params[i].data_ptr();
  a.grad = grads[i].data_ptr();
  a.numel = params[i].numel();
  a.dtype = params[i].dtype();
  a.grad_dtype = grads[i].dtype();
  a.id = o.ids[i];
  if (!o.element_offsets.empty()) a.first = o.element_offsets[i];
  a.step_count = static_cast<int64_t*>(o.step_counts->data_ptr()) + o.ids[i];
  if (i < o.masters.size() && o.masters[i].defined()) {
    a.master = static_cast<float*>(o.masters[i].data_ptr());
  }
  return a;
}

const float* flag_ptr(const MultiTensorOptions& o) {
  return o.found_inf != nullptr ? static_cast<const float*>(o.found_inf->data_ptr()) : nullptr;
}

// The fused unscale over `grads` into `found_inf` (device pointer), factor as UnscaleOp says.
void launch_unscale(std::span<Tensor> grads, double inv_scale, const double* state,
                    float* found_inf, cudaStream_t stream) {
  const UnscaleOp op{inv_scale, state, found_inf};
  for_each_batch(
      grads.size(), [&](size_t i) { return grads[i].numel(); },
      [&](size_t i) {
        TensorArg a;
        a.data = grads[i].data_ptr();
        a.numel = grads[i].numel();
        a.dtype = grads[i].dtype();
        return a;
      },
      [&](const Batch& b, int blocks) { launch_batch(b, blocks, op, stream); });
}

}  // namespace

void CudaBackend::sgd_step(std::span<Tensor> params, std::span<const Tensor> grads,
                           std::span<Tensor> momentum_bufs, const SgdStep& hyper) {
  DeviceGuard guard(device_);
  const MultiTensorOptions& o = hyper.options;
  const bool with_momentum = hyper.momentum != 0;
  MT_ASSERT(with_momentum || momentum_bufs.empty(), "sgd_step: momentum buffers without momentum");
  if (with_momentum) {
    check_step_call("sgd_step", Device::cuda(device_), params, grads, {momentum_bufs}, o);
  } else {
    check_step_call("sgd_step", Device::cuda(device_), params, grads, {}, o);
  }
  // bf16 / block-scaled momentum and Kahan compensation have no CUDA kernel yet: the CPU's.
  if (!plain_step_state(params, {momentum_bufs}, o)) {
    Backend::sgd_step(params, grads, momentum_bufs, hyper);
    return;
  }
  const SgdOp op{hyper.lr,       hyper.momentum, hyper.dampening, hyper.weight_decay,
                 hyper.nesterov, rounding_of(o), flag_ptr(o)};
  const cudaStream_t stream = stream_for(device_);
  for_each_batch(
      params.size(), [&](size_t i) { return params[i].numel(); },
      [&](size_t i) {
        TensorArg a = step_arg(params, grads, o, i);
        if (with_momentum) a.state0 = momentum_bufs[i].data_ptr();
        return a;
      },
      [&](const Batch& b, int blocks) { launch_step_batch(b, blocks, op, stream); });
  o.step_counts->bump_version();
}

void CudaBackend::adamw_step(std::span<Tensor> params, std::span<const Tensor> grads,
                             std::span<Tensor> exp_avgs, std::span<Tensor> exp_avg_sqs,
                             const AdamWStep& hyper) {
  DeviceGuard guard(device_);
  const MultiTensorOptions& o = hyper.options;
  check_step_call("adamw_step", Device::cuda(device_), params, grads, {exp_avgs, exp_avg_sqs}, o);
  // bf16 / block-scaled moments and Kahan compensation have no CUDA kernel yet: the CPU's.
  if (!plain_step_state(params, {exp_avgs, exp_avg_sqs}, o)) {
    Backend::adamw_step(params, grads, exp_avgs, exp_avg_sqs, hyper);
    return;
  }
  const AdamWOp op{hyper.lr,           hyper.beta1,    hyper.beta2, hyper.eps,
                   hyper.weight_decay, rounding_of(o), flag_ptr(o)};
  const cudaStream_t stream = stream_for(device_);
  for_each_batch(
      params.size(), [&](size_t i) { return params[i].numel(); },
      [&](size_t i) {
        TensorArg a = step_arg(params, grads, o, i);
        a.state0 = exp_avgs[i].data_ptr();
        a.state1 = exp_avg_sqs[i].data_ptr();
        return a;
      },
      [&](const Batch& b, int blocks) { launch_step_batch(b, blocks, op, stream); });
  o.step_counts->bump_version();
}

void CudaBackend::sparse_adamw_step(std::span<Tensor> tables, std::span<const Tensor> rows,
                                    std::span<const Tensor> grads, std::span<Tensor> exp_avgs,
                                    std::span<Tensor> exp_avg_sqs, std::span<Tensor> row_steps,
                                    const AdamWStep& hyper) {
  DeviceGuard guard(device_);
  const MultiTensorOptions& o = hyper.options;
  check_sparse_step_call("sparse_adamw_step", Device::cuda(device_), tables, rows, grads, exp_avgs,
                         exp_avg_sqs, row_steps, o);
  const AdamWOp op{hyper.lr,           hyper.beta1,    hyper.beta2, hyper.eps,
                   hyper.weight_decay, rounding_of(o), flag_ptr(o)};
  const cudaStream_t stream = stream_for(device_);
  for (size_t i = 0; i < tables.size(); ++i) {
    const int64_t num_rows = rows[i].numel(), dim = tables[i].size(1);
    if (num_rows == 0 || dim == 0) continue;
    TensorArg a;
    a.data = tables[i].data_ptr();
    a.grad = grads[i].data_ptr();
    a.state0 = exp_avgs[i].data_ptr();
    a.state1 = exp_avg_sqs[i].data_ptr();
    a.numel = tables[i].numel();
    a.dtype = tables[i].dtype();
    a.grad_dtype = grads[i].dtype();
    a.id = o.ids[i];
    if (i < o.masters.size() && o.masters[i].defined())
      a.master = static_cast<float*>(o.masters[i].data_ptr());
    const auto* ids = static_cast<const int64_t*>(rows[i].data_ptr());
    auto* steps = static_cast<int64_t*>(row_steps[i].data_ptr());
    const int64_t total = num_rows * dim;
    const auto blocks =
        unsigned(std::min<int64_t>((total + kBlockThreads - 1) / kBlockThreads, 4096));
    sparse_adamw_kernel<<<blocks, kBlockThreads, 0, stream>>>(a, ids, steps, num_rows, dim, op);
    MT_CUDA_CHECK_LAUNCH();
    const auto row_blocks =
        unsigned(std::min<int64_t>((num_rows + kBlockThreads - 1) / kBlockThreads, 1024));
    sparse_advance_kernel<<<row_blocks, kBlockThreads, 0, stream>>>(ids, steps, num_rows,
                                                                    flag_ptr(o));
    MT_CUDA_CHECK_LAUNCH();
    row_steps[i].bump_version();
  }
}

void CudaBackend::multi_tensor_norm(std::span<const Tensor> tensors, double norm_type,
                                    Tensor& out) {
  DeviceGuard guard(device_);
  MT_ASSERT(out.dtype() == DType::F64 && out.numel() == 1 && out.device() == Device::cuda(device_),
            "multi_tensor_norm writes one f64 element on cuda:", device_, ", got ", out.describe());
  MT_CHECK(norm_type > 0, "a gradient norm needs norm_type > 0 (or inf), got ", norm_type);
  check_plain_tensors("multi_tensor_norm", Device::cuda(device_), tensors);
  const NormKind kind = std::isinf(norm_type) ? NormKind::Inf
                        : norm_type == 2      ? NormKind::Two
                        : norm_type == 1      ? NormKind::One
                                              : NormKind::P;
  const cudaStream_t stream = stream_for(device_);
  const int64_t chunks = total_chunks(tensors);
  // At least one slot, so that no tensors (or only empty ones) give a norm of 0.
  const Tensor partials = scratch(std::max<int64_t>(chunks, 1) * int64_t(sizeof(double)), device_);
  double* partial = static_cast<double*>(partials.data_ptr());
  const NormPartialOp op{kind, norm_type, partial};
  for_each_batch(
      tensors.size(), [&](size_t i) { return tensors[i].numel(); },
      [&](size_t i) {
        TensorArg a;
        a.data = const_cast<void*>(tensors[i].data_ptr());
        a.numel = tensors[i].numel();
        a.dtype = tensors[i].dtype();
        return a;
      },
      [&](const Batch& b, int blocks) { launch_batch(b, blocks, op, stream); });
  norm_combine_kernel<<<1, 1, 0, stream>>>(partial, chunks, kind, norm_type,
                                           static_cast<double*>(out.data_ptr()));
  MT_CUDA_CHECK_LAUNCH();
}

void CudaBackend::multi_tensor_scale(std::span<Tensor> tensors, const Tensor& factor) {
  DeviceGuard guard(device_);
  check_plain_tensors("multi_tensor_scale", Device::cuda(device_), tensors);
  MT_ASSERT(factor.dtype() == DType::F64 && factor.numel() == 1 &&
                factor.device() == Device::cuda(device_),
            "multi_tensor_scale: the factor is one f64 element on cuda:", device_, ", got ",
            factor.describe());
  const ScaleOp op{static_cast<const double*>(factor.data_ptr())};
  const cudaStream_t stream = stream_for(device_);
  for_each_batch(
      tensors.size(), [&](size_t i) { return tensors[i].numel(); },
      [&](size_t i) {
        TensorArg a;
        a.data = tensors[i].data_ptr();
        a.numel = tensors[i].numel();
        a.dtype = tensors[i].dtype();
        return a;
      },
      [&](const Batch& b, int blocks) { launch_batch(b, blocks, op, stream); });
}

bool CudaBackend::unscale_and_check(std::span<Tensor> grads, double inv_scale, Tensor* found_inf) {
  DeviceGuard guard(device_);
  check_plain_tensors("unscale_and_check", Device::cuda(device_), grads);
  const cudaStream_t stream = stream_for(device_);
  if (found_inf != nullptr) {
    // The flag is the answer and stays on the device (see the top of this file): no wait.
    check_found_inf("unscale_and_check", Device::cuda(device_), *found_inf);
    launch_unscale(grads, inv_scale, nullptr, static_cast<float*>(found_inf->data_ptr()), stream);
    return false;
  }
  // A host result was asked for: a flag of our own, read back once the kernel is done.
  const Tensor flag = scratch(sizeof(float), device_);
  float* flag_dev = static_cast<float*>(flag.data_ptr());
  MT_CUDA_CHECK(cudaMemsetAsync(flag_dev, 0, sizeof(float), stream));
  launch_unscale(grads, inv_scale, nullptr, flag_dev, stream);
  float host = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&host, flag_dev, sizeof(float), cudaMemcpyDeviceToHost, stream));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host != 0.0f;
}

void CudaBackend::update_scale(Tensor& state, const Tensor& found_inf, const ScaleUpdate& rule) {
  DeviceGuard guard(device_);
  check_scale_state("update_scale", Device::cuda(device_), state);
  check_found_inf("update_scale", Device::cuda(device_), found_inf);
  update_scale_kernel<<<1, 1, 0, stream_for(device_)>>>(
      static_cast<double*>(state.data_ptr()), static_cast<const float*>(found_inf.data_ptr()),
      rule);
  MT_CUDA_CHECK_LAUNCH();
  state.bump_version();
}

void CudaBackend::unscale_with_state(std::span<Tensor> grads, const Tensor& scale_state,
                                     Tensor& found_inf) {
  DeviceGuard guard(device_);
  check_scale_state("unscale_and_check", Device::cuda(device_), scale_state);
  check_plain_tensors("unscale_and_check", Device::cuda(device_), grads);
  check_found_inf("unscale_and_check", Device::cuda(device_), found_inf);
  launch_unscale(grads, 1.0, static_cast<const double*>(scale_state.data_ptr()),
                 static_cast<float*>(found_inf.data_ptr()), stream_for(device_));
}

}  // namespace mantissa::backend::cuda
