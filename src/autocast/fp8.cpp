// FP8 training's op layer (mantissa/autocast/fp8.h): the recipes' scalings, the quantize/GEMM
// emulation on the backends' kernels (fp8_quantize, a bf16 matmul with fp32 output), the
// differentiable fp8_linear, the delayed-scaling state and the thread's fp8 region.
#include "mantissa/autocast/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <omp.h>

#include "autocast/linear_common.h"
#include "backend/backend.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"
#include "mantissa/numerics/convert.h"
#include "mantissa/numerics/format.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {

namespace {

thread_local Fp8Context* t_context = nullptr;

constexpr std::string_view kRoleNames[] = {"input", "weight", "grad_output"};

float fp8_max_of(DType d) {
  return float(format_info(*dtype_format(d)).max_finite);
}

// The scaling of `role` in the GEMM whose reduction runs along the columns of the quantized
// matrix: per tensor (delayed, current), a row (rowwise), 1 x 32 (MXFP8); blockwise weights are
// 128 x 128 blocks, its activations and gradients 1 x 128 tiles.
Fp8Scaling scaling_for(const Fp8Options& o, Fp8Role role, const Fp8TensorMeta& meta) {
  const Fp8ScaleRule rule = o.resolved_pow2_scales() ? Fp8ScaleRule::AmaxPow2 : Fp8ScaleRule::Amax;
  switch (o.recipe) {
    case Fp8Recipe::Delayed:
      return {0, 0, Fp8ScaleRule::Given, 1, meta.scale};
    case Fp8Recipe::Current:
      return {0, 0, rule, 1};
    case Fp8Recipe::MXFP8:
      return {1, 32, Fp8ScaleRule::AmaxPow2, 1};
    case Fp8Recipe::Blockwise:
      return role == Fp8Role::Weight ? Fp8Scaling{128, 128, rule, 1} : Fp8Scaling{1, 128, rule, 1};
    case Fp8Recipe::Rowwise:
    case Fp8Recipe::RowwiseGwHp:
      return {1, 0, rule, 1};
  }
  return {};
}

// What gives an Fp8Tensor's shape and device: its codes, or its values where the codes were not
// written (fp8_linear's quantizations on the CPU).
const Tensor& layout_of(const Fp8Tensor& t) {
  return t.codes.defined() ? t.codes : t.values;
}

// The transposed view of a quantized matrix: its blocks follow.
Fp8Tensor transposed(const Fp8Tensor& t) {
  Fp8Tensor r = t;
  r.codes = t.codes.defined() ? t.codes.t() : Tensor();
  r.scale_inv = t.scale_inv.t();
  r.amax = t.amax.defined() ? t.amax.t() : Tensor();
  r.values = t.values.defined() ? t.values.t() : Tensor();
  std::swap(r.block_rows, r.block_cols);
  return r;
}

// Each block's scale_inv repeated over its elements: (R, C) f32.
Tensor expand_blocks(const Tensor& s, int64_t br, int64_t bc, int64_t R, int64_t C) {
  const int64_t nbr = s.size(0), nbc = s.size(1);
  return s.contiguous()
      .view({nbr, 1, nbc, 1})
      .expand({nbr, br, nbc, bc})
      .reshape({nbr * br, nbc * bc})
      .narrow(0, 0, R)
      .narrow(1, 0, C);
}

// fp8 codes as bf16 values (exact), in the layout they have: the table conversion runs on the
// contiguous storage of a matrix or of its transpose.
Tensor codes_bf16(const Tensor& codes) {
  if (codes.is_contiguous()) return codes.to(DType::BF16);
  if (codes.t().is_contiguous()) return codes.t().to(DType::BF16).t();
  return codes.contiguous().to(DType::BF16);
}

// Records one quantization of `role` into the layer's state (amaxes into the history only while
// training: evaluation must not move the scales).
void observe(Fp8LinearState& st, Fp8Role role, const Fp8Tensor& q, const Fp8Options& o,
             bool training) {
  Fp8TensorMeta& m = st[role];
  m.place(q.scale_inv.device());
  ++m.quantizations;
  if (q.amax.numel() == 0) return;  // an empty tensor
  const bool record = training && o.recipe == Fp8Recipe::Delayed && m.amax_history.defined();
  backend::backend_for(q.scale_inv.device())
      .fp8_observe(q.amax.contiguous(), q.scale_inv.contiguous(), m.stats,
                   record ? &m.amax_history : nullptr);
  m.stats.bump_version();
  if (record) m.amax_history.bump_version();
}

}  // namespace

