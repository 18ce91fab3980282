// What a training run is: every option of `mantissa train`, as one table. From the table come the
// TrainConfig struct, the command line's options and their help, the TOML keys of a run config
// (--config, --print-config), the JSON stored in metrics and checkpoints, the Python dict, the
// checks of each value, and what --resume does with each option (config/run_config.h). Adding an
// option is one row here and the code that reads its field.
//
//   mantissa::config::TrainConfig c;       // mantissa::train::TrainConfig is the same type
//   c.model = "cnn";
//   c.precision = mantissa::amp::Precision::BF16;
//   mantissa::train::Trainer(c).fit();
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "mantissa/amp/precision.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/config/vocabularies.h"
#include "mantissa/data/loader.h"
#include "mantissa/optim/schedule.h"
#include "mantissa/optim/state_format.h"

namespace mantissa::config {

inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// A loss scale: "dynamic" (the precision's own: dynamic for fp16 O1/O2, none for bf16, a static 1
// for fp8) or a fixed positive number (static scaling). Stored as that text.
struct LossScale {
  std::optional<double> value;  // unset: dynamic
  bool operator==(const LossScale&) const = default;
  static LossScale parse(std::string_view text);  // a mantissa::Error names what is wrong
  std::string str() const;                        // "dynamic", or the shortest exact number
};

// The values a number option may take (integers are also checked against their type's range).
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;  // lo itself excluded
  bool hi_open = false;
};
inline constexpr Range kAnyValue{};
inline constexpr Range kPositive{0, std::numeric_limits<double>::infinity(), true};
inline constexpr Range kNonNegative{0};
inline constexpr Range kFraction{0, 1, false, true};  // [0, 1)
// Counts of steps, examples, tokens: large enough for any run, small enough that their products
// (batch x accumulation x sequence) cannot overflow an int64.
inline constexpr double kMaxCount = double(int64_t(1) << 40);
inline constexpr Range kCount{1, kMaxCount};
inline constexpr Range kCountOrZero{0, kMaxCount};

