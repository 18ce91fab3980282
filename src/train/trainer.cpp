#include "mantissa/train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "mantissa/amp/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/error.h"
#include "mantissa/data/dataset.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/clip.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Numbers in metrics keep every bit a float/double has (a resumed run is compared bitwise).
nlohmann::ordered_json record(const char* kind) {
  nlohmann::ordered_json j;
  j["kind"] = kind;
  return j;
}

int64_t count_correct(const Tensor& logits, const Tensor& y) {
  NoGrad ng;
  return int64_t(sum(eq(argmax(logits, 1), y)).item());
}

}  // namespace

std::string resolve_precision(const std::string& precision) {
  if (precision != "auto") return precision;
  return cpu_features().avx512_bf16 ? "bf16" : "fp16";
}

amp::Amp initialize_precision(nn::Module& model, optim::Optimizer& opt, const TrainConfig& c) {
  // tf32 is a matmul setting; bf16/fp16 are Apex opt levels (amp::initialize sets up the model,
  // the optimizer's masters and rounding, and the scaler); bf16-pure is bf16 O3 with stochastic
  // rounding and batch norm kept fp32.
  const std::string precision = resolve_precision(c.precision);
  set_matmul_precision(precision == "tf32" ? MatmulPrecision::High : MatmulPrecision::Highest);
  amp::OptLevel level = amp::OptLevel::O0;
  DType half = DType::F32;
  amp::AmpOptions ao;
  if (precision == "bf16-pure") {
    level = amp::OptLevel::O3;
    half = DType::BF16;
    ao = amp::bf16_pure_options(c.seed);
  } else if (precision == "bf16" || precision == "fp16") {
    half = precision == "bf16" ? DType::BF16 : DType::F16;
    level = *amp::parse_opt_level(c.opt_level.empty() ? "O1" : c.opt_level);
    if (c.rounding == "stochastic") ao.rounding = RoundingMode::Stochastic;
    ao.rounding_seed = c.seed;
  }
  if (c.loss_scale != "dynamic") ao.loss_scale = std::stod(c.loss_scale);
  return amp::initialize(model, opt, level, half, ao);
}

Trainer::Trainer(TrainConfig config) : config_(std::move(config)) {
  // "auto" becomes the precision this machine runs fastest, stored as such (checkpoints and
  // metrics name what ran).
  config_.precision = resolve_precision(config_.precision);
  config_.validate();
  set_num_threads(config_.threads > 0 ? config_.threads
                                      : int(std::max(1u, std::thread::hardware_concurrency())));
  build();
  if (!config_.resume_path.empty()) restore(load_checkpoint(config_.resume_path));
  metrics_ = config_.metrics_path.empty() ? std::make_unique<MetricsWriter>()
                                          : std::make_unique<MetricsWriter>(config_.metrics_path);
}

Trainer::~Trainer() = default;

void Trainer::build() {
  if (config_.data == "fashion-mnist") {
    train_set_ = data::load_fashion_mnist(config_.data_dir, true);
    test_set_ = data::load_fashion_mnist(config_.data_dir, false);
  } else {
    // One draw (the class patterns depend on the seed), split 5:1 into train and test.
    const int64_t n_train = config_.synthetic_size;
    const int64_t n_test = std::max<int64_t>(n_train / 5, 1);
    const data::ImageDataset all =
        data::synthetic_images(n_train + n_test, 1, 28, 10, config_.seed);
    train_set_ = data::head(all, n_train);
    test_set_ = all;
    test_set_.images = all.images.narrow(0, n_train, n_test);
    test_set_.labels = all.labels.narrow(0, n_train, n_test);
  }
  const std::vector<std::string> names = nn::model_names();
  MT_CHECK(std::find(names.begin(), names.end(), config_.model) != names.end() &&
               nn::model_input(config_.model) == nn::ModelInput::Image,
           "model '", config_.model,
           "' does not train on images here; image models are mlp, "
           "cnn, resnet, vit and lstm_classifier (see 'mantissa train --help')");
  nn::ModelConfig mc;
  mc.num_classes = train_set_.num_classes;
  mc.in_channels = train_set_.channels();
  mc.image_size = train_set_.height();
  mc.dropout = config_.dropout;
  mc.seed = config_.seed;
  manual_seed(config_.seed);
  model_ = nn::make_model(config_.model, mc);

  std::vector<Tensor> params = model_->parameters();
  if (config_.optimizer == "sgd") {
    optim::SGDOptions o;
    o.lr = config_.lr;
    o.momentum = config_.momentum;
    o.weight_decay = config_.weight_decay;
    o.nesterov = config_.nesterov;
    optimizer_ = std::make_unique<optim::SGD>(params, o);
  } else {
    optim::AdamWOptions o;
    o.lr = config_.lr;
    o.beta1 = config_.beta1;
    o.beta2 = config_.beta2;
    o.eps = config_.eps;
    o.weight_decay = config_.weight_decay;
    optimizer_ = std::make_unique<optim::AdamW>(params, o);
  }

  data::LoaderOptions lo;
  lo.batch_size = config_.batch_size;
  lo.shuffle = true;
  lo.seed = config_.seed;
  lo.num_workers = config_.workers;
  loader_ = std::make_unique<data::DataLoader>(train_set_, lo);

  optim::ScheduleOptions so;
  so.lr = config_.lr;
  so.warmup_steps = config_.warmup_steps;
  so.step_size = config_.step_size;
  so.gamma = config_.gamma;
  const int64_t epoch_steps = config_.epochs * loader_->num_batches();
  so.total_steps = config_.max_steps > 0 && (config_.epochs <= 0 || config_.max_steps < epoch_steps)
                       ? config_.max_steps
                       : epoch_steps;
  schedule_ =
      std::make_unique<optim::LRSchedule>(optim::LRSchedule::from_name(config_.schedule, so));

  amp_ = std::make_unique<amp::Amp>(initialize_precision(*model_, *optimizer_, config_));
}

