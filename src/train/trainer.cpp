#include "mantissa/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <span>
#include <thread>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/anomaly.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"
#include "mantissa/core/error.h"
#include "mantissa/data/images.h"
#include "mantissa/data/sampler.h"
#include "mantissa/data/tokenizer.h"
#include "mantissa/data/tokens.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/clip.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/run_config.h"
#include "train/divergence.h"
#include "train/run_log.h"
#include "train/underflow.h"

namespace mantissa::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

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

// The token streams of --data text: DIR/train.bin and DIR/val.bin (`mantissa tokenize --out
// DIR`), or a training shard with --val-path, or a lone shard whose last 5% is held out. The
// tokenizer (--tokenizer, or DIR/tokenizer.json) is checked against the shards when there is one,
// and its path recorded in the config (checkpoints carry it to `mantissa generate`).
std::pair<data::TokenDataset, data::TokenDataset> load_text_data(TrainConfig& c) {
  namespace fs = std::filesystem;
  const fs::path path(c.data_path);
  MT_CHECK(fs::exists(path), "--data-path '", c.data_path,
           "' does not exist; make one with `mantissa tokenize --out DIR` and pass DIR");
  fs::path train = path, val = c.val_path;
  if (fs::is_directory(path)) {
    train = path / "train.bin";
    MT_CHECK(fs::exists(train), "--data-path '", c.data_path,
             "' has no train.bin; it should be a directory written by `mantissa tokenize --out "
             "DIR`, or a token shard");
    if (val.empty() && fs::exists(path / "val.bin")) val = path / "val.bin";
    if (c.tokenizer.empty() && fs::exists(path / "tokenizer.json")) {
      c.tokenizer = (path / "tokenizer.json").string();
    }
  }
  int64_t vocab = 0;
  uint64_t fingerprint = 0;
  if (!c.tokenizer.empty()) {
    const data::BpeTokenizer tok = data::BpeTokenizer::load(c.tokenizer);
    vocab = tok.vocab_size();
    fingerprint = tok.fingerprint();
  }
  data::TokenDataset tr = data::load_token_shard(train.string(), vocab, fingerprint);
  if (val.empty()) return data::split_tokens(tr, 0.05);
  MT_CHECK(fs::exists(val), "--val-path '", val.string(), "' does not exist");
  data::TokenDataset va = data::load_token_shard(
      val.string(), tr.vocab_size, fingerprint ? fingerprint : tr.tokenizer_fingerprint);
  return {std::move(tr), std::move(va)};
}

// A checkpoint path that can be written: a file name in a directory that exists and takes a new
// file. Checked before any training, so that a run does not fail when its first epoch ends.
void check_checkpoint_path(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  MT_CHECK(!fs::is_directory(p), "--checkpoint '", path,
           "' is a directory; give a file name, e.g. ", (p / "run.safetensors").string());
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  MT_CHECK(fs::is_directory(dir), "--checkpoint '", path, "': the directory '", dir.string(),
           "' does not exist; create it first (mkdir -p ", dir.string(), ")");
  const fs::path probe = dir / (".mantissa-write-test-" + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "w");
  MT_CHECK(f != nullptr, "--checkpoint '", path, "': cannot write in '", dir.string(),
           "': ", std::strerror(errno));
  std::fclose(f);
  std::error_code ec;
  fs::remove(probe, ec);
}

}  // namespace

std::vector<optim::ParamGroup> decay_groups(nn::Module& model, double weight_decay) {
  std::vector<const TensorImpl*> exempt;
  for (auto& [path, m] : model.named_modules()) {
    const std::string& type = m->name();
    if (type == "Embedding" || type == "LayerNorm" || type.rfind("BatchNorm", 0) == 0) {
      for (const auto& [name, t] : m->named_parameters())
        exempt.push_back(t.impl());
    }
  }
  optim::ParamGroup decay{.params = {}, .options = {.weight_decay = weight_decay}, .name = "decay"};
  optim::ParamGroup none{.params = {}, .options = {.weight_decay = 0.0}, .name = "no_decay"};
  for (const auto& [name, p] : model.named_parameters()) {
    const bool skip =
        p.dim() < 2 || std::find(exempt.begin(), exempt.end(), p.impl()) != exempt.end();
    (skip ? none : decay).params.push_back(p);
  }
  std::vector<optim::ParamGroup> groups;
  for (optim::ParamGroup* g : {&decay, &none}) {
    if (!g->params.empty()) groups.push_back(std::move(*g));
  }
  return groups;
}

namespace {

int64_t read_count(const Tensor& acc) {
  return acc.defined() ? int64_t(acc.item()) : 0;
}

// The values of one-element tensors (device scalars) in one read: one host sync, not one each.
std::vector<float> read_scalars(const std::vector<Tensor>& scalars) {
  if (scalars.empty()) return {};
  if (scalars.size() == 1) return {float(scalars[0].item())};
  return stack(scalars).to_vector<float>();
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
  } else if (precision == "bf16" || precision == "fp16" || precision == "fp8") {
    // fp8: the Linear GEMMs in fp8 (the Trainer's fp8 context), everything else as bf16.
    half = precision == "fp16" ? DType::F16 : DType::BF16;
    level = *amp::parse_opt_level(c.opt_level.empty() ? "O1" : c.opt_level);
    if (c.rounding == "stochastic") ao.rounding = RoundingMode::Stochastic;
    if (c.rounding == "truncate") ao.rounding = RoundingMode::TowardZero;
    ao.rounding_seed = c.seed;
  }
  if (c.loss_scale != "dynamic") ao.loss_scale = std::stod(c.loss_scale);
  // fp8 needs no loss scaling (per-tensor scales give each tensor its range), but a static scale
  // of 1 checks the gradients: a step that met inf or NaN is skipped, as fp16's are.
  if (precision == "fp8" && c.loss_scale == "dynamic") ao.loss_scale = 1.0;
  ao.scaler.init_scale = c.init_scale;
  ao.scaler.max_scale = std::max(ao.scaler.max_scale, c.init_scale);
  return amp::initialize(model, opt, level, half, ao);
}

