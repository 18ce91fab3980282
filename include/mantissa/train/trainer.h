// The training loop behind `mantissa train`: one loop for every task (image classification,
// language modelling, the GAN, recommenders): data, models, optimizers and precision from the
// configuration, the step, evaluations, metrics, progress, checkpoints and exact resumption,
// interruption and divergence. What differs between tasks (their data, what a step and an
// evaluation are) is the task's (src/train/task.h).
//
//   mantissa::train::TrainConfig cfg = mantissa::train::defaults_for("cnn");
//   cfg.epochs = 5;
//   auto result = mantissa::train::Trainer(cfg).fit();
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mantissa/amp/amp.h"
#include "mantissa/amp/grad_scaler.h"
#include "mantissa/config/train_config.h"
#include "mantissa/data/loader.h"
#include "mantissa/dist/ddp.h"
#include "mantissa/nn/module.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/train/checkpoint.h"

namespace mantissa::train {

using config::kDefaultFashionMnistDir;
using config::TrainConfig;

struct Run;  // src/train/run.h
class Task;  // src/train/task.h

// Named numbers of a record, in the order they are written.
using Metrics = std::vector<std::pair<std::string, double>>;

struct EvalResult {
  double loss = 0;      // the task's loss (per target: per token for language models)
  double accuracy = 0;  // 0..1 (language models: next-token accuracy; 0 where there is none)
  int64_t samples = 0;  // what was evaluated: images, tokens, examples, generated images
  double seconds = 0;
  // The task's numbers, as its eval records name them (test_loss, test_accuracy; the
  // recommender's loss and auc; the GAN's frechet_distance, ms_ssim, ...).
  Metrics metrics;
  // The task's line of it ("val loss 2.31 perplexity 10.07 next-token acc 70.70%") and what
  // `samples` counts ("images", "tokens", "examples", "generated images"): Trainer::evaluate's.
  std::string text, unit;
  double perplexity() const;  // exp(loss): what a language model's loss is reported as
  // The metric named `name` (NaN when there is none).
  double metric(const std::string& name) const;
};

struct EpochResult {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0, train_accuracy = 0;
  EvalResult test;
  double seconds = 0;        // training time of the epoch (evaluation excluded)
  double samples_per_s = 0;  // targets per second: images, or tokens for language models
};

// One parameter's part of an underflow measurement: which layers lose their gradients.
struct LayerUnderflow {
  std::string name;  // the parameter's, e.g. "blocks.3.mlp.fc2.weight"
  int64_t nonzero = 0;
  int64_t cast_unscaled = 0;
  int64_t cast_scaled = 0;
  int64_t observed = 0;
  // Rows of a weight's gradient (its first dim: one output unit, one LSTM gate unit) that the
  // run's gradient leaves all zero while fp32's has a non-zero value in them: a unit that got no
  // gradient at all, not values that underflowed one by one.
  int64_t zero_rows = 0;
};

// Gradient underflow in fp16, summed over the measured steps (TrainConfig::underflow_every):
// of the `nonzero` fp32 reference gradient values, how many are zero when cast to fp16 as they
// are, when cast after multiplying by the loss scale, and in the run's own gradients.
struct UnderflowStats {
  int64_t measurements = 0;
  int64_t nonzero = 0;
  int64_t cast_unscaled = 0;
  int64_t cast_scaled = 0;
  int64_t observed = 0;
  int64_t zero_rows = 0;
  std::vector<LayerUnderflow> layers;  // every parameter, in the model's order
  UnderflowStats& operator+=(const UnderflowStats& o);
  // The (at most) n parameters with the largest fraction of their non-zero fp32 gradient values
  // zero in this run's own gradients, the most first; ties by name.
  std::vector<LayerUnderflow> worst(size_t n) const;
};

struct TrainResult {
  std::vector<EpochResult> epochs;  // the epochs this run trained (after a resume: the rest)
  EvalResult test;                  // the last evaluation
  double train_seconds = 0;         // all training time, resumed runs included
  int64_t steps = 0;
  int64_t skipped_steps = 0;  // optimizer steps skipped for inf/NaN gradients (this run)
  double loss_scale = 1;      // the main model's scale at the end
  // Tensor bytes on the run's device, over this run (data parallel: the largest rank's), and the
  // optimizer's state (moments, fp32 masters) at the end (ZeRO-1 shares it out).
  int64_t peak_memory_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t dataset_bytes = 0;  // of which the data held as tensors
  // The last step's numbers beyond its loss (the GAN's loss_d and loss_g, ...).
  Metrics last_step;
  // Stopped by the stop flag (Trainer::set_stop_flag): the flag's value (the signal, for the
  // CLI), and the checkpoint written then. The summary is not written and `test` holds the
  // last evaluation made, if any: nothing unmeasured is reported.
  int interrupted = 0;
  std::string checkpoint;
  UnderflowStats underflow;  // with TrainConfig::underflow_every
  // Stopped because the run diverged (TrainConfig::on_divergence): what happened, at which
  // step, and what was done; empty otherwise. No evaluation, summary or checkpoint follows it:
  // the last checkpoint written (last_good_checkpoint, at last_good_step) is the run's last
  // healthy state.
  std::string diverged;
  std::string last_good_checkpoint;
  int64_t last_good_step = 0;
  int64_t rollbacks = 0;  // --on-divergence rollback: how many times this run rolled back
};

// --on-divergence rollback: the most rollbacks in one run (each halves the learning rate).
inline constexpr int kMaxRollbacks = 3;

// Where an interrupted run without --checkpoint writes its state (the working directory).
inline constexpr const char* kInterruptedCheckpoint = "mantissa-interrupted.safetensors";

// The configuration a run that trains `model` starts from: TrainConfig's defaults with the
// task's own (the GAN's Adam at 2e-4 and beta1 0.5, the recommender's batch of 512, ...). The
// command line, run configs and the Python package start from it; a value set on top of it is
// used as given.
TrainConfig defaults_for(const std::string& model);

// Refuses, naming the option, what the run's task cannot honour: an option given a value other
// than its default whose feature (config::Feature) the task or the data lacks, and an unknown
// model or one that is half of another (with the models to choose from).
void check_supported(const TrainConfig& config);

// The task that trains `model`, in words ("image classification", "language model", "GAN",
// "recommender"), and the models there are, each with its task, for `--model` help.
std::string task_name(const std::string& model);
std::vector<std::pair<std::string, std::string>> trainable_models();

class Trainer {
 public:
  // Loads the data, builds the models and optimizers, and restores config.resume_path if set
  // (a Fixed option that differs from the checkpoint's is refused: config/run_config.h).
  explicit Trainer(TrainConfig config);
  ~Trainer();