// ---- names ------------------------------------------------------------------------------

std::string_view fp8_role_name(Fp8Role r) {
  return kRoleNames[size_t(r)];
}

DType fp8_dtype(Fp8Format format, Fp8Role role) {
  return format == Fp8Format::Hybrid && role == Fp8Role::GradOutput ? DType::FP8_E5M2
                                                                    : DType::FP8_E4M3;
}

// ---- the context ---------------------------------------------------------------------------

Fp8Context::Fp8Context(const Fp8Options& options) : options_(options) {
  MT_CHECK(options.amax_history_len >= 1, "fp8: the amax history needs at least one entry, got ",
           options.amax_history_len);
  MT_CHECK(options.margin >= 0 && options.margin < 64, "fp8: the margin must be in [0, 64), got ",
           options.margin);
  MT_CHECK(!options.pow2_scales || !*options.pow2_scales || options.recipe != Fp8Recipe::Delayed,
           "fp8: delayed scaling takes its scales from the amax history, not as powers of two; "
           "use --fp8-recipe current or rowwise for power-of-two scales");
  MT_CHECK(
      !options.pow2_scales || *options.pow2_scales || options.recipe != Fp8Recipe::MXFP8,
      "fp8: MXFP8's block scales are E8M0, powers of two by definition; drop --fp8-pow2-scales "
      "off or pick another recipe");
  MT_CHECK(!options.accumulate.fast || options.accumulate.promote_every >= 0,
           "fp8: promote_every must be >= 0 (0: never), got ", options.accumulate.promote_every);
  MT_CHECK(!options.accumulate.native ||
               (options.accumulate.fast && options.accumulate.promote_every == 0),
           "fp8: native accumulation is the GPU's own, fast and never promoted (cuBLASLt has no "
           "promotion interval); set fast = true and promote_every = 0, or use the model (fast:N)");
}

std::shared_ptr<Fp8LinearState> Fp8Context::add_layer(const std::string& name) {
  for (const auto& l : layers_)
    MT_CHECK(l->name != name, "fp8: layer '", name, "' has a state already");
  auto st = std::make_shared<Fp8LinearState>();
  st->name = name;
  if (options_.fp4) st->sr_seed = mix_seed(options_.fp4->seed, uint64_t(layers_.size()));
  if (options_.delayed()) {
    for (Fp8TensorMeta& m : st->meta)
      m.amax_history = Tensor::zeros({options_.amax_history_len}, DType::F32);
  }
  layers_.push_back(st);
  return st;
}

void Fp8Context::update(const AmaxReduce& reduce) {
  if (!options_.delayed() || layers_.empty()) return;
  NoGrad ng;
  const Device device = layers_.front()->meta[0].amax_history.device();
  std::vector<Tensor> histories, scales;
  std::vector<float> fp8_max;
  for (const auto& l : layers_) {
    for (int r = 0; r < kNumFp8Roles; ++r) {
      Fp8TensorMeta& m = l->meta[size_t(r)];
      m.place(device);
      histories.push_back(m.amax_history);
      scales.push_back(m.scale);
      fp8_max.push_back(fp8_max_of(fp8_dtype(options_.resolved_format(), Fp8Role(r))));
    }
  }
  if (reduce) {
    // This step's amaxes in one vector, reduced, and back into slot 0.
    std::vector<Tensor> slot0;
    for (const Tensor& h : histories)
      slot0.push_back(h.narrow(0, 0, 1));
    Tensor amaxes = cat(slot0, 0);
    reduce(amaxes);
    for (size_t i = 0; i < histories.size(); ++i)
      histories[i].narrow(0, 0, 1).copy_(amaxes.narrow(0, int64_t(i), 1));
  }
  backend::backend_for(device).fp8_update_scales(
      histories, scales, fp8_max, options_.amax_compute == AmaxCompute::Max, options_.margin);
  for (Tensor& t : histories)
    t.bump_version();
  for (Tensor& t : scales)
    t.bump_version();
}