Device require_device(const std::string& text) {
  const Device d = parse_device(text);
  if (d.is_cuda()) {
    MT_CHECK(cuda::is_available(), "no CUDA device: ", cuda_info().status,
             "; run with --device cpu");
    MT_CHECK(d.index < cuda::device_count(), d.str(), " does not exist: this machine has ",
             cuda::device_count(),
             " CUDA device(s); use cuda:0 .. cuda:", cuda::device_count() - 1);
  }
  return d;
}

Trainer::Trainer(TrainConfig config) : config_(std::move(config)) {
  // "auto" becomes the precision this machine runs fastest, stored as such (checkpoints and
  // metrics name what ran).
  config_.precision = resolve_precision(config_.precision);
  config_.validate();
  device_ = require_device(config_.device);
  set_num_threads(config_.threads > 0 ? config_.threads
                                      : int(std::max(1u, std::thread::hardware_concurrency())));
  if (config_.distributed) {
    // MPI starts the job and carries host values (the configuration check, the summary); the
    // gradients go through MPI on the CPU, through NCCL on GPUs: one per rank, by default the
    // rank's local number among the machine's GPUs (--device cuda).
    host_comm_ = dist::mpi_world();
    check_same_config();
    if (device_.is_cuda()) {
      if (config_.device == "cuda") {
        device_ = Device::cuda(dist::local_rank() % cuda::device_count());
      }
      comm_ = dist::nccl_world(device_.index);
    } else {
      comm_ = host_comm_;
    }
  }
  if (!config_.checkpoint_path.empty() && rank() == 0)
    check_checkpoint_path(config_.checkpoint_path);
  build();
  if (!config_.resume_path.empty()) {
    restore(load_checkpoint(config_.resume_path));
    last_good_checkpoint_ = config_.resume_path;
    last_good_step_ = state_.step;
  }
  log_ = rank() != 0 ? std::make_unique<RunLog>()
                     : std::make_unique<RunLog>(config_.metrics_path, config_.tensorboard_dir);
  if (log_->enabled()) {
    // The head of the metrics: the whole configuration (`mantissa train --config-from` reruns
    // it), as TensorBoard's text too.
    auto j = record("config");
    j["step"] = state_.step;
    j["config"] = nlohmann::ordered_json::parse(config_.to_json());
    log_->write(j);
    log_->text("config", "```toml\n" + to_toml(config_) + "```", state_.step);
  }
}

void Trainer::check_same_config() {
  // FNV-1a of the configuration: every rank must run the same one (mpirun starts the same
  // command, but a rank may read another file or a resumed checkpoint may differ).
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char ch : config_.to_json())
    h = (h ^ ch) * 1099511628211ull;
  const auto mine = int64_t(h >> 1);
  Tensor hi = Tensor::from_vector(std::vector<int64_t>{mine}, {1});
  Tensor lo = Tensor::from_vector(std::vector<int64_t>{-mine}, {1});
  host_comm_->all_reduce(hi, dist::ReduceOp::Max);
  host_comm_->all_reduce(lo, dist::ReduceOp::Max);
  MT_CHECK(hi.to_vector<int64_t>()[0] == mine && -lo.to_vector<int64_t>()[0] == mine, "the ",
           world_size(),
           " ranks were started with different training configurations (model, precision, data, "
           "batch size, resumed checkpoint, ...); start every rank with the same command");
}

Trainer::~Trainer() = default;

std::optional<data::Batch> Trainer::next_batch() {
  if (!loader_started_) {
    loader_->start_epoch(state_.epoch, state_.batch);
    loader_started_ = true;
  }
  return loader_->next();
}

void Trainer::set_record_callback(std::function<void(const std::string& json)> callback) {
  if (rank() == 0) log_->set_callback(std::move(callback));
}

