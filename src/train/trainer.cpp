// The Trainer's set-up and state (trainer.h): the machine, the task and its networks, the loader,
// the run log, checkpoints and what a caller reads of the run. The loop itself is loop.cpp.
#include "mantissa/train/trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "mantissa/amp/precision.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/config/run_config.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"
#include "mantissa/core/error.h"
#include "mantissa/data/sampler.h"
#include "mantissa/data/tokens.h"
#include "mantissa/tensor/ops.h"
#include "train/run.h"

namespace mantissa::train {
namespace {

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

// Data parallel: every rank's configuration is this one's, or a mantissa::Error.
void check_same_config(const Run& run) {
  // FNV-1a of the configuration: every rank must run the same one (mpirun starts the same
  // command, but a rank may read another file or a resumed checkpoint may differ).
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char ch : run.config.to_json())
    h = (h ^ ch) * 1099511628211ull;
  const auto mine = int64_t(h >> 1);
  Tensor hi = Tensor::from_vector(std::vector<int64_t>{mine}, {1});
  Tensor lo = Tensor::from_vector(std::vector<int64_t>{-mine}, {1});
  run.host_comm->all_reduce(hi, dist::ReduceOp::Max);
  run.host_comm->all_reduce(lo, dist::ReduceOp::Max);
  MT_CHECK(hi.to_vector<int64_t>()[0] == mine && -lo.to_vector<int64_t>()[0] == mine,
           "the ranks of this ", run.world_size(),
           "-rank job were started with different training configurations (model, precision, "
           "data, batch size, resumed checkpoint, ...); start every rank with the same command");
}

// The machine of the run: threads, the device and, data parallel, the communicators.
void set_up_machine(Run& run) {
  const TrainConfig& c = run.config;
  run.device = require_device(c.device);
  set_num_threads(c.threads > 0 ? c.threads
                                : int(std::max(1u, std::thread::hardware_concurrency())));
  if (!c.distributed) {
    const int launched = dist::launched_world_size();
    MT_CHECK(launched == 1, "this is one of ", launched,
             " processes an MPI launcher started, but --distributed is not given: each would "
             "train the whole run alone and write the same files; add --distributed to train data "
             "parallel, or start one process");
    return;
  }
  // MPI starts the job and carries host values (the configuration check, the summary); the
  // gradients go through MPI on the CPU, through NCCL on GPUs: one per rank, by default the
  // rank's local number among the machine's GPUs (--device cuda).
  run.host_comm = dist::mpi_world();
  run.comm = run.host_comm;  // for world_size() in the check's message
  check_same_config(run);
  if (run.device.is_cuda()) {
    if (c.device == "cuda") run.device = Device::cuda(dist::local_rank() % cuda::device_count());
    run.comm = dist::nccl_world(run.device.index);
  }
}

// --detect-anomaly: the names of every trainee's modules and parameters, for the report.
void name_for_anomalies(Run& run) {
  auto modules = std::make_shared<std::unordered_map<const void*, std::string>>();
  auto params = std::make_shared<std::unordered_map<const void*, std::string>>();
  for (const auto& t : run.trainees) {
    // After amp::initialize (O2 replaces the parameters by half copies): the names of what
    // trains.
    const std::string root = t->name().empty() ? run.config.model : t->name();
    const std::string prefix = t->name().empty() ? "" : t->name() + ".";
    for (const auto& [path, m] : t->model().named_modules())
      (*modules)[m] = path.empty() ? root : prefix + path;
    for (const auto& [name, p] : t->model().named_parameters())
      (*params)[p.impl()] = prefix + name;
  }
  run.anomaly_names.module = [modules](const void* m) {
    const auto it = modules->find(m);
    return it == modules->end() ? std::string() : it->second;
  };
  run.anomaly_names.context = [&run] { return "step " + std::to_string(run.state.step + 1); };
  run.anomaly_names.tensor = [params](const Tensor& t) {
    const auto it = params->find(t.impl());
    return it == params->end() ? std::string() : "parameter " + it->second;
  };
}

// The loader of the task's training data: rank r takes positions r, r + N, ... of each epoch's
// order, the last (size % N) dropped: the shards are disjoint, and step j's batches of all ranks
// are the examples step j of one process with N * batch_size would see.
void make_loader(Run& run, TaskData data) {
  if (run.comm) {
    if (!data.loader.sampler) {
      data.loader.sampler =
          std::make_shared<data::ShuffleSampler>(data.train->size(), run.config.seed);
    }
    data.loader.sampler = std::make_shared<data::DistributedSampler>(
        data.loader.sampler, run.rank(), run.world_size(), data::Remainder::Drop);
  }
  run.train_data = data.train;
  run.dataset_bytes = data.bytes;
  run.loader = std::make_unique<data::DevicePrefetcher>(data.train, data.loader, run.device,
                                                        run.config.input_pipeline);
  MT_CHECK(run.loader->num_batches() > 0, "the training data has ", data.train->size(),
           " examples: too few for one batch (", step_text(run),
           "); use a smaller batch or more data");
}

// The learning-rate schedule over the run's steps: --steps, or the epochs' batches, whichever ends
// first.
optim::LRSchedule schedule_of(const Run& run) {
  const TrainConfig& c = run.config;
  optim::ScheduleOptions so;
  so.lr = c.lr;
  so.warmup_steps = c.warmup_steps;
  so.step_size = c.step_size;
  so.gamma = c.gamma;
  const int64_t epoch_steps = c.epochs * run.loader->num_batches();
  so.total_steps =
      c.max_steps > 0 && (c.epochs <= 0 || c.max_steps < epoch_steps) ? c.max_steps : epoch_steps;
  MT_CHECK(c.schedule != optim::ScheduleKind::Cosine || c.warmup_steps <= so.total_steps,
           "--warmup ", c.warmup_steps, " is longer than the run's ", so.total_steps,
           " steps; use a shorter --warmup or a longer run");
  return optim::LRSchedule::of_kind(c.schedule, so);
}

}  // namespace