std::map<std::string, Tensor> Fp8Context::state_dict() const {
  std::map<std::string, Tensor> out;
  if (options_.fp4 && options_.fp4->sr) {
    for (const auto& l : layers_)
      out["fp8." + l->name + ".sr_draws"] =
          Tensor::from_vector(std::vector<int64_t>{l->sr_draws}, {1});
  }
  if (!options_.delayed()) return out;
  for (const auto& l : layers_) {
    for (int r = 0; r < kNumFp8Roles; ++r) {
      const Fp8TensorMeta& m = l->meta[size_t(r)];
      const std::string key = "fp8." + l->name + "." + std::string(kRoleNames[r]);
      out[key + ".scale"] = m.scale;
      out[key + ".amax_history"] = m.amax_history;
    }
  }
  return out;
}

void Fp8Context::load_state_dict(const std::map<std::string, Tensor>& state) {
  if (options_.fp4 && options_.fp4->sr) {
    for (const auto& l : layers_) {
      const std::string key = "fp8." + l->name + ".sr_draws";
      const auto d = state.find(key);
      MT_CHECK(d != state.end() && d->second.numel() == 1, "fp4: the checkpoint has no '", key,
               "': it was not written by an FP4 run with stochastic rounding of this model; "
               "resume with the precision and --fp4-sr it was trained with");
      l->sr_draws = int64_t(d->second.to(Device::cpu()).to(DType::I64).item());
    }
  }
  if (!options_.delayed()) return;
  NoGrad ng;
  for (const auto& l : layers_) {
    for (int r = 0; r < kNumFp8Roles; ++r) {
      Fp8TensorMeta& m = l->meta[size_t(r)];
      const std::string key = "fp8." + l->name + "." + std::string(kRoleNames[r]);
      const auto s = state.find(key + ".scale");
      const auto h = state.find(key + ".amax_history");
      MT_CHECK(s != state.end() && h != state.end(), "fp8: the checkpoint has no '", key,
               ".scale' and '.amax_history': it was not written by a delayed-scaling fp8 run of "
               "this model; resume with the precision it was trained in");
      MT_CHECK(s->second.numel() == 1 && h->second.numel() == m.amax_history.numel(), "fp8: '", key,
               ".amax_history' holds ", h->second.numel(), " entries but this run's history has ",
               m.amax_history.numel(), "; resume with the same --fp8-amax-history");
      m.scale.copy_(s->second.reshape({1}).to(m.scale.device()).to(DType::F32));
      m.amax_history.copy_(h->second.reshape({-1}).to(m.amax_history.device()).to(DType::F32));
    }
  }
}

// ---- a tensor's state ----------------------------------------------------------------------

Fp8TensorMeta::Fp8TensorMeta()
    : scale(Tensor::ones({1}, DType::F32)),
      stats(Tensor::from_vector(std::vector<float>{0.0f, 1.0f, 0.0f}, {3})) {}