void Trainer::build() {
  MT_CHECK(
      config_.model.rfind("dcgan", 0) != 0, "model '", config_.model,
      "' is a GAN (or half of one): train it with train::train_gan (mantissa train --model dcgan)");
  const std::vector<std::string> names = nn::model_names();
  MT_CHECK(std::find(names.begin(), names.end(), config_.model) != names.end(), "unknown model '",
           config_.model, "'; the models are: ", [&] {
             std::string list;
             for (const std::string& n : names)
               list += (list.empty() ? "" : ", ") + n;
             return list;
           }());
  MT_CHECK(nn::model_input(config_.model) != nn::ModelInput::Clicks, "model '", config_.model,
           "' is a recommender: train::train_recommender trains it (mantissa train --model ",
           config_.model, " --data synthetic-clicks), not the Trainer");
  language_model_ = nn::model_input(config_.model) == nn::ModelInput::Tokens;
  nn::ModelConfig mc;
  mc.dropout = config_.dropout;
  mc.seed = config_.seed;
  mc.activation_checkpointing = config_.checkpoint_activations
                                    ? nn::ActivationCheckpointing::PerBlock
                                    : nn::ActivationCheckpointing::Off;
  if (language_model_) {
    build_tokens(mc);
  } else {
    build_images(mc);
  }
  manual_seed(config_.seed);
  model_ = nn::make_model(config_.model, mc);
  // Before the optimizer and amp::initialize: their state (momenta, fp32 masters, the scaler's
  // flag) is made where the parameters are.
  model_->to(device_);

  // Parameter groups: every parameter decays, or (--decay weights, the default for token
  // models) only weights of two or more dims outside embeddings and norms.
  const bool weights_only =
      config_.decay == "weights" || (config_.decay == "auto" && language_model_);
  std::vector<optim::ParamGroup> groups =
      weights_only ? decay_groups(*model_, config_.weight_decay)
                   : std::vector<optim::ParamGroup>{{.params = model_->parameters()}};
  if (config_.optimizer == "sgd") {
    optim::SGDOptions o;
    o.lr = config_.lr;
    o.momentum = config_.momentum;
    o.weight_decay = config_.weight_decay;
    o.nesterov = config_.nesterov;
    optimizer_ = std::make_unique<optim::SGD>(std::move(groups), o);
  } else {
    optim::AdamWOptions o;
    o.lr = config_.lr;
    o.beta1 = config_.beta1;
    o.beta2 = config_.beta2;
    o.eps = config_.eps;
    o.weight_decay = config_.weight_decay;
    optimizer_ = std::make_unique<optim::AdamW>(std::move(groups), o);
  }

  // A loader batch is one optimizer step: grad_accum micro-batches of batch_size, so that an
  // accumulated step sees exactly the examples of one batch of batch_size * grad_accum.
  const int64_t step_batch = config_.batch_size * config_.grad_accum;
  data::LoaderOptions lo;
  lo.batch_size = step_batch;
  lo.shuffle = true;
  lo.seed = config_.seed;
  lo.num_workers = config_.workers;
  if (language_model_) {
    // Random windows with replacement (lm_batch's layout: batch k draws its windows from Philox
    // stream k); an "epoch" is as many windows as the stream has tokens.
    const auto& windows = static_cast<const data::TokenWindows&>(*train_data_);
    // Data parallel: the windows of the global batch (every rank's), each rank its share.
    const int64_t global_batch = step_batch * world_size();
    const int64_t per_epoch =
        std::max<int64_t>(1, windows.tokens().size() / (global_batch * config_.seq_len));
    lo.sampler = std::make_shared<data::ReplacementSampler>(
        windows.size(), per_epoch * global_batch, config_.seed, global_batch);
    lo.num_workers = 0;  // a batch is B * T int64 copies
  } else if (comm_) {
    lo.sampler = std::make_shared<data::ShuffleSampler>(train_data_->size(), config_.seed);
  }
  if (comm_) {
    // Rank r takes positions r, r + N, ... of each epoch's order, the last (size % N) dropped:
    // the shards are disjoint, and step j's batches of all ranks are the examples step j of
    // one process with N * batch_size would see.
    lo.sampler = std::make_shared<data::DistributedSampler>(lo.sampler, rank(), world_size(),
                                                            data::Remainder::Drop);
  }
  loader_ = std::make_unique<data::DevicePrefetcher>(
      train_data_, lo, device_, data::transfer_from_name(config_.input_pipeline));

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
  if (config_.on_divergence == "skip" &&
      amp_->scaler().options().mode == amp::ScaleMode::Disabled) {
    // A precision without a loss scaler applies every step: checking the gradients (one fused
    // pass) lets a step with inf/NaN be skipped instead.
    amp::GradScalerOptions check;
    check.init_scale = 1;
    check.mode = amp::ScaleMode::Static;
    check_scaler_ = std::make_unique<amp::GradScaler>(check);
  }
  if (config_.precision == "fp8") {
    amp::Fp8Options fo;
    fo.recipe = *amp::parse_fp8_recipe(config_.fp8_recipe);
    fo.format = *amp::parse_fp8_format(config_.fp8_format);
    fo.amax_history_len = config_.fp8_amax_history;
    fo.margin = config_.fp8_margin;
    fp8_ = std::make_unique<amp::Fp8Context>(fo);
    amp::prepare_fp8(*model_, *fp8_,
                     config_.fp8_layers == "all" ? amp::Fp8Layers::All : amp::Fp8Layers::Inner);
  }
  if (config_.detect_anomaly) {
    // After amp::initialize (O2 replaces the parameters by half copies): the names of what trains.
    auto modules = std::make_shared<std::unordered_map<const void*, std::string>>();
    for (const auto& [path, m] : model_->named_modules())
      (*modules)[m] = path.empty() ? config_.model : path;
    auto params = std::make_shared<std::unordered_map<const void*, std::string>>();
    for (const auto& [name, t] : model_->named_parameters())
      (*params)[t.impl()] = name;
    anomaly_names_.module = [modules](const void* m) {
      const auto it = modules->find(m);
      return it == modules->end() ? std::string() : it->second;
    };
    anomaly_names_.context = [this] { return "step " + std::to_string(state_.step + 1); };
    anomaly_names_.tensor = [params](const Tensor& t) {
      const auto it = params->find(t.impl());
      return it == params->end() ? std::string() : "parameter " + it->second;
    };
  }
  if (comm_) {
    // After amp::initialize, which may replace the parameters by half copies: the hooks go on
    // the tensors that train. Broadcasts rank 0's weights.
    dist::DdpOptions o;
    o.bucket_mb = config_.bucket_mb;
    o.grad_comm = config_.grad_comm == "bf16"   ? DType::BF16
                  : config_.grad_comm == "fp16" ? DType::F16
                                                : DType::F32;
    o.zero_stage = config_.zero;
    ddp_ = std::make_unique<dist::DistributedDataParallel>(*model_, comm_, o);
    // ZeRO-1: this rank's optimizer keeps state for, and updates, its own share.
    if (config_.zero == 1) optimizer_->set_owned_ranges(ddp_->owned_ranges(optimizer_->params()));
    // The averaged gradients carry an inf from any rank to all; the flag's all-reduce makes the
    // skip the same everywhere whatever a rank sees alone (one 4-byte collective a step, fp16).
    if (scaler().options().mode != amp::ScaleMode::Disabled) {
      scaler().set_overflow_reducer(
          [comm = comm_](Tensor& flag) { comm->all_reduce(flag, dist::ReduceOp::Max); });
    }
  }
}

void Trainer::build_images(nn::ModelConfig& mc) {
  MT_CHECK(config_.data == "fashion-mnist" || config_.data == "synthetic", "model '", config_.model,
           "' trains on images: use --data fashion-mnist or synthetic, not '", config_.data, "'");
  data::ImageDataset train, test;
  if (config_.data == "fashion-mnist") {
    train = data::load_fashion_mnist(config_.data_dir, true);
    test = data::load_fashion_mnist(config_.data_dir, false);
  } else {
    // One draw (the class patterns depend on the seed), split 5:1 into train and test.
    const int64_t n_train = config_.synthetic_size;
    const int64_t n_test = std::max<int64_t>(n_train / 5, 1);
    const data::ImageDataset all =
        data::synthetic_images(n_train + n_test, 1, 28, 10, config_.seed);
    train = all.slice(0, n_train);
    test = all.slice(n_train, n_test);
  }
  mc.num_classes = train.num_classes();
  mc.in_channels = train.channels();
  mc.image_size = train.height();
  for (const data::ImageDataset* d : {&train, &test})
    dataset_bytes_ += int64_t(d->images().nbytes() + d->labels().nbytes());
  train_data_ = std::make_shared<const data::ImageDataset>(std::move(train));
  eval_data_ = std::make_shared<const data::ImageDataset>(std::move(test));
}