// A checkpoint's namespaces beside the trainees' (the main model's names are unprefixed): the
// task's own state, under "optimizer.task.".
constexpr const char* kTaskState = "task";

std::string step_text(const Run& run) {
  const TrainConfig& c = run.config;
  std::string text = fmt::format("--batch-size {}", c.batch_size);
  if (c.grad_accum > 1) text += fmt::format(" x --grad-accum {}", c.grad_accum);
  if (run.world_size() > 1) text += fmt::format(" x {} ranks", run.world_size());
  return text;
}

void check_step_fits_the_data(const Run& run) {
  const TrainConfig& c = run.config;
  const int64_t examples = c.batch_size * c.grad_accum * run.world_size();
  const bool more = c.grad_accum > 1;
  if (const auto* w = dynamic_cast<const data::TokenWindows*>(run.train_data.get())) {
    const int64_t stream = w->tokens().size();
    MT_CHECK(examples * c.seq_len <= stream, "one step reads ", examples, " windows of ", c.seq_len,
             " tokens (", step_text(run), ", --seq-len ", c.seq_len, "): ", examples * c.seq_len,
             " tokens, more than the training stream's ", stream, "; use a smaller --batch-size",
             more ? ", --grad-accum" : "", " or --seq-len, or more text");
  } else {
    MT_CHECK(examples <= run.train_data->size(), "one step takes ", examples, " examples (",
             step_text(run), ") but the training data has ", run.train_data->size(),
             "; use a smaller --batch-size", more ? " or --grad-accum" : "", ", or more data");
  }
}

// The tokenizer of the run's token data (0: none, or not token data).
uint64_t data_tokenizer(const Run& run) {
  const auto* w = dynamic_cast<const data::TokenWindows*>(run.train_data.get());
  return w ? w->tokens().tokenizer_fingerprint : 0;
}