float Fp8TensorMeta::scale_value() const {
  return scale.to(Device::cpu()).to_vector<float>()[0];
}
std::vector<float> Fp8TensorMeta::history() const {
  return amax_history.defined() ? amax_history.to(Device::cpu()).to_vector<float>()
                                : std::vector<float>{};
}
float Fp8TensorMeta::last_amax() const {
  return stats.to(Device::cpu()).to_vector<float>()[0];
}
float Fp8TensorMeta::last_scale() const {
  return stats.to(Device::cpu()).to_vector<float>()[1];
}
int64_t Fp8TensorMeta::nonfinite() const {
  return int64_t(stats.to(Device::cpu()).to_vector<float>()[2]);
}
void Fp8TensorMeta::set_scale(float s) {
  NoGrad ng;
  scale.copy_(Tensor::from_vector(std::vector<float>{s}, {1}).to(scale.device()));
}
void Fp8TensorMeta::set_history(const std::vector<float>& h) {
  NoGrad ng;
  MT_CHECK(amax_history.defined() && int64_t(h.size()) == amax_history.numel(),
           "fp8: a history of ", h.size(), " entries for one of ",
           amax_history.defined() ? amax_history.numel() : 0);
  amax_history.copy_(Tensor::from_vector(h, {int64_t(h.size())}).to(amax_history.device()));
}
void Fp8TensorMeta::place(Device device) {
  if (scale.device() == device) return;
  NoGrad ng;
  scale = scale.to(device);
  stats = stats.to(device);
  if (amax_history.defined()) amax_history = amax_history.to(device);
}

// ---- the region ----------------------------------------------------------------------------

Fp8Autocast::Fp8Autocast(Fp8Context& context, bool enabled) : prev_(t_context) {
  t_context = enabled ? &context : nullptr;
}
Fp8Autocast::~Fp8Autocast() {
  t_context = prev_;
}
Fp8Context* fp8_context() {
  return t_context;
}

// ---- quantize, dequantize, GEMM ------------------------------------------------------------

