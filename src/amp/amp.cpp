// amp::initialize: the opt levels' table (amp.h) turned into settings of the model, the
// optimizer, the scaler and the forward pass; and the recipe a precision row names.
#include "mantissa/amp/amp.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <sstream>

#include "mantissa/amp/precision.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/layers.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {

AmpOptions bf16_pure_options(uint64_t seed) {
  AmpOptions o;
  o.keep_batchnorm_fp32 = true;
  o.master_weights = false;
  o.rounding = RoundingMode::Stochastic;
  o.rounding_seed = seed;
  return o;
}

namespace {

GradScalerOptions scaler_options(const AmpProperties& p, const GradScalerOptions& base) {
  GradScalerOptions o = base;
  o.mode = p.scale_mode;
  if (p.scale_mode != ScaleMode::Disabled) o.init_scale = p.init_scale;
  if (p.scale_mode == ScaleMode::Static) {
    o.min_scale = std::min(o.min_scale, p.init_scale);
    o.max_scale = std::max(o.max_scale, p.init_scale);
  }
  return o;
}

}  // namespace

Amp::Amp(const AmpProperties& properties, const GradScalerOptions& scaler)
    : properties_(properties), scaler_(scaler_options(properties, scaler)) {}

Tensor Amp::forward(nn::Module& model, const Tensor& x) const {
  const AmpProperties& p = properties_;
  std::optional<Fp8Autocast> f8;
  if (fp8_) f8.emplace(*fp8_);
  if (p.autocast) {
    Autocast region(x.device().type, p.dtype);
    return model(x);
  }
  if (!p.cast_model) return model(x);
  // Apex's patched forward: floating inputs in the model's dtype, the output back in fp32 (the
  // loss and what follows run in fp32). f64 inputs are cast as well: the model is dtype.
  const Tensor in = x.is_floating_point() ? cast(x, p.dtype) : x;
  const Tensor out = model(in);
  return out.is_floating_point() ? cast(out, DType::F32) : out;
}

nn::TensorList Amp::forward(nn::Module& model, const nn::TensorList& inputs) const {
  const AmpProperties& p = properties_;
  std::optional<Fp8Autocast> f8;
  if (fp8_) f8.emplace(*fp8_);
  MT_CHECK(!inputs.empty(), "Amp::forward: no inputs");
  if (p.autocast) {
    Autocast region(inputs[0].device().type, p.dtype);
    return model(inputs);
  }
  if (!p.cast_model) return model(inputs);
  nn::TensorList in;
  for (const Tensor& x : inputs)
    in.push_back(x.defined() && x.is_floating_point() ? cast(x, p.dtype) : x);
  nn::TensorList out = model(in);
  for (Tensor& y : out) {
    if (y.defined() && y.is_floating_point()) y = cast(y, DType::F32);
  }
  return out;
}

std::string Amp::describe() const {
  const AmpProperties& p = properties_;
  std::ostringstream os;
  if (fp8_ && fp8_->options().fp4) {
    const Fp4Options& o = *fp8_->options().fp4;
    os << "fp4 " << name_of(o.recipe) << " (rht " << (o.rht ? "on" : "off") << ", 2d "
       << (o.two_d ? "on" : "off") << ", sr " << (o.sr ? "on" : "off") << ") in "
       << fp8_->layers().size()
       << (fp8_->layers().size() == 1 ? " Linear layer; " : " Linear layers; ");
  } else if (fp8_) {
    const Fp8Options& o = fp8_->options();
    os << "fp8 " << name_of(o.recipe) << " (" << name_of(o.resolved_format())
       << (o.resolved_pow2_scales() ? ", power-of-two scales" : "")
       << (o.accumulate.fast ? ", accumulate " + o.accumulate.str() : "") << ") in "
       << fp8_->layers().size()
       << (fp8_->layers().size() == 1 ? " Linear layer; " : " Linear layers; ");
  }
  if (p.level == OptLevel::O0) {
    os << "fp32 O0: no mixed precision";
    return os.str();
  }
  const std::string_view d = p.dtype == DType::F16 ? "fp16" : "bf16";
  os << d << " " << name_of(p.level) << ": ";
  if (p.autocast) {
    os << "fp32 weights, autocast to " << d;
  } else {
    os << "weights " << d << (p.keep_batchnorm_fp32 ? " (batch norm fp32)" : "");
  }
  if (p.master_weights) os << ", fp32 master weights";
  if (p.cast_model && !p.master_weights) os << ", no master weights";
  switch (p.scale_mode) {
    case ScaleMode::Dynamic:
      os << ", dynamic loss scale from " << p.init_scale;
      break;
    case ScaleMode::Static:
      os << ", static loss scale " << p.init_scale;
      break;
    case ScaleMode::Disabled:
      os << ", no loss scaling";
      break;
  }
  if (p.cast_model) os << ", rounding " << rounding_name(p.rounding);
  if (p.compensation != optim::Compensation::None)
    os << ", " << name_of(p.compensation) << " compensation";
  return os.str();
}