void Trainer::restore(const Checkpoint& ckpt) {
  model_->load_state_dict(ckpt.model);
  optimizer_->load_state_dict(ckpt.optimizer);
  if (scaler().options().mode != amp::ScaleMode::Disabled && !ckpt.scaler.empty()) {
    scaler().load_state_dict(ckpt.scaler);
  }
  state_ = ckpt.state;
  set_generator_state(state_.generator);
}

int64_t Trainer::batches_per_epoch() const {
  return loader_->num_batches();
}

void Trainer::save(const std::string& path) const {
  TrainState s = state_;
  s.generator = generator_state();
  save_checkpoint(path, config_, s, model_->state_dict(), optimizer_->state_dict(),
                  amp_->scaler().state_dict());
}

double Trainer::train_step(const data::Batch& batch, int64_t* correct, bool* skipped) {
  optimizer_->set_lr(schedule_->lr_at(state_.step));
  optimizer_->zero_grad(true);
  amp::GradScaler& sc = scaler();
  const bool measure = config_.underflow_every > 0 && state_.step % config_.underflow_every == 0;
  std::vector<Tensor> reference;
  if (measure) reference = reference_gradients(batch);
  const Tensor logits = amp_->forward(*model_, batch.x);
  const Tensor loss = cross_entropy(logits, batch.y);  // fp32 for half logits
  sc.scale(loss).backward();
  if (measure) {
    const UnderflowStats u = measure_underflow(reference);
    underflow_ += u;
    if (metrics_->enabled()) {
      auto j = record("underflow");
      j["step"] = state_.step + 1;
      j["loss_scale"] = sc.get_scale();
      j["nonzero"] = u.nonzero;
      j["cast_unscaled"] = u.cast_unscaled;
      j["cast_scaled"] = u.cast_scaled;
      j["observed"] = u.observed;
      metrics_->write(j.dump());
    }
  }
  if (config_.clip_grad_norm > 0) {
    sc.unscale_(*optimizer_);  // clip the true gradients, not the scaled ones
    optim::clip_grad_norm(optimizer_->params(), config_.clip_grad_norm);
  }
  *skipped = sc.step(*optimizer_);
  sc.update();
  ++state_.step;
  *correct += count_correct(logits, batch.y);
  return loss.item();
}

std::vector<Tensor> Trainer::reference_gradients(const data::Batch& batch) {
  // The same weights and batch in fp32, without touching .grad, batch norm's running statistics
  // or the random generator (the real step then draws the same dropout masks).
  const GeneratorState gen = generator_state();
  std::vector<Tensor> buffers;
  for (const Tensor& b : model_->buffers())
    buffers.push_back(b.clone());
  std::vector<Tensor> grads;
  {
    amp::NoAutocast off;
    const Tensor loss = cross_entropy((*model_)(batch.x), batch.y);
    grads = autograd::grad({loss}, {}, model_->parameters());
  }
  {
    NoGrad ng;
    const std::vector<Tensor> live = model_->buffers();
    for (size_t i = 0; i < live.size(); ++i)
      Tensor(live[i]).copy_(buffers[i]);
  }
  set_generator_state(gen);
  return grads;
}