namespace {

// fp8_quantize, or with codes false (CPU only) its values and scales without the codes, which
// the CPU's emulated GEMMs do not read: a quarter less time a value.
// What a quantization writes: the codes (what a device's fp8 GEMM reads and per-tensor backward
// keeps) and the values (each code's value in bf16, what the emulated GEMMs read). Without codes
// is the CPU's (its fp8_quantize can write the values alone).
struct Outputs {
  bool codes = true;
  bool values = true;
};

Fp8Tensor quantize(const Tensor& x_arg, DType dtype, const Fp8Scaling& s, Outputs want) {
  const bool codes = want.codes;
  MT_CHECK(dtype == DType::FP8_E4M3 || dtype == DType::FP8_E5M2,
           "fp8_quantize: the target must be fp8_e4m3 or fp8_e5m2, got ", dtype_name(dtype));
  MT_CHECK(x_arg.defined() && x_arg.dim() == 2 && x_arg.is_floating_point() &&
               x_arg.dtype() != DType::F64,
           "fp8_quantize: x must be a 2-D f32, bf16 or f16 matrix, got ",
           x_arg.defined() ? x_arg.describe() : std::string("an undefined tensor"));
  MT_CHECK(s.block_rows >= 0 && s.block_cols >= 0, "fp8_quantize: block sizes must be >= 0");
  MT_CHECK(s.rule != Fp8ScaleRule::Given || (s.block_rows == 0 && s.block_cols == 0),
           "fp8_quantize: a given scale is for a whole tensor (block 0 x 0)");
  MT_CHECK(s.rule != Fp8ScaleRule::Given || s.scale_tensor.defined() ||
               (std::isfinite(s.scale) && s.scale > 0),
           "fp8_quantize: the scale must be finite and positive, got ", s.scale);
  NoGrad ng;
  const Tensor x = x_arg.contiguous();
  const int64_t R = x.size(0), C = x.size(1);
  Fp8Tensor q;
  q.block_rows = s.block_rows == 0 ? std::max<int64_t>(R, 1) : s.block_rows;
  q.block_cols = s.block_cols == 0 ? std::max<int64_t>(C, 1) : s.block_cols;
  const int64_t nbr = (R + q.block_rows - 1) / q.block_rows;
  const int64_t nbc = (C + q.block_cols - 1) / q.block_cols;
  MT_ASSERT(codes || x.device().is_cpu(), "fp8: values without codes are the CPU's");
  Tensor written = Tensor::empty(codes ? Shape{R, C} : Shape{0}, dtype, x.device());
  if (codes) q.codes = written;
  q.scale_inv = Tensor::empty({nbr, nbc}, DType::F32, x.device());
  q.amax = Tensor::empty({nbr, nbc}, DType::F32, x.device());
  q.power_of_two_scales = s.rule == Fp8ScaleRule::AmaxPow2;
  if (want.values) q.values = Tensor::empty({R, C}, DType::BF16, x.device());
  if (x.numel() == 0) return q;
  backend::Fp8QuantizeParams p;
  p.block_rows = q.block_rows;
  p.block_cols = q.block_cols;
  p.rule = backend::Fp8ScaleRule(int(s.rule));
  Tensor given;
  if (s.rule == Fp8ScaleRule::Given) {
    given = s.scale_tensor.defined()
                ? s.scale_tensor
                : Tensor::from_vector(std::vector<float>{s.scale}, {1}).to(x.device());
    MT_CHECK(given.device() == x.device() && given.numel() == 1 && given.dtype() == DType::F32,
             "fp8_quantize: the given scale tensor must be one f32 element on ", x.device().str(),
             ", got ", given.describe());
    p.given = &given;
  }
  p.values_only = !codes;
  backend::backend_for(x.device())
      .fp8_quantize(x, p, written, q.scale_inv, q.amax, want.values ? &q.values : nullptr);
  return q;
}

Fp8Tensor quantize_transposed(const Tensor& x, DType dtype, const Fp8Scaling& s, Outputs want) {
  MT_CHECK(x.defined() && x.dim() == 2, "fp8_quantize_transposed: x must be a 2-D matrix, got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  // A block of x^T (br rows, bc columns) is a block of x (bc rows, br columns); 0 still means
  // the whole dimension.
  Fp8Scaling swapped = s;
  std::swap(swapped.block_rows, swapped.block_cols);
  return transposed(quantize(x, dtype, swapped, want));
}

}  // namespace

Fp8Tensor fp8_quantize(const Tensor& x, DType dtype, const Fp8Scaling& s) {
  return quantize(x, dtype, s, {});
}

Fp8Tensor fp8_quantize_transposed(const Tensor& x, DType dtype, const Fp8Scaling& s) {
  return quantize_transposed(x, dtype, s, {});
}

Tensor fp8_dequantize(const Fp8Tensor& t) {
  NoGrad ng;
  const int64_t R = t.codes.size(0), C = t.codes.size(1);
  return mul(t.codes.to(DType::F32), expand_blocks(t.scale_inv, t.block_rows, t.block_cols, R, C));
}

Tensor fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& bias, DType out_dtype,
                const Fp8Accumulation& accumulate) {
  MT_CHECK(layout_of(a).defined() && layout_of(b).defined(),
           "fp8_gemm: an operand has neither codes nor values");
  const Tensor &la = layout_of(a), &lb = layout_of(b);
  MT_CHECK(la.dim() == 2 && lb.dim() == 2 && la.size(1) == lb.size(1),
           "fp8_gemm: a (M, K) and b (N, K) must share K, got ", la.describe(), " and ",
           lb.describe());
  MT_CHECK(accumulate.promote_every >= 0, "fp8_gemm: promote_every must be >= 0, got ",
           accumulate.promote_every);
  NoGrad ng;
  const int64_t M = la.size(0), K = la.size(1), N = lb.size(0);
  const int64_t bka = std::min(a.block_cols, K), bkb = std::min(b.block_cols, K);
  MT_CHECK(bka == bkb, "fp8_gemm: the blocks of a and b along K differ (", a.block_cols, " and ",
           b.block_cols, "); quantize both with the same block width");
  const bool per_tensor = a.block_rows >= M && b.block_rows >= N && bka >= K;
  const bool both_e5m2 = a.codes.defined() && b.codes.defined() &&
                         a.codes.dtype() == DType::FP8_E5M2 && b.codes.dtype() == DType::FP8_E5M2;
  backend::Backend& be = backend::backend_for(la.device());
  const bool codes_alone = per_tensor && !both_e5m2 && a.codes.defined() && b.codes.defined() &&
                           !(a.values.defined() && b.values.defined());
  if (codes_alone && (!accumulate.fast || accumulate.native)) {
    // Codes alone (a device's quantization): the backend's fp8 GEMM (cuBLASLt's on fp8 tensor
    // cores, else emulated), its operands with K innermost (a transposed view in backward is
    // copied, a byte a value).
    auto k_inner = [](const Tensor& c) { return c.stride(1) == 1 ? c : c.contiguous(); };
    Tensor out = Tensor::empty({M, N}, bias.defined() ? DType::F32 : out_dtype, la.device());
    be.fp8_gemm(k_inner(a.codes), a.scale_inv, k_inner(b.codes), b.scale_inv, accumulate.native,
                out);
    return bias.defined() ? add(out, bias.to(DType::F32)).to(out_dtype) : out;
  }
  if (accumulate.native) {
    warn("fp8:native-accumulate:modelled",
         "--fp8-accumulate native: " +
             std::string(la.device().is_cuda()
                             ? "the GPU's fast accumulation serves the per-tensor recipes' GEMMs "
                               "(delayed, current); this recipe's block-scaled GEMMs"
                             : "there are no fp8 tensor cores on the " + la.device().str() +
                                   "; its fp8 GEMMs") +
             " run the accumulator's model (--fp8-accumulate fast) instead");
  }
  // The emulation: the codes' values (exact in bf16), scaled per block in the backend's
  // block_scaled_gemm (or, accumulating fast, its narrow-accumulator model). Power-of-two scales
  // (MXFP8, rowwise) are in the values already, exactly (code * 2^e is exact in bf16 unless a
  // block's amax is below 2^-118, where it would be a bf16 subnormal): one GEMM of the scaled
  // values, with unit scales. (Accumulating fast, this is the model of scales applied after the
  // sums as long as the scales of a row and a column are the same along K: per tensor and per
  // row; MXFP8's block scales on Hopper are applied in software, per block, in any case.)
  const bool pow2 = a.power_of_two_scales && b.power_of_two_scales;
  auto operand = [pow2](const Fp8Tensor& t) {
    if (pow2) return t.values.defined() ? t.values : fp8_dequantize(t).to(DType::BF16);
    return t.values.defined() && !t.power_of_two_scales ? t.values : codes_bf16(t.codes);
  };
  Tensor out = Tensor::empty({M, N}, out_dtype, la.device());
  const Tensor one = pow2 ? Tensor::ones({1, 1}, DType::F32, la.device()) : Tensor();
  const Tensor& sa = pow2 ? one : a.scale_inv;
  const Tensor& sb = pow2 ? one : b.scale_inv;
  const int64_t ra = pow2 ? std::max<int64_t>(M, 1) : a.block_rows;
  const int64_t rb = pow2 ? std::max<int64_t>(N, 1) : b.block_rows;
  const int64_t bk = std::max<int64_t>(pow2 ? K : bka, 1);
  const Tensor* bias_p = bias.defined() ? &bias : nullptr;
  if (accumulate.fast) {
    be.fast_accumulate_gemm(operand(a), sa, ra, operand(b), sb, rb, bk, accumulate.promote_every,
                            bias_p, out);
  } else {
    be.block_scaled_gemm(operand(a), sa, ra, operand(b), sb, rb, bk, bias_p, out);
  }
  return out;
}

