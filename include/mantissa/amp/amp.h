// Opt levels: the whole mixed-precision recipe set up in one call, with NVIDIA Apex's meaning
// (docs/design.md §4), for fp16 and for bf16.
//
//   level  model weights                    forward                  master   loss scale
//   O0     fp32                             fp32                     -        none
//   O1     fp32                             autocast(dtype)          -        fp16: dynamic
//   O2     dtype, batch norm kept fp32      in dtype (inputs cast)   fp32     fp16: dynamic
//   O3     dtype, everything                in dtype (inputs cast)   -        none (scale 1)
//
// bf16 has fp32's range: no bf16 level scales the loss. O2/O3 cast the model's floating inputs
// to dtype and its outputs back to fp32 (Apex's patched forward), so the loss runs in fp32.
// `bf16_pure_options()` is the memory-lean variant of bf16 O3 (llm.c's recipe): bf16 weights
// with no master copy, stochastic rounding on every store so that updates smaller than half an
// ulp survive in expectation, and batch norm kept fp32.
//
//   optim::SGD opt(model->parameters(), {...});
//   amp::Amp amp = amp::initialize(*model, opt, amp::OptLevel::O2, DType::F16);
//   Tensor loss = cross_entropy(amp.forward(*model, x), y);
//   amp.scaler().scale(loss).backward();
//   amp.scaler().step(opt);
//   amp.scaler().update();
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "mantissa/amp/grad_scaler.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/core/dtype.h"
#include "mantissa/core/vocabulary.h"
#include "mantissa/nn/module.h"
#include "mantissa/numerics/format.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/optim/state_format.h"

namespace mantissa::amp {

// Apex's opt levels (the table above; name_of / find_word: core/vocabulary.h).
#define MT_FORALL_OPT_LEVELS(_)                                      \
  _(O0, "O0", "fp32")                                                \
  _(O1, "O1", "autocast, fp32 weights")                              \
  _(O2, "O2", "half weights except batch norm, fp32 master weights") \
  _(O3, "O3", "everything half")
MT_VOCABULARY(OptLevel, MT_FORALL_OPT_LEVELS)

// Overrides of a level's defaults (Apex's keyword arguments). Unset: the level's value.
struct AmpOptions {
  std::optional<bool> keep_batchnorm_fp32;  // O2: true, O3: false (other levels: must be unset)
  std::optional<bool> master_weights;       // O2: true, else false (O2/O3 only)
  // A number: static scaling at that scale (fp16 or bf16). Unset: dynamic for fp16 O1/O2,
  // none otherwise. The other fields of `scaler` (growth, hysteresis, ...) are used as given.
  std::optional<double> loss_scale;
  GradScalerOptions scaler;
  // How updates are stored into dtype weights (O2/O3): to nearest even, stochastically, or
  // truncated (toward zero).
  RoundingMode rounding = RoundingMode::NearestEven;
  uint64_t rounding_seed = 0;
  // Kahan: half weights without fp32 masters (O3, or O2 without masters) carry each store's
  // rounding error into the next update (optim::Optimizer::set_compensation); needs rounding
  // to nearest even.
  optim::Compensation compensation = optim::Compensation::None;
};

// bf16 O3 with stochastic rounding and batch norm kept fp32 (see above).
AmpOptions bf16_pure_options(uint64_t seed = 0);

// What initialize() set up.
struct AmpProperties {
  OptLevel level = OptLevel::O0;
  DType dtype = DType::F32;  // the low-precision dtype (F32 for O0)
  bool autocast = false;     // O1
  bool cast_model = false;   // O2, O3: weights (and inputs) in dtype
  bool keep_batchnorm_fp32 = false;
  bool master_weights = false;
  RoundingMode rounding = RoundingMode::NearestEven;
  optim::Compensation compensation = optim::Compensation::None;
  ScaleMode scale_mode = ScaleMode::Disabled;
  double init_scale = 1;
};

class Amp {
 public:
  Amp(const AmpProperties& properties, const GradScalerOptions& scaler);

  // model(x) in the level's precision: under autocast (O1), or with floating inputs cast to
  // dtype and the output cast to fp32 (O2/O3); plain for O0. Also for evaluation.
  Tensor forward(nn::Module& model, const Tensor& x) const;
  // The same for a module of several inputs and outputs (Module::forward_list): each floating
  // input cast (O2/O3), each floating output back to fp32.
  nn::TensorList forward(nn::Module& model, const nn::TensorList& inputs) const;

  GradScaler& scaler() { return scaler_; }
  const GradScaler& scaler() const { return scaler_; }
  const AmpProperties& properties() const { return properties_; }
  // One line, e.g. "fp16 O2: weights fp16 (batch norm fp32), fp32 master weights, dynamic loss
  // scale from 65536, rounding nearest-even"; with fp8 led by the recipe ("fp8 delayed (hybrid)
  // in 15 Linear layers; bf16 O1: ...").
  std::string describe() const;

  // fp8 (amp::initialize with Precision::FP8, precision.h): the context of the model's fp8
  // Linear layers; forward() then runs inside its Fp8Autocast region. Null without fp8.
  void set_fp8(std::shared_ptr<Fp8Context> context) { fp8_ = std::move(context); }
  Fp8Context* fp8() const { return fp8_.get(); }

 private:
  AmpProperties properties_;
  GradScaler scaler_;
  std::shared_ptr<Fp8Context> fp8_;
};

// Sets `model` and `opt` up for `level` in `dtype` (F16 or BF16; ignored for O0): turns the
// optimizer's fp32 master weights on from the current fp32 values, then casts the model (O2,
// O3), and sets the optimizer's store rounding. The model must be all fp32 and `opt` built on
// its parameters. Errors name what does not fit (e.g. keep_batchnorm_fp32 with O1).
Amp initialize(nn::Module& model, optim::Optimizer& opt, OptLevel level, DType dtype,
               const AmpOptions& options = {});

// Which Linear layers prepare_fp8 gives an fp8 state. Inner: the recipes keep the layers next to
// the input and the output (and the embedding) in bf16.
#define MT_FORALL_FP8_LAYERS(_)                                                      \
  _(Inner, "inner", "all but the first and the last Linear layer (in module order)") \
  _(All, "all", "every Linear layer")
MT_VOCABULARY(Fp8Layers, MT_FORALL_FP8_LAYERS)

// Gives the chosen Linear layers of `model` a state in `context` (named by their module path);
// they run in fp8 (or FP4: the context's options) inside an amp::Fp8Autocast region on
// `context`. The last `keep_last` of the chosen ones stay in bf16 (FP4's selective high
// precision; unset: kFp4HighPrecisionShare of them, rounded up, at least one left). Returns the
// paths, in order. A model without Linear layers (or Inner with fewer than three, or none left
// after keep_last) is an error naming the model.
std::vector<std::string> prepare_fp8(nn::Module& model, Fp8Context& context,
                                     Fp8Layers layers = Fp8Layers::Inner,
                                     std::optional<size_t> keep_last = 0);

}  // namespace mantissa::amp