  // Trains to the end of config.epochs (or config.max_steps), or for at most `max_epochs`
  // epochs in this call when it is positive (a run that stops early, as if interrupted).
  TrainResult fit(int64_t max_epochs = 0);
  // Stopping a run cleanly (Ctrl-C): while *flag is non-zero, fit() ends after the step under
  // way (data loading and evaluations stop too), writes a checkpoint of the state mid-epoch
  // (config.checkpoint_path, or kInterruptedCheckpoint when there is none) and returns with
  // result.interrupted = *flag. A run resumed from it continues exactly where it stopped. The
  // flag is only read (an atomic a signal handler may set); data parallel, the ranks agree on
  // it every step (one all-reduce of an int), so all stop after the same step. Null: none.
  void set_stop_flag(const std::atomic<int>* flag);
  // Every metrics record from now on (train every log_every steps, eval, underflow, fp8,
  // skipped_step, divergence, summary) is also handed to `callback` as its JSON text, on rank 0,
  // whether or not a metrics file or TensorBoard is written (the Python package's per-step
  // callback). An exception from it ends fit().
  void set_record_callback(std::function<void(const std::string& json)> callback);
  // No lines on stderr (epoch summaries, evaluations) and no progress bar: for a caller that
  // reports the run its own way (`mantissa study`). Records still go to the metrics and callback.
  void set_quiet(bool quiet);
  EvalResult evaluate();  // the task's evaluation, in eval mode, without a graph
  // The next training batch of the run's seeded loader, as fit() would take it from where the run
  // stands (nullopt at the end of the epoch): the data of a loop written elsewhere, e.g. the
  // Python package's custom loops. Not to be mixed with fit() on the same Trainer.
  std::optional<data::Batch> next_batch();

