// train_recommender: a Clicks model (dcn) on a click log in any precision recipe
// (include/mantissa/train/recommender.h, docs/training.md "Recommenders").
#include "mantissa/train/recommender.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mantissa/amp/amp.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/error.h"
#include "mantissa/data/clicks.h"
#include "mantissa/data/loader.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/clip.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/optim/schedule.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/run_config.h"
#include "mantissa/train/trainer.h"
#include "train/lazy_embeddings.h"
#include "train/run_log.h"

namespace mantissa::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The training and held-out examples, and what is known about them.
struct ClickData {
  std::shared_ptr<const data::Dataset> train, held_out;
  int64_t n_dense = 0;
  std::vector<int64_t> table_sizes;
  double bayes_log_loss = std::numeric_limits<double>::quiet_NaN();
  double constant_log_loss = 0;
  int64_t bytes = 0;
};

ClickData load_clicks(const TrainConfig& c) {
  ClickData d;
  std::shared_ptr<const data::ClickLog> log;
  int64_t n_train = 0;
  if (c.data == "synthetic-clicks") {
    data::SyntheticClickOptions o;
    o.examples = c.synthetic_size;
    o.seed = c.seed;
    o.hash_buckets = c.hash_buckets;
    data::SyntheticClicks s = data::synthetic_clicks(o);
    d.bayes_log_loss = s.bayes_log_loss;
    n_train = s.train_size;
    log = std::make_shared<const data::ClickLog>(std::move(s.log));
  } else {
    data::ClickFileOptions o;
    o.hash_buckets = c.hash_buckets;
    log = std::make_shared<const data::ClickLog>(data::read_click_log(c.data_path, o));
    if (c.val_path.empty()) {
      n_train = log->size() - std::max<int64_t>(1, log->size() / 10);
      MT_CHECK(n_train >= 1, "--data-path '", c.data_path, "' has ", log->size(),
               " example(s): too few to hold out the last 10% and train on the rest");
    } else {
      o.n_dense = log->n_dense;
      o.n_cat = log->n_cat;
      auto held = std::make_shared<const data::ClickLog>(data::read_click_log(c.val_path, o));
      d.held_out = std::make_shared<const data::ClickDataset>(held, 0, held->size());
      d.constant_log_loss = held->constant_log_loss();
      d.bytes +=
          int64_t(held->dense.size() * 4 + held->categorical.size() * 8 + held->labels.size() * 4);
      n_train = log->size();
    }
  }
  d.n_dense = log->n_dense;
  d.table_sizes = log->table_sizes;
  d.bytes += int64_t(log->dense.size() * 4 + log->categorical.size() * 8 + log->labels.size() * 4);
  d.train = std::make_shared<const data::ClickDataset>(log, 0, n_train);
  if (!d.held_out) {
    d.held_out = std::make_shared<const data::ClickDataset>(log, n_train, log->size() - n_train);
    d.constant_log_loss = log->slice(n_train, log->size() - n_train).constant_log_loss();
  }
  return d;
}

// The model with its embedding tables replaced by the batch's rows (nn::functional_call), as a
// Module that Amp::forward can run.
class WithRows final : public nn::Module {
 public:
  WithRows(nn::Module& inner, NamedTensors rows)
      : Module(inner.name()), inner_(inner), rows_(std::move(rows)) {}
  nn::TensorList forward_list(const nn::TensorList& inputs) override {
    return nn::functional_call(inner_, rows_, inputs);
  }

 private:
  nn::Module& inner_;
  NamedTensors rows_;
};

struct HeldOut {
  double loss = 0, auc = 0, seconds = 0;
  int64_t examples = 0;
};

// ROC AUC of scores against 0/1 labels: the Mann-Whitney statistic with tied scores given their
// average rank. NaN without both classes.
double roc_auc(const std::vector<float>& score, const std::vector<float>& label) {
  const size_t n = score.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
  double positives = 0, rank_sum = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    while (j < n && score[order[j]] == score[order[i]])
      ++j;
    const double rank = 0.5 * double(i + 1 + j);  // the average of ranks i+1 .. j
    for (size_t k = i; k < j; ++k) {
      if (label[order[k]] > 0.5f) {
        positives += 1;
        rank_sum += rank;
      }
    }
    i = j;
  }
  const double negatives = double(n) - positives;
  if (positives == 0 || negatives == 0) return std::numeric_limits<double>::quiet_NaN();
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

