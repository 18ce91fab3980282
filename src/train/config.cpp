#include "mantissa/train/config.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "mantissa/core/device.h"
#include "mantissa/core/error.h"

namespace mantissa::train {

// One list of fields serves both directions.
// clang-format off
#define MT_TRAIN_CONFIG_FIELDS(_) \
  _(model)                        \
  _(data)                         \
  _(data_dir)                     \
  _(synthetic_size)               \
  _(hash_buckets)                 \
  _(embedding_update)             \
  _(dropout)                      \
  _(data_path)                    \
  _(val_path)                     \
  _(tokenizer)                    \
  _(seq_len)                      \
  _(vocab_size)                   \
  _(eval_every)                   \
  _(eval_batches)                 \
  _(fd_feature_steps)             \
  _(grad_accum)                   \
  _(checkpoint_activations)       \
  _(epochs)                       \
  _(max_steps)                    \
  _(batch_size)                   \
  _(eval_batch_size)              \
  _(optimizer)                    \
  _(lr)                           \
  _(momentum)                     \
  _(nesterov)                     \
  _(weight_decay)                 \
  _(decay)                        \
  _(beta1)                        \
  _(beta2)                        \
  _(eps)                          \
  _(schedule)                     \
  _(warmup_steps)                 \
  _(step_size)                    \
  _(gamma)                        \
  _(clip_grad_norm)               \
  _(precision)                    \
  _(opt_level)                    \
  _(loss_scale)                   \
  _(init_scale)                   \
  _(rounding)                     \
  _(underflow_every)              \
  _(fp8_recipe)                   \
  _(fp8_format)                   \
  _(fp8_amax_history)             \
  _(fp8_margin)                   \
  _(fp8_layers)                   \
  _(device)                       \
  _(seed)                         \
  _(threads)                      \
  _(workers)                      \
  _(zero_grad)                    \
  _(input_pipeline)               \
  _(metrics_path)                 \
  _(tensorboard_dir)              \
  _(histogram_every)              \
  _(checkpoint_path)              \
  _(checkpoint_every)             \
  _(resume_path)                  \
  _(log_every)                    \
  _(on_divergence)                \
  _(divergence_patience)          \
  _(detect_anomaly)               \
  _(progress)                     \
  _(distributed)                  \
  _(bucket_mb)                    \
  _(grad_comm)                    \
  _(zero)
// clang-format on

namespace {

// One field's value, of exactly its type: nlohmann's get_to would convert 1e30 to an int64 (an
// undefined conversion, found by fuzz/config_fuzz.cpp) and 3.7 to 3.
template <typename T>
void read_value(const nlohmann::json& v, T& out, const std::string& key) {
  if constexpr (std::is_same_v<T, bool>) {
    MT_CHECK(v.is_boolean(), "training configuration: '", key, "' must be true or false, not ",
             v.dump());
    out = v.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    MT_CHECK(v.is_string(), "training configuration: '", key, "' must be a string, not ", v.dump());
    out = v.get<std::string>();
  } else if constexpr (std::is_integral_v<T>) {
    using Limits = std::numeric_limits<T>;
    bool fits = false;
    if (v.is_number_unsigned()) {
      fits = v.get<uint64_t>() <= uint64_t(Limits::max());
    } else if (v.is_number_integer()) {
      const int64_t x = v.get<int64_t>();
      fits = Limits::is_signed ? x >= int64_t(Limits::min()) && x <= int64_t(Limits::max())
                               : x >= 0 && uint64_t(x) <= uint64_t(Limits::max());
    }
    MT_CHECK(fits, "training configuration: '", key, "' must be an integer in [", +Limits::min(),
             ", ", +Limits::max(), "], not ", v.dump());
    out = v.is_number_unsigned() ? T(v.get<uint64_t>()) : T(v.get<int64_t>());
  } else {
    static_assert(std::is_floating_point_v<T>);
    MT_CHECK(v.is_number(), "training configuration: '", key, "' must be a number, not ", v.dump());
    out = v.get<T>();
  }
}

}  // namespace

std::string TrainConfig::to_json() const {
  nlohmann::ordered_json j;
#define MT_TO_JSON(f) j[#f] = f;
  MT_TRAIN_CONFIG_FIELDS(MT_TO_JSON)
#undef MT_TO_JSON
  return j.dump();
}

TrainConfig TrainConfig::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MT_CHECK(false, "the training configuration is not valid JSON: ", e.what());
  }
  MT_CHECK(j.is_object(), "the training configuration must be a JSON object");
  TrainConfig c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    bool known = false;
    // read_value checks each value's type before it reads it: nothing here throws nlohmann's
    // exceptions.
