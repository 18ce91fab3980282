// `mantissa train` and `mantissa eval`.
#include <fmt/core.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "mantissa/core/error.h"
#include "mantissa/core/stop_signals.h"
#include "mantissa/nn/models.h"
#include "mantissa/train/gan.h"
#include "mantissa/train/recommender.h"
#include "mantissa/train/run_config.h"
#include "mantissa/train/trainer.h"

namespace mantissa::cli {
namespace {

struct TrainArgs {
  train::TrainConfig config;
  bool no_progress = false;
  bool json = false;
  std::string config_file, config_from;
  bool print_config = false;
};

// Options of `train` that are not part of the run's configuration.
constexpr const char* kNotConfig[] = {"help", "json", "config", "config-from", "print-config"};

// The TrainConfig fields the command line set (for the run config: the command line wins).
std::set<std::string> fields_set_by(const CLI::App& cmd) {
  std::set<std::string> fields;
  for (const CLI::Option* opt : cmd.get_options()) {
    const std::string name = opt->get_single_name();
    if (opt->count() == 0 ||
        std::find(std::begin(kNotConfig), std::end(kNotConfig), name) != std::end(kNotConfig))
      continue;
    const std::string field =
        name == "no-progress" ? std::string("progress") : train::field_of_config_key(name);
    MT_ASSERT(!field.empty(), "the option --", name, " has no configuration field");
    fields.insert(field);
  }
  return fields;
}

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), what, ": cannot read '", path, "': ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The options that define the run itself: a resumed run takes them from its checkpoint, and
// giving a different value is refused rather than silently ignored.
constexpr const char* kRunDefining[] = {
    "--model",      "--data",         "--batch-size",       "--optimizer",
    "--lr",         "--momentum",     "--schedule",         "--warmup",
    "--seed",       "--weight-decay", "--dropout",          "--precision",
    "--loss-scale", "--opt-level",    "--rounding",         "--seq-len",
    "--grad-accum", "--decay",        "--vocab-size",       "--init-scale",
    "--fp8-recipe", "--fp8-format",   "--fp8-amax-history", "--fp8-margin",
    "--fp8-layers"};

// Ctrl-C and SIGTERM during `train`: the first asks the trainer to stop after the step under way
// and write a checkpoint (Trainer::set_stop_flag); a second one ends the process at once, by the
// signal's default action (the last checkpoint was written atomically, so it stays whole).
std::atomic<int> g_stop{0};
std::atomic<bool> g_announce{true};  // false on ranks other than 0: one message per job

void on_stop_signal(int sig) {
  if (g_stop.load() != 0) {
    std::signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_stop.store(sig);
  if (!g_announce.load()) return;
  static const char kSay[] =
      "\nmantissa: stopping after this step and writing a checkpoint (again to quit at once)\n";
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, kSay, sizeof kSay - 1);
}

// Percent of `part` in `whole` (0 when whole is 0).
double percent(int64_t part, int64_t whole) {
  return whole > 0 ? 100.0 * double(part) / double(whole) : 0.0;
}

void print_result(const train::TrainResult& r, const train::Trainer& trainer, bool json) {
  const train::TrainConfig& c = trainer.config();
  const amp::Amp& amp = trainer.amp();
  const bool scaled = amp.scaler().options().mode != amp::ScaleMode::Disabled;
  const train::UnderflowStats& u = r.underflow;
  if (json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(trainer.summary_json(r));
    j["amp"] = trainer.describe_precision();
    nlohmann::ordered_json epochs = nlohmann::ordered_json::array();
    for (const auto& e : r.epochs) {
      nlohmann::ordered_json ej = {{"epoch", e.epoch},
                                   {"train_loss", e.train_loss},
                                   {"test_loss", e.test.loss},
                                   {"test_accuracy", e.test.accuracy},
                                   {"seconds", e.seconds}};
      if (trainer.language_model()) {
        ej["val_perplexity"] = e.test.perplexity();
        ej["tokens_per_s"] = e.samples_per_s;
      }
      epochs.push_back(ej);
    }
    j["epochs"] = epochs;
    fmt::print("{}\n", j.dump());
    return;
  }
  const double per_epoch = r.epochs.empty() ? 0 : r.train_seconds / double(r.epochs.size());
  std::string scaling;
  if (scaled) {
    scaling = fmt::format(", loss scale {:g}, {} skipped steps", r.loss_scale, r.skipped_steps);
  }
  const std::string where = trainer.device().is_cpu() ? "" : " on " + trainer.device().str();
  if (trainer.language_model()) {
    const double tokens_per_s =
        r.train_seconds > 0
            ? double(r.steps * c.batch_size * c.grad_accum * c.seq_len) / r.train_seconds
            : 0;
    fmt::print(
        "{} on {} ({}){}: validation loss {:.4f}, perplexity {:.2f}, next-token accuracy "
        "{:.2f}%, {} steps, {:.1f} s training ({:.0f} tokens/s), peak memory {} (the tokens {} "
        "of it){}\n",
        c.model, c.data, trainer.describe_precision(), where, r.test.loss, r.test.perplexity(),
        100 * r.test.accuracy, r.steps, r.train_seconds, tokens_per_s,
        train::format_bytes(r.peak_memory_bytes), train::format_bytes(r.dataset_bytes), scaling);
    return;
  }
  fmt::print(
      "{} on {} ({}){}: test accuracy {:.2f}%, test loss {:.4f}, {} steps, {:.1f} s training "
      "({:.1f} s/epoch), peak memory {} (the dataset {} of it){}\n",
      c.model, c.data, trainer.describe_precision(), where, 100 * r.test.accuracy, r.test.loss,
      r.steps, r.train_seconds, per_epoch, train::format_bytes(r.peak_memory_bytes),
      train::format_bytes(r.dataset_bytes), scaling);
  if (u.measurements > 0) {
    fmt::print(
        "fp16 gradient underflow over {} measured steps, of {} non-zero fp32 gradient values: "
        "{:.3f}% become zero cast to fp16 unscaled, {:.3f}% at the loss scale, {:.3f}% are zero "
        "in this run's gradients\n",
        u.measurements, u.nonzero, percent(u.cast_unscaled, u.nonzero),
        percent(u.cast_scaled, u.nonzero), percent(u.observed, u.nonzero));
    std::string worst;
    for (const train::LayerUnderflow& l : u.worst(3)) {
      worst += fmt::format("{}{} {:.3f}% (unscaled {:.3f}%)", worst.empty() ? "" : ", ", l.name,
                           percent(l.observed, l.nonzero), percent(l.cast_unscaled, l.nonzero));
    }
    if (!worst.empty()) fmt::print("the layers that lose the most: {}\n", worst);
  }
}

// A recommender's run (train::train_recommender) and its final line.
int run_recommender(train::TrainConfig config, const CLI::App& cmd, bool from_file, bool json) {
  // The recommender's defaults where neither the command line nor a config file chose: AdamW at
  // 1e-3 without weight decay, batches of 512, 100,000 synthetic examples, one epoch.
  if (!from_file) {
    if (cmd.count("--optimizer") == 0) config.optimizer = "adamw";
    if (cmd.count("--lr") == 0) config.lr = 1e-3;
    if (cmd.count("--weight-decay") == 0) config.weight_decay = 0;
    if (cmd.count("--batch-size") == 0) config.batch_size = 512;
    if (cmd.count("--synthetic-size") == 0) config.synthetic_size = 100000;
    // --steps alone runs that many steps, over as many epochs as they take.
    if (cmd.count("--epochs") == 0) config.epochs = cmd.count("--steps") ? 0 : 1;
  }
  const train::RecommenderResult r = train::train_recommender(config);
  if (json) {
    nlohmann::ordered_json j;
    j["model"] = config.model;
    j["data"] = config.data;
    j["precision"] = r.precision;
    j["log_loss"] = r.log_loss;
    j["auc"] = r.auc;
    if (!std::isnan(r.bayes_log_loss)) j["bayes_log_loss"] = r.bayes_log_loss;
    j["constant_log_loss"] = r.constant_log_loss;
    j["steps"] = r.steps;
    j["seconds"] = r.seconds;
    j["skipped_steps"] = r.skipped_steps;
    j["loss_scale"] = r.loss_scale;
    j["peak_memory_bytes"] = r.peak_memory_bytes;
    j["embedding_update"] = r.embedding_update;
    j["table_update_seconds"] = r.table_update_seconds;
    j["optimizer_seconds_rest"] = r.optimizer_seconds_rest;
    fmt::print("{}\n", j.dump());
    return 0;
  }
  const std::string bayes =
      std::isnan(r.bayes_log_loss) ? "" : fmt::format("Bayes {:.4f}, ", r.bayes_log_loss);
  const std::string scaling =
      r.loss_scale != 1 || r.skipped_steps > 0
          ? fmt::format(", loss scale {:g}, {} skipped steps", r.loss_scale, r.skipped_steps)
          : "";
  fmt::print(
      "{} on {} ({}): held-out log loss {:.4f} ({}constant {:.4f}), AUC {:.4f}, {} steps, {:.1f} "
      "s training ({:.1f} ms/step), peak memory {}, tables updated {}{}\n",
      config.model, config.data, r.precision, r.log_loss, bayes, r.constant_log_loss, r.auc,
      r.steps, r.seconds, r.steps ? 1e3 * r.seconds / double(r.steps) : 0.0,
      train::format_bytes(r.peak_memory_bytes),
      r.embedding_update == "lazy" ? "lazily (the rows each batch touched)" : "densely (every row)",
      scaling);
  return 0;
}

}  // namespace