void restore_run(Run& run, const Checkpoint& ckpt, bool everything) {
  const uint64_t mine = data_tokenizer(run), theirs = ckpt.state.tokenizer_fingerprint;
  MT_CHECK(mine == 0 || theirs == 0 || mine == theirs,
           "the token data given was encoded by another tokenizer than the run trained with "
           "(fingerprint ",
           fmt::format("{:016x}", mine), ", the run's ", fmt::format("{:016x}", theirs),
           "); give the run's data (--data-path) and tokenizer (--tokenizer)");
  std::vector<std::string> names{kTaskState};
  for (const auto& t : run.trainees)
    names.push_back(t->name());
  for (const auto& t : run.trainees)
    t->load(ckpt, everything, names);
  if (!everything) return;
  NamedTensors task_state;
  for (const auto& [name, t] : ckpt.optimizer)
    if (name.starts_with(std::string(kTaskState) + "."))
      task_state.emplace_back(name.substr(std::strlen(kTaskState) + 1), t);
  run.task->load_state_dict(task_state);
  run.state = ckpt.state;
  if (mine != 0) run.state.tokenizer_fingerprint = mine;
  set_generator_state(run.state.generator);
}

Trainee& Run::add_trainee(std::string name, std::shared_ptr<nn::Module> model,
                          std::vector<optim::ParamGroup> groups) {
  trainees.push_back(
      std::make_unique<Trainee>(std::move(name), std::move(model), std::move(groups), *this));
  return *trainees.back();
}

int Run::stop_requested() const {
  if (stop_flag == nullptr) return 0;
  const int mine = stop_flag->load(std::memory_order_relaxed);
  if (!host_comm) return mine;
  // Every rank stops after the same step (a signal reaches the ranks at different moments).
  Tensor flag = Tensor::from_vector(std::vector<int64_t>{mine}, {1});
  host_comm->all_reduce(flag, dist::ReduceOp::Max);
  return int(flag.to_vector<int64_t>()[0]);
}

std::vector<std::unique_ptr<dist::DistributedDataParallel::FullParameters>> whole_models(
    const Run& run) {
  std::vector<std::unique_ptr<dist::DistributedDataParallel::FullParameters>> out;
  for (const auto& t : run.trainees)
    if (auto w = t->whole_parameters()) out.push_back(std::move(w));
  return out;
}