// ---- the op --------------------------------------------------------------------------------

void check_linear_operands(std::string_view op, const Tensor& x, const Tensor& w, const Tensor& b) {
  MT_CHECK(
      x.defined() && w.defined() && w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(1), op,
      ": x (..., in) and weight (out, in) do not fit: ", x.defined() ? x.describe() : "undefined",
      " and ", w.defined() ? w.describe() : "undefined");
  MT_CHECK(x.is_floating_point() && w.is_floating_point() && x.dtype() != DType::F64 &&
               w.dtype() != DType::F64,
           op, " takes f32, bf16 or f16 tensors, got ", x.describe(), " and ", w.describe());
  MT_CHECK(x.device() == w.device() && (!b.defined() || b.device() == x.device()), op,
           ": the tensors are on different devices");
  MT_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == w.size(0)), op, ": bias ",
           b.defined() ? b.describe() : "", " does not match weight ", w.describe());
}

DType linear_output_dtype(const Tensor& x, const Tensor& w, const Tensor& b) {
  DType out_dtype = promote_types(x.dtype(), w.dtype());
  if (b.defined()) out_dtype = promote_types(out_dtype, b.dtype());
  if (autocast_active() && is_autocast_enabled(x.device().type))
    out_dtype = autocast_dtype(x.device().type);
  return out_dtype;
}