HeldOut evaluate(nn::Module& model, const amp::Amp& amp,
                 const std::shared_ptr<const data::Dataset>& held, int64_t batch, int workers,
                 Device device) {
  const auto t0 = Clock::now();
  NoGrad ng;
  model.eval();
  data::LoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = false;
  lo.num_workers = workers;
  data::DevicePrefetcher loader(held, lo, device);
  std::vector<Tensor> logits, labels;
  for (auto& b : loader) {
    logits.push_back(amp.forward(model, {b["dense"], b["categorical"]})[0].to(DType::F32));
    labels.push_back(b["label"]);
  }
  model.train();
  // One read of everything (one host wait on a GPU).
  const std::vector<float> z = cat(logits, 0).to(Device::cpu()).to_vector<float>();
  const std::vector<float> y = cat(labels, 0).to(Device::cpu()).to_vector<float>();
  double sum = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    // binary_cross_entropy_with_logits in double: max(z, 0) - z y + log(1 + exp(-|z|)).
    const double zi = z[i];
    sum += std::max(zi, 0.0) - zi * double(y[i]) + std::log1p(std::exp(-std::fabs(zi)));
  }
  HeldOut r;
  r.examples = int64_t(z.size());
  r.loss = z.empty() ? 0.0 : sum / double(z.size());
  r.auc = roc_auc(z, y);
  r.seconds = seconds_since(t0);
  return r;
}

bool is_table(const std::string& name) {
  return name.starts_with("embeddings.") && name.ends_with(".weight");
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c,
                                                 std::vector<optim::ParamGroup> groups) {
  if (c.optimizer == "sgd") {
    optim::SGDOptions o;
    o.lr = c.lr;
    o.momentum = c.momentum;
    o.weight_decay = c.weight_decay;
    o.nesterov = c.nesterov;
    return std::make_unique<optim::SGD>(std::move(groups), o);
  }
  optim::AdamWOptions o;
  o.lr = c.lr;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.weight_decay = c.weight_decay;
  return std::make_unique<optim::AdamW>(std::move(groups), o);
}

void check_supported(const TrainConfig& c) {
  MT_CHECK(nn::model_input(c.model) == nn::ModelInput::Clicks,
           "train_recommender trains a "
           "recommender (dcn); model '",
           c.model, "' is not one: use mantissa train's Trainer");
  MT_CHECK(c.data == "synthetic-clicks" || c.data == "clicks", "model '", c.model,
           "' trains on click logs: use --data synthetic-clicks, or clicks --data-path FILE, "
           "not '",
           c.data, "'");
  auto refuse = [&](bool used, const char* what) {
    MT_CHECK(!used, "train_recommender does not take ", what, " (yet); drop it for --model ",
             c.model);
  };
  refuse(!c.checkpoint_path.empty() || c.checkpoint_every > 0, "--checkpoint");
  refuse(!c.resume_path.empty(), "--resume");
  refuse(c.distributed, "--distributed");
  refuse(c.grad_accum != 1, "--grad-accum");
  refuse(c.precision == "fp8", "--precision fp8");
  refuse(c.underflow_every > 0, "--underflow-every");
  refuse(c.detect_anomaly, "--detect-anomaly");
  refuse(c.on_divergence != "stop", "--on-divergence skip or rollback");
  refuse(c.checkpoint_activations, "--checkpoint-activations");
  refuse(c.zero_grad != "none", "--zero-grad zeros");
  refuse(c.input_pipeline != "prefetch", "--input-pipeline pinned or pageable");
}

}  // namespace