// clang-format off
// _(type, field, "key", default, resume policy, feature it needs, --help group, range, help)
// The key is the option (--key) and the config-file key; a bool whose default is true is the flag
// --no-KEY. A vocabulary option's help is followed by its words and theirs.
#define MT_FORALL_TRAIN_OPTIONS(_)                                                                 \
  /* ---- model and data ----------------------------------------------------------------- */      \
  _(std::string, model, "model", "cnn", Fixed, Any, Model, kAnyValue,                              \
    "The model, with the task that trains it")                \
  _(DataKind, data, "data", DataKind::FashionMnist, Fixed, Any, Model, kAnyValue,                  \
    "The data")                                                                                    \
  _(std::string, data_dir, "data-dir", kDefaultFashionMnistDir, Tunable, DataDir, Model,           \
    kAnyValue, "Directory of the Fashion-MNIST .gz files")                                         \
  _(int64_t, synthetic_size, "synthetic-size", 10000, Fixed, SyntheticSize, Model, kCount,         \
    "Synthetic data's size: images (synthetic; a fifth as many held out), tokens "                 \
    "(synthetic-text; the last 5% held out) or examples (synthetic-clicks; the last 10%)")         \
  /* Recommenders: rows of each categorical field's table (tokens are hashed into them, FNV-1a) */ \
  _(int64_t, hash_buckets, "hash-buckets", 10000, Fixed, Tables, Clicks,                           \
    (Range{2, double(int64_t(1) << 31)}),                                                          \
    "Recommenders: rows of each categorical field's embedding table (tokens hashed into them)")    \
  _(EmbeddingUpdate, embedding_update, "embedding-update", EmbeddingUpdate::Auto, Fixed, Tables,   \
    Clicks, kAnyValue, "Recommenders: how the embedding tables are updated")                       \
  _(double, dropout, "dropout", 0.0, Fixed, Any, Model, kFraction,                                 \
    "Dropout probability where the model has dropout")                                             \
  _(std::string, data_path, "data-path", "", Tunable, DataPath, Model, kAnyValue,                  \
    "--data text: the directory `mantissa tokenize --out DIR` wrote (train.bin, val.bin, "         \
    "tokenizer.json), or a token shard; --data clicks: a click log")                               \
  _(std::string, val_path, "val-path", "", Tunable, ValPath, Model, kAnyValue,                     \
    "The held-out data (default: DIR/val.bin, or the last 5% of a lone token shard; the last 10% " \
    "of a click log)")                                                                             \
  _(std::string, tokenizer, "tokenizer", "", Tunable, Tokenizer, Tokens, kAnyValue,                \
    "--data text: the tokenizer JSON, checked against the shards and kept for generation "         \
    "(default: DIR/tokenizer.json)")                                                               \
  _(int64_t, seq_len, "seq-len", 128, Fixed, SeqLen, Tokens, (Range{1, double(1 << 20)}),         \
    "Token models: tokens per training window (at most the model's context)")                      \
  _(int64_t, vocab_size, "vocab-size", 0, Fixed, VocabSize, Tokens,                                \
    (Range{0, double(int64_t(1) << 31)}),                                                          \
    "The model's vocabulary: synthetic-text's (0: 256); --data text sets it from the shards")      \
  _(int64_t, eval_every, "eval-every", 0, Tunable, Any, Schedule, kCountOrZero,                    \
    "Evaluate every N optimizer steps as well as at each epoch's end (0: epochs only)")            \
  _(int64_t, eval_batches, "eval-batches", 0, Tunable, EvalBatches, Schedule, kCountOrZero,        \
    "Evaluate on at most N batches (0: the whole test / validation / held-out set)")               \
  _(int64_t, fd_feature_steps, "fd-feature-steps", 0, Tunable, FeatureNetwork, Clicks,             \
    kCountOrZero,                                                                                  \
    "dcgan: steps the cnn of the Frechet distance's features trains (0: one epoch)")               \
  /* ---- batches and memory -------------------------------------------------------------- */     \
  /* Micro-batches per optimizer step: each step sees batch_size * grad_accum examples, their */   \
  /* loss summed over all micro-batches and divided once by their total target count. */           \
  _(int64_t, grad_accum, "grad-accum", 1, Fixed, GradAccum, Schedule,                              \
    (Range{1, double(1 << 20)}),                                                                   \
    "Micro-batches per optimizer step (their loss summed, divided once by all their targets: the " \
    "big batch's)")                                                                                \
  _(bool, checkpoint_activations, "checkpoint-activations", false, Tunable,                        \
    ActivationCheckpointing, Schedule, kAnyValue,                                                  \
    "Recompute each transformer block's / LSTM layer's activations in backward (less memory, one " \
    "more forward)")                                                                               \
  /* ---- length of the run --------------------------------------------------------------- */      \
  _(int64_t, epochs, "epochs", 5, Tunable, Any, Schedule, kCountOrZero,                            \
    "Epochs (given --steps without --epochs: as many as the steps take)")                          \
  _(int64_t, max_steps, "steps", 0, Tunable, Any, Schedule, kCountOrZero,                          \
    "Stop after this many optimizer steps (0: when the epochs end)")                               \
  _(int64_t, batch_size, "batch-size", 128, Fixed, Any, Schedule, (Range{1, double(1 << 30)}),    \
    "Training (micro-)batch size: a step sees batch-size * grad-accum examples")                   \
  _(int64_t, eval_batch_size, "eval-batch-size", 0, Tunable, Any, Schedule,                        \
    (Range{0, double(1 << 30)}),                                                                   \
    "Evaluation batch size (0: 256 images, a token model's training batch, 1024 click examples, "  \
    "500 generated images)")                                                                       \
  /* ---- optimizer ----------------------------------------------------------------------- */      \
  _(OptimizerKind, optimizer, "optimizer", OptimizerKind::Sgd, Fixed, Any, Optimizer, kAnyValue,   \
    "The optimizer")                                                                               \
  _(double, lr, "lr", 0.05, Fixed, Any, Optimizer, kPositive, "Peak learning rate")               \
  _(double, momentum, "momentum", 0.9, Fixed, Any, Optimizer, kFraction, "SGD's momentum")        \
  _(bool, nesterov, "nesterov", false, Fixed, Any, Optimizer, kAnyValue, "SGD: Nesterov momentum") \
  _(double, weight_decay, "weight-decay", 5e-4, Fixed, Any, Optimizer, kNonNegative,               \
    "Weight decay (AdamW's decoupled; SGD's added to the gradient)")                               \
  _(Decay, decay, "decay", Decay::Auto, Fixed, Any, Optimizer, kAnyValue,                          \
    "Which parameters decay")                                                                      \
  _(double, beta1, "beta1", 0.9, Fixed, Any, Optimizer, kFraction, "AdamW's first-moment decay")  \
  _(double, beta2, "beta2", 0.999, Fixed, Any, Optimizer, kFraction,                               \
    "AdamW's second-moment decay")                                                                 \
  _(double, eps, "eps", 1e-8, Fixed, Any, Optimizer, kPositive, "AdamW's epsilon")                 \
  _(optim::ScheduleKind, schedule, "schedule", optim::ScheduleKind::Cosine, Fixed, Any, Optimizer, \
    kAnyValue, "The learning-rate schedule")                                                       \
  _(int64_t, warmup_steps, "warmup", 0, Fixed, Any, Optimizer, kCountOrZero,                       \
    "Linear warmup steps (cosine)")                                                                \
  _(int64_t, step_size, "step-size", 1000, Fixed, Any, Optimizer, kCount,                          \
    "Step schedule: steps between drops")                                                          \
  _(double, gamma, "gamma", 0.1, Fixed, Any, Optimizer, kPositive,                                 \
    "Step schedule: the factor of each drop")                                                      \
  _(double, clip_grad_norm, "clip-grad-norm", 0.0, Fixed, Any, Optimizer, kNonNegative,            \
    "Clip the gradients' global 2-norm to this (0: off)")                                          \
  /* Memory per parameter (docs/memory.md): the optimizer's state in fewer bytes. */               \
  _(optim::StateFormat, optim_state, "optim-state", optim::StateFormat::F32, Fixed, Any,          \
    Optimizer, kAnyValue, "How the optimizer keeps its state (SGD's momentum, AdamW's moments)")  \
  _(std::optional<optim::StateFormat>, exp_avg_state, "exp-avg-state", std::nullopt, Fixed, Any,  \
    Optimizer, kAnyValue, "AdamW's first moment (empty: --optim-state)")                           \
  _(std::optional<optim::StateFormat>, exp_avg_sq_state, "exp-avg-sq-state", std::nullopt, Fixed, \
    Any, Optimizer, kAnyValue, "AdamW's second moment (empty: --optim-state)")                     \
  _(int64_t, state_block, "state-block", 256, Fixed, Any, Optimizer,                               \
    (Range{32, double(optim::kMaxStateBlock)}),                                                    \
    "fp8 and 8bit state: elements per fp32 absmax, a power of two (parameters under 4096 "        \
    "elements keep fp32 state)")                                                                   \
  /* ---- precision ----------------------------------------------------------------------- */      \
  /* "auto" becomes the precision this machine runs fastest when the run starts, stored as such */ \
  /* (checkpoints and metrics name what ran). */                                                   \
  _(amp::Precision, precision, "precision", amp::Precision::FP32, Fixed, Any, Precision,           \
    kAnyValue, "The precision recipe")                                                             \
  _(std::optional<amp::OptLevel>, opt_level, "opt-level", std::nullopt, Fixed, Any, Precision,     \
    kAnyValue, "Apex's opt level for bf16, fp16 and fp8 (empty: the precision's, O1)")             \
  _(LossScale, loss_scale, "loss-scale", LossScale{}, Fixed, Any, Precision, kAnyValue,            \
    "dynamic (fp16 O1/O2's; none for bf16) or a fixed number (static scaling)")                    \
  _(double, init_scale, "init-scale", 65536.0, Fixed, Any, Precision, kPositive,                   \
    "Where a dynamic loss scale starts (PyTorch's init_scale)")                                    \
  _(std::optional<StoreRounding>, rounding, "rounding", std::nullopt, Fixed, Any, Precision,       \
    kAnyValue,                                                                                     \
    "How updates are stored into half weights (O2, O3, bf16-pure; empty: stochastic for "          \
    "bf16-pure, nearest otherwise)")                                                               \
  _(optim::Compensation, compensation, "compensation", optim::Compensation::None, Fixed, Any,     \
    Precision, kAnyValue,                                                                          \
    "What carries half weights' rounding error without fp32 masters (bf16-pure or O3; kahan "     \
    "stores to nearest)")                                                                          \
  _(int64_t, underflow_every, "underflow-every", 0, Tunable, Underflow, Precision, kCountOrZero,   \
    "Every N steps, measure fp16 gradient underflow against fp32 gradients of the same weights "   \
    "(fp16 O1; one more fp32 forward and backward each; 0: off)")                                  \
  _(amp::Fp8Recipe, fp8_recipe, "fp8-recipe", amp::Fp8Options{}.recipe, Fixed, Fp8, Fp8, kAnyValue, \
    "How fp8 scales are chosen")                                                                   \
  _(std::optional<amp::Fp8Format>, fp8_format, "fp8-format", std::nullopt, Fixed, Fp8, Fp8,       \
    kAnyValue, "The fp8 formats (empty: the recipe's: e4m3 for the rowwise ones, hybrid otherwise)") \
  _(std::optional<Switch>, fp8_pow2_scales, "fp8-pow2-scales", std::nullopt, Fixed, Fp8, Fp8,     \
    kAnyValue,                                                                                     \
    "Scales rounded to powers of two, 2^-ceil(log2(amax / fp8_max)) (empty: the recipe's: on for " \
    "rowwise and mxfp8, off otherwise)")                                                           \
  _(amp::Fp8Accumulation, fp8_accumulate, "fp8-accumulate", amp::Fp8Accumulation{}, Fixed, Fp8,   \
    Fp8, kAnyValue,                                                                                \
    "How fp8 GEMMs sum: fp32; fast[:N]: the tensor cores' ~13-bit accumulator modelled, "          \
    "promoted to fp32 every N products (DeepSeek-V3: 128; no N: never); native: the GPU's own "    \
    "(cuBLASLt FAST_ACCUM; elsewhere the model)")                                                  \
  _(int64_t, fp8_amax_history, "fp8-amax-history", 1024, Fixed, Fp8, Fp8,                          \
    (Range{1, double(1 << 20)}), "Delayed scaling: steps of amax history the scale is the max over") \
  _(int, fp8_margin, "fp8-margin", 0, Fixed, Fp8, Fp8, (Range{0, 63}),                             \
    "Delayed scaling: scale = fp8_max / amax / 2^margin")                                          \
  _(amp::Fp8Layers, fp8_layers, "fp8-layers", amp::Fp8Layers::Inner, Fixed, Fp8, Fp8, kAnyValue,   \
    "Which Linear layers run in fp8")                                                              \
  _(amp::Fp4Recipe, fp4_recipe, "fp4-recipe", amp::Fp4Recipe::NVFP4, Fixed, Fp4, Fp4, kAnyValue,   \
    "The FP4 block scaling")                                                                       \
  _(Switch, fp4_rht, "fp4-rht", Switch::On, Fixed, Fp4, Fp4, kAnyValue,                            \
    "The 16-point Random Hadamard Transform on the weight-gradient GEMM's inputs")                 \
  _(Switch, fp4_2d, "fp4-2d", Switch::On, Fixed, Fp4, Fp4, kAnyValue,                              \
    "NVFP4 weights in 16x16 blocks (forward and backward see the same quantized weight)")          \
  _(Switch, fp4_sr, "fp4-sr", Switch::On, Fixed, Fp4, Fp4, kAnyValue,                              \
    "Stochastic rounding of the gradients' FP4 values")                                            \
  _(amp::MxScale, fp4_mx_scale, "fp4-mx-scale", amp::MxScale::Floor, Fixed, Fp4, Fp4, kAnyValue,   \
    "MXFP4: how the E8M0 block scale is rounded")                                                  \
  _(amp::Fp8Layers, fp4_layers, "fp4-layers", amp::Fp8Layers::Inner, Fixed, Fp4, Fp4, kAnyValue,   \
    "Which Linear layers are FP4 candidates")                                                      \
  _(int64_t, fp4_high_precision_layers, "fp4-high-precision-layers", -1, Fixed, Fp4, Fp4,          \
    (Range{-1, double(1 << 20)}),                                                                  \
    "How many of the last FP4 candidates stay bf16 (-1: the NVFP4 paper's last 15%, rounded up)")  \
  /* ---- machine ------------------------------------------------------------------------- */      \
  /* Checkpoints are written from host copies and load onto any device. */                         \
  _(std::string, device, "device", "cpu", Tunable, Any, Machine, kAnyValue,                        \
    "cpu, cuda or cuda:N: where the model, optimizer state and batches live")                      \
  _(uint64_t, seed, "seed", 0, Fixed, Any, Machine, kAnyValue,                                     \
    "Seed of the initialisation, data order, dropout and stochastic rounding")                     \
  _(int, threads, "threads", 0, Tunable, Any, Machine, (Range{0, 4096}),                           \
    "Compute threads (0: every core)")                                                             \
  _(int, workers, "workers", 2, Tunable, Any, Machine, (Range{0, 256}), "Data-loader threads")    \
  _(ZeroGrad, zero_grad, "zero-grad", ZeroGrad::None, Tunable, Any, Machine, kAnyValue,            \
    "How gradients are reset before each step")                                                    \
  /* On the CPU nothing is copied: the three are the same. */                                      \
  _(data::Transfer, input_pipeline, "input-pipeline", data::Transfer::Prefetch, Tunable, Any,      \
    Machine, kAnyValue, "How batches reach a GPU")                                                 \
  /* ---- outputs ------------------------------------------------------------------------- */      \
  _(std::string, metrics_path, "metrics", "", Output, Any, Outputs, kAnyValue,                     \
    "Append JSON-lines metrics to FILE (the first record of a launch: the whole configuration)")   \
  _(std::string, tensorboard_dir, "tensorboard", "", Output, Any, Outputs, kAnyValue,              \
    "Write TensorBoard event files to DIR: the metrics' scalars, histograms of weights and "       \
    "gradients, the configuration (tensorboard --logdir DIR)")                                     \
  _(int64_t, histogram_every, "histogram-every", 0, Tunable, Any, Outputs, kCountOrZero,           \
    "--tensorboard: weight and gradient histograms every N steps (0: at each evaluation)")         \
  _(std::string, checkpoint_path, "checkpoint", "", Output, Any, Outputs, kAnyValue,               \
    "Write a checkpoint (safetensors) to FILE after every epoch (a resumed run: the file it "       \
    "resumed from, unless given)")                                                                 \
  _(int64_t, checkpoint_every, "checkpoint-every", 0, Output, Any, Outputs, kCountOrZero,          \
    "Also write the checkpoint every N steps (mid-epoch; a resumed run continues exactly)")        \
  _(std::string, resume_path, "resume", "", Launch, Any, Outputs, kAnyValue,                       \
    "Continue the run saved in checkpoint FILE")                                                   \
  _(int64_t, log_every, "log-every", 50, Tunable, Any, Outputs, kCount,                            \
    "Steps between metric records / progress lines")                                               \
  /* ---- divergence ---------------------------------------------------------------------- */      \
  _(OnDivergence, on_divergence, "on-divergence", OnDivergence::Stop, Tunable, Any, Stability,     \
    kAnyValue,                                                                                     \
    "When a step is applied with a non-finite loss, or --divergence-patience steps in a row are "  \
    "skipped for inf/NaN gradients where that cannot help")                                        \
  _(int64_t, divergence_patience, "divergence-patience", 10, Tunable, Any, Stability, kCount,      \
    "Skipped steps in a row (fp16 at its minimum loss scale, or with --on-divergence skip) "       \
    "before the run counts as diverged")                                                           \
  _(bool, detect_anomaly, "detect-anomaly", false, Tunable, Any, Stability, kAnyValue,             \
    "Check every op of forward and backward for inf/NaN and stop at the first one made, naming "   \
    "the op, the module path, dtypes, shapes and magnitudes (slow)")                               \
  _(bool, progress, "progress", true, Launch, Any, Outputs, kAnyValue,                             \
    "A progress bar on a terminal (plain lines elsewhere)")                                        \
  /* ---- data parallel ------------------------------------------------------------------- */      \
  /* Every rank trains on its shard of each epoch with batch_size examples a step, gradients */    \
  /* averaged in buckets while backward runs; rank 0 alone prints and writes (distributed.md). */  \
  _(bool, distributed, "distributed", false, Launch, Distributed, Parallel, kAnyValue,             \
    "Data parallel across the ranks of `mpirun -n N`: each rank trains on its shard with "         \
    "--batch-size examples a step, gradients averaged; rank 0 prints and writes")                  \
  _(double, bucket_mb, "bucket-mb", 25.0, Tunable, Distributed, Parallel,                          \
    (Range{0, 1 << 20, true}), "Gradients go out in buckets of this many MiB during backward")     \
  _(GradComm, grad_comm, "grad-comm", GradComm::Fp32, Launch, Distributed, Parallel, kAnyValue,    \
    "The dtype gradients travel in between ranks (applied in fp32)")                               \
  _(int, zero, "zero", 0, Launch, Distributed, Parallel, (Range{0, 3}),                            \
    "ZeRO stage: 1 shards the optimizer state (moments, fp32 masters) across the ranks, 2 the "    \
    "gradients too, 3 the parameters too (each block gathered while it runs); 0 keeps all whole")
