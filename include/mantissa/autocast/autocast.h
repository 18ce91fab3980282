// Autocast: inside an RAII region, each op runs in the precision its entry in the cast-policy
// table asks for (src/autocast/cast_policy.cpp, the one table): GEMMs and convolutions in the
// region's low-precision dtype, softmax/norms/losses/exp/log/reductions in fp32, mixed binary
// inputs in the widest. Outside any region nothing changes. State is per thread; regions nest, and
// an inner one may change the dtype or disable autocast until it ends.
//
//   {
//     amp::Autocast ac(x.device(), DType::BF16);       // the device type is required
//     Tensor loss = cross_entropy(model(x), y);   // linear in bf16, the loss in fp32
//   }
//   loss.backward();                              // fp32 parameters get fp32 gradients
//
// The casts are ordinary differentiable casts, so gradients flow back in each input's dtype.
// Within the outermost region, an fp32 leaf that requires grad (a parameter) is cast to the
// low-precision dtype once and reused; the copies are freed when the outermost region ends.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "mantissa/core/device.h"
#include "mantissa/core/dtype.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::amp {

// The ops autocast knows, one line each: _(Enum, name). The policy of each is in the table of
// src/autocast/cast_policy.cpp; an op missing from this list runs in its inputs' dtype.
#define MT_FORALL_AUTOCAST_OPS(_)                                     \
  _(Matmul, "matmul")                                                 \
  _(Linear, "linear")                                                 \
  _(Conv2d, "conv2d")                                                 \
  _(ConvTranspose2d, "conv_transpose2d")                              \
  _(ScaledDotProductAttention, "scaled_dot_product_attention")        \
  _(LstmSequence, "lstm_sequence")                                    \
  _(Softmax, "softmax")                                               \
  _(LogSoftmax, "log_softmax")                                        \
  _(LayerNorm, "layer_norm")                                          \
  _(BatchNorm, "batch_norm")                                          \
  _(CrossEntropy, "cross_entropy")                                    \
  _(BinaryCrossEntropy, "binary_cross_entropy")                       \
  _(BinaryCrossEntropyWithLogits, "binary_cross_entropy_with_logits") \
  _(Exp, "exp")                                                       \
  _(Log, "log")                                                       \
  _(Pow, "pow")                                                       \
  _(Rsqrt, "rsqrt")                                                   \
  _(Reciprocal, "reciprocal")                                         \
  _(Sum, "sum")                                                       \
  _(Mean, "mean")                                                     \
  _(Var, "var")                                                       \
  _(Add, "add")                                                       \
  _(Sub, "sub")                                                       \
  _(Mul, "mul")                                                       \
  _(Div, "div")                                                       \
  _(Maximum, "maximum")                                               \
  _(Minimum, "minimum")                                               \
  _(Where, "where")                                                   \
  _(Cat, "cat")                                                       \
  _(Stack, "stack")

enum class OpId : uint16_t {
#define MT_AUTOCAST_OP_ENUM(e, name) e,
  MT_FORALL_AUTOCAST_OPS(MT_AUTOCAST_OP_ENUM)
#undef MT_AUTOCAST_OP_ENUM
};

#define MT_AUTOCAST_OP_COUNT(...) +1
inline constexpr int kNumAutocastOps = 0 MT_FORALL_AUTOCAST_OPS(MT_AUTOCAST_OP_COUNT);
#undef MT_AUTOCAST_OP_COUNT

std::string_view op_name(OpId op);

// What autocast does with an op's floating inputs (f64 and integer tensors are never cast).
enum class CastPolicy : uint8_t {
  LowerPrecision,  // to the region's dtype (f16 or bf16): GEMMs, convolutions, attention
  Fp32,            // to f32: ops whose range or accumulation needs it
  Promote,         // mixed floating dtypes to the widest of them
  None,            // untouched: the op runs in its inputs' dtype
};

// Whether an op may run in an fp16 region at all (PyTorch bans a few whose fp16 gradients
// overflow or underflow; bf16 regions run them with their policy).
enum class Fp16Rule : uint8_t { Allowed, Banned };

struct PolicyEntry {
  OpId op;
  CastPolicy policy;
  Fp16Rule fp16 = Fp16Rule::Allowed;
  // For a banned op: the safe alternative to tell the user about.
  std::string_view instead = {};
};

// The table's row for an op.
const PolicyEntry& policy_entry(OpId op);
inline CastPolicy policy_of(OpId op) {
  return policy_entry(op).policy;
}
std::string_view policy_name(CastPolicy p);

