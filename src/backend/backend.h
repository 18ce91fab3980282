// Internal: the kernels a device provides. The op layer (src/tensor/) checks arguments, picks
// dtypes, allocates outputs and records autograd; a Backend only computes. Outputs are passed in
// allocated (and contiguous unless said otherwise); inputs may be any strided view, and all
// floating inputs of one call share one dtype unless said otherwise.
//
// Storage and compute types are separate: kernels load any float dtype to float (double for
// f64), compute, and round on store (RNE). Reductions and GEMM accumulate in fp32 (f64 in f64).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "backend/backend_ops.h"
#include "backend/op_tables.h"
#include "mantissa/core/device.h"
#include "mantissa/numerics/convert.h"
#include "mantissa/numerics/format.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend {

// UnaryOp, BinaryOp, ReduceOp and what each op is: backend/op_tables.h.

struct Scalars {
  double a = 0, b = 0;
};

struct MatmulOptions {
  // Round fp32 inputs to this format first (TF32 for set_matmul_precision("high")); FP32 = none.
  Format input_rounding = Format::FP32;
};

// fp8 scaling (autocast/fp8.h): how fp8_quantize picks each block's scale.
enum class Fp8ScaleRule : uint8_t {
  Given,     // *p.given for every block (per-tensor delayed scaling: the scale from the history)
  Amax,      // fp8_max / amax in fp32 (current scaling; DeepSeek-V3's blocks)
  AmaxPow2,  // 2^-e, e = ceil(log2(amax / fp8_max)) in [-127, 127] (MXFP8's E8M0 scales)
};

struct Fp8QuantizeParams {
  // The block extent; 0 means the whole dimension (0, 0: per tensor; 1, 32: MXFP8).
  int64_t block_rows = 0, block_cols = 0;
  Fp8ScaleRule rule = Fp8ScaleRule::Given;
  // Given only: the scale, one F32 element on x's device, read there (delayed scaling's state
  // stays where the tensors are: no host read per quantization).
  const Tensor* given = nullptr;
  // CPU, with values given: write the values only; codes then names the fp8 dtype and is not
  // written (any shape). The CPU's emulated GEMMs read only the values.
  bool values_only = false;
};

// FP4 block scaling (docs/fp4.md): how fp4_quantize scales each block.
enum class Fp4ScaleRule : uint8_t {
  Nvfp4,    // blocks of 16, E4M3 scales under an fp32 per-tensor scale (Transformer Engine)
  MxFloor,  // blocks of 32, E8M0 scale 2^(floor(log2(amax)) - 2) (the OCP MX spec)
  MxCeil,   // blocks of 32, E8M0 scale 2^ceil(log2(amax / 6)) (never saturates; TE, torchao)
};

struct Fp4QuantizeParams {
  Fp4ScaleRule rule = Fp4ScaleRule::Nvfp4;
  // 1, or 16 for NVFP4's 16 x 16 blocks (weights: the forward and the backward GEMM then see
  // the same quantized values). The block width is the rule's (fp4_block_cols).
  int64_t block_rows = 1;
  // Stochastic rounding of the scaled values (element i of Philox's stream (seed, offset), i
  // the row-major index); else round to nearest even.
  bool stochastic = false;
  uint64_t seed = 0, offset = 0;
  // NVFP4: the tensor amax to scale by (one F32 element on x's device), e.g. reduced across
  // ranks; nullptr: x's own.
  const Tensor* amax = nullptr;
  // Quantize Q = x^T (the wgrad GEMM's operands, reduced down x's columns) without transposing
  // x (R, C): Q is (C, Rp), Rp = the codes' (or values') rows, >= R and a multiple of the block
  // length bc, x's rows R..Rp-1 read as zeros; its 1 x bc blocks run down x's columns. codes and
  // values are written in x's layout, (Rp, C) (Q's element (c, r) at [r, c]: Q is their transposed
  // view), block_scales as (Rp / bc, C); stochastic rounding draws Q's row-major index c * Rp + r.
  // Bit for bit the quantization of Q made contiguous. 1 x bc blocks only.
  bool columns = false;
  // With columns: Q's rows through the 16-point Random Hadamard Transform first (hadamard16's
  // definition with these signs, rounded to x's dtype), the amax the transformed tensor's; Rp
  // a multiple of 16.
  bool rht = false;
  uint32_t rht_signs = 0;
  // The CPU: the values only (the emulation never reads the codes; codes is then not written).
  bool values_only = false;
};

struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};

