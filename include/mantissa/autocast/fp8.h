// FP8 training: the GEMMs of Linear layers in fp8 with the published scaling recipes, exact on
// any CPU (docs/fp8.md).
//
//   amp::Fp8Context fp8({.recipe = amp::Fp8Recipe::Delayed});   // or Current, Rowwise, ...
//   amp::prepare_fp8(*model, fp8);            // amp.h: fp8 state on the Linear layers it picks
//   {
//     amp::Autocast ac(Device::cpu(), DType::BF16);   // everything else as bf16 O1
//     amp::Fp8Autocast f8(fp8);                       // Linear layers with a state run in fp8
//     loss = cross_entropy((*model)(x), y);
//   }
//   loss.backward();                          // both backward GEMMs in fp8 too
//   opt.step();
//   fp8.update();                             // delayed scaling: next step's scales
//
// A Linear layer in fp8 (fp8_linear) quantizes its input and weight to E4M3 and the gradient of
// its output to E5M2 (Fp8Format::Hybrid; Fp8Format::E4M3 uses E4M3 for all three), each with a
// scale so its values use fp8's range, and computes y = x W^T, dx = dy W and dW = dy^T x as fp8
// products accumulated in fp32 and rounded once (the Hopper contract; Fp8Options::accumulate
// fast: Hopper's narrow accumulator, modelled). How the scale is chosen is the recipe:
//   Delayed   per tensor, from the amax history of earlier steps (TE's DelayedScaling: history
//             1024, max over it, margin 0; scale = fp8_max / amax / 2^margin). This step's amax
//             is recorded for the next: update() computes the new scales, then rolls the history.
//   Current   per tensor, from this tensor's amax (one extra pass over it); the default, as
//             torchao's tensorwise recipe is its default (it dropped delayed scaling).
//   MXFP8     blocks of 32 along the reduction dimension with power-of-two (E8M0) scales.
//   Blockwise DeepSeek-V3: 1 x 128 tiles for activations and gradients, 128 x 128 blocks for
//             weights, fp32 scales, the partial sums of each 128-wide slice scaled and
//             accumulated in fp32.
//   Rowwise   torchao's: every GEMM's operands with a scale per row along its reduction (x per
//             token, W per output row forward; W per input column, dy per token for dx; dy^T
//             and x^T per feature for dW), E4M3 for all three, power-of-two scales.
//   RowwiseGwHp torchao's rowwise_with_gw_hp: the forward as rowwise; dx = dy (per row) . W
//             (one scale for the whole weight); dW = dy^T x in the forward's precision (bf16
//             with fp32 sums), not in fp8.
// The emulation is exact: the fp8 codes (exact in bf16) go through a bf16 GEMM with fp32
// accumulation, and the scales are applied to the fp32 sums (per tensor, per 128-slice) or, being
// powers of two, to the codes (MXFP8).
//
// A tensor holding inf or NaN quantizes to NaN (finite values beyond fp8's range saturate), so
// the step's gradients are not finite and the loss scaler skips the step; its amax is not
// recorded, and it is counted (Fp8TensorMeta::nonfinite; the trainer's fp8 records warn, key
// "fp8:nonfinite", naming the layer).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mantissa/autocast/fp4.h"
#include "mantissa/core/dtype.h"
#include "mantissa/core/vocabulary.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::amp {

