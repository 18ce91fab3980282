// Trainer::fit: the one training loop of every task (trainer.h, task.h): batches, the schedule,
// the task's step, values read back once per window, train records and progress, mid-epoch
// checkpoints and evaluations, the epoch's evaluation and checkpoint, interruption and
// divergence.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "mantissa/autograd/anomaly.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/config/run_config.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/clock.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/report.h"
#include "train/divergence.h"
#include "train/run.h"

namespace mantissa::train {
namespace {

// The values of one-element tensors (device scalars of one dtype) in one read: one host sync,
// not one each.
std::vector<double> read_scalars(const std::vector<Tensor>& scalars) {
  if (scalars.empty()) return {};
  if (scalars.size() == 1) return {scalars[0].item()};
  return stack(scalars).to(DType::F64).to(Device::cpu()).to_vector<double>();
}

// The run's loop: one object per fit() call, its steps and epochs as methods.
class Loop {
 public:
  Loop(Run& run, int64_t max_epochs);
  TrainResult run();

 private:
  bool steps_done() const { return c_.max_steps > 0 && run_.state.step >= c_.max_steps; }
  bool scaled() const { return run_.main().scaler().options().mode != amp::ScaleMode::Disabled; }
  int64_t skipped_so_far() const;
  void train_epoch();
  void step(const data::Batch& batch);
  void read_back();
  void observe_steps(const std::vector<double>& losses, int64_t window_skips);
  void write_train_record(const std::vector<double>& losses, double elapsed);
  void evaluate_mid_epoch();
  void end_epoch(double epoch_seconds);
  void save_checkpoint(bool at_end);
  bool handle_divergence();
  void stop_interrupted();
  void finish();

  Run& run_;
  const TrainConfig& c_;
  Task& task_;
  TrainResult result_;
  Progress progress_;
  DivergenceGuard guard_;
  int64_t batches_, epochs_, stop_epoch_;
  // Reading a device value back (the loss, the correct count) waits for the GPU to finish the
  // step. On the GPU the losses and counts are kept on the device and read once every
  // log_every steps (and at the end of an epoch), so the host queues steps ahead; on the CPU
  // a read costs nothing and happens every step.
  int64_t read_every_;
  int64_t skipped_before_ = 0, skipped_at_read_ = 0;
  std::string diverged_;  // why, once the guard has said so (the same on every rank)