// --model dcgan: train::train_gan, a progress line per train record (or eval) on stderr, one
// result line (or JSON) on stdout.
static int run_gan(const train::TrainConfig& config, bool json) {
  const train::GanResult r = train::train_gan(config, [](const std::string& text) {
    const nlohmann::json j = nlohmann::json::parse(text);
    const std::string kind = j.value("kind", "");
    if (kind == "config") {
      fmt::print(stderr, "dcgan: {}\n", j.value("precision", ""));
    } else if (kind == "train") {
      fmt::print(stderr,
                 "step {}: loss_d {:.4f} loss_g {:.4f} D(x) {:.3f} D(G(z)) {:.3f} | loss scale "
                 "{:g} | {:.0f} samples/s\n",
                 j.value("step", 0), j.value("loss_d", 0.0), j.value("loss_g", 0.0),
                 j.value("d_real", 0.0), j.value("d_fake", 0.0), j.value("loss_scale", 1.0),
                 j.value("samples_per_s", 0.0));
    } else if (kind == "eval") {
      fmt::print(stderr, "eval step {}: frechet distance (cnn features) {:.3f}, ms-ssim {:.4f}\n",
                 j.value("step", 0), j.value("frechet_distance", 0.0), j.value("ms_ssim", 0.0));
    }
  });
  if (json) {
    nlohmann::ordered_json j;
    j["model"] = "dcgan";
    j["frechet_distance"] = r.frechet_distance;
    j["ms_ssim"] = r.ms_ssim;
    j["seconds"] = r.seconds;
    j["steps"] = r.steps;
    j["skipped_steps"] = r.skipped_steps;
    j["loss_scale"] = r.loss_scale;
    j["peak_memory_bytes"] = r.peak_memory_bytes;
    j["final_loss_d"] = r.final_loss_d;
    j["final_loss_g"] = r.final_loss_g;
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print(
      "dcgan on {} ({}): frechet distance {:.3f} (cnn features, not FID), ms-ssim {:.4f}, {} "
      "steps, {:.1f} s training ({:.1f} ms/step), final loss_d {:.4f} loss_g {:.4f}, peak "
      "memory {}, loss scale {:g}, {} skipped steps\n",
      config.data,
      train::resolve_precision(config.precision) +
          (config.opt_level.empty() ? "" : " " + config.opt_level),
      r.frechet_distance, r.ms_ssim, r.steps, r.seconds, 1000 * r.seconds / double(r.steps),
      r.final_loss_d, r.final_loss_g, train::format_bytes(r.peak_memory_bytes), r.loss_scale,
      r.skipped_steps);
  return 0;
}

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  train::TrainConfig& c = args->config;
  CLI::App* cmd = app.add_subcommand("train", "Train a model (default: the cnn on Fashion-MNIST)");
  cmd->add_option("--model", c.model,
                  "Model: " + fmt::format("{}", fmt::join(nn::model_names(), ", ")) +
                      "; dcgan trains the DC-GAN pair (train::train_gan)")
      ->capture_default_str();
  cmd->add_option("--data", c.data,
                  "Dataset: fashion-mnist or synthetic (image models); text or synthetic-text "
                  "(token models: gpt2_tiny, gpt2, lstm); synthetic-clicks or clicks "
                  "(recommenders: dcn)")
      ->capture_default_str();
  cmd->add_option("--hash-buckets", c.hash_buckets,
                  "Recommenders: rows of each categorical field's embedding table (tokens are "
                  "hashed into them, FNV-1a)")
      ->capture_default_str();
  cmd->add_option("--embedding-update", c.embedding_update,
                  "Recommenders: lazy (AdamW on the table rows a batch touched), dense (every "
                  "row, every step) or auto (lazy on the CPU, dense on a GPU)")
      ->capture_default_str();
  cmd->add_option("--data-path", c.data_path,
                  "--data text: the directory `mantissa tokenize --out DIR` wrote (train.bin, "
                  "val.bin, tokenizer.json), or a token shard; --data clicks: a click log (TSV, "
                  "or CSV by extension: label, dense, categorical columns)");
  cmd->add_option("--val-path", c.val_path,
                  "--data text: the validation shard (default: DIR/val.bin, or the last 5% of "
                  "the training shard)");
  cmd->add_option("--tokenizer", c.tokenizer,
                  "--data text: the tokenizer JSON, kept for generation (default: "
                  "DIR/tokenizer.json)");
  cmd->add_option("--synthetic-size", c.synthetic_size,
                  "--data synthetic: training images; synthetic-text: tokens; synthetic-clicks: "
                  "examples, the last 10% held out (dcn's default: 100000)")
      ->capture_default_str();
  cmd->add_option("--seq-len", c.seq_len, "Token models: tokens per training window")
      ->capture_default_str();
  cmd->add_option("--vocab-size", c.vocab_size, "--data synthetic-text: the vocabulary (0: 256)")
      ->capture_default_str();
  cmd->add_option("--eval-every", c.eval_every,
                  "Evaluate every N optimizer steps as well as at each epoch's end (0: epochs "
                  "only)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", c.eval_batches,
                  "Evaluate on at most N batches (0: the whole test / validation set)")
      ->capture_default_str();
  cmd->add_option("--eval-batch-size", c.eval_batch_size,
                  "Evaluation batch size (0: 256 images, or a token model's training batch)")
      ->capture_default_str();
  cmd->add_option("--fd-feature-steps", c.fd_feature_steps,
                  "dcgan: steps the cnn of the Frechet distance's features trains (0: one epoch)")
      ->capture_default_str();
  cmd->add_option("--data-dir", c.data_dir, "Directory of the Fashion-MNIST .gz files")
      ->capture_default_str();
  cmd->add_option("--epochs", c.epochs, "Epochs")->capture_default_str();
  cmd->add_option("--steps", c.max_steps, "Stop after this many steps (0: run all epochs)")
      ->capture_default_str();
  cmd->add_option("--batch-size", c.batch_size,
                  "Training (micro-)batch size: a step sees batch-size * grad-accum examples")
      ->capture_default_str();
  cmd->add_option("--grad-accum", c.grad_accum,
                  "Micro-batches per optimizer step (their loss summed, divided once by all "
                  "their targets: the big batch's)")
      ->capture_default_str();
  cmd->add_flag("--checkpoint-activations", c.checkpoint_activations,
                "Recompute each transformer block's / LSTM layer's activations in backward "
                "(less memory, one more forward)");
  cmd->add_option("--optimizer", c.optimizer, "sgd or adamw")->capture_default_str();
  cmd->add_option("--lr", c.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  cmd->add_flag("--nesterov", c.nesterov, "Nesterov momentum");
  cmd->add_option("--weight-decay", c.weight_decay, "Weight decay")->capture_default_str();
  cmd->add_option("--decay", c.decay,
                  "Which parameters decay: all, weights (not biases, norms, embeddings) or auto "
                  "(weights for token models, all for image models)")
      ->capture_default_str();
  cmd->add_option("--schedule", c.schedule, "constant, step or cosine")->capture_default_str();
  cmd->add_option("--warmup", c.warmup_steps, "Linear warmup steps")->capture_default_str();
  cmd->add_option("--clip-grad-norm", c.clip_grad_norm, "Clip the gradient norm (0: off)")
      ->capture_default_str();
  cmd->add_option("--dropout", c.dropout, "Dropout probability where the model has dropout")
      ->capture_default_str();
  cmd->add_option("--precision", c.precision,
                  "fp32, tf32 (f32 GEMM/conv inputs rounded to tf32), bf16 or fp16 (mixed "
                  "precision at --opt-level), fp8 (Linear GEMMs in fp8 by --fp8-recipe, the rest "
                  "bf16 at --opt-level), bf16-pure (bf16 weights, no fp32 master, stochastic "
                  "rounding) or auto (bf16 where the CPU has native bf16, else fp16)")
      ->capture_default_str();
  cmd->add_option("--fp8-recipe", c.fp8_recipe,
                  "fp8 scaling: delayed (per tensor, from the amax history), current (per tensor, "
                  "this step's amax), mxfp8 (32-wide blocks, power-of-two scales) or blockwise "
                  "(DeepSeek-V3: 1x128 activation tiles, 128x128 weight blocks)")
      ->capture_default_str();
  cmd->add_option("--fp8-format", c.fp8_format,
                  "hybrid (E4M3 forward, E5M2 gradients) or e4m3 (E4M3 for all)")
      ->capture_default_str();
  cmd->add_option("--fp8-amax-history", c.fp8_amax_history,
                  "Delayed scaling: steps of amax history the scale is the max over")
      ->capture_default_str();
  cmd->add_option("--fp8-margin", c.fp8_margin,
                  "Delayed scaling: scale = fp8_max / amax / 2^margin")
      ->capture_default_str();
  cmd->add_option("--fp8-layers", c.fp8_layers,
                  "inner (the first and last Linear layers stay bf16) or all")
      ->capture_default_str();
  cmd->add_option("--opt-level", c.opt_level,
                  "bf16/fp16: O1 (autocast, fp32 weights; default), O2 (half weights except "
                  "batch norm, fp32 master weights) or O3 (all half)");
  cmd->add_option("--loss-scale", c.loss_scale,
                  "dynamic (fp16 O1/O2; none for bf16) or a fixed number")
      ->capture_default_str();
  cmd->add_option("--init-scale", c.init_scale, "Where the dynamic loss scale starts (fp16 O1/O2)")
      ->capture_default_str();
  cmd->add_option("--rounding", c.rounding,
                  "How updates are stored into half weights (O2, O3, bf16-pure): nearest, "
                  "stochastic or truncate (toward zero)");
  cmd->add_option("--underflow-every", c.underflow_every,
                  "Every N steps, measure fp16 gradient underflow against fp32 gradients "
                  "(bf16/fp16 O1; 0: off)")
      ->capture_default_str();
  cmd->add_option("--seed", c.seed, "Seed of the initialisation, shuffling and dropout")
      ->capture_default_str();
  cmd->add_option("--device", c.device,
                  "cpu, cuda or cuda:N: where the model, optimizer and batches live")
      ->capture_default_str();
  cmd->add_option("--threads", c.threads, "Compute threads (0: every core)")->capture_default_str();
  cmd->add_option("--workers", c.workers, "Data-loader threads")->capture_default_str();
  cmd->add_option("--zero-grad", c.zero_grad,
                  "How gradients are reset before each step: none (dropped, set_to_none) or "
                  "zeros (kept, filled with zeros)")
      ->capture_default_str();
  cmd->add_option("--input-pipeline", c.input_pipeline,
                  "How batches reach a GPU: prefetch (side-stream copies one batch ahead, "
                  "normalized on the device), pinned (page-locked batches, non_blocking copies) "
                  "or pageable (blocking copies); the same on the CPU")
      ->capture_default_str();
  cmd->add_option("--metrics", c.metrics_path,
                  "Append JSON-lines metrics to FILE (its first record of a launch: the whole "
                  "configuration)");
  cmd->add_option("--tensorboard", c.tensorboard_dir,
                  "Write TensorBoard event files to DIR: the metrics' scalars (loss, accuracy or "
                  "perplexity, lr, loss scale, skipped steps, grad norm, throughput, peak memory), "
                  "histograms of weights and gradients, the configuration (tensorboard --logdir "
                  "DIR)");
  cmd->add_option("--histogram-every", c.histogram_every,
                  "--tensorboard: weight and gradient histograms every N steps (0: at each "
                  "evaluation)")
      ->capture_default_str();
  cmd->add_option("--checkpoint", c.checkpoint_path,
                  "Write a checkpoint (safetensors) to FILE after every epoch");
  cmd->add_option("--checkpoint-every", c.checkpoint_every,
                  "Also write the checkpoint every N steps (mid-epoch; a resumed run continues "
                  "exactly)")
      ->capture_default_str();
  cmd->add_option("--resume", c.resume_path, "Continue the run saved in checkpoint FILE");
  cmd->add_option("--on-divergence", c.on_divergence,
                  "When a step is applied with a non-finite loss, or --divergence-patience steps "
                  "in a row are skipped for inf/NaN gradients where that cannot help: stop (say "
                  "so and name the last good checkpoint), skip (also check fp32/bf16 gradients "
                  "and skip such steps) or rollback (reload the last checkpoint, halve the "
                  "learning rate; at most 3 times)")
      ->check(CLI::IsMember({"stop", "skip", "rollback"}))
      ->capture_default_str();
  cmd->add_flag("--detect-anomaly", c.detect_anomaly,
                "Check every op of forward and backward for inf/NaN and stop at the first one "
                "made, naming the op, the module path, dtypes, shapes and magnitudes (slow: for "
                "finding where an overflow comes from)");
  cmd->add_option("--divergence-patience", c.divergence_patience,
                  "Skipped steps in a row (fp16 at its minimum loss scale, or with "
                  "--on-divergence skip) before the run counts as diverged")
      ->capture_default_str();
  cmd->add_option("--log-every", c.log_every, "Steps between metric records / progress lines")
      ->capture_default_str();
  cmd->add_flag("--distributed", c.distributed,
                "Data parallel across the ranks of `mpirun -n N` (docs/distributed.md): each "
                "rank trains on its shard with --batch-size examples a step, gradients averaged; "
                "rank 0 prints and writes");
  cmd->add_option("--bucket-mb", c.bucket_mb,
                  "--distributed: gradients go out in buckets of this many MiB during backward")
      ->capture_default_str();
  cmd->add_option("--grad-comm", c.grad_comm,
                  "--distributed: fp32, bf16 or fp16, the dtype gradients travel in (divided by "
                  "the world size first; applied in fp32)")
      ->capture_default_str();
  cmd->add_option("--zero", c.zero,
                  "--distributed: 1 shards the optimizer state (moments, fp32 masters) across "
                  "the ranks, ZeRO-1; 0 keeps it whole on every rank")
      ->capture_default_str();
  cmd->add_flag("--no-progress", args->no_progress, "No progress bar (config key: progress)");
  cmd->add_flag("--json", args->json, "Print the final result as JSON");
  cmd->add_option("--config", args->config_file,
                  "Read the run's options from a TOML file: keys are these options' names "
                  "(batch-size = 64, precision = \"bf16\"); the command line overrides it "
                  "(examples in configs/)");
  cmd->add_option("--config-from", args->config_from,
                  "Start from the configuration a run stored in its checkpoint or metrics file "
                  "(its outputs are not taken: give new ones); --config and the command line "
                  "override it");
  cmd->add_flag("--print-config", args->print_config,
                "Print the effective configuration as TOML (a file --config reads) and exit");
  return [args, cmd] {
    train::TrainConfig config = args->config;
    config.progress = !args->no_progress;
    if (!args->config_file.empty() || !args->config_from.empty()) {
      MT_CHECK(config.resume_path.empty(),
               "--resume continues a run as its checkpoint stores it and takes no --config or "
               "--config-from; give the options that may change (--steps, --epochs, outputs) on "
               "the command line");
      const train::TrainConfig base = args->config_from.empty()
                                          ? train::TrainConfig{}
                                          : train::stored_run_config(args->config_from);
      std::string text;
      if (!args->config_file.empty()) text = read_text_file(args->config_file, "--config");
      config = train::resolve_run_config(
          base, text, args->config_file.empty() ? args->config_from : args->config_file, config,
          fields_set_by(*cmd));
    }
    if (!config.resume_path.empty()) {
      // The run continues as saved; only where to write, how long and how fast may change.
      const train::Checkpoint ckpt = train::load_checkpoint(config.resume_path);
      train::TrainConfig merged = ckpt.config;
      train::TrainConfig given = args->config;
      for (const char* opt : kRunDefining) {
        if (cmd->count(opt) == 0) continue;
        // Compare the option's value in the given config against the checkpoint's.
        const nlohmann::json g = nlohmann::json::parse(given.to_json());
        const nlohmann::json s = nlohmann::json::parse(ckpt.config.to_json());
        const std::string key = train::field_of_config_key(std::string(opt).substr(2));
        MT_CHECK(!g.contains(key) || g[key] == s[key], "--resume continues the run saved in '",
                 config.resume_path, "', whose ", opt, " is ", s[key].dump(), "; drop ", opt,
                 " or start a new run");
      }
      merged.resume_path = config.resume_path;
      if (cmd->count("--epochs")) merged.epochs = config.epochs;
      if (cmd->count("--steps")) merged.max_steps = config.max_steps;
      if (cmd->count("--metrics")) merged.metrics_path = config.metrics_path;
      if (cmd->count("--tensorboard")) merged.tensorboard_dir = config.tensorboard_dir;
      if (cmd->count("--histogram-every")) merged.histogram_every = config.histogram_every;
      if (cmd->count("--checkpoint")) merged.checkpoint_path = config.checkpoint_path;
      if (cmd->count("--checkpoint-every")) merged.checkpoint_every = config.checkpoint_every;
      if (cmd->count("--threads")) merged.threads = config.threads;
      if (cmd->count("--device")) merged.device = config.device;
      if (cmd->count("--workers")) merged.workers = config.workers;
      if (cmd->count("--zero-grad")) merged.zero_grad = config.zero_grad;
      if (cmd->count("--input-pipeline")) merged.input_pipeline = config.input_pipeline;
      if (cmd->count("--data-dir")) merged.data_dir = config.data_dir;
      if (cmd->count("--data-path")) merged.data_path = config.data_path;
      if (cmd->count("--val-path")) merged.val_path = config.val_path;
      if (cmd->count("--eval-every")) merged.eval_every = config.eval_every;
      if (cmd->count("--eval-batches")) merged.eval_batches = config.eval_batches;
      if (cmd->count("--fd-feature-steps")) merged.fd_feature_steps = config.fd_feature_steps;
      if (cmd->count("--log-every")) merged.log_every = config.log_every;
      if (cmd->count("--on-divergence")) merged.on_divergence = config.on_divergence;
      if (cmd->count("--detect-anomaly")) merged.detect_anomaly = config.detect_anomaly;
      if (cmd->count("--divergence-patience"))
        merged.divergence_patience = config.divergence_patience;
      // A run saved by N ranks goes on with M: the state is the same on every rank.
      merged.distributed = config.distributed;
      if (cmd->count("--bucket-mb")) merged.bucket_mb = config.bucket_mb;
      if (cmd->count("--grad-comm")) merged.grad_comm = config.grad_comm;
      if (!merged.distributed) merged.grad_comm = "fp32";
      // Checkpoints hold the whole optimizer state, sharded or not.
      merged.zero = merged.distributed ? config.zero : 0;
      merged.progress = config.progress;
      config = merged;
    }
    if (args->print_config) {
      fmt::print("# mantissa train --config FILE reads this back\n{}", train::to_toml(config));
      return 0;
    }
    if (config.model == "dcgan") return run_gan(config, args->json);
    if (nn::model_input(config.model) == nn::ModelInput::Clicks) {
      return run_recommender(config, *cmd, !args->config_file.empty() || !args->config_from.empty(),
                             args->json);
    }
    train::Trainer trainer(config);
    g_announce = trainer.rank() == 0;
    const StopSignals stop_signals(on_stop_signal);  // on its own stack: stop_signals.h
    trainer.set_stop_flag(&g_stop);
    const train::TrainResult r = trainer.fit();
    if (r.interrupted != 0) {
      if (trainer.rank() == 0) {
        const train::TrainConfig& run = trainer.config();
        std::string launch = fmt::format("mantissa train --resume {}", r.checkpoint);
        if (trainer.world_size() > 1) {
          // What a data-parallel resume takes from the command line, not the checkpoint.
          launch = fmt::format("mpirun -n {} {} --distributed", trainer.world_size(), launch);
          if (run.zero != 0) launch += fmt::format(" --zero {}", run.zero);
          if (run.grad_comm != "fp32") launch += " --grad-comm " + run.grad_comm;
        }
        fmt::print(stderr,
                   "mantissa train: stopped by {} after step {}; the state is in {}. Continue "
                   "with:\n  {}\n",
                   r.interrupted == SIGTERM ? "SIGTERM" : "Ctrl-C", r.steps, r.checkpoint, launch);
      }
      return 128 + r.interrupted;  // 130 for SIGINT, 143 for SIGTERM, as a shell reports them
    }
    if (!r.diverged.empty()) {
      if (trainer.rank() == 0) {
        const train::TrainConfig& run = trainer.config();
        const std::string last =
            !r.last_good_checkpoint.empty() ? fmt::format("the last good state is step {} in {}",
                                                          r.last_good_step, r.last_good_checkpoint)
            : run.checkpoint_path.empty()
                ? std::string(
                      "there is no checkpoint (--checkpoint FILE --checkpoint-every N "
                      "keeps one)")
                : "no checkpoint of a healthy state had been written yet";
        std::string help = "a smaller --lr or a --warmup, --clip-grad-norm";
        if (run.precision == "fp16") help += ", bf16 instead of fp16 (no loss scale to outgrow)";
        if (run.on_divergence != "rollback")
          help +=
              ", --on-divergence rollback (back to the last checkpoint with half the "
              "learning rate)";
        fmt::print(stderr,
                   "mantissa train: the run diverged: {}. Training stopped after step {} and "
                   "wrote nothing more; {}. What may help: {}.\n",
                   r.diverged, r.steps, last, help);
      }
      return kDivergedExit;
    }
    if (trainer.rank() == 0) print_result(r, trainer, args->json);
    return 0;
  };
}

Command add_eval_command(CLI::App& app) {
  struct EvalArgs {
    std::string checkpoint, data_dir, device = "cpu";
    bool json = false;
  };
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Test-set loss and accuracy of a checkpoint");
  cmd->add_option("--checkpoint", args->checkpoint, "A checkpoint written by mantissa train")
      ->required();
  cmd->add_option("--data-dir", args->data_dir, "Directory of the Fashion-MNIST .gz files");
  cmd->add_option("--device", args->device,
                  "cpu, cuda or cuda:N (any device, whichever the run trained on)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print JSON");
  return [args] {
    train::require_device(args->device);
    const train::Checkpoint ckpt = train::load_checkpoint(args->checkpoint);
    const train::EvalResult r =
        train::evaluate_checkpoint(args->checkpoint, args->data_dir, args->device);
    if (args->json) {
      nlohmann::ordered_json j;
      j["checkpoint"] = args->checkpoint;
      j["model"] = ckpt.config.model;
      j["test_loss"] = r.loss;
      j["test_accuracy"] = r.accuracy;
      if (nn::model_input(ckpt.config.model) == nn::ModelInput::Tokens) {
        j["val_perplexity"] = r.perplexity();
      }
      j["samples"] = r.samples;
      j["device"] = args->device;
      fmt::print("{}\n", j.dump());
    } else if (nn::model_input(ckpt.config.model) == nn::ModelInput::Tokens) {
      fmt::print(
          "{} ({} after {} steps): validation loss {:.4f}, perplexity {:.2f}, next-token "
          "accuracy {:.2f}% on {} tokens\n",
          args->checkpoint, ckpt.config.model, ckpt.state.step, r.loss, r.perplexity(),
          100 * r.accuracy, r.samples);
    } else {
      fmt::print("{} ({} after {} steps): test accuracy {:.2f}%, test loss {:.4f} on {} images\n",
                 args->checkpoint, ckpt.config.model, ckpt.state.step, 100 * r.accuracy, r.loss,
                 r.samples);
    }
    return 0;
  };
}

}  // namespace mantissa::cli