// The recipes (name_of / find_word: core/vocabulary.h), each with its traits: whether it scales
// per tensor (one scale serves all three GEMMs, so backward keeps the codes), the formats it uses
// unless Fp8Options::format says, and whether its scales are powers of two unless
// Fp8Options::pow2_scales says.
#define MT_FORALL_FP8_RECIPES(_)                                                                   \
  _(Delayed, "delayed", "per tensor, from the amax history of earlier steps (Transformer Engine)", \
    true, Fp8Format::Hybrid, false)                                                                \
  _(Current, "current", "per tensor, from this step's amax (torchao's tensorwise, TE's current)",  \
    true, Fp8Format::Hybrid, false)                                                                \
  _(MXFP8, "mxfp8", "blocks of 32 along the reduction dimension, power-of-two scales", false,      \
    Fp8Format::Hybrid, true)                                                                       \
  _(Blockwise, "blockwise", "DeepSeek-V3: 1x128 activation tiles, 128x128 weight blocks", false,   \
    Fp8Format::Hybrid, false)                                                                      \
  _(Rowwise, "rowwise",                                                                            \
    "torchao's: a scale per row along each GEMM's reduction, E4M3, power-of-two scales", false,    \
    Fp8Format::E4M3, true)                                                                         \
  _(RowwiseGwHp, "rowwise_with_gw_hp",                                                             \
    "torchao's: rowwise forward, the input gradient against a per-tensor weight scale, the "       \
    "weight gradient in high precision",                                                           \
    false, Fp8Format::E4M3, false)

#define MT_FORALL_FP8_FORMATS(_)                                                      \
  _(Hybrid, "hybrid", "E4M3 for inputs and weights, E5M2 (more range) for gradients") \
  _(E4M3, "e4m3", "E4M3 for all three")
MT_VOCABULARY(Fp8Format, MT_FORALL_FP8_FORMATS)
MT_VOCABULARY(Fp8Recipe, MT_FORALL_FP8_RECIPES)

// How delayed scaling reads its history: the max over it, or only the most recent amax.
enum class AmaxCompute : uint8_t { Max, MostRecent };

// How the fp8 GEMMs sum their products: in fp32 (the exact contract: products exact, sums in
// fp32), or fast: Hopper's fp8 tensor-core accumulator, modelled (docs/fp8.md) as 13 bits after
// the leading one (e8m13), the products added in order of k, each sum exact then truncated
// toward zero; the partial sum added to an fp32 one every `promote_every` products (0: at the
// end of each K slice of scales only, i.e. never for per-tensor and per-row scales), as
// DeepSeek-V3 promotes every 128. Or native: the device's own fast accumulation, unmodelled --
// cuBLASLt's FAST_ACCUM on fp8 tensor cores, for the per-tensor recipes' GEMMs of codes; every
// other GEMM (the CPU's, a GPU's without fp8 tensor cores, the block-scaled recipes') runs the
// model (fast), with a warning. Spelled "fp32", "fast", "fast:N" or "native".
struct Fp8Accumulation {
  bool fast = false;
  int64_t promote_every = 0;
  bool native = false;  // fast too
  bool operator==(const Fp8Accumulation&) const = default;
  static Fp8Accumulation parse(std::string_view text);  // a mantissa::Error names what is wrong
  std::string str() const;
};

struct Fp8Options {
  Fp8Recipe recipe = Fp8Recipe::Current;
  // Unset: the recipe's (e4m3 for the rowwise recipes, as torchao's; hybrid otherwise).
  std::optional<Fp8Format> format = std::nullopt;
  // Unset: the recipe's (on for rowwise and mxfp8). On: each block's scale the power of two
  // 2^-ceil(log2(amax / fp8_max)), so scaling is exact. Delayed scaling has no such rule and
  // MXFP8 no other.
  std::optional<bool> pow2_scales = std::nullopt;
  Fp8Accumulation accumulate{};
  int64_t amax_history_len = 1024;  // Delayed
  AmaxCompute amax_compute = AmaxCompute::Max;
  int margin = 0;  // Delayed: scale = fp8_max / amax / 2^margin
  // Set: the layers run the FP4 recipe instead (fp4.h; recipe, format and the delayed-scaling
  // fields are then not used).
  std::optional<Fp4Options> fp4 = std::nullopt;
  bool delayed() const { return !fp4 && recipe == Fp8Recipe::Delayed; }
  Fp8Format resolved_format() const;
  bool resolved_pow2_scales() const;
  // Whether one scale per tensor serves all three GEMMs (delayed, current).
  bool per_tensor() const;
};

// The three tensors of an fp8 Linear layer.
enum class Fp8Role : uint8_t { Input, Weight, GradOutput };
inline constexpr int kNumFp8Roles = 3;
std::string_view fp8_role_name(Fp8Role r);  // "input", "weight", "grad_output"