UnderflowStats Trainer::measure_underflow(const std::vector<Tensor>& reference) const {
  NoGrad ng;
  UnderflowStats u;
  u.measurements = 1;
  const double scale = amp_->scaler().get_scale();
  const std::vector<Tensor> params = model_->parameters();
  // Elements where both masks are true.
  auto both = [](const Tensor& a, const Tensor& b) {
    return int64_t(sum(mul(a.to(DType::F32), b.to(DType::F32))).item());
  };
  const Tensor zero16 = Tensor::scalar(0.0, DType::F16);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!reference[i].defined()) continue;
    const Tensor r = reference[i].to(DType::F32);
    const Tensor nz = ne(r, Tensor::scalar(0.0, DType::F32));
    u.nonzero += int64_t(sum(nz.to(DType::F32)).item());
    u.cast_unscaled += both(nz, eq(r.to(DType::F16), zero16));
    u.cast_scaled += both(nz, eq(mul(r, scale).to(DType::F16), zero16));
    const Tensor own = params[i].grad();
    u.observed +=
        own.defined() ? both(nz, eq(own, Tensor::scalar(0.0, own.dtype()))) : both(nz, nz);
  }
  return u;
}

UnderflowStats& UnderflowStats::operator+=(const UnderflowStats& o) {
  measurements += o.measurements;
  nonzero += o.nonzero;
  cast_unscaled += o.cast_unscaled;
  cast_scaled += o.cast_scaled;
  observed += o.observed;
  return *this;
}

EvalResult Trainer::evaluate() {
  const auto t0 = Clock::now();
  NoGrad ng;
  model_->eval();
  data::LoaderOptions lo;
  lo.batch_size = config_.eval_batch_size;
  lo.shuffle = false;
  lo.num_workers = config_.workers;
  data::DataLoader loader(test_set_, lo);
  double loss_sum = 0;
  int64_t correct = 0, n = 0;
  for (auto& batch : loader) {
    const Tensor logits = amp_->forward(*model_, batch.x);
    CrossEntropyOptions ce;
    ce.reduction = Reduction::Sum;
    loss_sum += cross_entropy(logits, batch.y, ce).item();
    correct += count_correct(logits, batch.y);
    n += batch.y.numel();
  }
  model_->train();
  return {n ? loss_sum / double(n) : 0.0, n ? double(correct) / double(n) : 0.0, n,
          seconds_since(t0)};
}