  // The main model (the GAN's generator) and its optimizer, loss scaler and precision.
  nn::Module& model();
  optim::Optimizer& optimizer();
  // The loss scaler of the run's precision, or (--on-divergence skip on a precision without
  // one) a static scale of 1 that checks the gradients and skips steps with inf/NaN.
  amp::GradScaler& scaler();
  const amp::Amp& amp() const;
  // amp's description ("fp8 delayed (hybrid) in 15 Linear layers; bf16 O1: ...").
  std::string describe_precision() const;
  // The models' weights from a checkpoint and, for --precision fp8, their delayed-scaling state
  // (what evaluating the checkpoint needs; resuming restores everything else too).
  void load_weights(const Checkpoint& ckpt);
  const amp::Fp8Context* fp8() const;
  const TrainConfig& config() const;
  Device device() const;
  const TrainState& state() const;
  // The loss of every step this Trainer ran, in order (for resume tests and plots).
  const std::vector<float>& step_losses() const;
  int64_t batches_per_epoch() const;
  // Whether the model is a language model (tokens in, next-token logits out).
  bool language_model() const;
  // Data parallel (config.distributed): this process's rank and the number of ranks (0 and 1
  // otherwise); rank 0 alone prints, writes metrics and checkpoints.
  int rank() const;
  int world_size() const;
  // The data-parallel wrapper of the main model (nullptr without config.distributed).
  const dist::DistributedDataParallel* ddp() const;

  // A checkpoint of the current state. Data parallel: every rank calls it (ZeRO-1 gathers the
  // optimizer's shards), rank 0 writes.
  void save(const std::string& path) const;
  // A run's result as one JSON object: what the metrics file's "summary" record holds (the
  // task's numbers, time, peak memory, steps, skipped steps, loss scale, precision, opt level,
  // underflow, model, parameters, device).
  std::string summary_json(const TrainResult& result) const;
  // The one line `mantissa train` prints at the end of a run.
  std::string result_line(const TrainResult& result) const;

 private:
  std::unique_ptr<Run> run_;
};

// The device named by `text` (cpu, cuda, cuda:N), checked to exist: a mantissa::Error in one
// line otherwise ("no CUDA device: <why>; run with --device cpu").
Device require_device(const std::string& text);

// The parameter groups of --decay weights: "decay" (weights of two or more dims, with
// weight_decay) and "no_decay" (biases, and every parameter of Embedding, LayerNorm and batch
// norm modules, with none) — the usual transformer recipe (nanoGPT, Hugging Face), by module type
// rather than by name. Tied parameters are listed once.
std::vector<optim::ParamGroup> decay_groups(nn::Module& model, double weight_decay);

// `mantissa eval`: the evaluation of a checkpoint's weights on `device` (cpu, cuda, cuda:N;
// whatever device the run trained on), with the data at `data_dir` (Fashion-MNIST), or the
// token shards, tokenizer or held-out data given here instead of the stored paths.
struct EvalOptions {
  std::string device = "cpu";
  std::string data_dir{}, data_path{}, val_path{}, tokenizer{};
};
EvalResult evaluate_checkpoint(const std::string& path, const EvalOptions& options = {});

}  // namespace mantissa::train
