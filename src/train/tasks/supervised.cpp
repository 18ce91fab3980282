// The supervised tasks (supervised.h): the model, the step and the evaluation they share.
#include "train/tasks/supervised.h"

#include <set>
#include <utility>

#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/clock.h"
#include "mantissa/data/sampler.h"
#include "mantissa/tensor/ops.h"
#include "train/run.h"

namespace mantissa::train {
namespace {

// A language model's logits (B, T, V) and targets (B, T) as the (N, V) and (N) of a
// classifier: every token is one target.
Tensor flat_logits(const Tensor& logits) {
  return logits.dim() == 3 ? logits.reshape({-1, logits.size(-1)}) : logits;
}
Tensor flat_targets(const Tensor& y) {
  return y.dim() == 2 ? y.reshape({-1}) : y;
}

// The cross-entropy of a batch (mean or sum over its targets), fp32 for half logits.
Tensor loss_of(const Tensor& logits, const Tensor& y, Reduction reduction = Reduction::Mean) {
  CrossEntropyOptions ce;
  ce.reduction = reduction;
  return cross_entropy(flat_logits(logits), flat_targets(y), ce);
}

// Adds the batch's correct predictions to *acc (an I64 scalar on the logits' device), without
// reading anything back.
void count_correct(const Tensor& logits, const Tensor& y, Tensor* acc) {
  NoGrad ng;
  const Tensor c = sum(eq(argmax(flat_logits(logits), 1), flat_targets(y)));
  *acc = acc->defined() ? add(*acc, c) : c;
}

// The underflow measurement's record: the counts per layer and the log2 picture of the step
// (docs/training.md): activation gradients, weight gradients and weights, all in fp32; the
// updates are added once the step has made them.
Json underflow_record(const Run& run, const UnderflowStats& u, const ActivationGradients& act,
                      const std::vector<Tensor>& reference) {
  auto j = record("underflow");
  j["step"] = run.state.step + 1;
  j["loss_scale"] = run.main().scaler().get_scale();
  j["nonzero"] = u.nonzero;
  j["cast_unscaled"] = u.cast_unscaled;
  j["cast_scaled"] = u.cast_scaled;
  j["observed"] = u.observed;
  j["zero_rows"] = u.zero_rows;
  Json layers = Json::array();
  for (const LayerUnderflow& l : u.layers) {
    if (l.nonzero == 0) continue;
    layers.push_back({{"name", l.name},
                      {"nonzero", l.nonzero},
                      {"cast_unscaled", l.cast_unscaled},
                      {"cast_scaled", l.cast_scaled},
                      {"observed", l.observed},
                      {"zero_rows", l.zero_rows}});
  }
  j["layers"] = std::move(layers);
  j["activations"] = act.to_json();
  Log2Counts gradients, weights;
  for (const Tensor& g : reference)
    if (g.defined()) gradients.add(g);
  NoGrad ng;
  for (const Tensor& p : const_cast<Run&>(run).main().model().parameters())
    weights.add(p);
  j["weight_gradients"] = gradients.to_json();
  j["weights"] = weights.to_json();
  return j;
}

// The distribution the measurement looks at: log2|g| of the fp32 gradients, one bucket per
// binary exponent (fp16's normals start at 2^-14, its subnormals at 2^-24).
void write_log2_histogram(Run& run, const std::vector<Tensor>& reference, int64_t step) {
  NoGrad ng;
  std::vector<float> all;
  for (const Tensor& g : reference) {
    if (!g.defined()) continue;
    const std::vector<float> v = g.to(DType::F32).to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  run.log->histogram("underflow/log2_abs_gradient", log2_histogram(all), step);
}

}  // namespace

TaskData SupervisedTask::build(Run& run) {
  const TrainConfig& c = run.config;
  nn::ModelConfig mc;
  mc.dropout = c.dropout;
  mc.seed = c.seed;
  mc.activation_checkpointing = c.checkpoint_activations ? nn::ActivationCheckpointing::PerBlock
                                                         : nn::ActivationCheckpointing::Off;
  load_data(run, mc);
  manual_seed(c.seed);
  std::shared_ptr<nn::Module> model = nn::make_model(c.model, mc);
  // Parameter groups: every parameter decays, or (--decay weights, the default for token
  // models) only weights of two or more dims outside embeddings and norms.
  const bool weights_only =
      c.decay == config::Decay::Weights || (c.decay == config::Decay::Auto && tokens());
  std::vector<optim::ParamGroup> groups =
      weights_only ? decay_groups(*model, c.weight_decay)
                   : std::vector<optim::ParamGroup>{{.params = model->parameters()}};
  run.add_trainee("", std::move(model), std::move(groups));

  // A loader batch is one optimizer step: grad_accum micro-batches of batch_size, so that an
  // accumulated step sees exactly the examples of one batch of batch_size * grad_accum.
  TaskData d;
  d.train = train_data_;
  d.bytes = data_bytes_;
  d.loader.batch_size = c.batch_size * c.grad_accum;
  d.loader.shuffle = true;
  d.loader.seed = c.seed;
  d.loader.num_workers = c.workers;
  if (tokens()) {
    // Random windows with replacement (lm_batch's layout: batch k draws its windows from Philox
    // stream k); an "epoch" is as many windows as the stream has tokens. Data parallel: the
    // windows of the global batch (every rank's), each rank its share.
    const auto& windows = static_cast<const data::TokenWindows&>(*train_data_);
    const int64_t global_batch = d.loader.batch_size * run.world_size();
    // (At least one: Trainer::fit refuses a step larger than the stream, an evaluation not.)
    const int64_t per_epoch =
        std::max<int64_t>(1, windows.tokens().size() / (global_batch * c.seq_len));
    d.loader.sampler = std::make_shared<data::ReplacementSampler>(
        windows.size(), per_epoch * global_batch, c.seed, global_batch);
    d.loader.num_workers = 0;  // a batch is B * T int64 copies
  }
  return d;
}

StepOutput SupervisedTask::step(const data::Batch& batch, Run& run) {
  StepOutput out;
  out.loss = run.config.grad_accum == 1 ? step_whole(batch, run, &out.correct)
                                        : step_accumulated(batch, run, &out.correct);
  out.targets = batch.y().numel();
  return out;
}

Tensor SupervisedTask::step_whole(const data::Batch& batch, Run& run, Tensor* correct) {
  const TrainConfig& c = run.config;
  Trainee& t = run.main();
  const bool measure = c.underflow_every > 0 && run.state.step % c.underflow_every == 0;
  std::vector<Tensor> reference;
  ActivationGradients activations(t.scaler().get_scale());
  if (measure) reference = reference_gradients(run, batch, &activations);
  const Tensor logits = t.forward(batch.x());
  const Tensor loss = loss_of(logits, batch.y());
  t.backward(loss);
  count_correct(logits, batch.y(), correct);
  std::optional<Json> record;
  std::vector<Tensor> weights_before;
  if (measure) {
    const UnderflowStats u = measure_underflow(t, reference);
    if (run.log->tensorboard()) write_log2_histogram(run, reference, run.state.step + 1);
    run.underflow += u;
    if (run.log->enabled()) {
      record = underflow_record(run, u, activations, reference);
      NoGrad ng;
      for (const Tensor& p : t.model().parameters())
        weights_before.push_back(p.to(DType::F32).to(Device::cpu()).clone());
    }
  }
  t.step(run);
  if (record) {
    // What the update did to the weights.
    std::vector<Tensor> after;
    for (const Tensor& p : t.model().parameters())
      after.push_back(p.to(DType::F32).to(Device::cpu()));
    (*record)["updates"] = weight_updates(weights_before, after);
    run.log->write(*record);
  }
  return loss.detach();
}

// Gradient accumulation: micro-batches of batch_size, each one's summed loss divided by the
// target count of the WHOLE batch, so the gradients add up to the big batch's mean-loss gradient
// exactly (not a mean of per-micro-batch means, which weighs a short last micro-batch's targets
// more). The scale stays the same over the step; unscale, the inf/NaN check and clipping happen
// once, in step().
Tensor SupervisedTask::step_accumulated(const data::Batch& batch, Run& run, Tensor* correct) {
  Trainee& t = run.main();
  const Tensor& x = batch.x();
  const Tensor& y = batch.y();
  const int64_t n = x.size(0), total = y.numel(), micro = run.config.batch_size;
  Tensor loss;
  for (int64_t start = 0; start < n; start += micro) {
    const int64_t len = std::min(micro, n - start);
    const Tensor xm = x.narrow(0, start, len), ym = y.narrow(0, start, len);
    // Data parallel: only the last micro-batch's backward communicates (the sum of all).
    if (t.ddp()) t.ddp()->set_require_sync(start + len >= n);
    const Tensor logits = t.forward(xm);
    const Tensor part = div(loss_of(logits, ym, Reduction::Sum), double(total));
    t.backward(part);
    count_correct(logits, ym, correct);
    NoGrad ng;
    loss = loss.defined() ? add(loss, part.detach()) : part.detach();
  }
  t.step(run);
  return loss;
}

std::vector<Tensor> SupervisedTask::reference_gradients(Run& run, const data::Batch& batch,
                                                        ActivationGradients* activations) {
  nn::Module& model = run.main().model();
  // The same weights and batch in fp32, without touching .grad, batch norm's running statistics
  // or the random generator (the real step then draws the same dropout masks).
  const GeneratorState gen = generator_state();
  std::vector<Tensor> buffers;
  for (const Tensor& b : model.buffers())
    buffers.push_back(b.clone());
  std::vector<Tensor> grads;
  {
    amp::NoAutocast off;
    // Every layer's output gradient passes through a hook into `activations`, once per tensor
    // (a layer that returns its input, such as dropout at p = 0, hands on the same one).
    std::optional<nn::OutputObserver> observer;
    std::set<std::pair<const void*, uint32_t>> hooked;
    if (activations != nullptr) {
      observer.emplace([activations, &hooked](const nn::Module&, const Tensor& out) {
        if (!out.requires_grad() || !hooked.emplace(out.grad_fn().get(), out.output_nr()).second)
          return;
        out.register_hook([activations](const Tensor& g) {
          activations->add(g);
          return Tensor();
        });
      });
    }
    const Tensor loss = loss_of(model(batch.x()), batch.y());
    observer.reset();
    grads = autograd::grad({loss}, {}, model.parameters());
  }
  {
    NoGrad ng;
    const std::vector<Tensor> live = model.buffers();
    for (size_t i = 0; i < live.size(); ++i)
      Tensor(live[i]).copy_(buffers[i]);
  }
  set_generator_state(gen);
  return grads;
}

EvalResult SupervisedTask::evaluate(Run& run) {
  const TrainConfig& c = run.config;
  Trainee& t = run.main();
  const auto t0 = Clock::now();
  NoGrad ng;
  t.model().eval();
  data::LoaderOptions lo;
  const int64_t eval_batch = c.eval_batch_size > 0 ? c.eval_batch_size
                             : tokens()            ? c.batch_size * c.grad_accum
                                                   : 256;
  lo.batch_size = eval_batch;
  lo.shuffle = false;
  lo.num_workers = tokens() ? 0 : c.workers;
  if (c.eval_batches > 0) {
    // The first eval_batches batches of the (sequential) evaluation set.
    const int64_t n = std::min(eval_data_->size(), c.eval_batches * eval_batch);
    lo.sampler = std::make_shared<data::SequentialSampler>(n);
  }
  data::DevicePrefetcher loader(eval_data_, lo, run.device, c.input_pipeline);
  // The per-batch losses and the count stay on the device until the end: one host read.
  std::vector<Tensor> losses;
  Tensor correct_acc;
  int64_t n = 0;
  for (auto& batch : loader) {
    if (run.stopping()) break;  // an interrupted run reports no evaluation
    const Tensor logits = t.forward(batch.x());
    losses.push_back(loss_of(logits, batch.y(), Reduction::Sum).to(DType::F32));
    count_correct(logits, batch.y(), &correct_acc);
    n += batch.y().numel();
  }
  double loss_sum = 0;
  if (!losses.empty()) {
    for (const float l : stack(losses).to(Device::cpu()).to_vector<float>())
      loss_sum += l;
  }
  const int64_t correct = correct_acc.defined() ? int64_t(correct_acc.item()) : 0;
  t.model().train();
  EvalResult r;
  r.loss = n ? loss_sum / double(n) : 0.0;
  r.accuracy = n ? double(correct) / double(n) : 0.0;
  r.samples = n;
  r.seconds = seconds_since(t0);
  r.metrics = {{"test_loss", r.loss}, {"test_accuracy", r.accuracy}};
  if (tokens()) r.metrics.emplace_back("val_perplexity", r.perplexity());
  return r;
}

}  // namespace mantissa::train