// clang-format on

// The options, named.
enum class Field : uint8_t {
#define MT_OPTION_ENUMERATOR(type, field, ...) field,
  MT_FORALL_TRAIN_OPTIONS(MT_OPTION_ENUMERATOR)
#undef MT_OPTION_ENUMERATOR
};

// What kind of value an option takes (how the command line, TOML and JSON spell it).
enum class ValueKind : uint8_t { Bool, Integer, Unsigned, Real, Text, Word, OptionalWord };

struct OptionInfo {
  Field field;
  std::string_view name;  // the C++ field, and the key of the stored JSON
  std::string_view key;   // the option without "--", and the config-file key
  Resume resume;
  Feature feature;
  OptionGroup group;
  ValueKind kind;
  Range range;
  std::string_view help;
  std::span<const Word> words;  // a vocabulary option's words, else empty
};

namespace detail {
template <typename T>
struct ValueTraits;
}  // namespace detail

struct TrainConfig {
#define MT_OPTION_FIELD(type, field, key, def, ...) type field = def;
  MT_FORALL_TRAIN_OPTIONS(MT_OPTION_FIELD)
#undef MT_OPTION_FIELD

  // Every option as JSON (the stored form: vocabulary options as their words, 64-bit integers
  // exact), in the table's order.
  std::string to_json() const;
  // Unknown keys, values of the wrong type or outside an option's range are errors naming the
  // key; keys left out keep their defaults (a checkpoint written before an option existed).
  static TrainConfig from_json(const std::string& json);
  // Each option's own range (also checked where a value is read from text or JSON), then the
  // rules between options: a clear mantissa::Error naming the options otherwise.
  void validate() const;
  // Sets the option `key` (as the command line and config files name it: "batch-size",
  // "precision"; underscores may stand for dashes) from its text as the command line spells it
  // ("64", "bf16", "true"): the same checks and messages. Returns *this.
  TrainConfig& set(std::string_view key, std::string_view text);