// The fused attention of scaled_dot_product_attention without a mask: q (B, H, Tq, D), k and v
// (B, H, Tk, D), out (B, H, Tq, D), one float dtype. Inputs in any layout (a backend copies what
// its kernels cannot read); out contiguous, or on the CPU any layout whose head-dim elements are
// adjacent (sdpa writes it in the query's dim order). lse (B, H, Tq), F32 (F64 for
// f64 inputs, like the norms' saved statistics), receives each query row's log-sum-exp of the
// scaled (and masked) scores, which the backward uses to recompute the probabilities instead of
// storing them (flash attention). Causal: query i sees keys 0..i (top-left aligned, as PyTorch's
// is_causal). Scores, softmax and the weighted sum are computed in fp32; out is rounded once.
struct AttentionParams {
  double scale = 1.0;
  bool causal = false;
};

// Whether the CPU backend's fused attention runs on its vectorized fp32 kernels (x86-64 with
// AVX2 and FMA, under MANTISSA_ISA's cap): measured faster there than the composed path for
// f32/bf16/f16 (bench/attention_bench.cpp). f64 and other CPUs run the plain loops.
bool cpu_fused_attention_vectorized();

// The vector build the CPU backend's loops run ("AVX-512", "AVX2" or the baseline: cpu/
// vector_isa.h; MANTISSA_ISA caps it, MANTISSA_CPU_ISA=baseline forces the baseline), for
// benchmarks to name what they measured.
const char* cpu_vector_build();

struct Pool2dParams {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  bool count_include_pad = true;  // avg pool
};

// ---- multi-tensor optimizer kernels ------------------------------------------------------------
// One call updates every parameter of one parameter group in one pass (docs/design.md §5): element
// i of each span belongs to tensor i. Parameters may mix float dtypes; each is loaded in its
// storage dtype, updated in fp32 (f64 for f64) and rounded once on store (RNE). Optimizer state
// (momentum, exp_avg, exp_avg_sq) is kept in a format of optim/state_format.h, told by the state
// tensor's dtype: optimizer_state_dtype(param) (F32 for f32/half/fp8 parameters, F64 for f64:
// the compute type itself), BF16, or block-scaled: FP8_E4M3 (fp8) or U8 (8bit) codes with an F32
// absmax per block in state_scales (below). A step decodes each chunk of state, updates it in the
// compute type and encodes it again (state_math.h). Gradients may be any float dtype. Every tensor
// is contiguous and on this device; a gradient has its parameter's shape. Results do not depend on
// the thread count.
//
// Step counts live on the device, as PyTorch's fused optimizers keep theirs: `step_counts` is an
// I64 tensor on this device with one entry per parameter of the optimizer, and tensor i of the
// call is its row ids[i]. A call that is not skipped first advances the rows of its tensors by
// one and then reads them as each tensor's t (1 = its first update: the state buffers are then
// written, not read, so they may hold anything). A skipped call (found_inf set) leaves them as
// they are, so AdamW's bias correction never counts a skipped step.
//
// The mixed-precision recipe (docs/design.md §4) lives in MultiTensorOptions:
// - fp32 master weights: when `masters` is not empty it has one entry per parameter; a defined
//   masters[i] (F32, contiguous, the parameter's shape, for a parameter stored narrower than
//   f32) is what the update reads and writes, and the parameter then receives the updated
//   master rounded to its own dtype. An undefined entry updates the parameter itself.
// - the rounding of every store into a narrower parameter dtype: NearestEven, or Stochastic with
//   element j of tensor i at its t-th update drawing random_bits(seed, t, (ids[i] << 40) +
//   element_offsets[i] + j) (offsets: 0 when empty; a tensor that is a slice of its parameter,
//   as a ZeRO-1 shard, names where it starts so its bits are the whole parameter's): fresh bits
//   at every update, and bits that depend neither on which other parameters have
//   gradients nor on skipped steps. Stores into f32/f64 parameters are exact: the rounding mode
//   does not apply to them.
// - the loss scaler's device-side skip: `found_inf`, when given, is a one-element F32 tensor on
//   this device; a non-zero value makes the whole call a no-op (parameters, masters, state and
//   step counts untouched) without the host reading it.
// - Kahan compensation (optim::Compensation::Kahan): when `compensations` is not empty it has
//   one entry per parameter; a defined compensations[i] (the parameter's dtype and shape, for a
//   parameter stored narrower than f32 without a master) holds what the last store of each
//   element lost: the update's result x becomes x + c, the parameter round(x + c) to nearest
//   even, and c the rounding of x + c - p. Stores with a compensation are always to nearest.
// - block-scaled state: `state_scales` is empty when no state of the call is block-scaled, else
//   it has (states of the kernel) x (tensors) entries, state_scales[s * tensors + i] the F32
//   absmax of state s of tensor i (ceil(numel / state_block) elements) where that state is
//   FP8_E4M3 or U8, undefined elsewhere. Blocks start at the tensor's first element: a tensor
//   that is a slice of its parameter (element_offsets) starts on a block boundary of it. The
//   first state (momentum, exp_avg) uses the signed dynamic map, the second (exp_avg_sq) the
//   unsigned one, and as fp8 stores its square root.
// check_step_call (multi_tensor_check.cpp) is the one validation of these arguments, shared by
// every backend.
struct MultiTensorOptions {
  std::span<const uint64_t> ids;              // one per parameter: its index in the optimizer
  std::span<const uint64_t> element_offsets;  // empty, or one per parameter (above)
  Tensor* step_counts = nullptr;              // I64 (parameters of the optimizer), on this device
  std::span<Tensor> masters;
  RoundingMode store_rounding = RoundingMode::NearestEven;  // NearestEven | Stochastic
  uint64_t seed = 0;
  const Tensor* found_inf = nullptr;
  std::span<Tensor> compensations;
  std::span<Tensor> state_scales;
  int64_t state_block = 256;
};

