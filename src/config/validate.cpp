// TrainConfig::validate: each option's range (for values assigned to the struct; text and JSON
// are checked where they are read, train_config.cpp), then the rules between options; what an
// option needs of the task that trains the model is checked by the task (train::check_supported).
#include <cmath>
#include <string>
#include <utility>

#include "mantissa/config/train_config.h"
#include "mantissa/core/device.h"
#include "mantissa/core/error.h"

namespace mantissa::config {
namespace {

std::string level_text(const std::optional<amp::OptLevel>& l) {
  return l ? std::string(name_of(*l)) : std::string();
}

void validate_precision(const TrainConfig& c) {
  const amp::Precision p = c.precision;
  const std::string name(name_of(p));
  if (c.opt_level && !amp::accepts_level(p, *c.opt_level)) {
    const std::string level = level_text(c.opt_level);
    MT_CHECK(p != amp::Precision::BF16Pure,
             "--precision bf16-pure is its own level (bf16 O3 with stochastic rounding); drop "
             "--opt-level ",
             level);
    MT_CHECK(!amp::low_precision_gemms(p), "--precision ", name, " runs the Linear GEMMs in ", name,
             " and the rest as bf16 O1 or O2; --opt-level ", level, " is not one of them");
    MT_CHECK(amp::precision_info(p).levels != amp::kLevelO0, "--opt-level ", level,
             " needs a half precision: add --precision bf16 or fp16 (", name, " is O0 only)");
    MT_CHECK(false, "--opt-level O0 trains in fp32: use --precision fp32");
  }
  const bool half_weights = p == amp::Precision::BF16Pure || c.opt_level == amp::OptLevel::O2 ||
                            c.opt_level == amp::OptLevel::O3;
  if (c.rounding && *c.rounding != StoreRounding::Nearest) {
    MT_CHECK(half_weights, "--rounding ", name_of(*c.rounding),
             " applies to half weights (--opt-level O2 or O3, or --precision bf16-pure); with ",
             name, c.opt_level ? " " : "", c.opt_level ? level_text(c.opt_level) : std::string(),
             " the weights are fp32");
  }
  const bool kahan = c.compensation == optim::Compensation::Kahan;
  MT_CHECK(p != amp::Precision::BF16Pure || !c.rounding || kahan ||
               *c.rounding == StoreRounding::Stochastic,
           "--precision bf16-pure keeps no fp32 master and needs --rounding stochastic (or "
           "--compensation kahan); for ",
           name_of(*c.rounding), " rounding use --precision bf16 --opt-level O3");
  if (kahan) {
    MT_CHECK(p == amp::Precision::BF16Pure || c.opt_level == amp::OptLevel::O3,
             "--compensation kahan keeps half weights accurate without fp32 masters: use it with "
             "--precision bf16-pure or --opt-level O3 (",
             name, c.opt_level ? " " : "", level_text(c.opt_level),
             c.opt_level == amp::OptLevel::O2 ? " keeps fp32 masters" : " has fp32 weights", ")");
    MT_CHECK(!c.rounding || *c.rounding == StoreRounding::Nearest,
             "--compensation kahan stores to nearest; drop --rounding ", name_of(*c.rounding));
  }
  const bool scalable = amp::precision_info(p).levels != amp::kLevelO0;
  MT_CHECK(!c.loss_scale.value || scalable, "--loss-scale ", c.loss_scale.str(),
           " applies to --precision fp16 or bf16, not ", name);
  const bool dynamic_fp16 =
      !c.loss_scale.value && (p == amp::Precision::FP16 || p == amp::Precision::Auto);
  MT_CHECK(std::isfinite(float(c.init_scale)) && float(c.init_scale) > 0,
           "--init-scale must be positive and finite in fp32, got ", c.init_scale);
  MT_CHECK(c.init_scale == TrainConfig{}.init_scale || dynamic_fp16,
           "--init-scale starts dynamic loss scaling, which --precision fp16 uses; with ", name,
           " and --loss-scale ", c.loss_scale.str(), " there is none");
  MT_CHECK(c.underflow_every == 0 ||
               (p == amp::Precision::FP16 && (!c.opt_level || c.opt_level == amp::OptLevel::O1)),
           "--underflow-every measures fp16 underflow against fp32 gradients of the same weights, "
           "so it needs --precision fp16 at O1 (fp32 weights)");
  MT_CHECK(c.grad_accum == 1 || c.underflow_every == 0,
           "--underflow-every measures single-batch steps; drop it or --grad-accum");
}

void validate_optimizer_state(const TrainConfig& c) {
  for (const auto& [given, key] : {std::pair{c.exp_avg_state, "exp-avg-state"},
                                   std::pair{c.exp_avg_sq_state, "exp-avg-sq-state"}}) {
    MT_CHECK(!given || c.optimizer == OptimizerKind::AdamW, "--", key,
             " is AdamW's; with --optimizer ", name_of(c.optimizer),
             " --optim-state sets the momentum's format");
  }
  MT_CHECK((c.state_block & (c.state_block - 1)) == 0,
           "--state-block must be a power of two (32 to ", optim::kMaxStateBlock, "), got ",
           c.state_block);
  const auto f32 = optim::StateFormat::F32;
  MT_CHECK(c.optim_state == f32 || c.optimizer != OptimizerKind::Sgd || c.momentum > 0,
           "--optim-state ", name_of(c.optim_state),
           " sets the format of SGD's momentum buffer, and with --momentum 0 there is none");
  MT_CHECK(!narrow_optimizer_state(c) || c.embedding_update != EmbeddingUpdate::Lazy,
           "--embedding-update lazy keeps its tables' moments in fp32; with --optim-state ",
           name_of(c.optim_state), " use --embedding-update dense");
}

}  // namespace

void TrainConfig::validate() const {
  for (const OptionInfo& o : options()) {
    const std::string wrong = value_error(*this, o.field);
    MT_CHECK(wrong.empty(), "--", o.key, " ", wrong);
  }
  MT_CHECK(data != DataKind::Clicks || !data_path.empty(),
           "--data clicks needs --data-path: a click log, tab-separated (.csv: comma) with a "
           "label, dense and categorical columns per line");
  MT_CHECK(data != DataKind::Text || !data_path.empty(),
           "--data text needs --data-path: the directory `mantissa tokenize --out DIR` wrote, or "
           "a token shard");
  MT_CHECK(epochs > 0 || max_steps > 0, "give a positive --epochs or --steps");
  try {
    parse_device(device);
  } catch (const Error& e) {
    MT_CHECK(false, "--device: ", e.message());
  }
  validate_precision(*this);
  MT_CHECK(checkpoint_every == 0 || !checkpoint_path.empty(),
           "--checkpoint-every writes the --checkpoint file: give --checkpoint FILE too");
  MT_CHECK(on_divergence != OnDivergence::Rollback || !checkpoint_path.empty(),
           "--on-divergence rollback reloads the last checkpoint written: give --checkpoint FILE "
           "(and --checkpoint-every N to lose fewer steps)");
  MT_CHECK(distributed || grad_comm == GradComm::Fp32,
           "--grad-comm applies to data-parallel runs: add --distributed (under mpirun)");
  MT_CHECK(distributed || zero == 0,
           "--zero shards the optimizer state across data-parallel ranks: add --distributed "
           "(under mpirun)");
  MT_CHECK(zero < 3 || underflow_every == 0,
           "--underflow-every reruns backward on fp32 copies of the whole weights, which --zero 3 "
           "keeps only in shards; drop --underflow-every or use --zero 2");
  validate_optimizer_state(*this);
  MT_CHECK(embedding_update != EmbeddingUpdate::Lazy || optimizer == OptimizerKind::AdamW,
           "--embedding-update lazy is AdamW's (LazyAdam); with --optimizer ", name_of(optimizer),
           " use --embedding-update dense");
}

}  // namespace mantissa::config