Amp initialize(nn::Module& model, optim::Optimizer& opt, OptLevel level, DType dtype,
               const AmpOptions& options) {
  const std::string where = "amp::initialize(" + std::string(name_of(level)) + ")";
  AmpProperties p;
  p.level = level;
  if (level == OptLevel::O0) {
    p.dtype = DType::F32;
  } else {
    MT_CHECK(dtype == DType::F16 || dtype == DType::BF16, where,
             ": the low-precision dtype must be f16 or bf16, got ", dtype_name(dtype));
    p.dtype = dtype;
  }
  const bool casts = level == OptLevel::O2 || level == OptLevel::O3;
  MT_CHECK(casts || !options.keep_batchnorm_fp32.has_value(), where,
           ": keep_batchnorm_fp32 applies to O2 and O3, where the model is cast");
  MT_CHECK(casts || !options.master_weights.value_or(false), where,
           ": master weights apply to O2 and O3, where the weights are ", "half; at ",
           name_of(level), " they are fp32 already");
  MT_CHECK(casts || options.rounding == RoundingMode::NearestEven, where, ": ",
           rounding_name(options.rounding),
           " rounding applies to half weights (O2, O3, bf16-pure); at ", name_of(level),
           " the weights are fp32");
  for (const auto& [name, t] : model.named_parameters()) {
    MT_CHECK(!t.is_floating_point() || t.dtype() == DType::F32, where,
             ": expects an fp32 model, but parameter '", name, "' is ", dtype_name(t.dtype()),
             "; build the model in fp32 and let initialize cast it");
  }
  p.autocast = level == OptLevel::O1;
  p.cast_model = casts;
  p.keep_batchnorm_fp32 = casts && options.keep_batchnorm_fp32.value_or(level == OptLevel::O2);
  p.master_weights = casts && options.master_weights.value_or(level == OptLevel::O2);
  p.rounding = options.rounding;
  if (options.compensation != optim::Compensation::None) {
    MT_CHECK(casts && !p.master_weights, where, ": ", name_of(options.compensation),
             " compensation is for half weights without fp32 masters (O3, bf16-pure); ",
             p.master_weights ? "the masters keep the exact weights already"
                              : "the weights are fp32 at this level");
    MT_CHECK(p.rounding == RoundingMode::NearestEven, where, ": ", name_of(options.compensation),
             " compensation stores to nearest even, not ", rounding_name(p.rounding));
  }
  p.compensation = options.compensation;
  if (options.loss_scale.has_value()) {
    const double s = *options.loss_scale;
    MT_CHECK(std::isfinite(s) && s > 0, where, ": a static loss scale must be finite and > 0, got ",
             s);
    MT_CHECK(level != OptLevel::O0, where, ": O0 trains in fp32 and scales no loss");
    p.scale_mode = ScaleMode::Static;
    p.init_scale = s;
  } else if (dtype == DType::F16 && (level == OptLevel::O1 || level == OptLevel::O2)) {
    p.scale_mode = ScaleMode::Dynamic;
    p.init_scale = options.scaler.init_scale;
  }

  // Masters first, from the fp32 values; then the cast (the optimizer holds the same handles).
  opt.set_master_weights(p.master_weights);
  opt.set_store_rounding(p.rounding, options.rounding_seed);
  opt.set_compensation(p.compensation);
  if (casts) {
    if (p.keep_batchnorm_fp32) {
      model.to(p.dtype, [](const nn::Module& m) { return !nn::is_batch_norm(m); });
    } else {
      model.to(p.dtype);
    }
  }
  return Amp(p, options.scaler);
}