// The largest state block, a divisor of every block size a kernel takes (the CPU's chunks hold
// whole blocks); optim::kMaxStateBlock is the same (a static_assert in optimizer.cpp).
inline constexpr int64_t kMaxStateBlockElements = 2048;

// Whether a state tensor of dtype `state` is block-scaled (has an absmax per block).
constexpr bool block_scaled_state(DType state) {
  return state == DType::FP8_E4M3 || state == DType::U8;
}

// The dtype of an optimizer's state for a parameter of dtype `param` (and of its master).
constexpr DType optimizer_state_dtype(DType param) {
  return param == DType::F64 ? DType::F64 : DType::F32;
}

// PyTorch's torch.optim.SGD: g += wd * p; buf = momentum * buf + (1 - dampening) * g (buf = g on
// the first update); g = nesterov ? g + momentum * buf : buf; p -= lr * g.
struct SgdStep {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  MultiTensorOptions options;
};

// PyTorch's torch.optim.AdamW: p *= 1 - lr * wd; m = lerp(m, g, 1 - beta1);
// v = beta2 * v + (1 - beta2) * g^2; p -= lr / (1 - beta1^t) * m / (sqrt(v / (1 - beta2^t)) + eps)
// with t the tensor's step count (eps added after the square root of the corrected second
// moment; the corrections come from adamw_bias_correction in step_math.h).
struct AdamWStep {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  MultiTensorOptions options;
};

// The loss scaler's update rule (see update_scale and step_math.h).
struct ScaleUpdate {
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 1;
  double min_scale = 1.0;
  double max_scale = 16777216.0;
};

// The kernels of one device. The ops are the table of backend_ops.h (one row each, with its
// contract): a backend overrides the ones it has, and the others run on the CPU backend through
// the fallback (fallback.cpp), counted and warned about once per op. copy and fill are the two
// every backend must have.
class Backend {
 public:
  virtual ~Backend() = default;
  // "cpu", "cuda": names the backend in messages and in the fallback's warnings.
  virtual std::string_view name() const = 0;

  // dst = src, any strides on both sides, converting dtype (RNE into narrower floats).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  virtual void fill(Tensor& dst, double value) = 0;

#define MT_BACKEND_DECLARE(family, R, op, params, args) virtual R op params;
  MT_FORALL_BACKEND_OPS(MT_BACKEND_DECLARE)
#undef MT_BACKEND_DECLARE
};

// Declares the override of every op of the table, for a backend that has them all (the CPU and
// CUDA backends); a backend that lacks some declares the ones it has instead.
#define MT_BACKEND_OVERRIDE(family, R, op, params, args) R op params override;
#define MT_BACKEND_OVERRIDE_ALL                       \
  std::string_view name() const override;             \
  void copy(const Tensor& src, Tensor& dst) override; \
  void fill(Tensor& dst, double value) override;      \
  MT_FORALL_BACKEND_OPS(MT_BACKEND_OVERRIDE)

Backend& backend_for(Device device);
Backend& cpu_backend();

}  // namespace mantissa::backend
