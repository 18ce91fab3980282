// The training loop behind `mantissa train`: data, model, optimizer, schedule, evaluation every
// epoch, metrics, progress, checkpoints and exact resumption.
//
//   mantissa::train::TrainConfig cfg;
//   cfg.model = "cnn";
//   cfg.epochs = 5;
//   auto result = mantissa::train::Trainer(cfg).fit();
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mantissa/amp/amp.h"
#include "mantissa/amp/grad_scaler.h"
#include "mantissa/autograd/anomaly.h"
#include "mantissa/data/loader.h"
#include "mantissa/dist/ddp.h"
#include "mantissa/nn/models.h"
#include "mantissa/nn/module.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/optim/schedule.h"
#include "mantissa/train/checkpoint.h"
#include "mantissa/train/config.h"
#include "mantissa/train/report.h"

namespace mantissa::train {

class RunLog;               // src/train/run_log.h
class ActivationGradients;  // src/train/underflow.h

struct EvalResult {
  double loss = 0;      // mean cross-entropy (per target: per token for language models)
  double accuracy = 0;  // 0..1 (language models: next-token accuracy)
  int64_t samples = 0;  // targets: images, or tokens
  double seconds = 0;
  double perplexity() const;  // exp(loss): what a language model's loss is reported as
};

struct EpochResult {
  int64_t epoch = 0;  // 1-based
  double train_loss = 0, train_accuracy = 0;
  EvalResult test;
  double seconds = 0;        // training time of the epoch (evaluation excluded)
  double samples_per_s = 0;  // targets per second: images, or tokens for language models
};

// Gradient underflow in fp16, summed over the measured steps (TrainConfig::underflow_every):
// of the `nonzero` fp32 reference gradient values, how many are zero when cast to fp16 as they
// are, when cast after multiplying by the loss scale, and in the run's own gradients.
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
  int64_t skipped_steps = 0;  // fp16: steps skipped for inf/NaN gradients (this run)
  double loss_scale = 1;      // fp16: the scale at the end
  // Tensor bytes on the run's device, over this run (data parallel: the largest rank's), and the
  // optimizer's state (moments, fp32 masters) at the end (ZeRO-1 shares it out).
  int64_t peak_memory_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t dataset_bytes = 0;  // of which the train and test sets (held as tensors)
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

class Trainer {
 public:
  // Loads the data, builds the model and optimizer, and restores config.resume_path if set
  // (whose configuration then defines the run; pass the merged config from the CLI).
  explicit Trainer(TrainConfig config);
  ~Trainer();

  // Trains to the end of config.epochs (or config.max_steps), or for at most `max_epochs`
  // epochs in this call when it is positive (a run that stops early, as if interrupted).
  TrainResult fit(int64_t max_epochs = 0);
  // Stopping a run cleanly (Ctrl-C): while *flag is non-zero, fit() ends after the step under
  // way, writes a checkpoint of the state mid-epoch (config.checkpoint_path, or
  // kInterruptedCheckpoint when there is none) and returns with result.interrupted = *flag. A
  // run resumed from it continues exactly where it stopped. The flag is only read (an atomic a
  // signal handler may set); data parallel, the ranks agree on it every step (one all-reduce of
  // an int), so all stop after the same step. Null: none.
  void set_stop_flag(const std::atomic<int>* flag) { stop_flag_ = flag; }
  // Every metrics record from now on (train every log_every steps, eval, underflow, fp8,
  // skipped_step, divergence, summary) is also handed to `callback` as its JSON text, on rank 0,
  // whether or not a metrics file or TensorBoard is written (the Python package's per-step
  // callback). An exception from it ends fit().
  void set_record_callback(std::function<void(const std::string& json)> callback);
  // No lines on stderr (epoch summaries, evaluations) and no progress bar: for a caller that
  // reports the run its own way (`mantissa study`). Records still go to the metrics and callback.
  void set_quiet(bool quiet) { quiet_ = quiet; }
  EvalResult evaluate();  // the test set, in eval mode, without a graph
  // The next training batch of the run's seeded loader, as fit() would take it from where the run
  // stands (nullopt at the end of the epoch): the data of a loop written elsewhere, e.g. the
  // Python package's custom loops. Not to be mixed with fit() on the same Trainer.
  std::optional<data::Batch> next_batch();

  nn::Module& model() { return *model_; }
  optim::Optimizer& optimizer() { return *optimizer_; }
  // The loss scaler of the run's precision, or (--on-divergence skip on a precision without
  // one) a static scale of 1 that checks the gradients and skips steps with inf/NaN.
  amp::GradScaler& scaler() { return check_scaler_ ? *check_scaler_ : amp_->scaler(); }
  const amp::Amp& amp() const { return *amp_; }
  // amp's description, led by the fp8 recipe for --precision fp8 ("fp8 delayed (hybrid) in 15
  // Linear layers; bf16 O1: ...").
  std::string describe_precision() const;
  // The model's weights from a checkpoint and, for --precision fp8, its delayed-scaling state
  // (what evaluating the checkpoint needs; resuming restores everything else too).
  void load_weights(const Checkpoint& ckpt);
  const amp::Fp8Context* fp8() const { return fp8_.get(); }
  const TrainConfig& config() const { return config_; }
  Device device() const { return device_; }
  const TrainState& state() const { return state_; }
  // The loss of every step this Trainer ran, in order (for resume tests and plots).
  const std::vector<float>& step_losses() const { return step_losses_; }
  int64_t batches_per_epoch() const;
  // Whether the model is a language model (tokens in, next-token logits out).
  bool language_model() const { return language_model_; }
  // Data parallel (config.distributed): this process's rank and the number of ranks (0 and 1
  // otherwise); rank 0 alone prints, writes metrics and checkpoints.
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int world_size() const { return comm_ ? comm_->world_size() : 1; }
  // The data-parallel wrapper (nullptr without config.distributed): its last step's
  // communication figures.
  const dist::DistributedDataParallel* ddp() const { return ddp_.get(); }