void Trainer::build_tokens(nn::ModelConfig& mc) {
  MT_CHECK(config_.data == "text" || config_.data == "synthetic-text", "model '", config_.model,
           "' trains on tokens: use --data text --data-path DIR (a directory written by "
           "`mantissa tokenize --out DIR`) or --data synthetic-text, not '",
           config_.data, "'");
  data::TokenDataset train, val;
  if (config_.data == "synthetic-text") {
    const int64_t vocab = config_.vocab_size > 0 ? config_.vocab_size : 256;
    std::tie(train, val) = data::split_tokens(
        data::synthetic_tokens(config_.synthetic_size, vocab, config_.seed), 0.05);
  } else {
    std::tie(train, val) = load_text_data(config_);
  }
  const int64_t vocab = train.vocab_size;
  config_.vocab_size = vocab;  // the model's: checkpoints carry it to generate and eval
  const int64_t t = config_.seq_len;
  MT_CHECK(train.size() > t && val.size() > t, "--seq-len ", t,
           " is longer than the training stream (", train.size(),
           " tokens) or the validation "
           "stream (",
           val.size(), " tokens); use a shorter --seq-len or more text");
  if (config_.model == "gpt2") {
    MT_CHECK(vocab <= 50257 && t <= 1024,
             "gpt2 has a vocabulary of 50257 and a context of 1024; "
             "the data's vocabulary is ",
             vocab, " and --seq-len ", t);
  }
  mc.vocab_size = vocab;
  mc.max_seq_len = t;
  dataset_bytes_ = int64_t((train.tokens.size() + val.tokens.size()) * sizeof(train.tokens[0]));
  train_data_ = std::make_shared<const data::TokenWindows>(std::move(train), t, 1);
  // Evaluation walks the validation stream once, in non-overlapping windows.
  eval_data_ = std::make_shared<const data::TokenWindows>(std::move(val), t, t);
}

void Trainer::load_weights(const Checkpoint& ckpt) {
  model_->load_state_dict(ckpt.model);
  if (!fp8_) return;
  std::map<std::string, Tensor> fp8_state;
  for (const auto& [name, t] : ckpt.scaler)
    if (name.starts_with("fp8.")) fp8_state[name] = t;
  fp8_->load_state_dict(fp8_state);
}

void Trainer::restore(const Checkpoint& ckpt) {
  load_weights(ckpt);
  optimizer_->load_state_dict(ckpt.optimizer);
  // The "scaler." group holds the loss scaler's state and, for fp8, the delayed scaling state
  // (load_weights took that).
  NamedTensors scaler_state;
  for (const auto& [name, t] : ckpt.scaler)
    if (!name.starts_with("fp8.")) scaler_state.emplace_back(name, t);
  // (The gradient check of --on-divergence skip, a static scale of 1, keeps no state.)
  if (amp_->scaler().options().mode != amp::ScaleMode::Disabled && !scaler_state.empty()) {
    amp_->scaler().load_state_dict(scaler_state);
  }
  state_ = ckpt.state;
  set_generator_state(state_.generator);
}

int64_t Trainer::batches_per_epoch() const {
  return loader_->num_batches();
}

void Trainer::save(const std::string& path) const {
  // ZeRO-1: the optimizer's state is spread over the ranks; every rank sends its share to rank 0,
  // which writes the whole of it, as an unsharded run would.
  const NamedTensors opt_state =
      ddp_ ? ddp_->gather_optimizer_state(*optimizer_) : optimizer_->state_dict();
  if (rank() != 0) return;
  TrainState s = state_;
  s.generator = generator_state();
  NamedTensors precision_state = amp_->scaler().state_dict();
  if (fp8_) {
    for (auto& [name, t] : fp8_->state_dict())
      precision_state.emplace_back(name, t);
  }
  save_checkpoint(path, config_, s, model_->state_dict(), opt_state, precision_state);
}

