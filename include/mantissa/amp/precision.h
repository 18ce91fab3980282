// Precision recipes by name: what `--precision bf16 --opt-level O2` means, in one table, and the
// one call that sets a model and its optimizer up for it (amp::initialize with a Recipe). The
// trainer, `mantissa bench`, `mantissa generate` and the Python package all go through these.
//
//   amp::Recipe r{.precision = amp::Precision::FP16, .level = amp::OptLevel::O2};
//   amp::Amp amp = amp::initialize(*model, opt, r);   // fp16 weights, fp32 masters, dynamic scale
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mantissa/amp/amp.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/core/dtype.h"
#include "mantissa/core/vocabulary.h"
#include "mantissa/numerics/format.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {

// The opt levels a precision accepts, as a mask of 1 << OptLevel.
inline constexpr uint8_t kLevelO0 = 1, kLevelsHalf = 2 | 4 | 8, kLevelsFp8 = 2 | 4, kLevelsNone = 0;

// clang-format off
// _(Enumerator, "name", "help", half dtype, default level, accepted levels, GEMM precision)
#define MT_FORALL_PRECISIONS(_)                                                                   \
  _(FP32, "fp32", "fp32 everywhere", DType::F32, OptLevel::O0, kLevelO0,                         \
    MatmulPrecision::Highest)                                                                     \
  _(TF32, "tf32", "fp32, with f32 GEMM and convolution inputs rounded to tf32", DType::F32,      \
    OptLevel::O0, kLevelO0, MatmulPrecision::High)                                               \
  _(BF16, "bf16", "bf16 mixed precision at --opt-level", DType::BF16, OptLevel::O1, kLevelsHalf, \
    MatmulPrecision::Highest)                                                                     \
  _(FP16, "fp16", "fp16 mixed precision at --opt-level, with dynamic loss scaling", DType::F16,  \
    OptLevel::O1, kLevelsHalf, MatmulPrecision::Highest)                                          \
  _(FP8, "fp8", "the Linear layers' GEMMs in fp8 by --fp8-recipe, the rest bf16 at O1 or O2",    \
    DType::BF16, OptLevel::O1, kLevelsFp8, MatmulPrecision::Highest)                              \
  _(FP4, "fp4",                                                                                   \
    "the Linear layers' GEMMs on FP4 inputs by --fp4-recipe (emulated exactly), the rest bf16 at " \
    "O1 or O2",                                                                                   \
    DType::BF16, OptLevel::O1, kLevelsFp8, MatmulPrecision::Highest)                              \
  _(BF16Pure, "bf16-pure",                                                                        \
    "bf16 weights without fp32 masters, stochastic rounding, batch norm fp32 (bf16 O3)",          \
    DType::BF16, OptLevel::O3, kLevelsNone, MatmulPrecision::Highest)                             \
  _(Auto, "auto", "bf16 where the CPU has native bf16 dot products, else fp16", DType::F32,       \
    OptLevel::O1, kLevelsHalf, MatmulPrecision::Highest)
// clang-format on
MT_VOCABULARY(Precision, MT_FORALL_PRECISIONS)

// What a precision's row says.
struct PrecisionInfo {
  DType dtype;           // the half dtype of the recipe (F32 for fp32 and tf32)
  OptLevel level;        // the level it runs at when none is given
  uint8_t levels;        // the levels it accepts (kLevelsNone: none may be given)
  MatmulPrecision gemm;  // set_matmul_precision for the run
};
const PrecisionInfo& precision_info(Precision p);

// Auto -> BF16 where the CPU has native bf16 dot products (avx512_bf16), else FP16; the others
// as they are.
Precision resolve(Precision p);

// Whether `level` may be given with precision p.
bool accepts_level(Precision p, OptLevel level);

// A precision recipe: a name and what may be changed of it.
struct Recipe {
  Precision precision = Precision::FP32;
  std::optional<OptLevel> level;         // unset: the precision's
  std::optional<RoundingMode> rounding;  // of stores into half weights; unset: the precision's
  // Kahan compensation of half weights without masters (O3, bf16-pure: it makes bf16-pure
  // round to nearest).
  optim::Compensation compensation = optim::Compensation::None;
  // A static loss scale. Unset: dynamic for fp16 O1/O2, a static 1 for fp8 (a step whose
  // gradients met inf or NaN is skipped), none otherwise.
  std::optional<double> loss_scale;
  double init_scale = 65536.0;  // where a dynamic scale starts
  uint64_t seed = 0;            // of stochastic rounding
  // Precision::FP8: the recipe and which Linear layers run in fp8.
  Fp8Options fp8;
  Fp8Layers fp8_layers = Fp8Layers::Inner;
  // Precision::FP4: the recipe, which Linear layers run in FP4, and how many of the last of
  // those stay bf16 (selective high precision; -1: the paper's share, kFp4HighPrecisionShare).
  Fp4Options fp4;
  Fp8Layers fp4_layers = Fp8Layers::Inner;
  int64_t fp4_high_precision_layers = -1;
};

// The NVFP4 paper keeps about the last 15% of the network in bf16 (its 12B model: the final
// blocks); -1 for fp4_high_precision_layers means this share of the FP4 candidates, rounded up.
inline constexpr double kFp4HighPrecisionShare = 0.15;

// Whether a precision runs the Linear layers' GEMMs by a block-scaled recipe (fp8, fp4).
constexpr bool low_precision_gemms(Precision p) {
  return p == Precision::FP8 || p == Precision::FP4;
}

// The level a recipe runs at (its own, or its precision's).
OptLevel level_of(const Recipe& r);

// Sets `model` and `opt` up for the recipe (amp::initialize with the level's dtype and options,
// set_matmul_precision, and for fp8 an Fp8Context with prepare_fp8 on the chosen Linear layers).
// Precision::Auto is resolved first. A mantissa::Error names what does not fit.
Amp initialize(nn::Module& model, optim::Optimizer& opt, const Recipe& recipe);

}  // namespace mantissa::amp