TrainResult Trainer::fit(int64_t max_epochs) {
  TrainResult result;
  reset_peak_memory();
  const int64_t batches = loader_->num_batches();
  const int64_t epochs =
      config_.epochs > 0 ? config_.epochs : (config_.max_steps + batches - 1) / batches;
  Progress progress(config_.progress, config_.log_every);
  auto steps_done = [&] { return config_.max_steps > 0 && state_.step >= config_.max_steps; };

  const int64_t stop_epoch = max_epochs > 0 ? std::min(epochs, state_.epoch + max_epochs) : epochs;
  while (state_.epoch < stop_epoch && !steps_done()) {
    model_->train();
    loader_->start_epoch(state_.epoch, state_.batch);
    const auto t0 = Clock::now();
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, run_batches = 0;
    while (!steps_done()) {
      std::optional<data::Batch> batch = loader_->next();
      if (!batch) break;
      bool skipped = false;
      const double loss = train_step(*batch, &correct, &skipped);
      result.skipped_steps += skipped;
      step_losses_.push_back(float(loss));
      loss_sum += loss;
      seen += batch->y.numel();
      ++run_batches;
      ++state_.batch;
      const double elapsed = seconds_since(t0);
      StepStats s;
      s.epoch = state_.epoch + 1;
      s.epochs = epochs;
      s.batch = state_.batch;
      s.batches = batches;
      s.step = state_.step;
      s.loss = loss_sum / double(run_batches);
      s.accuracy = seen ? double(correct) / double(seen) : 0;
      s.samples_per_s = elapsed > 0 ? double(seen) / elapsed : 0;
      s.lr = optimizer_->lr();
      s.eta_s = run_batches ? elapsed / double(run_batches) * double(batches - state_.batch) : 0;
      if (scaler().options().mode != amp::ScaleMode::Disabled) {
        s.loss_scale = scaler().get_scale();
        s.skipped = result.skipped_steps;
      }
      progress.update(s);
      if (metrics_->enabled() && state_.step % config_.log_every == 0) {
        auto j = record("train");
        j["step"] = state_.step;
        j["epoch"] = state_.epoch + 1;
        j["loss"] = loss;
        j["lr"] = optimizer_->lr();
        j["samples_per_s"] = s.samples_per_s;
        j["loss_scale"] = scaler().get_scale();
        j["skipped"] = skipped;
        metrics_->write(j.dump());
      }
    }
    const double epoch_seconds = seconds_since(t0);
    state_.train_seconds += epoch_seconds;
    const bool finished_epoch = state_.batch >= batches;
    EpochResult er;
    er.epoch = state_.epoch + 1;
    er.train_loss = run_batches ? loss_sum / double(run_batches) : 0;
    er.train_accuracy = seen ? double(correct) / double(seen) : 0;
    er.seconds = epoch_seconds;
    er.samples_per_s = epoch_seconds > 0 ? double(seen) / epoch_seconds : 0;
    if (finished_epoch) {
      ++state_.epoch;
      state_.batch = 0;
    }
    er.test = evaluate();
    result.test = er.test;
    if (metrics_->enabled()) {
      auto j = record("eval");
      j["epoch"] = er.epoch;
      j["step"] = state_.step;
      j["test_loss"] = er.test.loss;
      j["test_accuracy"] = er.test.accuracy;
      j["train_loss"] = er.train_loss;
      j["train_accuracy"] = er.train_accuracy;
      j["epoch_seconds"] = er.seconds;
      metrics_->write(j.dump());
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "epoch %lld/%lld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | "
                  "%.1f s (%.0f samples/s) | peak %s",
                  (long long)er.epoch, (long long)epochs, er.train_loss, 100 * er.train_accuracy,
                  er.test.loss, 100 * er.test.accuracy, er.seconds, er.samples_per_s,
                  format_bytes(memory_stats().peak_bytes).c_str());
    progress.end_epoch(line);
    result.epochs.push_back(er);
    if (!config_.checkpoint_path.empty()) save(config_.checkpoint_path);
  }
  result.train_seconds = state_.train_seconds;
  result.steps = state_.step;
  result.loss_scale = scaler().get_scale();
  result.underflow = underflow_;
  result.peak_memory_bytes = memory_stats().peak_bytes;
  for (const data::ImageDataset* d : {&train_set_, &test_set_})
    result.dataset_bytes += d->images.nbytes() + d->labels.nbytes();
  if (metrics_->enabled()) {
    auto j = record("summary");
    j.update(nlohmann::ordered_json::parse(summary_json(result)));
    metrics_->write(j.dump());
  }
  return result;
}

std::string Trainer::summary_json(const TrainResult& result) const {
  nlohmann::ordered_json j;
  j["test_accuracy"] = result.test.accuracy;
  j["test_loss"] = result.test.loss;
  j["train_seconds"] = result.train_seconds;
  j["peak_memory_bytes"] = result.peak_memory_bytes;
  j["dataset_bytes"] = result.dataset_bytes;
  j["steps"] = result.steps;
  j["skipped_steps"] = result.skipped_steps;
  j["loss_scale"] = result.loss_scale;
  j["precision"] = config_.precision;
  j["opt_level"] = std::string(amp::opt_level_name(amp_->properties().level));
  const UnderflowStats& u = result.underflow;
  if (u.measurements > 0) {
    j["underflow"] = {{"measurements", u.measurements},
                      {"nonzero", u.nonzero},
                      {"cast_unscaled", u.cast_unscaled},
                      {"cast_scaled", u.cast_scaled},
                      {"observed", u.observed}};
  }
  j["model"] = config_.model;
  j["parameters"] = model_->num_parameters();
  return j.dump();
}

EvalResult evaluate_checkpoint(const std::string& path, const std::string& data_dir) {
  Checkpoint ckpt = load_checkpoint(path);
  TrainConfig c = ckpt.config;
  c.resume_path.clear();
  c.metrics_path.clear();
  c.checkpoint_path.clear();
  c.progress = false;
  if (!data_dir.empty()) c.data_dir = data_dir;
  Trainer t(c);
  t.model().load_state_dict(ckpt.model);
  return t.evaluate();
}

}  // namespace mantissa::train