Tensor Trainer::train_step(const data::Batch& batch, Tensor* correct, bool* skipped) {
  // A dynamic loss scaler's gradient overflows are expected (it skips those steps): the check
  // then covers the forward only.
  std::optional<autograd::DetectAnomaly> anomaly;
  if (config_.detect_anomaly) {
    anomaly.emplace(anomaly_names_, scaler().options().mode != amp::ScaleMode::Dynamic);
  }
  schedule_->apply(*optimizer_, state_.step);
  if (state_.lr_scale != 1) {
    for (size_t g = 0; g < optimizer_->num_groups(); ++g)
      optimizer_->set_lr(g, optimizer_->lr(g) * state_.lr_scale);
  }
  optimizer_->zero_grad(config_.zero_grad == "none");
  if (ddp_) ddp_->broadcast_buffers();  // rank 0's batch-norm statistics, as PyTorch's DDP
  amp::GradScaler& sc = scaler();
  const Tensor& x = batch.x();
  const Tensor& y = batch.y();
  Tensor loss;  // the step's loss: the mean over every target of the batch
  // An underflow measurement's record, written once the step has updated the weights (with what
  // the update did to them), and the fp32 weights before it.
  std::optional<nlohmann::ordered_json> underflow_record;
  std::vector<Tensor> weights_before;
  if (config_.grad_accum == 1) {
    const bool measure = config_.underflow_every > 0 && state_.step % config_.underflow_every == 0;
    std::vector<Tensor> reference;
    ActivationGradients activations(sc.get_scale());
    if (measure) reference = reference_gradients(batch, &activations);
    const Tensor logits = forward(x);
    loss = loss_of(logits, y);
    sc.scale(loss).backward();
    count_correct(logits, y, correct);
    if (measure) {
      const UnderflowStats u = measure_underflow(reference);
      if (log_->tensorboard()) write_log2_histogram(reference, state_.step + 1);
      underflow_ += u;
      if (log_->enabled()) {
        auto j = record("underflow");
        j["step"] = state_.step + 1;
        j["loss_scale"] = sc.get_scale();
        j["nonzero"] = u.nonzero;
        j["cast_unscaled"] = u.cast_unscaled;
        j["cast_scaled"] = u.cast_scaled;
        j["observed"] = u.observed;
        j["zero_rows"] = u.zero_rows;
        nlohmann::ordered_json layers = nlohmann::ordered_json::array();
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
        // The picture (docs/training.md): log2 histograms of the activation gradients, the
        // weight gradients and the weights, all in fp32; the updates are added after the step.
        j["activations"] = activations.to_json();
        Log2Counts gradients, weights;
        for (const Tensor& g : reference)
          if (g.defined()) gradients.add(g);
        NoGrad ng;
        for (const Tensor& p : model_->parameters()) {
          weights.add(p);
          weights_before.push_back(p.to(DType::F32).to(Device::cpu()).clone());
        }
        j["weight_gradients"] = gradients.to_json();
        j["weights"] = weights.to_json();
        underflow_record = std::move(j);
      }
    }
  } else {
    // Gradient accumulation: micro-batches of batch_size, each one's summed loss divided by the
    // target count of the WHOLE batch, so the gradients add up to the big batch's mean-loss
    // gradient exactly (not a mean of per-micro-batch means, which weighs a short last
    // micro-batch's targets more). The scale stays the same over the step; unscale_, the
    // inf/NaN check and clipping happen once, below.
    const int64_t n = x.size(0), total = y.numel();
    for (int64_t start = 0; start < n; start += config_.batch_size) {
      const int64_t len = std::min(config_.batch_size, n - start);
      const Tensor xm = x.narrow(0, start, len), ym = y.narrow(0, start, len);
      // Data parallel: only the last micro-batch's backward communicates (the sum of all).
      if (ddp_) ddp_->set_require_sync(start + len >= n);
      const Tensor logits = forward(xm);
      const Tensor part = div(loss_of(logits, ym, Reduction::Sum), double(total));
      sc.scale(part).backward();
      count_correct(logits, ym, correct);
      NoGrad ng;
      loss = loss.defined() ? add(loss, part.detach()) : part.detach();
    }
  }
  // Every rank's gradients become their mean over the ranks (an inf or NaN anywhere reaches
  // every rank, so all skip the same steps); a rank's norm is then the global norm.
  if (ddp_) ddp_->finish_gradients();
  // The gradient norm of the steps the metrics record (before clipping, of the true gradients):
  // clipping's own, or the norm of the model's gradients over the loss scale. ZeRO-1 without
  // clipping records none (a rank holds only its share of the gradients).
  const bool record_norm = log_->enabled() && (state_.step + 1) % config_.log_every == 0;
  // TensorBoard's histograms: this step's true gradients (before the update, over the loss
  // scale) and the weights it makes, every histogram_every steps or at each evaluation.
  const int64_t next = state_.step + 1;
  const bool histograms =
      log_->tensorboard() && (config_.histogram_every > 0
                                  ? next % config_.histogram_every == 0
                                  : state_.batch + 1 == batches_per_epoch() ||
                                        (config_.eval_every > 0 && next % config_.eval_every == 0));
  if (histograms) write_histograms(/*gradients=*/true, next, 1.0 / sc.get_scale());
  grad_norm_ = Tensor();
  if (config_.clip_grad_norm > 0) {
    sc.unscale_(*optimizer_);  // clip the true gradients, not the scaled ones
    // ZeRO-1: each rank holds its own share of the gradients; the norm is over all ranks'.
    const Tensor norm = optim::clip_grad_norm(optimizer_->params(), config_.clip_grad_norm, 2.0,
                                              ddp_ ? ddp_->norm_combiner() : optim::NormCombiner{});
    if (record_norm) grad_norm_ = norm;
  } else if (record_norm && config_.zero == 0) {
    NoGrad ng;
    grad_norm_ = div(optim::grad_norm(model_->parameters()), sc.get_scale());
  }
  const amp::StepResult stepped = sc.step(*optimizer_);
  // On a GPU the answer is read back with the losses (read_back), not here: no wait per step.
  *skipped = !sc.on_device() && stepped.skipped();
  // Which layers overflowed, not only that one did: a skipped step's record names the
  // parameters whose gradients hold inf/NaN (on the CPU, where the skip is known here; a GPU
  // decides it on the device).
  if (*skipped && log_->enabled()) {
    NoGrad ng;
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const auto& [name, p] : model_->named_parameters()) {
      if (!p.grad().defined()) continue;
      for (const float g : p.grad().to(DType::F32).to_vector<float>()) {
        if (!std::isfinite(g)) {
          layers.push_back(name);
          break;
        }
      }
    }
    auto j = record("skipped_step");
    j["step"] = state_.step + 1;
    j["loss_scale"] = sc.get_scale();
    j["nonfinite_gradients"] = std::move(layers);
    log_->write(j);
  }
  sc.update();
  // Delayed scaling: the next step's scales from this step's amaxes, their maximum over the
  // ranks (every rank quantizes with the same scales, and rank 0's checkpoint holds them all).
  if (fp8_) {
    amp::Fp8Context::AmaxReduce over_ranks;
    if (host_comm_) {
      over_ranks = [this](std::span<float> amaxes) {
        Tensor t = Tensor::from_vector(std::vector<float>(amaxes.begin(), amaxes.end()),
                                       {int64_t(amaxes.size())});
        host_comm_->all_reduce(t, dist::ReduceOp::Max);
        const std::vector<float> all = t.to_vector<float>();
        std::copy(all.begin(), all.end(), amaxes.begin());
      };
    }
    fp8_->update(over_ranks);
  }
  if (ddp_) ddp_->all_gather_parameters();  // ZeRO-1: every owner's update to every rank
  if (underflow_record) {
    std::vector<Tensor> after;
    for (const Tensor& p : model_->parameters())
      after.push_back(p.to(DType::F32).to(Device::cpu()));
    (*underflow_record)["updates"] = weight_updates(weights_before, after);
    log_->write(*underflow_record);
  }
  ++state_.step;
  if (histograms) write_histograms(/*gradients=*/false, next);
  return loss.detach().to(DType::F32);
}