void Run::write_weight_histograms(int64_t step) {
  NoGrad ng;
  const auto whole = whole_models(*this);
  for (const auto& t : trainees) {
    const std::string prefix = t->name().empty() ? "" : t->name() + ".";
    for (const auto& [name, p] : t->model().named_parameters())
      log->histogram("weights/" + prefix + name, p.to(DType::F32).to_vector<float>(), step);
  }
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

Trainer::Trainer(TrainConfig config) : run_(std::make_unique<Run>()) {
  Run& run = *run_;
  run.config = std::move(config);
  TrainConfig& c = run.config;
  // "auto" becomes the precision this machine runs fastest, stored as such (checkpoints and
  // metrics name what ran).
  c.precision = amp::resolve(c.precision);
  c.validate();
  check_supported(c);
  // A resumed run is the stored one: what it may not change is refused before anything is
  // built or written.
  std::optional<Checkpoint> resume;
  if (!c.resume_path.empty()) resume = load_checkpoint(c.resume_path);
  set_up_machine(run);
  if (!c.checkpoint_path.empty() && run.rank() == 0) check_checkpoint_path(c.checkpoint_path);
  run.task = make_task(c);
  manual_seed(c.seed);
  TaskData data = run.task->build(run);  // (completes what the data decide: a vocabulary)
  MT_ASSERT(!run.trainees.empty(), "the task built no network");
  if (resume) config::check_same_run(resume->config, c, c.resume_path);
  make_loader(run, std::move(data));
  run.state.tokenizer_fingerprint = data_tokenizer(run);
  run.schedule = std::make_unique<optim::LRSchedule>(schedule_of(run));
  if (c.detect_anomaly) name_for_anomalies(run);
  if (resume) {
    restore_run(run, *resume, /*everything=*/true);
    run.last_good_checkpoint = c.resume_path;
    run.last_good_step = run.state.step;
  }
  run.log = run.rank() != 0 ? std::make_unique<RunLog>()
                            : std::make_unique<RunLog>(c.metrics_path, c.tensorboard_dir);
}

Trainer::~Trainer() = default;

void Trainer::set_stop_flag(const std::atomic<int>* flag) {
  run_->stop_flag = flag;
}

void Trainer::set_record_callback(std::function<void(const std::string& json)> callback) {
  if (run_->rank() == 0) run_->log->set_callback(std::move(callback));
}

void Trainer::set_quiet(bool quiet) {
  run_->quiet = quiet;
}

std::optional<data::Batch> Trainer::next_batch() {
  Run& run = *run_;
  if (!run.loader_started) {
    run.loader->start_epoch(run.state.epoch, run.state.batch);
    run.loader_started = true;
  }
  return run.loader->next();
}

EvalResult Trainer::evaluate() {
  EvalResult r;
  {
    const auto whole = whole_models(*run_);
    r = run_->task->evaluate(*run_);
  }
  r.text = run_->task->describe(r);
  r.unit = run_->task->eval_unit();
  return r;
}

nn::Module& Trainer::model() {
  return run_->main().model();
}
optim::Optimizer& Trainer::optimizer() {
  return run_->main().optimizer();
}
amp::GradScaler& Trainer::scaler() {
  return run_->main().scaler();
}
const amp::Amp& Trainer::amp() const {
  return run_->main().amp();
}
std::string Trainer::describe_precision() const {
  return run_->main().amp().describe();
}
const amp::Fp8Context* Trainer::fp8() const {
  return run_->main().amp().fp8();
}
const TrainConfig& Trainer::config() const {
  return run_->config;
}
Device Trainer::device() const {
  return run_->device;
}
const TrainState& Trainer::state() const {
  return run_->state;
}
const std::vector<float>& Trainer::step_losses() const {
  return run_->step_losses;
}
int64_t Trainer::batches_per_epoch() const {
  return run_->loader->num_batches();
}
bool Trainer::language_model() const {
  return std::string_view(run_->task->unit()) == "tokens";
}
int Trainer::rank() const {
  return run_->rank();
}
int Trainer::world_size() const {
  return run_->world_size();
}
const dist::DistributedDataParallel* Trainer::ddp() const {
  return run_->main().ddp();
}

void Trainer::load_weights(const Checkpoint& ckpt) {
  restore_run(*run_, ckpt, /*everything=*/false);
}

void Trainer::save(const std::string& path) const {
  save_run(*run_, path);
}

std::string Trainer::summary_json(const TrainResult& result) const {
  return summary_of(*run_, result);
}

std::string Trainer::result_line(const TrainResult& result) const {
  return run_->task->result_line(result, *run_);
}

void save_run(const Run& run, const std::string& path) {
  NamedTensors model, opt, scaler;
  for (const auto& t : run.trainees)
    t->save(model, opt, scaler, run);  // (ZeRO-1: every rank sends its share)
  if (run.rank() != 0) return;
  for (auto& [name, t] : run.task->state_dict())
    opt.emplace_back(std::string(kTaskState) + "." + name, t);
  TrainState s = run.state;
  s.generator = generator_state();
  save_checkpoint(path, run.config, s, model, opt, scaler);
}

double EvalResult::perplexity() const {
  return std::exp(loss);
}

double EvalResult::metric(const std::string& name) const {
  for (const auto& [n, v] : metrics)
    if (n == name) return v;
  return std::nan("");
}

EvalResult evaluate_checkpoint(const std::string& path, const EvalOptions& options) {
  Checkpoint ckpt = load_checkpoint(path);
  TrainConfig c = ckpt.config;
  c.device = options.device;
  for (const config::OptionInfo& o : config::options()) {
    if (o.resume == config::Resume::Output || o.resume == config::Resume::Launch)
      config::set_value_json(c, o.field, config::value_json(TrainConfig{}, o.field));
  }
  c.progress = false;
  c.distributed = false;
  c.zero = 0;
  c.grad_comm = config::GradComm::Fp32;
  if (!options.data_dir.empty()) c.data_dir = options.data_dir;
  if (!options.data_path.empty()) {
    c.data_path = options.data_path;
    c.tokenizer.clear();  // the new directory's tokenizer.json (the checkpoint checks it)
  }
  if (!options.val_path.empty()) c.val_path = options.val_path;
  if (!options.tokenizer.empty()) c.tokenizer = options.tokenizer;
  Trainer t(c);
  t.load_weights(ckpt);  // the models, and an fp8 run's scales: evaluation quantizes with them
  return t.evaluate();
}

}  // namespace mantissa::train