RecommenderResult train_recommender(const TrainConfig& config,
                                    std::function<void(const std::string& json)> on_record) {
  TrainConfig c = config;
  c.precision = resolve_precision(c.precision);
  c.validate();
  check_supported(c);
  const Device device = require_device(c.device);
  set_num_threads(c.threads > 0 ? c.threads
                                : int(std::max(1u, std::thread::hardware_concurrency())));
  const bool lazy =
      c.embedding_update == "lazy" || (c.embedding_update == "auto" && device.is_cpu());
  MT_CHECK(!lazy || device.is_cpu(), "--embedding-update lazy updates the tables on the host; on ",
           device.str(), " use --embedding-update dense (or auto)");
  MT_CHECK(!lazy || c.optimizer == "adamw",
           "--embedding-update lazy is AdamW's (LazyAdam); with --optimizer ", c.optimizer,
           " use --embedding-update dense");
  MT_CHECK(!lazy || c.clip_grad_norm == 0,
           "--clip-grad-norm with lazy embedding updates is not there yet: use "
           "--embedding-update dense");

  const ClickData data = load_clicks(c);
  nn::ModelConfig mc;
  mc.dense_features = data.n_dense;
  mc.table_sizes = data.table_sizes;
  mc.dropout = c.dropout;
  mc.seed = c.seed;
  manual_seed(c.seed);
  std::shared_ptr<nn::Module> model = nn::make_model(c.model, mc);
  model->to(device);

  // The tables apart from the rest: their own optimizer (dense) or the lazy update. No weight
  // decay on tables, biases or cross-layer vectors; --decay all decays the other weights too.
  std::vector<std::string> table_names;
  std::vector<Tensor> tables;
  optim::ParamGroup decay{
      .params = {}, .options = {.weight_decay = c.weight_decay}, .name = "decay"};
  optim::ParamGroup none{.params = {}, .options = {.weight_decay = 0.0}, .name = "no_decay"};
  for (const auto& [name, p] : model->named_parameters()) {
    if (is_table(name)) {
      table_names.push_back(name);
      tables.push_back(p);
    } else {
      (p.dim() >= 2 || c.decay == "all" ? decay : none).params.push_back(p);
    }
  }
  std::vector<optim::ParamGroup> groups;
  for (optim::ParamGroup* g : {&decay, &none})
    if (!g->params.empty()) groups.push_back(std::move(*g));
  std::unique_ptr<optim::Optimizer> opt = make_optimizer(c, std::move(groups));
  std::unique_ptr<optim::Optimizer> table_opt;
  std::unique_ptr<LazyEmbeddingAdam> lazy_opt;
  if (!tables.empty()) {
    if (lazy) {
      lazy_opt = std::make_unique<LazyEmbeddingAdam>(
          tables, LazyAdamOptions{.beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps});
    } else {
      std::vector<optim::ParamGroup> tg{
          {.params = tables, .options = {.weight_decay = 0.0}, .name = "tables"}};
      table_opt = make_optimizer(c, std::move(tg));
    }
  }
  // The run's precision over the model and the main optimizer; the tables' optimizer (dense)
  // gets the same masters and rounding, the lazy update its own.
  amp::Amp amp = initialize_precision(*model, *opt, c);
  const RoundingMode rounding = opt->store_rounding();
  if (table_opt) {
    table_opt->set_master_weights(opt->master_weights());
    table_opt->set_store_rounding(rounding, c.seed);
  }
  if (lazy_opt) lazy_opt->set_precision(opt->master_weights(), rounding, c.seed);
  amp::GradScaler& sc = amp.scaler();
  const bool scaled = sc.options().mode != amp::ScaleMode::Disabled;
  const int64_t n_optimizers = table_opt ? 2 : 1;
  // Each optimizer's overflow flag passes here when unscale_ sets it: a lazy step's tables with
  // inf/NaN gradients raise it, and with two optimizers both skip when either overflowed.
  bool tables_overflow = false;
  std::vector<Tensor> flags;
  sc.set_overflow_reducer([&](Tensor& flag) {
    if (tables_overflow) flag.fill_(1.0);
    flags.push_back(flag);
  });

  data::LoaderOptions lo;
  lo.batch_size = c.batch_size;
  lo.shuffle = true;
  lo.seed = c.seed;
  lo.num_workers = c.workers;
  data::DevicePrefetcher loader(data.train, lo, device);
  const int64_t batches = loader.num_batches();
  const int64_t epochs = c.epochs > 0 ? c.epochs : (c.max_steps + batches - 1) / batches;
  const int64_t total_steps = c.max_steps > 0 && (c.epochs <= 0 || c.max_steps < epochs * batches)
                                  ? c.max_steps
                                  : epochs * batches;
  optim::ScheduleOptions so;
  so.lr = c.lr;
  so.warmup_steps = c.warmup_steps;
  so.step_size = c.step_size;
  so.gamma = c.gamma;
  so.total_steps = total_steps;
  const optim::LRSchedule schedule = optim::LRSchedule::from_name(c.schedule, so);
  const int64_t eval_batch = c.eval_batch_size > 0 ? c.eval_batch_size : 1024;

  RunLog log(c.metrics_path, c.tensorboard_dir);
  if (on_record) log.set_callback(on_record);
  const std::string precision = amp.describe();
  if (log.enabled()) {
    auto j = record("config");
    j["step"] = 0;
    j["config"] = nlohmann::ordered_json::parse(c.to_json());
    log.write(j);
    log.text("config", "```toml\n" + to_toml(c) + "```", 0);
  }
  const bool bayes_known = !std::isnan(data.bayes_log_loss);
  if (c.progress) {
    std::fprintf(stderr,
                 "%s on %s: %lld training / %lld held-out examples, %lld parameters, %s, "
                 "embedding tables updated %s\n",
                 c.model.c_str(), c.data.c_str(), (long long)data.train->size(),
                 (long long)data.held_out->size(), (long long)model->num_parameters(),
                 precision.c_str(), lazy ? "lazily (touched rows)" : "densely (every row)");
  }

  RecommenderResult result;
  result.bayes_log_loss = data.bayes_log_loss;
  result.constant_log_loss = data.constant_log_loss;
  result.embedding_update = lazy ? "lazy" : "dense";
  result.precision = precision;
  reset_peak_memory(device);
  auto eval_and_record = [&](int64_t step) {
    const HeldOut e = evaluate(*model, amp, data.held_out, eval_batch, c.workers, device);
    if (log.enabled()) {
      auto j = record("eval");
      j["step"] = step;
      j["loss"] = e.loss;
      j["auc"] = e.auc;
      if (bayes_known) j["bayes_log_loss"] = data.bayes_log_loss;
      j["constant_log_loss"] = data.constant_log_loss;
      j["examples"] = e.examples;
      j["eval_seconds"] = e.seconds;
      log.write(j);
    }
    if (c.progress) {
      std::fprintf(stderr, "eval at step %lld: held-out log loss %.4f%s, AUC %.4f\n",
                   (long long)step, e.loss,
                   bayes_known
                       ? (" (Bayes " + std::to_string(data.bayes_log_loss).substr(0, 6) +
                          ", constant " + std::to_string(data.constant_log_loss).substr(0, 6) + ")")
                             .c_str()
                       : "",
                   e.auc);
    }
    return e;
  };

  int64_t step = 0, skipped = 0, seen = 0;
  std::vector<Tensor> pending;  // losses not read back yet (a GPU's are read every log_every)
  double train_seconds = 0, window_seconds = 0;
  int64_t window_examples = 0;
  HeldOut last;
  for (int64_t epoch = 0; epoch < epochs && step < total_steps; ++epoch) {
    model->train();
    loader.start_epoch(epoch, 0);
    while (step < total_steps) {
      std::optional<data::Batch> batch = loader.next();
      if (!batch) break;
      const auto t0 = Clock::now();
      schedule.apply(*opt, step);
      if (table_opt) schedule.apply(*table_opt, step);
      opt->zero_grad(true);
      if (table_opt) table_opt->zero_grad(true);
      const Tensor& dense = (*batch)["dense"];
      const Tensor& cat_ids = (*batch)["categorical"];
      const Tensor& y = (*batch)["label"];
      Tensor logits;
      LazyEmbeddingAdam::Batch rows;
      if (lazy_opt) {
        rows = lazy_opt->gather(cat_ids);
        NamedTensors repl;
        for (size_t f = 0; f < table_names.size(); ++f)
          repl.emplace_back(table_names[f], rows.leaves[f]);
        WithRows with_rows(*model, std::move(repl));
        logits = amp.forward(with_rows, {dense, rows.local})[0];
      } else {
        logits = amp.forward(*model, {dense, cat_ids})[0];
      }
      const Tensor loss = binary_cross_entropy_with_logits(logits, y);
      sc.scale(loss).backward();
      float inv_scale = 1.f;
      tables_overflow = false;
      flags.clear();
      if (lazy_opt && scaled) {
        inv_scale = float(1.0 / sc.get_scale());
        tables_overflow = !lazy_opt->finite(rows, inv_scale);
      }
      if (c.clip_grad_norm > 0 && table_opt) {
        sc.unscale_(*opt);
        sc.unscale_(*table_opt);
        std::vector<Tensor> all = opt->params();
        all.insert(all.end(), tables.begin(), tables.end());
        optim::clip_grad_norm(all, c.clip_grad_norm);
      } else if (c.clip_grad_norm > 0) {
        sc.unscale_(*opt);
        optim::clip_grad_norm(opt->params(), c.clip_grad_norm);
      } else if (table_opt && scaled) {
        sc.unscale_(*opt);
        sc.unscale_(*table_opt);
      }
      if (flags.size() == 2) {
        // Either optimizer's overflow skips both (no host wait: on the device).
        NoGrad ng;
        const Tensor any = maximum(flags[0], flags[1]);
        flags[0].copy_(any);
        flags[1].copy_(any);
      }
      const auto t_opt = Clock::now();
      const amp::StepResult r = sc.step(*opt);
      const auto t_tables = Clock::now();
      if (table_opt) sc.step(*table_opt);
      // The CPU knows the skip at once (lazy runs there); a GPU's is counted at the end.
      const bool step_skipped = scaled && !sc.on_device() && r.skipped();
      if (lazy_opt && !step_skipped) lazy_opt->step(rows, schedule.lr_at(step), inv_scale);
      if (device.is_cpu()) {
        result.table_update_seconds += seconds_since(t_tables);
        result.optimizer_seconds_rest += std::chrono::duration<double>(t_tables - t_opt).count();
      }
      sc.update();
      ++step;
      skipped += step_skipped;
      pending.push_back(loss.detach());
      const double dt = seconds_since(t0);
      train_seconds += dt;
      window_seconds += dt;
      seen += y.size(0);
      window_examples += y.size(0);
      const bool log_now = step % c.log_every == 0;
      if (device.is_cpu() || log_now || step == total_steps) {
        // Losses read back (a wait on a GPU, once per log interval); a non-finite loss of a step
        // that was not skipped ends the run.
        const std::vector<float> losses = stack(pending).to(Device::cpu()).to_vector<float>();
        const int64_t first = step - int64_t(pending.size()) + 1;
        pending.clear();
        if (sc.on_device()) skipped = sc.skipped_steps() / n_optimizers;
        for (size_t i = 0; i < losses.size(); ++i) {
          MT_CHECK(std::isfinite(losses[i]) || (scaled && (device.is_cuda() || step_skipped)),
                   "the run diverged: step ", first + int64_t(i), "'s loss is ", losses[i],
                   "; try a smaller --lr or a --warmup", c.precision == "fp16" ? ", or bf16" : "");
        }
        if (log_now) {
          const double per_s = window_seconds > 0 ? double(window_examples) / window_seconds : 0;
          if (log.enabled()) {
            auto j = record("train");
            j["step"] = step;
            j["epoch"] = epoch + 1;
            j["loss"] = double(losses.back());
            j["lr"] = opt->lr();
            j["samples_per_s"] = per_s;
            j["loss_scale"] = sc.get_scale();
            j["skipped"] = step_skipped;
            j["skipped_steps"] = skipped;
            j["peak_memory_bytes"] = memory_stats(device).peak_bytes;
            log.write(j);
          }
          if (c.progress) {
            std::fprintf(stderr,
                         "step %lld/%lld (epoch %lld): loss %.4f, lr %.3g, %.0f examples/s%s\n",
                         (long long)step, (long long)total_steps, (long long)epoch + 1,
                         double(losses.back()), opt->lr(), per_s,
                         scaled ? (", loss scale " + std::to_string(sc.get_scale()) + ", " +
                                   std::to_string(skipped) + " skipped")
                                      .c_str()
                                : "");
          }
          window_seconds = 0;
          window_examples = 0;
        }
      }
      if (c.eval_every > 0 && step % c.eval_every == 0 && step < total_steps) {
        last = eval_and_record(step);
      }
    }
  }
  if (device.is_cuda()) cuda::synchronize(device.index);
  last = eval_and_record(step);
  result.log_loss = last.loss;
  result.auc = last.auc;
  result.held_out_examples = last.examples;
  result.seconds = train_seconds;
  result.steps = step;
  result.skipped_steps = sc.on_device() ? sc.skipped_steps() / n_optimizers : skipped;
  result.loss_scale = sc.get_scale();
  result.peak_memory_bytes = memory_stats(device).peak_bytes;
  if (log.enabled()) {
    auto j = record("summary");
    j["model"] = c.model;
    j["data"] = c.data;
    j["parameters"] = model->num_parameters();
    j["precision"] = precision;
    j["device"] = device.str();
    j["embedding_update"] = result.embedding_update;
    j["log_loss"] = result.log_loss;
    j["auc"] = result.auc;
    if (bayes_known) j["bayes_log_loss"] = result.bayes_log_loss;
    j["constant_log_loss"] = result.constant_log_loss;
    j["seconds"] = result.seconds;
    j["steps"] = result.steps;
    j["skipped_steps"] = result.skipped_steps;
    j["loss_scale"] = result.loss_scale;
    j["peak_memory_bytes"] = result.peak_memory_bytes;
    j["table_update_seconds"] = result.table_update_seconds;
    j["optimizer_seconds_rest"] = result.optimizer_seconds_rest;
    j["dataset_bytes"] = data.bytes;
    log.write(j);
  }
  return result;
}

}  // namespace mantissa::train