  // The epoch under way.
  Clock::time_point t0_;
  double loss_sum_ = 0, eval_seconds_ = 0;
  int64_t correct_ = 0, seen_ = 0, run_batches_ = 0;
  std::vector<Tensor> pending_losses_;    // steps not read back yet
  std::vector<uint8_t> pending_skipped_;  // and how many skips each had (known on the CPU)
  std::vector<std::vector<std::pair<std::string, Tensor>>> pending_scalars_;
  Tensor pending_correct_;
  std::vector<std::pair<std::string, Tensor>> last_scalars_;  // of the last step read back
  bool last_skipped_ = false;
  // The last step's scalars, read.
  Metrics read_last_scalars() const;
};

Loop::Loop(Run& run, int64_t max_epochs)
    : run_(run),
      c_(run.config),
      task_(*run.task),
      progress_(c_.progress && run.rank() == 0 && !run.quiet, c_.log_every),
      guard_(c_.divergence_patience),
      batches_(run.loader->num_batches()),
      epochs_(c_.epochs > 0 ? c_.epochs : (c_.max_steps + batches_ - 1) / batches_),
      stop_epoch_(max_epochs > 0 ? std::min(epochs_, run.state.epoch + max_epochs) : epochs_),
      read_every_(run.device.is_cuda() ? c_.log_every : 1) {
  skipped_before_ = skipped_at_read_ = skipped_so_far();
}

int64_t Loop::skipped_so_far() const {
  int64_t n = 0;
  for (const auto& t : run_.trainees)
    if (t->scaler().options().mode != amp::ScaleMode::Disabled) n += t->scaler().skipped_steps();
  return n;
}

TrainResult Loop::run() {
  reset_peak_memory(run_.device);
  // A resumed run with nothing left to train would report an evaluation it never made.
  MT_CHECK(c_.resume_path.empty() || !run_.step_losses.empty() ||
               (run_.state.epoch < stop_epoch_ && !steps_done()),
           "the run saved in '", c_.resume_path, "' is already complete (step ", run_.state.step,
           c_.max_steps > 0 ? " of --steps " + std::to_string(c_.max_steps) : "", ", epoch ",
           run_.state.epoch, " of --epochs ", epochs_,
           "); to train on, pass a larger --steps or --epochs with --resume");
  if (run_.log->enabled() && !run_.config_recorded) {
    // The head of the metrics, once per Trainer (a fit() in parts continues the same records):
    // the whole configuration (`mantissa train --config-from` reruns it), as TensorBoard's text
    // too.
    run_.config_recorded = true;
    auto j = record("config");
    j["step"] = run_.state.step;
    j["config"] = Json::parse(c_.to_json());
    j["precision"] = run_.main().amp().describe();
    task_.describe_config(j);
    run_.log->write(j);
    run_.log->text("config", "```toml\n" + config::to_toml(c_) + "```", run_.state.step);
  }
  while (run_.state.epoch < stop_epoch_ && !steps_done()) {
    train_epoch();
    if (!diverged_.empty()) {
      if (handle_divergence()) continue;
      break;
    }
    if (result_.interrupted) {
      stop_interrupted();
      break;
    }
    end_epoch(seconds_since(t0_) - eval_seconds_);
    if (result_.interrupted) break;
  }
  finish();
  return result_;
}

void Loop::train_epoch() {
  for (const auto& t : run_.trainees)
    t->model().train();
  run_.loader->start_epoch(run_.state.epoch, run_.state.batch);
  t0_ = Clock::now();
  loss_sum_ = eval_seconds_ = 0;
  correct_ = seen_ = run_batches_ = 0;
  while (!steps_done()) {
    if ((result_.interrupted = run_.stop_requested()) != 0) break;
    std::optional<data::Batch> batch = run_.loader->next();
    if (!batch) break;
    step(*batch);
    ++run_batches_;
    ++run_.state.batch;
    const int64_t s = run_.state.step;
    if (s % read_every_ == 0 || run_.state.batch == batches_ || steps_done()) read_back();
    if (!diverged_.empty()) break;
    // Mid-epoch checkpoints (the epoch's end writes its own), of a state the guard has seen.
    if (c_.checkpoint_every > 0 && s % c_.checkpoint_every == 0 && run_.state.batch < batches_) {
      read_back();
      if (!diverged_.empty()) break;
      save_checkpoint(false);
    }
    if (c_.eval_every > 0 && s % c_.eval_every == 0 && run_.state.batch < batches_ &&
        !steps_done()) {
      read_back();
      if (!diverged_.empty()) break;
      evaluate_mid_epoch();
    }
  }
  read_back();
  // The epoch's time includes its last queued GPU work (one wait per epoch).
  if (run_.device.is_cuda()) cuda::synchronize(run_.device.index);
  run_.state.train_seconds += seconds_since(t0_) - eval_seconds_;
}

void Loop::step(const data::Batch& batch) {
  const int64_t next = run_.state.step + 1;
  // What the step records: the gradient norm on the steps a train record reports; TensorBoard's
  // histograms (the true gradients before the update, the weights after it) every
  // histogram_every steps or at each evaluation.
  run_.request.record_norm = run_.log->enabled() && next % c_.log_every == 0;
  run_.request.histograms =
      run_.log->tensorboard() &&
      (c_.histogram_every > 0
           ? next % c_.histogram_every == 0
           : run_.state.batch + 1 == batches_ || (c_.eval_every > 0 && next % c_.eval_every == 0));
  run_.apply_schedule();
  for (const auto& t : run_.trainees) {
    t->zero_grad();
    // rank 0's batch-norm statistics, as PyTorch's DDP
    if (t->ddp()) t->ddp()->broadcast_buffers();
  }
  StepOutput out;
  {
    // A dynamic loss scaler's gradient overflows are expected (it skips those steps): the check
    // then covers the forward only.
    std::optional<autograd::DetectAnomaly> anomaly;
    if (c_.detect_anomaly) {
      anomaly.emplace(run_.anomaly_names,
                      run_.main().scaler().options().mode != amp::ScaleMode::Dynamic);
    }
    out = task_.step(batch, run_);
  }
  ++run_.state.step;
  if (run_.request.histograms) run_.write_weight_histograms(run_.state.step);
  int64_t skips = 0;
  for (const auto& t : run_.trainees)
    skips += t->last_skipped();
  pending_losses_.push_back(out.loss.detach());
  pending_skipped_.push_back(uint8_t(skips));
  pending_scalars_.push_back(std::move(out.scalars));
  if (out.correct.defined()) {
    NoGrad ng;
    pending_correct_ =
        pending_correct_.defined() ? add(pending_correct_, out.correct) : out.correct;
  }
  result_.skipped_steps += skips;
  last_skipped_ = skips > 0;
  seen_ += out.targets;
}

void Loop::read_back() {
  if (pending_losses_.empty()) return;
  const std::vector<double> losses = read_scalars(pending_losses_);
  pending_losses_.clear();
  if (pending_correct_.defined()) correct_ += int64_t(pending_correct_.item());
  pending_correct_ = Tensor();
  // A GPU scaler decides the skip on the device: its counters are read back here, with the
  // losses.
  const int64_t skipped = skipped_so_far();
  const int64_t window_skips = skipped - skipped_at_read_;
  skipped_at_read_ = skipped;
  if (run_.main().scaler().on_device()) {
    result_.skipped_steps = skipped - skipped_before_;
    last_skipped_ = run_.main().scaler().found_inf();
  }
  for (const double loss : losses) {
    run_.step_losses.push_back(float(loss));
    loss_sum_ += loss;
  }
  last_scalars_ = pending_scalars_.back();
  observe_steps(losses, window_skips);
  const double elapsed = seconds_since(t0_) - eval_seconds_;
  StepStats st;
  st.epoch = run_.state.epoch + 1;
  st.epochs = epochs_;
  st.batch = run_.state.batch;
  st.batches = batches_;
  st.step = run_.state.step;
  st.steps = run_.schedule->options().total_steps;
  st.loss = loss_sum_ / double(run_batches_);
  st.accuracy = task_.has_accuracy() && seen_ ? double(correct_) / double(seen_) : -1;
  st.samples_per_s = elapsed > 0 ? double(seen_) / elapsed : 0;
  st.unit = task_.unit();
  st.lr = run_.main().optimizer().lr();
  st.eta_s =
      run_batches_ ? elapsed / double(run_batches_) * double(batches_ - run_.state.batch) : 0;
  if (scaled()) {
    st.loss_scale = run_.main().scaler().get_scale();
    st.skipped = result_.skipped_steps;
  }
  progress_.update(st);
  if (run_.log->enabled() && run_.state.step % c_.log_every == 0) {
    write_train_record(losses, elapsed);
  }
  pending_skipped_.clear();
  pending_scalars_.clear();
}

// The divergence guard sees every step in order. On a GPU the window's skips are known only as a
// count: all or none, or else the steps whose loss is not finite (their gradients are not
// either, and a scaler skips them).
void Loop::observe_steps(const std::vector<double>& losses, int64_t window_skips) {
  const amp::GradScaler& sc = run_.main().scaler();
  const bool dynamic = sc.options().mode == amp::ScaleMode::Dynamic;
  const bool at_min = dynamic && sc.at_min_scale();
  for (size_t i = 0; i < losses.size() && diverged_.empty(); ++i) {
    StepOutcome o;
    o.step = run_.state.step - int64_t(losses.size()) + int64_t(i) + 1;
    o.loss = float(losses[i]);
    o.skipped = sc.on_device() ? window_skips >= int64_t(losses.size()) ||
                                     (window_skips > 0 && !std::isfinite(losses[i]))
                               : pending_skipped_[i] != 0;
    diverged_ = guard_.observe(o, dynamic, at_min);
  }
  if (run_.host_comm) {
    // Every rank stops or rolls back after the same step (an inf reaches all ranks' weights
    // through the averaged gradients, but a rank's own loss may show it a step earlier).
    Tensor flag = Tensor::from_vector(std::vector<int64_t>{diverged_.empty() ? 0 : 1}, {1});
    run_.host_comm->all_reduce(flag, dist::ReduceOp::Max);
    if (flag.to_vector<int64_t>()[0] != 0 && diverged_.empty()) {
      diverged_ = "step " + std::to_string(run_.state.step) + ": another rank's loss diverged";
    }
  }
}

void Loop::write_train_record(const std::vector<double>& losses, double elapsed) {
  const Trainee& main = run_.main();
  auto j = record("train");
  j["step"] = run_.state.step;
  j["epoch"] = run_.state.epoch + 1;
  j["loss"] = losses.back();
  // The task's own numbers of the last step (the GAN's loss_d, loss_g, ...): one read.
  for (const auto& [name, v] : read_last_scalars())
    j[name] = v;
  j["lr"] = main.optimizer().lr();
  j[std::string(task_.unit()) == "tokens" ? "tokens_per_s" : "samples_per_s"] =
      elapsed > 0 ? double(seen_) / elapsed : 0.0;
  j["train_seconds"] = run_.state.train_seconds + elapsed;  // the run's so far, no evaluation
  j["loss_scale"] = main.scaler().get_scale();
  for (size_t i = 1; i < run_.trainees.size(); ++i) {
    const Trainee& t = *run_.trainees[i];
    j["loss_scale_" + t.name()] = t.scaler().get_scale();
  }
  j["skipped"] = last_skipped_;
  j["skipped_steps"] = result_.skipped_steps;
  if (main.last_grad_norm().defined()) j["grad_norm"] = main.last_grad_norm().item();
  j["peak_memory_bytes"] = memory_stats(run_.device).peak_bytes;
  run_.log->write(j);
  if (main.amp().fp8()) run_.log->write(fp8_record(run_));
}

Metrics Loop::read_last_scalars() const {
  std::vector<Tensor> values;
  for (const auto& [name, t] : last_scalars_)
    values.push_back(t.detach().to(DType::F64));
  const std::vector<double> read = read_scalars(values);
  Metrics out;
  for (size_t i = 0; i < read.size(); ++i)
    out.emplace_back(last_scalars_[i].first, read[i]);
  return out;
}

void Loop::evaluate_mid_epoch() {
  const auto e0 = Clock::now();
  EvalResult r;
  {
    const auto whole = whole_models(run_);
    r = task_.evaluate(run_);
  }
  eval_seconds_ += seconds_since(e0);
  // A stop during the evaluation cut it short: its figures are of part of the data, not shown
  // (the next step boundary stops the run).
  if (run_.stopping()) return;
  if (run_.log->enabled()) {
    auto j = record("eval");
    j["epoch"] = run_.state.epoch + 1;
    j["step"] = run_.state.step;
    for (const auto& [name, v] : r.metrics)
      j[name] = v;
    j["eval_seconds"] = r.seconds;
    run_.log->write(j);
  }
  if (run_.rank() == 0 && !run_.quiet) {
    progress_.end_epoch(fmt::format("eval at step {}: {}", run_.state.step, task_.describe(r)));
  }
}

void Loop::end_epoch(double epoch_seconds) {
  const bool finished_epoch = run_.state.batch >= batches_;
  EpochResult er;
  er.epoch = run_.state.epoch + 1;
  er.train_loss = run_batches_ ? loss_sum_ / double(run_batches_) : 0;
  er.train_accuracy = seen_ ? double(correct_) / double(seen_) : 0;
  er.seconds = epoch_seconds;
  er.samples_per_s = epoch_seconds > 0 ? double(seen_) / epoch_seconds : 0;
  if (finished_epoch) {
    ++run_.state.epoch;
    run_.state.batch = 0;
  }
  {
    const auto whole = whole_models(run_);
    er.test = task_.evaluate(run_);
  }
  if ((result_.interrupted = run_.stop_requested()) != 0) {
    // Stopped during the evaluation: its figures are of part of the data and not reported; the
    // run stops with the epoch's state saved.
    stop_interrupted();
    return;
  }
  result_.test = er.test;
  if (run_.log->enabled()) {
    auto j = record("eval");
    j["epoch"] = er.epoch;
    j["step"] = run_.state.step;
    for (const auto& [name, v] : er.test.metrics)
      j[name] = v;
    j["train_loss"] = er.train_loss;
    if (task_.has_accuracy()) j["train_accuracy"] = er.train_accuracy;
    j["epoch_seconds"] = er.seconds;
    j["eval_seconds"] = er.test.seconds;
    run_.log->write(j);
  }
  if (run_.rank() == 0 && !run_.quiet) {
    const std::string acc =
        task_.has_accuracy() ? fmt::format(" acc {:.2f}%", 100 * er.train_accuracy) : "";
    progress_.end_epoch(fmt::format(
        "epoch {}/{}: train loss {:.4f}{} | {} | {:.1f} s ({:.0f} {}/s) "
        "| peak {}",
        er.epoch, epochs_, er.train_loss, acc, task_.describe(er.test), er.seconds,
        er.samples_per_s, task_.unit(), format_bytes(memory_stats(run_.device).peak_bytes)));
  }
  result_.epochs.push_back(er);
  if (!c_.checkpoint_path.empty()) save_checkpoint(run_.state.epoch >= stop_epoch_ || steps_done());
}

// The checkpoint, when the guard trusts the state (or at the run's end, which it reached without
// diverging); then it is the last good one.
void Loop::save_checkpoint(bool at_end) {
  if (!guard_.trusted() && !at_end) return;
  save_run(run_, c_.checkpoint_path);  // rank 0 writes
  if (guard_.trusted()) {
    run_.last_good_checkpoint = c_.checkpoint_path;
    run_.last_good_step = run_.state.step;
  }
}

// What --on-divergence does once the run has diverged: true when it goes on (rolled back to the
// last good checkpoint; the epoch loop then restarts from its state), false to stop.
bool Loop::handle_divergence() {
  const bool roll = c_.on_divergence == config::OnDivergence::Rollback &&
                    !run_.last_good_checkpoint.empty() && result_.rollbacks < kMaxRollbacks;
  if (run_.log->enabled()) {
    auto j = record("divergence");
    j["step"] = run_.state.step;
    j["what"] = diverged_;
    j["action"] = roll ? "rollback" : "stop";
    if (!run_.last_good_checkpoint.empty()) {
      j["checkpoint"] = run_.last_good_checkpoint;
      j["checkpoint_step"] = run_.last_good_step;
    }
    run_.log->write(j);
  }
  if (!roll) {
    if (c_.on_divergence == config::OnDivergence::Rollback) {
      diverged_ += run_.last_good_checkpoint.empty()
                       ? "; no checkpoint had been written yet to roll back to"
                       : "; rolled back " + std::to_string(kMaxRollbacks) + " times already";
    }
    result_.diverged = diverged_;
    return false;
  }
  const double spent = run_.state.train_seconds, lr_scale = run_.state.lr_scale;
  restore_run(run_, load_checkpoint(run_.last_good_checkpoint), /*everything=*/true);
  // Half the smaller of the two factors: rolling back twice to the same checkpoint must not
  // retrace the same steps.
  run_.state.lr_scale = std::min(lr_scale, run_.state.lr_scale) * 0.5;
  run_.state.train_seconds = spent;  // time spent is spent
  ++result_.rollbacks;
  guard_.reset();
  if (run_.rank() == 0) {
    progress_.end_epoch(fmt::format(
        "{}; rolled back to step {} ('{}') with the learning rate x{:g} (rollback {} of {})",
        diverged_, run_.state.step, run_.last_good_checkpoint, run_.state.lr_scale,
        result_.rollbacks, kMaxRollbacks));
  }
  diverged_.clear();
  return true;
}

// Mid-epoch, or during an epoch's closing evaluation: the state says which batch comes next; no
// evaluation and no summary (nothing is reported that was not measured), the checkpoint, and the
// result.
void Loop::stop_interrupted() {
  result_.checkpoint = c_.checkpoint_path.empty() ? kInterruptedCheckpoint : c_.checkpoint_path;
  save_run(run_, result_.checkpoint);
  if (run_.rank() == 0 && !run_.quiet) {
    const double loss = run_batches_ ? loss_sum_ / double(run_batches_) : 0.0;
    progress_.end_epoch(
        run_.state.batch == 0 && run_batches_ > 0
            ? fmt::format("epoch {}/{}: trained (train loss {:.4f}), stopped during its "
                          "evaluation after step {}",
                          run_.state.epoch, epochs_, loss, run_.state.step)
            : fmt::format("epoch {}/{}: stopped after step {} (batch {} of {}), train loss {:.4f}",
                          run_.state.epoch + 1, epochs_, run_.state.step, run_.state.batch,
                          batches_, loss));
  }
}

void Loop::finish() {
  TrainResult& r = result_;
  r.train_seconds = run_.state.train_seconds;
  r.steps = run_.state.step;
  r.loss_scale = run_.main().scaler().get_scale();
  r.underflow = run_.underflow;
  r.peak_memory_bytes = memory_stats(run_.device).peak_bytes;
  for (const auto& t : run_.trainees)
    for (const optim::Optimizer* o : t->optimizers())
      r.optimizer_state_bytes += o->state_nbytes();
  if (run_.host_comm) {
    // Per rank, the largest: what a machine must hold for one rank.
    Tensor most = Tensor::from_vector(
        std::vector<int64_t>{r.peak_memory_bytes, r.optimizer_state_bytes}, {2});
    run_.host_comm->all_reduce(most, dist::ReduceOp::Max);
    r.peak_memory_bytes = most.to_vector<int64_t>()[0];
    r.optimizer_state_bytes = most.to_vector<int64_t>()[1];
  }
  r.dataset_bytes = run_.dataset_bytes;
  r.last_step = read_last_scalars();
  r.last_good_checkpoint = run_.last_good_checkpoint;
  r.last_good_step = run_.last_good_step;
  if (run_.log->enabled() && !r.interrupted && r.diverged.empty()) {
    auto j = record("summary");
    j.update(Json::parse(summary_of(run_, r)));
    run_.log->write(j);
  }
}

}  // namespace

void Run::apply_schedule() {
  for (const auto& t : trainees) {
    for (optim::Optimizer* o : t->optimizers()) {
      schedule->apply(*o, state.step);
      if (state.lr_scale != 1) {
        for (size_t g = 0; g < o->num_groups(); ++g)
          o->set_lr(g, o->lr(g) * state.lr_scale);
      }
    }
  }
}

TrainResult Trainer::fit(int64_t max_epochs) {
  check_step_fits_the_data(*run_);
  return Loop(*run_, max_epochs).run();
}

}  // namespace mantissa::train