// ---- regions -------------------------------------------------------------------------------

// RAII region: autocast for tensors on `device` in `dtype` (F16 or BF16; unset: the device type's
// default, bf16 on the CPU and fp16 on CUDA, as PyTorch's), or off (enabled = false) until it
// ends. Restores the previous state of that device type on exit. Regions on other device types
// are left as they are. The device type is required (as torch.autocast's device_type): a region
// only acts on ops whose tensors live on its device type, so a CPU region around a GPU model
// would do nothing. A region that ends having seen ops, but none on its device type, says so
// through mantissa::warn when the region check is on (the default in debug builds; see
// set_autocast_region_check).
class Autocast {
 public:
  explicit Autocast(DeviceType device, std::optional<DType> dtype = {}, bool enabled = true);
  explicit Autocast(Device device, std::optional<DType> dtype = {}, bool enabled = true)
      : Autocast(device.type, dtype, enabled) {}
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DeviceType device_;
  bool enabled_;
  bool prev_enabled_;
  DType prev_dtype_;
  // Ops with floating inputs met per device type (this thread) when the region began.
  std::array<int64_t, kNumDeviceTypes> seen_at_start_;
};

// Whether an enabled region that ends without meeting a tensor of its own device type (but
// tensors of another) warns (mantissa::warn, key "autocast:device:<type>"). On by default in
// builds without NDEBUG, off otherwise. Process-wide.
void set_autocast_region_check(bool on);
bool autocast_region_check();

// The dtype a region on `device` lowers to when none is given: bf16 on the CPU, fp16 on CUDA.
DType default_autocast_dtype(DeviceType device);

// RAII: autocast off on every device type inside (code that must run in its inputs' dtypes).
class NoAutocast {
 public:
  NoAutocast();
  ~NoAutocast();
  NoAutocast(const NoAutocast&) = delete;
  NoAutocast& operator=(const NoAutocast&) = delete;

 private:
  std::array<bool, kNumDeviceTypes> prev_;
};

bool is_autocast_enabled(DeviceType device);
// The dtype a region on `device` lowers to (also when disabled: the last one set; at first the
// device type's default).
DType autocast_dtype(DeviceType device);
// How many Autocast regions enclose this point (enabled or not) on this thread.
int autocast_nesting();

// ---- the weight-cast cache -----------------------------------------------------------------

struct CastCacheStats {
  int64_t casts = 0;    // low-precision copies of parameters made (cache misses)
  int64_t hits = 0;     // uses served from the cache
  int64_t entries = 0;  // copies held now
  int64_t bytes = 0;    // their size
};
// This thread's counters (casts and hits accumulate until reset_cast_cache_stats()).
CastCacheStats cast_cache_stats();
void reset_cast_cache_stats();
// Frees the cached copies now (the outermost region's end does it too).
void clear_cast_cache();

// ---- the op layer's entry point ------------------------------------------------------------

namespace detail {
// Replaces ins[i] by the cast ones where the policy casts (writing them to store[i]).
void apply_policy(OpId op, const Tensor** ins, Tensor* store, size_t n);
}  // namespace detail

// Whether any autocast region is enabled on this thread: the one check an op pays outside.
// Not inline: an extern thread_local read from other files goes through a TLS wrapper that
// UBSan saw return null (GCC 12, static library); one call per op costs nothing measurable.
bool autocast_active();

// An op's inputs after its autocast policy: `AutocastInputs in(OpId::Matmul, a, b);` then
// in[0], in[1]. Outside a region it only holds pointers to the arguments.
template <size_t N>
class AutocastInputs {
 public:
  template <typename... T>
  explicit AutocastInputs(OpId op, const T&... inputs) : ptr_{&inputs...} {
    static_assert(sizeof...(T) == N);
    if (autocast_active()) [[unlikely]]
      detail::apply_policy(op, ptr_.data(), store_.data(), N);
  }
  const Tensor& operator[](size_t i) const { return *ptr_[i]; }

 private:
  std::array<const Tensor*, N> ptr_;
  std::array<Tensor, N> store_;
};
template <typename... T>
AutocastInputs(OpId, const T&...) -> AutocastInputs<sizeof...(T)>;

// The same for an op taking a list (cat, stack): the cast list, or `tensors` itself outside.
std::vector<Tensor> autocast_list(OpId op, const std::vector<Tensor>& tensors);

}  // namespace mantissa::amp
