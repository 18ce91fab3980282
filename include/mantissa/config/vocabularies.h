// The closed vocabularies of a training run's options that belong to no lower layer (the
// precision, opt levels and fp8 recipes are amp's; schedules and optimizers optim's; the input
// pipeline data's), and the vocabularies of the option table itself: how an option behaves on
// --resume, which task feature it needs, and the section of `--help` it is shown in.
#pragma once

#include <bitset>
#include <cstdint>
#include <optional>

#include "mantissa/core/dtype.h"
#include "mantissa/core/vocabulary.h"
#include "mantissa/numerics/format.h"

namespace mantissa::config {

// ---- what an option is to a resumed run -----------------------------------------------------
#define MT_FORALL_RESUME_POLICIES(_)                                                         \
  _(Fixed, "fixed",                                                                          \
    "defines the run: a resumed run keeps the checkpoint's, and a different value given on " \
    "the command line is refused")                                                           \
  _(Tunable, "tunable",                                                                      \
    "may change on --resume: given, it is applied; not given, the checkpoint's is kept")     \
  _(Output, "output",                                                                        \
    "where the run writes: as tunable on --resume; --config-from clears it, a rerun writes " \
    "its own outputs")                                                                       \
  _(Launch, "launch",                                                                        \
    "how this process runs: always this command's value (or the default), never the "        \
    "checkpoint's")
MT_VOCABULARY(Resume, MT_FORALL_RESUME_POLICIES)

// ---- what an option needs of the task (and its data) that trains the model ------------------
// Each task type lists the features it has (train/task.h), each dataset those its data has
// (DataKind below); an option whose feature the run lacks is refused by name when it is given a
// value other than its default, so that no option is accepted and then ignored.
#define MT_FORALL_FEATURES(_)                                                                \
  _(Any, "any", "every task")                                                                \
  _(DataDir, "data-dir", "--data fashion-mnist")                                             \
  _(SyntheticSize, "synthetic-size", "--data synthetic, synthetic-text or synthetic-clicks") \
  _(DataPath, "data-path", "--data text or clicks")                                          \
  _(ValPath, "val-path", "--data text or clicks")                                            \
  _(Tokenizer, "tokenizer", "--data text")                                                   \
  _(VocabSize, "vocab-size", "token models (--data text checks it against the shards)")      \
  _(SeqLen, "seq-len", "token models")                                                       \
  _(Tables, "tables", "recommenders (embedding tables)")                                     \
  _(FeatureNetwork, "feature-network", "the GAN (its Frechet distance's feature network)")   \
  _(GradAccum, "grad-accum", "classifiers and language models")                              \
  _(EvalBatches, "eval-batches", "classifiers, language models and recommenders")            \
  _(ActivationCheckpointing, "activation-checkpointing", "classifiers and language models")  \
  _(Underflow, "underflow", "classifiers and language models")                               \
  _(Fp8, "fp8", "classifiers and language models (their Linear layers)")                     \
  _(Fp4, "fp4", "classifiers and language models (their Linear layers)")                     \
  _(Distributed, "distributed", "classifiers and language models")
MT_VOCABULARY(Feature, MT_FORALL_FEATURES)

inline constexpr size_t kNumFeatures = std::size(kFeatureWords);
using Features = std::bitset<kNumFeatures>;

// The set of the given features.
template <typename... F>
constexpr Features features_of(F... f) {
  return Features(((1ull << static_cast<size_t>(f)) | ... | 0ull));
}

// ---- the sections of `mantissa train --help` -------------------------------------------------
#define MT_FORALL_OPTION_GROUPS(_)                                 \
  _(Model, "Model and data", "")                                   \
  _(Tokens, "Language models", "")                                 \
  _(Clicks, "Recommenders and the GAN", "")                        \
  _(Schedule, "Length, batches and schedule", "")                  \
  _(Optimizer, "Optimizer", "")                                    \
  _(Precision, "Precision", "")                                    \
  _(Fp8, "fp8 (--precision fp8)", "")                              \
  _(Fp4, "fp4 (--precision fp4)", "")                              \
  _(Machine, "Machine", "")                                        \
  _(Parallel, "Data parallel (mpirun -n N ... --distributed)", "") \
  _(Outputs, "Outputs", "")                                        \
  _(Stability, "Divergence and debugging", "")
MT_VOCABULARY(OptionGroup, MT_FORALL_OPTION_GROUPS)

// ---- the run's own vocabularies ---------------------------------------------------------------
// _(Enumerator, "name", "help", what the model takes, the features of the data)
#define MT_FORALL_DATA_KINDS(_)                                                                   \
  _(FashionMnist, "fashion-mnist", "the Fashion-MNIST images (--data-dir)", DataInput::Images,    \
    features_of(Feature::DataDir))                                                                \
  _(Synthetic, "synthetic", "seeded images of 10 learnable classes (--synthetic-size)",           \
    DataInput::Images, features_of(Feature::SyntheticSize))                                       \
  _(Text, "text", "token shards written by `mantissa tokenize --out DIR` (--data-path DIR)",      \
    DataInput::Tokens,                                                                            \
    features_of(Feature::DataPath, Feature::ValPath, Feature::Tokenizer, Feature::VocabSize,      \
                Feature::SeqLen))                                                                 \
  _(SyntheticText, "synthetic-text", "a learnable seeded token stream (--synthetic-size tokens)", \
    DataInput::Tokens, features_of(Feature::SyntheticSize, Feature::VocabSize, Feature::SeqLen))  \
  _(SyntheticClicks, "synthetic-clicks",                                                          \
    "a click log drawn from a planted model (--synthetic-size examples)", DataInput::Clicks,      \
    features_of(Feature::SyntheticSize))                                                          \
  _(Clicks, "clicks",                                                                             \
    "a click log at --data-path: label, dense and categorical columns, tab-separated (.csv: "     \
    "comma)",                                                                                     \
    DataInput::Clicks, features_of(Feature::DataPath, Feature::ValPath))

// What a dataset feeds a model.
enum class DataInput : uint8_t { Images, Tokens, Clicks };

MT_VOCABULARY(DataKind, MT_FORALL_DATA_KINDS)
DataInput data_input(DataKind d);
Features data_features(DataKind d);

#define MT_FORALL_OPTIMIZER_KINDS(_)                    \
  _(Sgd, "sgd", "SGD with --momentum (and --nesterov)") \
  _(AdamW, "adamw", "AdamW with --beta1, --beta2, --eps (decoupled weight decay)")
MT_VOCABULARY(OptimizerKind, MT_FORALL_OPTIMIZER_KINDS)

#define MT_FORALL_DECAYS(_)                                                                      \
  _(Auto, "auto", "weights for token models and recommenders, all for image models and the GAN") \
  _(All, "all", "every parameter")                                                               \
  _(Weights, "weights", "weights of two or more dims, not biases, norms or embeddings")
MT_VOCABULARY(Decay, MT_FORALL_DECAYS)

#define MT_FORALL_EMBEDDING_UPDATES(_)                                                            \
  _(Auto, "auto", "lazy with --optimizer adamw, dense with sgd (on every device)")                \
  _(Lazy, "lazy", "AdamW on the table rows a batch touched only (LazyAdam, per-row step counts)") \
  _(Dense, "dense", "the optimizer over every row of every table, every step")
MT_VOCABULARY(EmbeddingUpdate, MT_FORALL_EMBEDDING_UPDATES)

#define MT_FORALL_ZERO_GRADS(_)                                                       \
  _(None, "none", "dropped before each step (PyTorch's zero_grad(set_to_none=True))") \
  _(Zeros, "zeros", "kept and filled with zeros (their memory stays allocated through forward)")
MT_VOCABULARY(ZeroGrad, MT_FORALL_ZERO_GRADS)

// _(Enumerator, "name", "help", the rounding mode)
#define MT_FORALL_STORE_ROUNDINGS(_)                                                        \
  _(Nearest, "nearest", "to nearest, ties to even", RoundingMode::NearestEven)              \
  _(Stochastic, "stochastic", "up with the probability of the discarded fraction (Philox)", \
    RoundingMode::Stochastic)                                                               \
  _(Truncate, "truncate", "toward zero (the BFLOAT16 study's comparison)", RoundingMode::TowardZero)
MT_VOCABULARY(StoreRounding, MT_FORALL_STORE_ROUNDINGS)
RoundingMode rounding_mode(StoreRounding r);

// An ingredient of a recipe, switched on or off (--fp4-rht off).
#define MT_FORALL_SWITCHES(_) \
  _(On, "on", "")             \
  _(Off, "off", "")
MT_VOCABULARY(Switch, MT_FORALL_SWITCHES)
constexpr bool is_on(Switch s) {
  return s == Switch::On;
}

// _(Enumerator, "name", "help", the dtype gradients travel in)
#define MT_FORALL_GRAD_COMMS(_)                                            \
  _(Fp32, "fp32", "gradients exchanged in fp32", DType::F32)               \
  _(Bf16, "bf16", "in bf16 (half the bytes; summed in fp32)", DType::BF16) \
  _(Fp16, "fp16", "in fp16 (divided by the world size first)", DType::F16)
MT_VOCABULARY(GradComm, MT_FORALL_GRAD_COMMS)
DType grad_comm_dtype(GradComm g);

#define MT_FORALL_DIVERGENCE_ACTIONS(_)                                                      \
  _(Stop, "stop", "end the run, saying what happened and which checkpoint is the last good") \
  _(Skip, "skip", "also check fp32/bf16 gradients and skip steps with inf/NaN ones")         \
  _(Rollback, "rollback",                                                                    \
    "reload the last good checkpoint and halve the learning rate (at most 3 times)")
MT_VOCABULARY(OnDivergence, MT_FORALL_DIVERGENCE_ACTIONS)

}  // namespace mantissa::config