  // A checkpoint of the current state. Data parallel: every rank calls it (ZeRO-1 gathers the
  // optimizer's shards), rank 0 writes.
  void save(const std::string& path) const;
  // A run's result as one JSON object: what the metrics file's "summary" record holds (accuracy,
  // loss, time, peak memory, steps, skipped steps, loss scale, precision, opt level, underflow,
  // model, parameters, device).
  std::string summary_json(const TrainResult& result) const;

 private:
  void build();
  // Data parallel: every rank's configuration is this one's, or a mantissa::Error.
  void check_same_config();
  void restore(const Checkpoint& ckpt);
  void build_images(nn::ModelConfig& mc);
  void build_tokens(nn::ModelConfig& mc);
  // One optimizer step over a loader batch of batch_size * grad_accum examples (grad_accum
  // micro-batches); returns the loss (F32, on the device, not read back) and adds the batch's
  // correct predictions to *correct (I64 on the device) without a host sync.
  Tensor train_step(const data::Batch& batch, Tensor* correct, bool* skipped);
  // The evaluation and its metrics record and line, at `epoch` (1-based) after `step`.
  EvalResult evaluate_and_report(int64_t epoch, const char* when);
  // Compares this step's fp32 reference gradients (same weights and batch, no autocast) with
  // the run's own scaled gradients (call after backward, before unscale).
  UnderflowStats measure_underflow(const std::vector<Tensor>& reference) const;
  // The fp32 gradients of the batch's loss; with `activations`, every layer's output gradient
  // also goes into it.
  std::vector<Tensor> reference_gradients(const data::Batch& batch,
                                          ActivationGradients* activations = nullptr);
  // model(x) in the run's precision (amp's forward, inside the fp8 region for --precision fp8).
  Tensor forward(const Tensor& x);
  // TensorBoard histograms of every parameter ("weights/<name>") or its gradient
  // ("gradients/<name>"), each value times `factor`; and of log2|g| of the underflow
  // measurement's fp32 reference gradients (src/train/records.cpp).
  void write_histograms(bool gradients, int64_t step, double factor = 1.0);
  void write_log2_histogram(const std::vector<Tensor>& reference, int64_t step);
  // The per-layer fp8 amaxes and scales, a metrics record (JSON).
  std::string fp8_record() const;

  TrainConfig config_;
  Device device_;
  TrainState state_;
  bool language_model_ = false;
  // Training examples and the evaluation set: images and labels, or token windows.
  std::shared_ptr<const data::Dataset> train_data_, eval_data_;
  int64_t dataset_bytes_ = 0;
  std::shared_ptr<nn::Module> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LRSchedule> schedule_;
  std::unique_ptr<amp::Amp> amp_;
  std::unique_ptr<amp::Fp8Context> fp8_;           // --precision fp8
  std::unique_ptr<amp::GradScaler> check_scaler_;  // --on-divergence skip: see scaler()
  // The newest checkpoint of a healthy state (written by this run or resumed from) and its step:
  // where --on-divergence rollback returns to.
  std::string last_good_checkpoint_;
  int64_t last_good_step_ = 0;
  // --detect-anomaly: the model's module paths and parameter names, for the report.
  autograd::AnomalyNames anomaly_names_;
  UnderflowStats underflow_;
  std::unique_ptr<data::DevicePrefetcher> loader_;
  bool loader_started_ = false;  // by next_batch()
  std::unique_ptr<RunLog> log_;  // --metrics and --tensorboard (rank 0)
  std::vector<float> step_losses_;
  Tensor grad_norm_;  // of the last step, on the steps a train record reports (F64, on device)
  std::shared_ptr<dist::Communicator> comm_;       // config.distributed: MPI or NCCL
  std::shared_ptr<dist::Communicator> host_comm_;  // config.distributed: MPI
  const std::atomic<int>* stop_flag_ = nullptr;
  bool quiet_ = false;
  // The stop flag's value, the same on every rank (0: go on).
  int stop_requested() const;
  std::unique_ptr<dist::DistributedDataParallel> ddp_;  // config.distributed
};

// The device named by `text` (cpu, cuda, cuda:N), checked to exist: a mantissa::Error in one
// line otherwise ("no CUDA device: <why>; run with --device cpu").
Device require_device(const std::string& text);

// The parameter groups of --decay weights: "decay" (weights of two or more dims, with
// weight_decay) and "no_decay" (biases, and every parameter of Embedding, LayerNorm and batch
// norm modules, with none) — the usual transformer recipe (nanoGPT, Hugging Face), by module type
// rather than by name. Tied parameters are listed once.
std::vector<optim::ParamGroup> decay_groups(nn::Module& model, double weight_decay);

// "auto" -> "bf16" where the CPU has native bf16 dot products, else "fp16"; others unchanged.
std::string resolve_precision(const std::string& precision);
// The run's precision (config.precision, opt_level, loss_scale, rounding, seed) applied to a
// model and its optimizer: set_matmul_precision and amp::initialize. What Trainer and
// `mantissa bench` use.
amp::Amp initialize_precision(nn::Module& model, optim::Optimizer& opt, const TrainConfig& config);

// `mantissa eval`: the test-set loss and accuracy of a checkpoint's weights, on `device`
// (cpu, cuda, cuda:N; whatever device the run trained on).
EvalResult evaluate_checkpoint(const std::string& path, const std::string& data_dir = "",
                               const std::string& device = "cpu");

}  // namespace mantissa::train
