// The recommender task (recommender.h).
#include "train/tasks/recommender.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/clock.h"
#include "mantissa/data/clicks.h"
#include "mantissa/data/sampler.h"
#include "mantissa/metrics/classification.h"
#include "mantissa/nn/models.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/report.h"
#include "train/run.h"

namespace mantissa::train {
namespace {

// The training and held-out examples, and what is known about them.
struct ClickData {
  std::shared_ptr<const data::Dataset> train, held_out;
  int64_t n_dense = 0;
  std::vector<int64_t> table_sizes;
  double bayes_log_loss = std::numeric_limits<double>::quiet_NaN();
  double constant_log_loss = 0;
  int64_t bytes = 0;
};

int64_t bytes_of(const data::ClickLog& log) {
  return int64_t(log.dense.size() * 4 + log.categorical.size() * 8 + log.labels.size() * 4);
}

ClickData load_clicks(const TrainConfig& c) {
  ClickData d;
  std::shared_ptr<const data::ClickLog> log;
  int64_t n_train = 0;
  if (c.data == config::DataKind::SyntheticClicks) {
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
      d.bytes += bytes_of(*held);
      n_train = log->size();
    }
  }
  d.n_dense = log->n_dense;
  d.table_sizes = log->table_sizes;
  d.bytes += bytes_of(*log);
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

bool is_table(const std::string& name) {
  return name.starts_with("embeddings.") && name.ends_with(".weight");
}

// Whether the tables update lazily: --embedding-update lazy, or auto with AdamW and fp32
// optimizer state (on every device: the update is the backend's sparse_adamw_step, whose
// moments are fp32; a narrower --optim-state makes auto dense).
bool lazy_tables(const TrainConfig& c) {
  const bool lazy =
      c.embedding_update == config::EmbeddingUpdate::Lazy ||
      (c.embedding_update == config::EmbeddingUpdate::Auto &&
       c.optimizer == config::OptimizerKind::AdamW && !config::narrow_optimizer_state(c));
  MT_CHECK(!lazy || c.clip_grad_norm == 0,
           "--clip-grad-norm with lazy embedding updates is not there yet: use "
           "--embedding-update dense");
  return lazy;
}

}  // namespace

void RecommenderTask::defaults(TrainConfig& c) {
  c.data = config::DataKind::SyntheticClicks;
  c.optimizer = config::OptimizerKind::AdamW;
  c.lr = 1e-3;
  c.weight_decay = 0;
  c.batch_size = 512;
  c.synthetic_size = 100000;
  c.epochs = 1;
}

TaskData RecommenderTask::build(Run& run) {
  const TrainConfig& c = run.config;
  const bool lazy = lazy_tables(c);
  ClickData data = load_clicks(c);
  held_out_ = data.held_out;
  bayes_log_loss_ = data.bayes_log_loss;
  constant_log_loss_ = data.constant_log_loss;
  nn::ModelConfig mc;
  mc.dense_features = data.n_dense;
  mc.table_sizes = data.table_sizes;
  mc.dropout = c.dropout;
  mc.seed = c.seed;
  manual_seed(c.seed);
  std::shared_ptr<nn::Module> model = nn::make_model(c.model, mc);
  // The tables apart from the rest: their own optimizer (dense) or the lazy update. No weight
  // decay on tables, biases or cross-layer vectors; --decay all decays the other weights too.
  std::vector<Tensor> tables;
  optim::ParamGroup decay{
      .params = {}, .options = {.weight_decay = c.weight_decay}, .name = "decay"};
  optim::ParamGroup none{.params = {}, .options = {.weight_decay = 0.0}, .name = "no_decay"};
  for (const auto& [name, p] : model->named_parameters()) {
    if (is_table(name)) {
      table_names_.push_back(name);
      tables.push_back(p);
    } else {
      (p.dim() >= 2 || c.decay == config::Decay::All ? decay : none).params.push_back(p);
    }
  }
  std::vector<optim::ParamGroup> groups;
  for (optim::ParamGroup* g : {&decay, &none})
    if (!g->params.empty()) groups.push_back(std::move(*g));
  // The lazy update's masters start from the fp32 tables, before the precision casts them.
  if (lazy && !tables.empty()) {
    lazy_ = std::make_unique<optim::SparseAdamW>(
        tables, optim::SparseAdamWOptions{.beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps});
  }
  Trainee& t = run.add_trainee("", std::move(model), std::move(groups));
  // The tables' own optimizer (dense) or the lazy update get the main one's masters and rounding.
  if (lazy_) {
    lazy_->set_precision(t.optimizer().master_weights(), t.optimizer().store_rounding(), c.seed);
  } else if (!tables.empty()) {
    std::vector<optim::ParamGroup> tg{
        {.params = tables, .options = {.weight_decay = 0.0}, .name = "tables"}};
    t.add_optimizer("tables", make_optimizer(c, std::move(tg)));
  }
  TaskData d;
  d.train = data.train;
  d.bytes = data.bytes;
  d.loader.batch_size = c.batch_size;
  d.loader.shuffle = true;
  d.loader.seed = c.seed;
  d.loader.num_workers = c.workers;
  return d;
}

StepOutput RecommenderTask::step(const data::Batch& batch, Run& run) {
  Trainee& t = run.main();
  const Tensor& dense = batch["dense"];
  const Tensor& ids = batch["categorical"];
  const Tensor& y = batch["label"];
  Tensor logits;
  optim::SparseAdamW::Batch rows;
  if (lazy_) {
    rows = lazy_->gather(ids);
    NamedTensors replaced;
    for (size_t f = 0; f < table_names_.size(); ++f)
      replaced.emplace_back(table_names_[f], rows.leaves[f]);
    WithRows with_rows(t.model(), std::move(replaced));
    logits = t.amp().forward(with_rows, {dense, rows.local})[0];
  } else {
    logits = t.forward({dense, ids})[0];
  }
  const Tensor loss = binary_cross_entropy_with_logits(logits, y);
  t.backward(loss);
  // A lazy step's tables with inf/NaN gradients skip the whole step, as the scaler would.
  const bool scaled = t.scaler().options().mode != amp::ScaleMode::Disabled;
  const float inv_scale = lazy_ && scaled ? float(1.0 / t.scaler().get_scale()) : 1.0f;
  const bool tables_overflow = lazy_ && !lazy_->unscale(rows, inv_scale) && scaled;
  const auto t0 = Clock::now();
  const bool skipped = t.step(run, tables_overflow);
  const auto t1 = Clock::now();
  if (lazy_ && !skipped) lazy_->step(rows, run.lr());
  if (run.device.is_cpu()) {
    rest_seconds_ += std::chrono::duration<double>(t1 - t0).count();
    table_seconds_ += seconds_since(t1);
  }
  StepOutput out;
  out.loss = loss.detach();
  out.targets = y.size(0);
  return out;
}

EvalResult RecommenderTask::evaluate(Run& run) {
  const TrainConfig& c = run.config;
  Trainee& t = run.main();
  const auto t0 = Clock::now();
  NoGrad ng;
  t.model().eval();
  data::LoaderOptions lo;
  lo.batch_size = c.eval_batch_size > 0 ? c.eval_batch_size : 1024;
  lo.shuffle = false;
  lo.num_workers = c.workers;
  if (c.eval_batches > 0) {
    lo.sampler = std::make_shared<data::SequentialSampler>(
        std::min(held_out_->size(), c.eval_batches * lo.batch_size));
  }
  data::DevicePrefetcher loader(held_out_, lo, run.device, c.input_pipeline);
  std::vector<Tensor> logits, labels;
  for (auto& b : loader) {
    if (run.stopping()) break;
    logits.push_back(t.forward({b["dense"], b["categorical"]})[0].to(DType::F32));
    labels.push_back(b["label"]);
  }
  t.model().train();
  // One read of everything (one host wait on a GPU).
  std::vector<float> z, y;
  if (!logits.empty()) {
    z = cat(logits, 0).to(Device::cpu()).to_vector<float>();
    y = cat(labels, 0).to(Device::cpu()).to_vector<float>();
  }
  EvalResult r;
  r.loss = metrics::binary_log_loss(z, y);
  r.samples = int64_t(z.size());
  r.seconds = seconds_since(t0);
  r.metrics = {{"loss", r.loss}, {"auc", metrics::roc_auc(z, y)}};
  if (!std::isnan(bayes_log_loss_)) r.metrics.emplace_back("bayes_log_loss", bayes_log_loss_);
  r.metrics.emplace_back("constant_log_loss", constant_log_loss_);
  r.metrics.emplace_back("examples", double(r.samples));
  return r;
}

std::string RecommenderTask::describe(const EvalResult& e) const {
  const std::string bayes =
      std::isnan(bayes_log_loss_) ? "" : fmt::format("Bayes {:.4f}, ", bayes_log_loss_);
  return fmt::format("held-out log loss {:.4f} ({}constant {:.4f}), AUC {:.4f}", e.loss, bayes,
                     constant_log_loss_, e.metric("auc"));
}

NamedTensors RecommenderTask::state_dict() const {
  return lazy_ ? lazy_->state_dict() : NamedTensors{};
}

void RecommenderTask::load_state_dict(const NamedTensors& state) {
  if (lazy_) lazy_->load_state_dict(state);
}

void RecommenderTask::summarize(const TrainResult& r, Json& j) const {
  j["log_loss"] = r.test.loss;
  j["embedding_update"] = lazy_ ? "lazy" : "dense";
  j["seconds"] = r.train_seconds;
  j["table_update_seconds"] = table_seconds_;
  j["optimizer_seconds_rest"] = rest_seconds_;
}

std::string RecommenderTask::result_line(const TrainResult& r, const Run& run) const {
  const std::string scaling =
      r.loss_scale != 1 || r.skipped_steps > 0
          ? fmt::format(", loss scale {:g}, {} skipped steps", r.loss_scale, r.skipped_steps)
          : "";
  return fmt::format(
      "{} on {} ({}): {}, {} steps, {:.1f} s training ({:.1f} ms/step), peak memory {}, tables "
      "updated {}{}",
      run.config.model, name_of(run.config.data), run.main().amp().describe(), describe(r.test),
      r.steps, r.train_seconds, r.steps ? 1e3 * r.train_seconds / double(r.steps) : 0.0,
      format_bytes(r.peak_memory_bytes),
      lazy_ ? "lazily (the rows each batch touched)" : "densely (every row)", scaling);
}

}  // namespace mantissa::train