// The fp8 dtype a role is quantized to under a format.
DType fp8_dtype(Fp8Format format, Fp8Role role);

// What one tensor of one layer has seen, and (delayed scaling) the scale its next quantization
// uses. The state is tensors on the layer's device (F32; they move there with its first
// quantization), updated there by backend ops (fp8_observe, fp8_update_scales): a step reads
// nothing back to the host. The readers below wait for the device (a GPU's: once per call).
struct Fp8TensorMeta {
  Tensor scale;         // (1): delayed: the scale of the next quantization
  Tensor amax_history;  // (len): delayed: slot 0 collects this step's amax (TE's layout)
  // The last quantization (training or not), for the metrics: {the amax over the whole tensor,
  // the smallest scale a block used (per tensor: the scale), quantizations that met inf or NaN}.
  Tensor stats;
  int64_t quantizations = 0;

  Fp8TensorMeta();
  float scale_value() const;
  std::vector<float> history() const;
  float last_amax() const;
  float last_scale() const;
  int64_t nonfinite() const;
  // Sets the delayed-scaling state from host values (tests, a warmed-up start), on its device.
  void set_scale(float s);
  void set_history(const std::vector<float>& h);
  // Moves the state to `device` (a no-op where it is).
  void place(Device device);
};

// The scaling state of one fp8 Linear layer.
struct Fp8LinearState {
  std::string name;  // the layer's path in its model, e.g. "h.0.mlp.c_fc"
  std::array<Fp8TensorMeta, kNumFp8Roles> meta;
  // FP4 with stochastic rounding: the layer's Philox seed, and the streams it has drawn (each
  // SR quantization takes the next offset; checkpointed, so a resumed run draws the same bits).
  uint64_t sr_seed = 0;
  int64_t sr_draws = 0;
  Fp8TensorMeta& operator[](Fp8Role r) { return meta[size_t(r)]; }
  const Fp8TensorMeta& operator[](Fp8Role r) const { return meta[size_t(r)]; }
};

// The recipe and every layer's state: what a training run in fp8 owns.
class Fp8Context {
 public:
  explicit Fp8Context(const Fp8Options& options = {});

  const Fp8Options& options() const { return options_; }
  // A state for the layer `name` (unique), kept here for update(), checkpoints and metrics.
  std::shared_ptr<Fp8LinearState> add_layer(const std::string& name);
  const std::vector<std::shared_ptr<Fp8LinearState>>& layers() const { return layers_; }

  // Every tensor's amax of this step (history slot 0), in a fixed order of layers and roles, as
  // one F32 vector on the layers' device: what `reduce` of update() turns in place into their
  // maximum over the data-parallel ranks.
  using AmaxReduce = std::function<void(Tensor& amaxes)>;

  // Once per optimizer step, after backward. Delayed: `reduce`, when given, first turns this
  // step's amaxes into their maximum over the data-parallel ranks (an all-reduce), so that every
  // rank computes the same scales, as Transformer Engine reduces them over its group; then each
  // tensor's new scale from its history (max, or the most recent), kept where the amax is 0 or
  // not finite; then the history rolls (slot 0 moves to the end, the new slot 0 is zeroed).
  // Other recipes: nothing.
  void update(const AmaxReduce& reduce = {});

  // For checkpoints: "fp8.<layer>.<role>.scale" (F32, 1) and ".amax_history" (F32, len) for
  // delayed scaling; "fp8.<layer>.sr_draws" (I64, 1) for FP4 with stochastic rounding; nothing
  // for the other recipes (their scales come from the data).
  std::map<std::string, Tensor> state_dict() const;
  // Restores what state_dict wrote; a missing or misshapen entry is an error naming it.
  void load_state_dict(const std::map<std::string, Tensor>& state);

 private:
  Fp8Options options_;
  std::vector<std::shared_ptr<Fp8LinearState>> layers_;
};