Tensor linear_bias_grad(const Tensor& g2, DType b_dtype) {
  // fp32 sums rounded once into the bias's dtype; a gradient in that dtype is read as it is (and
  // should autocast widen the sum, the result is cast back).
  return (g2.dtype() == b_dtype ? sum(g2, {0}) : sum(g2.to(DType::F32), {0})).to(b_dtype);
}

namespace {

// rowwise_with_gw_hp's weight gradient dw (out, in) = g^T (out, M) . x (M, in) in the forward's
// precision `hp`: both rounded to it (bf16 under autocast) and multiplied with fp32 sums, rounded
// once into the weight's dtype (for bf16, the emulation's GEMM with unit scales).
Tensor high_precision_wgrad(const Tensor& g2, const Tensor& x2, DType hp, DType w_dtype) {
  NoGrad ng;
  if (hp != DType::BF16) return matmul(g2.t().to(DType::F32), x2.to(DType::F32)).to(w_dtype);
  const int64_t out_features = g2.size(1), in = x2.size(1), M = g2.size(0);
  Tensor dw = Tensor::empty({out_features, in}, w_dtype, g2.device());
  const Tensor one = Tensor::ones({1, 1}, DType::F32, g2.device());
  backend::backend_for(g2.device())
      .block_scaled_gemm(g2.t().to(DType::BF16), one, std::max<int64_t>(out_features, 1),
                         x2.t().to(DType::BF16), one, std::max<int64_t>(in, 1),
                         std::max<int64_t>(M, 1), nullptr, dw);
  return dw;
}

}  // namespace