std::vector<std::string> prepare_fp8(nn::Module& model, Fp8Context& context, Fp8Layers layers,
                                     std::optional<size_t> keep_last) {
  std::vector<std::pair<std::string, nn::Linear*>> linears;
  for (auto& [path, m] : model.named_modules()) {
    if (auto* l = dynamic_cast<nn::Linear*>(m)) linears.emplace_back(path, l);
  }
  const size_t skip = layers == Fp8Layers::Inner ? 1 : 0;
  const std::string what = context.options().fp4 ? "fp4" : "fp8";
  MT_CHECK(linears.size() > 2 * skip, what, ": the model ", model.name(), " has ", linears.size(),
           linears.size() == 1 ? " Linear layer" : " Linear layers",
           layers == Fp8Layers::Inner
               ? ", and " + what + " keeps the first and the last in bf16; pass --" + what +
                     "-layers all to run them in " + what + " too"
               : "; " + what + " runs the GEMMs of Linear layers, so it has nothing to do here");
  const size_t chosen = linears.size() - 2 * skip;
  // Unset: the NVFP4 paper's share of the candidates, rounded up, leaving at least one.
  const size_t keep = keep_last
                          ? *keep_last
                          : std::min(size_t(std::ceil(kFp4HighPrecisionShare * double(chosen))),
                                     chosen > 0 ? chosen - 1 : 0);
  MT_CHECK(keep < chosen, what, ": keeping the last ", keep, " of the model ", model.name(), "'s ",
           chosen, " candidate Linear layers in bf16 leaves none to run in ", what,
           "; lower --fp4-high-precision-layers");
  std::vector<std::string> names;
  for (size_t i = skip; i + skip + keep < linears.size(); ++i) {
    linears[i].second->set_fp8_state(context.add_layer(linears[i].first));
    names.push_back(linears[i].first);
  }
  return names;
}

// The recipe a precision names (precision.h's table), set up by the level-level call above.
Amp initialize(nn::Module& model, optim::Optimizer& opt, const Recipe& recipe) {
  const Precision p = resolve(recipe.precision);
  const PrecisionInfo& info = precision_info(p);
  MT_CHECK(!recipe.level || accepts_level(p, *recipe.level), "precision ", name_of(p),
           " does not run at opt level ", name_of(*recipe.level));
  set_matmul_precision(info.gemm);
  const OptLevel level = level_of(recipe);
  AmpOptions ao;
  if (p == Precision::BF16Pure) {
    // bf16 O3 without masters, stochastic rounding (nearest under Kahan), batch norm fp32.
    ao = bf16_pure_options(recipe.seed);
    if (recipe.compensation != optim::Compensation::None) ao.rounding = RoundingMode::NearestEven;
  } else if (level != OptLevel::O0) {
    ao.rounding = recipe.rounding.value_or(RoundingMode::NearestEven);
    ao.rounding_seed = recipe.seed;
  }
  ao.compensation = recipe.compensation;
  ao.loss_scale = recipe.loss_scale;
  // fp8 needs no loss scaling (per-tensor scales give each tensor its range), but a static scale
  // of 1 checks the gradients: a step that met inf or NaN is skipped, as fp16's are.
  if (low_precision_gemms(p) && !ao.loss_scale) ao.loss_scale = 1.0;
  ao.scaler.init_scale = recipe.init_scale;
  ao.scaler.max_scale = std::max(ao.scaler.max_scale, recipe.init_scale);
  Amp amp = initialize(model, opt, level, info.dtype, ao);
  if (p == Precision::FP8) {
    // The Linear GEMMs in fp8 (the layers prepare_fp8 picks), everything else as bf16.
    auto context = std::make_shared<Fp8Context>(recipe.fp8);
    prepare_fp8(model, *context, recipe.fp8_layers);
    amp.set_fp8(std::move(context));
  } else if (p == Precision::FP4) {
    // The same in FP4, the last candidates kept bf16 (selective high precision).
    Fp8Options o;
    o.fp4 = recipe.fp4;
    auto context = std::make_shared<Fp8Context>(o);
    const int64_t n = recipe.fp4_high_precision_layers;
    prepare_fp8(model, *context, recipe.fp4_layers,
                n >= 0 ? std::optional<size_t>(size_t(n)) : std::nullopt);
    amp.set_fp8(std::move(context));
  }
  return amp;
}

}  // namespace mantissa::amp