// RAII region: Linear layers that have an fp8 state (amp::prepare_fp8) run in fp8 under
// `context`'s recipe until it ends; enabled = false turns fp8 off inside. Per thread, nests.
class Fp8Autocast {
 public:
  explicit Fp8Autocast(Fp8Context& context, bool enabled = true);
  ~Fp8Autocast();
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  Fp8Context* prev_;
};

// The context of the innermost enabled region on this thread, or null.
Fp8Context* fp8_context();

// ---- the pieces, for tests and custom layers ---------------------------------------------------

// How a tensor's scales are chosen (see the recipes above).
enum class Fp8ScaleRule : uint8_t {
  Given,     // `scale` for the whole tensor
  Amax,      // fp8_max / amax in fp32 per block (1 where amax is 0 or not finite)
  AmaxPow2,  // the power of two 2^-ceil(log2(amax / fp8_max)) per block, E8M0's range
};

struct Fp8Scaling {
  int64_t block_rows = 0, block_cols = 0;  // 0: the whole dimension (0, 0: per tensor)
  Fp8ScaleRule rule = Fp8ScaleRule::Given;
  float scale = 1;  // Given only
  // Given only, instead of `scale` when defined: the scale as one F32 element on x's device
  // (delayed scaling's state, read where it lives).
  Tensor scale_tensor{};
};

// A matrix in fp8: codes (R, C) and one scale_inv per block (F32, (ceil(R/br), ceil(C/bc))); the
// value of element (r, c) is codes[r, c] * scale_inv[r / br, c / bc]. amax: each block's max |x|.
// fp8_linear's quantizations on the CPU, whose GEMMs read only the values, leave codes undefined
// unless backward keeps them; fp8_gemm takes such an operand's shape from its values.
struct Fp8Tensor {
  Tensor codes;
  Tensor scale_inv;
  Tensor amax;
  int64_t block_rows = 0, block_cols = 0;  // resolved: never 0
  bool power_of_two_scales = false;        // AmaxPow2: scaled values are exact in bf16
  // BF16 (R, C), what the emulated GEMM multiplies: the codes' values, times scale_inv when the
  // scales are powers of two (both exact in bf16). Undefined when dropped (a saved tensor keeps
  // only the codes: fp8_gemm then converts them).
  Tensor values;
};

// x (R, C), any float dtype, to fp8 `dtype` (FP8_E4M3 or FP8_E5M2): codes = x * scale rounded to
// nearest even, finite overflow saturated, inf and NaN to NaN.
Fp8Tensor fp8_quantize(const Tensor& x, DType dtype, const Fp8Scaling& scaling);
// fp8_quantize(x.t(), dtype, scaling), the same codes, values and scales: on the CPU x is
// quantized in the transposed blocks and the result viewed transposed, without the transposed
// copy (what backward needs for block scales along the other dimension).
Fp8Tensor fp8_quantize_transposed(const Tensor& x, DType dtype, const Fp8Scaling& scaling);
// The values an Fp8Tensor stands for, in f32 (codes * scale_inv, rounded to f32).
Tensor fp8_dequantize(const Fp8Tensor& t);

// a (M, K) @ b (N, K)^T [+ bias (N)] -> (M, N) in `out_dtype`: the fp8 products accumulated in
// fp32, each block's scales applied to its partial sum, the bias added in fp32, rounded once.
// a and b may be transposed views of quantized tensors (the blocks follow the view). Their
// blocks along K must agree (both per tensor, or the same width). `accumulate` fast: the sums
// in the narrow accumulator's model instead (Fp8Accumulation), on any device.
Tensor fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& bias, DType out_dtype,
                const Fp8Accumulation& accumulate = {});

// The op: linear(x, weight, bias) with all three GEMMs in fp8 under `options`, recording amaxes
// into `state` (while grad mode is on) and, with delayed scaling, quantizing with its scales.
// The output has linear()'s dtype under the current autocast state; gradients flow to x, weight
// and bias in their dtypes.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Fp8LinearState& state,
                  const Fp8Options& options);

}  // namespace mantissa::amp