#define MT_FROM_JSON(f)               \
  if (key == #f) {                    \
    read_value(it.value(), c.f, key); \
    known = true;                     \
  }
    MT_TRAIN_CONFIG_FIELDS(MT_FROM_JSON)
#undef MT_FROM_JSON
    MT_CHECK(known, "training configuration: unknown key '", key, "'");
  }
  return c;
}

void TrainConfig::validate() const {
  MT_CHECK(data == "fashion-mnist" || data == "synthetic" || data == "text" ||
               data == "synthetic-text" || data == "synthetic-clicks" || data == "clicks",
           "unknown dataset '", data,
           "'; use fashion-mnist or synthetic (images), text or synthetic-text (token models), "
           "synthetic-clicks or clicks (recommenders)");
  MT_CHECK(data != "clicks" || !data_path.empty(),
           "--data clicks needs --data-path: a click log, tab-separated (.csv: comma) with a "
           "label, dense and categorical columns per line");
  MT_CHECK(hash_buckets >= 2, "--hash-buckets must be at least 2 (row 0 is the empty token), got ",
           hash_buckets);
  MT_CHECK(embedding_update == "auto" || embedding_update == "lazy" || embedding_update == "dense",
           "unknown --embedding-update '", embedding_update,
           "'; use lazy (the rows a batch touched), dense (every row) or auto (lazy on the CPU, "
           "dense on a GPU)");
  MT_CHECK(data != "text" || !data_path.empty(),
           "--data text needs --data-path: the directory `mantissa tokenize --out DIR` wrote, or "
           "a token shard");
  MT_CHECK(seq_len > 0, "--seq-len must be positive, got ", seq_len);
  MT_CHECK(vocab_size >= 0, "--vocab-size must be non-negative, got ", vocab_size);
  MT_CHECK(eval_every >= 0, "--eval-every must be 0 (each epoch) or positive, got ", eval_every);
  MT_CHECK(eval_batches >= 0, "--eval-batches must be 0 (all) or positive, got ", eval_batches);
  MT_CHECK(fd_feature_steps >= 0, "--fd-feature-steps must be 0 (one epoch) or positive, got ",
           fd_feature_steps);
  MT_CHECK(grad_accum >= 1, "--grad-accum must be at least 1, got ", grad_accum);
  MT_CHECK(grad_accum == 1 || underflow_every == 0,
           "--underflow-every measures single-batch steps; drop it or --grad-accum");
  MT_CHECK(decay == "auto" || decay == "all" || decay == "weights", "unknown --decay '", decay,
           "'; use all, weights (no decay on biases, norms and embeddings) or auto");
  MT_CHECK(epochs > 0 || max_steps > 0, "give a positive --epochs or --steps");
  MT_CHECK(batch_size > 0, "--batch-size must be positive, got ", batch_size);
  MT_CHECK(eval_batch_size >= 0, "the eval batch size must be 0 (auto) or positive, got ",
           eval_batch_size);
  MT_CHECK(optimizer == "sgd" || optimizer == "adamw", "unknown optimizer '", optimizer,
           "'; use sgd or adamw");
  MT_CHECK(lr > 0, "--lr must be positive, got ", lr);
  MT_CHECK(momentum >= 0 && momentum < 1, "--momentum must be in [0, 1), got ", momentum);
  MT_CHECK(weight_decay >= 0, "--weight-decay must be non-negative, got ", weight_decay);
  MT_CHECK(dropout >= 0 && dropout < 1, "--dropout must be in [0, 1), got ", dropout);
  try {
    parse_device(device);
  } catch (const Error& e) {
    MT_CHECK(false, "--device: ", e.message());
  }
  MT_CHECK(threads >= 0, "--threads must be 0 (all cores) or positive, got ", threads);
  MT_CHECK(workers >= 0, "--workers must be non-negative, got ", workers);
  MT_CHECK(zero_grad == "none" || zero_grad == "zeros", "unknown --zero-grad '", zero_grad,
           "'; use none (drop the gradients before each step, set_to_none) or zeros (keep them "
           "and fill them with zeros)");
  MT_CHECK(
      input_pipeline == "prefetch" || input_pipeline == "pinned" || input_pipeline == "pageable",
      "unknown --input-pipeline '", input_pipeline,
      "'; use prefetch (side-stream copies, normalized on the device), pinned (page-locked "
      "batches, non_blocking copies) or pageable (blocking copies)");
  MT_CHECK(log_every > 0, "--log-every must be positive, got ", log_every);
  MT_CHECK(histogram_every >= 0,
           "--histogram-every must be 0 (at each evaluation) or positive, got ", histogram_every);
  MT_CHECK(clip_grad_norm >= 0, "--clip-grad-norm must be non-negative, got ", clip_grad_norm);
  MT_CHECK(synthetic_size > 0, "the synthetic dataset size must be positive");
  const bool half = precision == "bf16" || precision == "fp16" || precision == "fp8";
  MT_CHECK(half || precision == "fp32" || precision == "tf32" || precision == "bf16-pure" ||
               precision == "auto",
           "unknown --precision '", precision,
           "'; use fp32, tf32, bf16, fp16, fp8, bf16-pure or auto (bf16 where the CPU has it, "
           "else fp16)");
  MT_CHECK(fp8_recipe == "delayed" || fp8_recipe == "current" || fp8_recipe == "mxfp8" ||
               fp8_recipe == "blockwise",
           "unknown --fp8-recipe '", fp8_recipe, "'; use delayed, current, mxfp8 or blockwise");
  MT_CHECK(fp8_format == "hybrid" || fp8_format == "e4m3", "unknown --fp8-format '", fp8_format,
           "'; use hybrid (E4M3 forward, E5M2 gradients) or e4m3 (E4M3 for all)");
  MT_CHECK(fp8_layers == "inner" || fp8_layers == "all", "unknown --fp8-layers '", fp8_layers,
           "'; use inner (the first and last Linear layers stay bf16) or all");
  MT_CHECK(fp8_amax_history >= 1 && fp8_amax_history <= (int64_t(1) << 20),
           "--fp8-amax-history must be in [1, 2^20], got ", fp8_amax_history);
  MT_CHECK(fp8_margin >= 0 && fp8_margin < 64, "--fp8-margin must be in [0, 64), got ", fp8_margin);
  const TrainConfig defaults;
  MT_CHECK(precision == "fp8" ||
               (fp8_recipe == defaults.fp8_recipe && fp8_format == defaults.fp8_format &&
                fp8_amax_history == defaults.fp8_amax_history &&
                fp8_margin == defaults.fp8_margin && fp8_layers == defaults.fp8_layers),
           "the --fp8-* options apply to --precision fp8, not ", precision);
  MT_CHECK(
      precision != "fp8" || opt_level.empty() || opt_level == "O1" || opt_level == "O2",
      "--precision fp8 runs the Linear GEMMs in fp8 and the rest as bf16 O1 or O2; --opt-level ",
      opt_level, " is not one of them");
  MT_CHECK(opt_level.empty() || opt_level == "O0" || opt_level == "O1" || opt_level == "O2" ||
               opt_level == "O3",
           "unknown --opt-level '", opt_level, "'; use O0, O1, O2 or O3");
  if (precision == "fp32" || precision == "tf32") {
    MT_CHECK(opt_level.empty() || opt_level == "O0", "--opt-level ", opt_level,
             " needs a half precision: add --precision bf16 or fp16 (", precision, " is O0 only)");
  } else if (precision == "bf16-pure") {
    MT_CHECK(opt_level.empty(),
             "--precision bf16-pure is its own level (bf16 O3 with stochastic "
             "rounding); drop --opt-level ",
             opt_level);
  } else {
    MT_CHECK(opt_level != "O0", "--opt-level O0 trains in fp32: use --precision fp32");
  }
  MT_CHECK(rounding.empty() || rounding == "nearest" || rounding == "stochastic" ||
               rounding == "truncate",
           "unknown --rounding '", rounding, "'; use nearest, stochastic or truncate");
  const bool half_weights = precision == "bf16-pure" || opt_level == "O2" || opt_level == "O3";
  MT_CHECK(rounding.empty() || rounding == "nearest" || half_weights, "--rounding ", rounding,
           " applies to half weights (--opt-level O2 or O3, or --precision bf16-pure); with ",
           precision, opt_level.empty() ? "" : " " + opt_level, " the weights are fp32");
  MT_CHECK(precision != "bf16-pure" || rounding.empty() || rounding == "stochastic",
           "--precision bf16-pure keeps no fp32 master and needs --rounding stochastic; for ",
           rounding, " rounding use --precision bf16 --opt-level O3");
  MT_CHECK(underflow_every >= 0, "--underflow-every must be 0 (off) or positive, got ",
           underflow_every);
  MT_CHECK(
      underflow_every == 0 || (precision == "fp16" && (opt_level.empty() || opt_level == "O1")),
      "--underflow-every measures fp16 underflow against fp32 gradients of the same weights, "
      "so it needs --precision fp16 at O1 (fp32 weights)");
  MT_CHECK(loss_scale == "dynamic" || half || precision == "auto", "--loss-scale ", loss_scale,
           " applies to --precision fp16 or bf16, not ", precision);
  MT_CHECK(std::isfinite(init_scale) && init_scale > 0 && float(init_scale) > 0 &&
               std::isfinite(float(init_scale)),
           "--init-scale must be positive and finite in fp32, got ", init_scale);
  MT_CHECK(init_scale == 65536.0 ||
               (loss_scale == "dynamic" && (precision == "fp16" || precision == "auto")),
           "--init-scale starts dynamic loss scaling, which --precision fp16 uses; with ",
           precision, " and --loss-scale ", loss_scale, " there is none");
  MT_CHECK(bucket_mb > 0, "--bucket-mb must be positive, got ", bucket_mb);
  MT_CHECK(checkpoint_every >= 0,
           "--checkpoint-every must be 0 (epoch ends only) or positive, got ", checkpoint_every);
  MT_CHECK(checkpoint_every == 0 || !checkpoint_path.empty(),
           "--checkpoint-every writes the --checkpoint file: give --checkpoint FILE too");
  MT_CHECK(grad_comm == "fp32" || grad_comm == "bf16" || grad_comm == "fp16",
           "unknown --grad-comm '", grad_comm,
           "'; use fp32, bf16 or fp16 (the dtype gradients travel in between ranks)");
  MT_CHECK(distributed || grad_comm == "fp32",
           "--grad-comm applies to data-parallel runs: add --distributed (under mpirun)");
  MT_CHECK(zero == 0 || zero == 1, "--zero ", zero,
           " is not there; use 0 (every rank keeps the whole optimizer state) or 1 (sharded)");
  MT_CHECK(distributed || zero == 0,
           "--zero shards the optimizer state across data-parallel ranks: add --distributed "
           "(under mpirun)");
  MT_CHECK(on_divergence == "stop" || on_divergence == "skip" || on_divergence == "rollback",
           "unknown --on-divergence '", on_divergence,
           "'; use stop, skip (skip steps with inf/NaN gradients) or rollback (reload the last "
           "checkpoint, halve the learning rate)");
  MT_CHECK(divergence_patience >= 1, "--divergence-patience must be at least 1, got ",
           divergence_patience);
  MT_CHECK(on_divergence != "rollback" || !checkpoint_path.empty(),
           "--on-divergence rollback reloads the last checkpoint written: give --checkpoint FILE "
           "(and --checkpoint-every N to lose fewer steps)");
  if (loss_scale != "dynamic") {
    char* end = nullptr;
    const double v = std::strtod(loss_scale.c_str(), &end);
    MT_CHECK(end == loss_scale.c_str() + loss_scale.size() && !loss_scale.empty() && v > 0 &&
                 std::isfinite(v),
             "--loss-scale takes 'dynamic' or a positive number, got '", loss_scale, "'");
  }
}

}  // namespace mantissa::train
