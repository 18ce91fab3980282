// The precision table (amp/precision.h) and the one call that sets a recipe up.
#include "mantissa/amp/precision.h"

#include <algorithm>
#include <memory>

#include "mantissa/core/cpu.h"
#include "mantissa/core/error.h"

namespace mantissa::amp {

const PrecisionInfo& precision_info(Precision p) {
  static constexpr PrecisionInfo kInfo[] = {
#define MT_PRECISION_INFO(e, name, help, dtype, level, levels, gemm) {dtype, level, levels, gemm},
      MT_FORALL_PRECISIONS(MT_PRECISION_INFO)
#undef MT_PRECISION_INFO
  };
  return kInfo[size_t(p)];
}

Precision resolve(Precision p) {
  if (p != Precision::Auto) return p;
  return cpu_features().avx512_bf16 ? Precision::BF16 : Precision::FP16;
}

bool accepts_level(Precision p, OptLevel level) {
  return (precision_info(p).levels >> int(level)) & 1;
}

OptLevel level_of(const Recipe& r) {
  return r.level.value_or(precision_info(resolve(r.precision)).level);
}

Amp initialize(nn::Module& model, optim::Optimizer& opt, const Recipe& recipe) {
  const Precision p = resolve(recipe.precision);
  const PrecisionInfo& info = precision_info(p);
  MT_CHECK(!recipe.level || accepts_level(p, *recipe.level), "precision ", name_of(p),
           " does not run at opt level ", name_of(*recipe.level));
  set_matmul_precision(info.gemm);
  const OptLevel level = level_of(recipe);
  AmpOptions ao;
  if (p == Precision::BF16Pure) {
    // bf16 O3 without masters, stochastic rounding, batch norm fp32.
    ao = bf16_pure_options(recipe.seed);
  } else if (level != OptLevel::O0) {
    ao.rounding = recipe.rounding.value_or(RoundingMode::NearestEven);
    ao.rounding_seed = recipe.seed;
  }
  ao.loss_scale = recipe.loss_scale;
  // fp8 needs no loss scaling (per-tensor scales give each tensor its range), but a static scale
  // of 1 checks the gradients: a step that met inf or NaN is skipped, as fp16's are.
  if (p == Precision::FP8 && !ao.loss_scale) ao.loss_scale = 1.0;
  ao.scaler.init_scale = recipe.init_scale;
  ao.scaler.max_scale = std::max(ao.scaler.max_scale, recipe.init_scale);
  Amp amp = initialize(model, opt, level, info.dtype, ao);
  if (p == Precision::FP8) {
    // The Linear GEMMs in fp8 (the layers prepare_fp8 picks), everything else as bf16.
    auto context = std::make_shared<Fp8Context>(recipe.fp8);
    prepare_fp8(model, *context, recipe.fp8_layers);
    amp.set_fp8(std::move(context));
  }
  return amp;
}

}  // namespace mantissa::amp