Tensor fp8_linear(const Tensor& x, const Tensor& w, const Tensor& b, Fp8LinearState& state,
                  const Fp8Options& o) {
  if (o.fp4) return fp4_linear(x, w, b, state, *o.fp4);
  check_linear_operands("fp8_linear", x, w, b);
  if (!x.device().is_cpu() && !o.per_tensor()) {
    warn("fp8:emulated:" + std::string(name_of(o.recipe)),
         "fp8 on " + x.device().str() + ": the " + std::string(name_of(o.recipe)) +
             " recipe's GEMMs run emulated (fp8 codes through a bf16 GEMM with fp32 sums, the "
             "CPU's numbers); cuBLASLt's block-scaled fp8 GEMMs are not wired (the per-tensor "
             "recipes, delayed and current, use its fp8 GEMM)");
  }
  for (Fp8TensorMeta& m : state.meta)
    m.place(x.device());  // the scaling state lives with the tensors
  const int64_t in = w.size(1), out_features = w.size(0);
  const DType out_dtype = linear_output_dtype(x, w, b);
  const bool training = autograd::needs_grad({&x, &w, &b});
  const DType fwd_dtype = fp8_dtype(o.resolved_format(), Fp8Role::Input);
  const DType grad_dtype = fp8_dtype(o.resolved_format(), Fp8Role::GradOutput);
  const Fp8Accumulation acc = o.accumulate;

  // Per-tensor scales serve every GEMM, so the codes are what backward keeps (a byte per value);
  // block scales run along the reduction dimension, which differs in each GEMM, so the block
  // recipes keep the inputs and quantize them again along the other dimension.
  const bool keep_codes = o.per_tensor();
  // What each quantization writes, the one choice by device: the CPU's GEMMs are emulated and
  // read the values, so codes are written only where backward keeps them; on a device the
  // per-tensor GEMMs read the codes (fp8 tensor cores) and the block recipes' emulated GEMMs
  // the values (its quantization writes the codes in any case).
  const bool on_cpu = x.device().is_cpu();
  const auto outputs = [on_cpu, keep_codes](bool kept) {
    return Outputs{.codes = !on_cpu || kept, .values = on_cpu || !keep_codes};
  };
  const Outputs fwd = outputs(keep_codes && training), once = outputs(false);
  const Tensor x2 = x.reshape({-1, in}).contiguous();  // (M, in)
  Fp8Tensor qx =
      quantize(x2, fwd_dtype, scaling_for(o, Fp8Role::Input, state[Fp8Role::Input]), fwd);
  Fp8Tensor qw =
      quantize(w, fwd_dtype, scaling_for(o, Fp8Role::Weight, state[Fp8Role::Weight]), fwd);
  observe(state, Fp8Role::Input, qx, o, training);
  observe(state, Fp8Role::Weight, qw, o, training);
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = out_features;
  Tensor y = fp8_gemm(qx, qw, b, out_dtype, acc).view(out_shape);
  if (!training) return y;

  // The codes only (a byte a value): backward converts them again.
  auto codes_only = [keep_codes](Fp8Tensor t) {
    if (!keep_codes) return Fp8Tensor{};
    t.amax = t.values = Tensor();
    return t;
  };
  const Fp8Tensor kx = codes_only(qx), kw = codes_only(qw);
  const autograd::SavedTensor saved_x(keep_codes ? Tensor() : x2.detach());
  const autograd::SavedTensor saved_w(keep_codes ? Tensor() : w.detach());
  const Shape x_shape = x.shape();
  const DType x_dtype = x.dtype(), w_dtype = w.dtype(), b_dtype = b.defined() ? b.dtype() : w_dtype;
  const bool gx = x.requires_grad(), gw = w.requires_grad(), gb = b.defined() && b.requires_grad();
  Fp8LinearState* st = &state;
  autograd::record(
      "fp8LinearBackward", {x, w, b}, {y},
      [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor& g = grads[0];
        if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
        const Tensor g2 = g.reshape({-1, out_features}).contiguous();  // (M, out)
        Fp8Tensor qg = quantize(
            g2, grad_dtype, scaling_for(o, Fp8Role::GradOutput, (*st)[Fp8Role::GradOutput]), once);
        observe(*st, Fp8Role::GradOutput, qg, o, true);
        Tensor dx, dw, db;
        if (keep_codes) {
          if (gx) dx = fp8_gemm(qg, transposed(kw), Tensor(), x_dtype, acc);
          if (gw) dw = fp8_gemm(transposed(qg), transposed(kx), Tensor(), w_dtype, acc);
        } else {
          const Tensor xv = saved_x.unpack(), wv = saved_w.unpack();
          Fp8Scaling sw = scaling_for(o, Fp8Role::Weight, (*st)[Fp8Role::Weight]);
          const Fp8Scaling sg = scaling_for(o, Fp8Role::GradOutput, (*st)[Fp8Role::GradOutput]);
          const Fp8Scaling sx = scaling_for(o, Fp8Role::Input, (*st)[Fp8Role::Input]);
          // rowwise_with_gw_hp: the input gradient against one scale for the whole weight.
          if (o.recipe == Fp8Recipe::RowwiseGwHp) sw.block_rows = sw.block_cols = 0;
          if (gx) {  // dx (M, in) = g (M, out) . w^T (in, out): reduction along out
            dx = fp8_gemm(qg, quantize_transposed(wv, fwd_dtype, sw, once), Tensor(), x_dtype, acc);
          }
          if (gw && o.recipe == Fp8Recipe::RowwiseGwHp) {
            dw = high_precision_wgrad(g2, xv, out_dtype, w_dtype);
          } else if (gw) {  // dw (out, in) = g^T (out, M) . x^T (in, M): reduction along M
            dw = fp8_gemm(quantize_transposed(g2, grad_dtype, sg, once),
                          quantize_transposed(xv, fwd_dtype, sx, once), Tensor(), w_dtype, acc);
          }
        }
        if (gb) db = linear_bias_grad(g2, b_dtype);
        return {gx ? dx.reshape(x_shape) : Tensor(), dw, db};
      });
  return y;
}

}  // namespace mantissa::amp