  bool operator==(const TrainConfig&) const = default;
};

inline constexpr size_t kNumOptions = [] {
  size_t n = 0;
#define MT_OPTION_COUNT(...) ++n;
  MT_FORALL_TRAIN_OPTIONS(MT_OPTION_COUNT)
#undef MT_OPTION_COUNT
  return n;
}();

using FieldSet = std::bitset<kNumOptions>;

// Every option's row, in the table's order (indexed by Field).
std::span<const OptionInfo> options();
const OptionInfo& option(Field f);
// The option whose key (or field name; underscores may stand for dashes) is `key`.
std::optional<Field> find_option(std::string_view key);

// An option's value in `c` as its JSON text ("128", "\"cosine\"", "0.05").
std::string value_json(const TrainConfig& c, Field f);
// Sets the option from its JSON text; "" when it was taken, else what is wrong with the value
// ("must be positive, got 0", "unknown --precision 'fp12'; did you mean ...").
std::string set_value_json(TrainConfig& c, Field f, std::string_view json);
// The option's value as a command line spells it ("128", "cosine", "true", "" for an unset
// optional), and parsed back from that text (numbers must be whole numbers or decimals, words
// from the vocabulary): "" when taken, else what is wrong.
std::string value_text(const TrainConfig& c, Field f);
std::string set_value_text(TrainConfig& c, Field f, std::string_view text);
// What is wrong with the option's value in `c` (outside its range, not finite), or "": what
// validate() checks of each option, for a value assigned to the struct directly.
std::string value_error(const TrainConfig& c, Field f);
// Whether the option's values in a and b are the same.
bool same_value(const TrainConfig& a, const TrainConfig& b, Field f);

// The config's precision recipe (amp::initialize's input).
amp::Recipe recipe_of(const TrainConfig& c);

// AdamW's moment formats as the run gives them (--exp-avg-state / --exp-avg-sq-state, else
// --optim-state), and whether the run's optimizer keeps any state narrower than fp32 (SGD: its
// momentum, --optim-state).
optim::StateFormat exp_avg_format_of(const TrainConfig& c);
optim::StateFormat exp_avg_sq_format_of(const TrainConfig& c);
bool narrow_optimizer_state(const TrainConfig& c);

}  // namespace mantissa::config