Tensor Trainer::forward(const Tensor& x) {
  std::optional<amp::Fp8Autocast> f8;
  if (fp8_) f8.emplace(*fp8_);
  return amp_->forward(*model_, x);
}

std::vector<Tensor> Trainer::reference_gradients(const data::Batch& batch,
                                                 ActivationGradients* activations) {
  // The same weights and batch in fp32, without touching .grad, batch norm's running statistics
  // or the random generator (the real step then draws the same dropout masks).
  const GeneratorState gen = generator_state();
  std::vector<Tensor> buffers;
  for (const Tensor& b : model_->buffers())
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
    const Tensor loss = loss_of((*model_)(batch.x()), batch.y());
    observer.reset();
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

double EvalResult::perplexity() const {
  return std::exp(loss);
}

EvalResult Trainer::evaluate() {
  const auto t0 = Clock::now();
  NoGrad ng;
  model_->eval();
  data::LoaderOptions lo;
  const int64_t eval_batch = config_.eval_batch_size > 0 ? config_.eval_batch_size
                             : language_model_           ? config_.batch_size * config_.grad_accum
                                                         : 256;
  lo.batch_size = eval_batch;
  lo.shuffle = false;
  lo.num_workers = language_model_ ? 0 : config_.workers;
  if (config_.eval_batches > 0) {
    // The first eval_batches batches of the (sequential) evaluation set.
    const int64_t n = std::min(eval_data_->size(), config_.eval_batches * eval_batch);
    lo.sampler = std::make_shared<data::SequentialSampler>(n);
  }
  data::DevicePrefetcher loader(eval_data_, lo, device_,
                                data::transfer_from_name(config_.input_pipeline));
  // The per-batch losses and the count stay on the device until the end: one host read.
  std::vector<Tensor> losses;
  Tensor correct_acc;
  int64_t n = 0;
  for (auto& batch : loader) {
    const Tensor logits = forward(batch.x());
    losses.push_back(loss_of(logits, batch.y(), Reduction::Sum).to(DType::F32));
    count_correct(logits, batch.y(), &correct_acc);
    n += batch.y().numel();
  }
  double loss_sum = 0;
  for (const float l : read_scalars(losses))
    loss_sum += l;
  const int64_t correct = read_count(correct_acc);
  model_->train();
  return {n ? loss_sum / double(n) : 0.0, n ? double(correct) / double(n) : 0.0, n,
          seconds_since(t0)};
}

EvalResult Trainer::evaluate_and_report(int64_t epoch, const char* when) {
  const EvalResult r = evaluate();
  if (log_->enabled()) {
    auto j = record("eval");
    j["epoch"] = epoch;
    j["step"] = state_.step;
    j["test_loss"] = r.loss;
    j["test_accuracy"] = r.accuracy;
    if (language_model_) j["val_perplexity"] = r.perplexity();
    j["eval_seconds"] = r.seconds;
    log_->write(j);
  }
  if (rank() != 0 || quiet_) return r;
  if (when != nullptr && language_model_) {
    std::fprintf(stderr,
                 "%s step %lld: val loss %.4f, perplexity %.2f, next-token accuracy %.2f%%\n", when,
                 (long long)state_.step, r.loss, r.perplexity(), 100 * r.accuracy);
  } else if (when != nullptr) {
    std::fprintf(stderr, "%s step %lld: test loss %.4f, accuracy %.2f%%\n", when,
                 (long long)state_.step, r.loss, 100 * r.accuracy);
  }
  return r;
}

TrainResult Trainer::fit(int64_t max_epochs) {
  TrainResult result;
  reset_peak_memory(device_);
  const int64_t batches = loader_->num_batches();
  const int64_t epochs =
      config_.epochs > 0 ? config_.epochs : (config_.max_steps + batches - 1) / batches;
  Progress progress(config_.progress && rank() == 0, config_.log_every);
  auto steps_done = [&] { return config_.max_steps > 0 && state_.step >= config_.max_steps; };
  // Reading a device value back (the loss, the correct count) waits for the GPU to finish the
  // step. On the GPU the losses and counts are kept on the device and read once every
  // log_every steps (and at the end of an epoch), so the host queues steps ahead; on the CPU
  // a read costs nothing and happens every step. The progress bar and the "train" metric
  // records are updated at these reads.
  const int64_t read_every = device_.is_cuda() ? config_.log_every : 1;
  const bool scaled = scaler().options().mode != amp::ScaleMode::Disabled;
  const int64_t skipped_before = scaled ? scaler().skipped_steps() : 0;
  const bool dynamic = scaler().options().mode == amp::ScaleMode::Dynamic;
  DivergenceGuard guard(config_.divergence_patience);
  std::string diverged;  // why, once the guard has said so (the same on every rank)
  int64_t skipped_at_read = skipped_before;
  // What --on-divergence does once the run has diverged: true when it goes on (rolled back to
  // the last good checkpoint, the epoch loop then restarts from its state), false to stop.
  auto handle_divergence = [&] {
    const bool roll = config_.on_divergence == "rollback" && !last_good_checkpoint_.empty() &&
                      result.rollbacks < kMaxRollbacks;
    if (log_->enabled()) {
      auto j = record("divergence");
      j["step"] = state_.step;
      j["what"] = diverged;
      j["action"] = roll ? "rollback" : "stop";
      if (!last_good_checkpoint_.empty()) {
        j["checkpoint"] = last_good_checkpoint_;
        j["checkpoint_step"] = last_good_step_;
      }
      log_->write(j);
    }
    if (!roll) {
      if (config_.on_divergence == "rollback") {
        diverged += last_good_checkpoint_.empty()
                        ? "; no checkpoint had been written yet to roll back to"
                        : "; rolled back " + std::to_string(kMaxRollbacks) + " times already";
      }
      result.diverged = diverged;
      return false;
    }
    const double spent = state_.train_seconds, lr_scale = state_.lr_scale;
    restore(load_checkpoint(last_good_checkpoint_));
    // Half the smaller of the two factors: rolling back twice to the same checkpoint must not
    // retrace the same steps.
    state_.lr_scale = std::min(lr_scale, state_.lr_scale) * 0.5;
    state_.train_seconds = spent;  // time spent is spent
    ++result.rollbacks;
    guard.reset();
    if (rank() == 0) {
      char line[512];
      std::snprintf(line, sizeof line,
                    "%s; rolled back to step %lld ('%s') with the learning rate x%g (rollback %lld "
                    "of %d)",
                    diverged.c_str(), (long long)state_.step, last_good_checkpoint_.c_str(),
                    state_.lr_scale, (long long)result.rollbacks, kMaxRollbacks);
      progress.end_epoch(line);
    }
    diverged.clear();
    return true;
  };
  // The checkpoint, when the guard trusts the state (or at the run's end, which it reached
  // without diverging); then it is the last good one.
  auto save_checkpoint = [&](bool at_end) {
    if (!guard.trusted() && !at_end) return;
    save(config_.checkpoint_path);  // rank 0 writes
    if (guard.trusted()) {
      last_good_checkpoint_ = config_.checkpoint_path;
      last_good_step_ = state_.step;
    }
  };

  const int64_t stop_epoch = max_epochs > 0 ? std::min(epochs, state_.epoch + max_epochs) : epochs;
  // A resumed run with nothing left to train would report an evaluation it never made.
  MT_CHECK(config_.resume_path.empty() || !step_losses_.empty() ||
               (state_.epoch < stop_epoch && !steps_done()),
           "the run saved in '", config_.resume_path, "' is already complete (step ", state_.step,
           config_.max_steps > 0 ? " of --steps " + std::to_string(config_.max_steps) : "",
           ", epoch ", state_.epoch, " of --epochs ", epochs,
           "); to train on, pass a larger --steps or --epochs with --resume");
  while (state_.epoch < stop_epoch && !steps_done()) {
    model_->train();
    loader_->start_epoch(state_.epoch, state_.batch);
    const auto t0 = Clock::now();
    double loss_sum = 0;
    int64_t correct = 0, seen = 0, run_batches = 0;
    std::vector<Tensor> pending_losses;    // steps not read back yet
    std::vector<uint8_t> pending_skipped;  // and whether each was skipped (known on the CPU)
    Tensor pending_correct;
    bool last_skipped = false;
    double eval_seconds = 0;  // evaluations inside the epoch (--eval-every): not training time
    auto read_back = [&] {
      if (pending_losses.empty()) return;
      const std::vector<float> losses = read_scalars(pending_losses);
      pending_losses.clear();
      correct += read_count(pending_correct);
      pending_correct = Tensor();
      if (scaler().on_device()) {
        // A GPU scaler decides the skip on the device: its counters are read back here, with
        // the losses.
        result.skipped_steps = scaler().skipped_steps() - skipped_before;
        last_skipped = scaler().found_inf();
      }
      for (const float loss : losses) {
        step_losses_.push_back(loss);
        loss_sum += loss;
      }
      // The divergence guard sees every step in order. On a GPU the window's skips are known
      // only as a count: all or none, or else the steps whose loss is not finite (their
      // gradients are not either, and a scaler skips them).
      const int64_t window_skips = scaled ? scaler().skipped_steps() - skipped_at_read : 0;
      skipped_at_read += window_skips;
      const bool at_min = dynamic && scaler().at_min_scale();
      for (size_t i = 0; i < losses.size() && diverged.empty(); ++i) {
        StepOutcome o;
        o.step = state_.step - int64_t(losses.size()) + int64_t(i) + 1;
        o.loss = losses[i];
        o.skipped = scaler().on_device() ? window_skips == int64_t(losses.size()) ||
                                               (window_skips > 0 && !std::isfinite(losses[i]))
                                         : pending_skipped[i] != 0;
        diverged = guard.observe(o, dynamic, at_min);
      }
      pending_skipped.clear();
      if (host_comm_) {
        // Every rank stops or rolls back after the same step (an inf reaches all ranks' weights
        // through the averaged gradients, but a rank's own loss may show it a step earlier).
        Tensor flag = Tensor::from_vector(std::vector<int64_t>{diverged.empty() ? 0 : 1}, {1});
        host_comm_->all_reduce(flag, dist::ReduceOp::Max);
        if (flag.to_vector<int64_t>()[0] != 0 && diverged.empty()) {
          diverged = "step " + std::to_string(state_.step) + ": another rank's loss diverged";
        }
      }
      const double elapsed = seconds_since(t0) - eval_seconds;
      StepStats st;
      st.epoch = state_.epoch + 1;
      st.epochs = epochs;
      st.batch = state_.batch;
      st.batches = batches;
      st.step = state_.step;
      st.loss = loss_sum / double(run_batches);
      st.accuracy = seen ? double(correct) / double(seen) : 0;
      st.samples_per_s = elapsed > 0 ? double(seen) / elapsed : 0;
      st.unit = language_model_ ? "tokens" : "samples";
      st.lr = optimizer_->lr();
      st.eta_s = run_batches ? elapsed / double(run_batches) * double(batches - state_.batch) : 0;
      if (scaled) {
        st.loss_scale = scaler().get_scale();
        st.skipped = result.skipped_steps;
      }
      progress.update(st);
      if (log_->enabled() && state_.step % config_.log_every == 0) {
        auto j = record("train");
        j["step"] = state_.step;
        j["epoch"] = state_.epoch + 1;
        j["loss"] = double(losses.back());
        j["lr"] = optimizer_->lr();
        j[language_model_ ? "tokens_per_s" : "samples_per_s"] = st.samples_per_s;
        j["train_seconds"] = state_.train_seconds + elapsed;  // the run's so far, no evaluation
        j["loss_scale"] = scaler().get_scale();
        j["skipped"] = last_skipped;
        j["skipped_steps"] = result.skipped_steps;
        if (grad_norm_.defined()) j["grad_norm"] = grad_norm_.item();
        j["peak_memory_bytes"] = memory_stats(device_).peak_bytes;
        log_->write(j);
        if (fp8_) log_->write(nlohmann::ordered_json::parse(fp8_record()));
      }
    };
    while (!steps_done()) {
      if ((result.interrupted = stop_requested()) != 0) break;
      std::optional<data::Batch> batch = loader_->next();
      if (!batch) break;
      bool skipped = false;
      pending_losses.push_back(train_step(*batch, &pending_correct, &skipped));
      pending_skipped.push_back(skipped);
      result.skipped_steps += skipped;
      last_skipped = skipped;
      seen += batch->y().numel();
      ++run_batches;
      ++state_.batch;
      if (state_.step % read_every == 0 || state_.batch == batches || steps_done()) read_back();
      if (!diverged.empty()) break;
      // Mid-epoch checkpoints (the epoch's end writes its own), of a state the guard has seen.
      if (config_.checkpoint_every > 0 && state_.step % config_.checkpoint_every == 0 &&
          state_.batch < batches) {
        read_back();
        if (!diverged.empty()) break;
        save_checkpoint(false);
      }
      if (config_.eval_every > 0 && state_.step % config_.eval_every == 0 &&
          state_.batch < batches && !steps_done()) {
        read_back();
        if (!diverged.empty()) break;
        const auto e0 = Clock::now();
        evaluate_and_report(state_.epoch + 1, "eval at");
        eval_seconds += seconds_since(e0);
      }
    }
    read_back();
    // The epoch's time includes its last queued GPU work (one wait per epoch).
    if (device_.is_cuda()) cuda::synchronize(device_.index);
    const double epoch_seconds = seconds_since(t0) - eval_seconds;
    state_.train_seconds += epoch_seconds;
    // A diverged state is neither evaluated nor saved.
    if (!diverged.empty()) {
      if (handle_divergence()) continue;
      break;
    }
    if (result.interrupted) {
      // Mid-epoch: the state says which batch comes next; no evaluation and no summary (nothing
      // is reported that was not measured), the checkpoint, and the result below.
      result.checkpoint =
          config_.checkpoint_path.empty() ? kInterruptedCheckpoint : config_.checkpoint_path;
      save(result.checkpoint);
      if (rank() == 0 && !quiet_) {
        char line[160];
        std::snprintf(line, sizeof line,
                      "epoch %lld/%lld: stopped after step %lld (batch %lld of %lld), train loss "
                      "%.4f",
                      (long long)state_.epoch + 1, (long long)epochs, (long long)state_.step,
                      (long long)state_.batch, (long long)batches,
                      run_batches ? loss_sum / double(run_batches) : 0.0);
        progress.end_epoch(line);
      }
      break;
    }
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
    if (log_->enabled()) {
      auto j = record("eval");
      j["epoch"] = er.epoch;
      j["step"] = state_.step;
      j["test_loss"] = er.test.loss;
      j["test_accuracy"] = er.test.accuracy;
      if (language_model_) j["val_perplexity"] = er.test.perplexity();
      j["train_loss"] = er.train_loss;
      j["train_accuracy"] = er.train_accuracy;
      j["epoch_seconds"] = er.seconds;
      log_->write(j);
    }
    char line[256];
    if (language_model_) {
      std::snprintf(line, sizeof line,
                    "epoch %lld/%lld: train loss %.4f | val loss %.4f perplexity %.2f | %.1f s "
                    "(%.0f tokens/s) | peak %s",
                    (long long)er.epoch, (long long)epochs, er.train_loss, er.test.loss,
                    er.test.perplexity(), er.seconds, er.samples_per_s,
                    format_bytes(memory_stats(device_).peak_bytes).c_str());
    } else {
      std::snprintf(line, sizeof line,
                    "epoch %lld/%lld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | "
                    "%.1f s (%.0f samples/s) | peak %s",
                    (long long)er.epoch, (long long)epochs, er.train_loss, 100 * er.train_accuracy,
                    er.test.loss, 100 * er.test.accuracy, er.seconds, er.samples_per_s,
                    format_bytes(memory_stats(device_).peak_bytes).c_str());
    }
    if (rank() == 0 && !quiet_) progress.end_epoch(line);
    result.epochs.push_back(er);
    if (!config_.checkpoint_path.empty())
      save_checkpoint(state_.epoch >= stop_epoch || steps_done());
  }
  result.train_seconds = state_.train_seconds;
  result.steps = state_.step;
  result.loss_scale = scaler().get_scale();
  result.underflow = underflow_;
  result.peak_memory_bytes = memory_stats(device_).peak_bytes;
  result.optimizer_state_bytes = optimizer_->state_nbytes();
  if (comm_) {
    // Per rank, the largest: what a machine must hold for one rank.
    Tensor most = Tensor::from_vector(
        std::vector<int64_t>{result.peak_memory_bytes, result.optimizer_state_bytes}, {2});
    host_comm_->all_reduce(most, dist::ReduceOp::Max);
    result.peak_memory_bytes = most.to_vector<int64_t>()[0];
    result.optimizer_state_bytes = most.to_vector<int64_t>()[1];
  }
  result.dataset_bytes = dataset_bytes_;
  result.last_good_checkpoint = last_good_checkpoint_;
  result.last_good_step = last_good_step_;
  if (log_->enabled() && !result.interrupted && result.diverged.empty()) {
    auto j = record("summary");
    j.update(nlohmann::ordered_json::parse(summary_json(result)));
    log_->write(j);
  }
  return result;
}

int Trainer::stop_requested() const {
  if (stop_flag_ == nullptr) return 0;
  const int mine = stop_flag_->load(std::memory_order_relaxed);
  if (!host_comm_) return mine;
  // Every rank stops after the same step (a signal reaches the ranks at different moments).
  Tensor flag = Tensor::from_vector(std::vector<int64_t>{mine}, {1});
  host_comm_->all_reduce(flag, dist::ReduceOp::Max);
  return int(flag.to_vector<int64_t>()[0]);
}

EvalResult evaluate_checkpoint(const std::string& path, const std::string& data_dir,
                               const std::string& device) {
  Checkpoint ckpt = load_checkpoint(path);
  TrainConfig c = ckpt.config;
  c.device = device;
  c.resume_path.clear();
  c.metrics_path.clear();
  c.tensorboard_dir.clear();
  c.checkpoint_path.clear();
  c.progress = false;
  if (!data_dir.empty()) c.data_dir = data_dir;
  Trainer t(c);
  t.load_weights(ckpt);  // the model, and an fp8 run's scales: evaluation quantizes with them
  return t.evaluate();
}

}  // namespace mantissa::train
