// The precision study (include/mantissa/study/study.h, docs/study.md).
#include "mantissa/study/study.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"
#include "mantissa/core/error.h"
#include "mantissa/data/text_corpus.h"
#include "mantissa/data/tokenizer.h"
#include "mantissa/data/tokens.h"
#include "mantissa/train/gan.h"
#include "mantissa/train/recommender.h"
#include "mantissa/train/trainer.h"

namespace mantissa::study {

using namespace mantissa::train;  // the runs of the study are the training layer's

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const std::vector<StudyRecipe>& study_recipes() {
  using amp::OptLevel;
  using amp::Precision;
  using config::StoreRounding;
  constexpr config::LossScale kDynamic{}, kOne{1.0};
  static const std::vector<StudyRecipe> recipes = {
      {"fp32", "fp32 everywhere (the reference)", Precision::FP32, {}, kDynamic, {}, {}, {}},
      {"tf32",
       "fp32 with GEMM/conv inputs rounded to tf32",
       Precision::TF32,
       {},
       kDynamic,
       {},
       {},
       {}},
      {"bf16-O1",
       "autocast to bf16, fp32 weights",
       Precision::BF16,
       OptLevel::O1,
       kDynamic,
       {},
       {},
       {}},
      {"bf16-O2",
       "bf16 weights and activations, fp32 masters, round to nearest even",
       Precision::BF16,
       OptLevel::O2,
       kDynamic,
       StoreRounding::Nearest,
       {},
       {}},
      {"bf16-O2-trunc",
       "bf16-O2 with the weights stored truncated (toward zero)",
       Precision::BF16,
       OptLevel::O2,
       kDynamic,
       StoreRounding::Truncate,
       {},
       {}},
      {"bf16-pure",
       "bf16 weights without fp32 masters, stochastic rounding",
       Precision::BF16Pure,
       {},
       kDynamic,
       {},
       {},
       {}},
      {"fp16-O1",
       "autocast to fp16, fp32 weights, dynamic loss scaling",
       Precision::FP16,
       OptLevel::O1,
       kDynamic,
       {},
       {},
       {}},
      {"fp16-O2",
       "fp16 weights, fp32 masters, dynamic loss scaling",
       Precision::FP16,
       OptLevel::O2,
       kDynamic,
       {},
       {},
       {}},
      {"fp16-noscale",
       "fp16-O1 without loss scaling (a static scale of 1)",
       Precision::FP16,
       OptLevel::O1,
       kOne,
       {},
       {},
       {}},
      {"fp8-delayed",
       "fp8 Linear GEMMs, per-tensor delayed scaling (E4M3 forward, E5M2 gradients), the rest "
       "bf16-O1",
       Precision::FP8,
       OptLevel::O1,
       kDynamic,
       {},
       amp::Fp8Recipe::Delayed,
       {}},
      {"fp8-current",
       "fp8 Linear GEMMs, per-tensor current scaling, the rest bf16-O1",
       Precision::FP8,
       OptLevel::O1,
       kDynamic,
       {},
       amp::Fp8Recipe::Current,
       {}},
      {"fp8-mxfp8",
       "fp8 Linear GEMMs, MXFP8 32-element blocks, the rest bf16-O1",
       Precision::FP8,
       OptLevel::O1,
       kDynamic,
       {},
       amp::Fp8Recipe::MXFP8,
       {}},
      {"fp8-rowwise",
       "fp8 Linear GEMMs, torchao's rowwise recipe (a power-of-two scale per row, E4M3 "
       "everywhere), the rest bf16-O1",
       Precision::FP8,
       OptLevel::O1,
       kDynamic,
       {},
       amp::Fp8Recipe::Rowwise,
       {}},
      {"fp8-rowwise-gw-hp",
       "fp8 Linear GEMMs, torchao's rowwise_with_gw_hp (the weight gradient in bf16), the rest "
       "bf16-O1",
       Precision::FP8,
       OptLevel::O1,
       kDynamic,
       {},
       amp::Fp8Recipe::RowwiseGwHp,
       {}},
      {"fp8-fast-accumulate",
       "fp8-current with the tensor cores' 13-bit accumulator for whole sums (cuBLASLt's "
       "fast accumulation), modelled",
       Precision::FP8,
       OptLevel::O1,
       kDynamic,
       {},
       amp::Fp8Recipe::Current,
       {},
       {.fast = true}},
      {"fp8-fast-accumulate-128",
       "fp8-fast-accumulate with the partial sums promoted to fp32 every 128 products "
       "(DeepSeek-V3)",
       Precision::FP8,
       OptLevel::O1,
       kDynamic,
       {},
       amp::Fp8Recipe::Current,
       {},
       {.fast = true, .promote_every = 128}},
      {"fp4-nvfp4",
       "NVFP4 Linear GEMMs with the paper's recipe (RHT on wgrad, 16x16 weight blocks, SR "
       "gradients, the last 15% of layers bf16), the rest bf16-O1",
       Precision::FP4,
       OptLevel::O1,
       kDynamic,
       {},
       {},
       {}},
      {"fp4-nvfp4-no-rht",
       "fp4-nvfp4 without the Random Hadamard Transform",
       Precision::FP4,
       OptLevel::O1,
       kDynamic,
       {},
       {},
       {.rht = false}},
      {"fp4-nvfp4-no-2d",
       "fp4-nvfp4 with 1x16 weight blocks (backward quantizes the weight again)",
       Precision::FP4,
       OptLevel::O1,
       kDynamic,
       {},
       {},
       {.two_d = false}},
      {"fp4-nvfp4-no-sr",
       "fp4-nvfp4 with gradients rounded to nearest",
       Precision::FP4,
       OptLevel::O1,
       kDynamic,
       {},
       {},
       {.sr = false}},
      {"fp4-mxfp4",
       "MXFP4 Linear GEMMs (32-element blocks, E8M0 scales by the OCP rule), RHT and SR as "
       "fp4-nvfp4",
       Precision::FP4,
       OptLevel::O1,
       kDynamic,
       {},
       {},
       {.recipe = amp::Fp4Recipe::MXFP4}},
      // The optimizer's state in fewer bytes, on bf16-O2 (docs/memory.md).
      {"state-bf16",
       "bf16-O2 with the optimizer state (momentum, AdamW's moments) in bf16",
       Precision::BF16,
       OptLevel::O2,
       kDynamic,
       StoreRounding::Nearest,
       {},
       {},
       {},
       optim::StateFormat::BF16},
      {"state-fp8",
       "bf16-O2 with the optimizer state in fp8 E4M3 under an absmax per 256 (the second moment "
       "as its root)",
       Precision::BF16,
       OptLevel::O2,
       kDynamic,
       StoreRounding::Nearest,
       {},
       {},
       {},
       optim::StateFormat::FP8},
      {"state-8bit",
       "bf16-O2 with the optimizer state in bitsandbytes' blockwise dynamic 8-bit",
       Precision::BF16,
       OptLevel::O2,
       kDynamic,
       StoreRounding::Nearest,
       {},
       {},
       {},
       optim::StateFormat::Q8},
      {"bf16-pure-kahan",
       "bf16 weights without fp32 masters, Kahan-compensated (a bf16 buffer of each weight's "
       "rounding error), stores to nearest",
       Precision::BF16Pure,
       {},
       kDynamic,
       {},
       {},
       {},
       {},
       optim::StateFormat::F32,
       optim::Compensation::Kahan},
      {"bf16-pure-kahan-8bit",
       "bf16-pure-kahan with the optimizer state in blockwise 8-bit: about 6 bytes a parameter",
       Precision::BF16Pure,
       {},
       kDynamic,
       {},
       {},
       {},
       {},
       optim::StateFormat::Q8,
       optim::Compensation::Kahan},
  };
  return recipes;
}

const std::vector<StudyFamily>& study_families() {
  static const std::vector<StudyFamily> families = {
      {"mlp", "MLP", "test_accuracy", true, true, "test accuracy (%)"},
      {"cnn", "CNN", "test_accuracy", true, true, "test accuracy (%)"},
      {"resnet", "CNN", "test_accuracy", true, true, "test accuracy (%)"},
      {"lstm", "RNN", "test_loss", false, true, "validation loss (nats/token)"},
      {"gpt2_tiny", "transformer", "test_loss", false, true, "validation loss (nats/token)"},
      {"dcgan", "GAN", "frechet_distance", false, false,
       "Fréchet distance (Mantissa's cnn features, not Inception)"},
      {"dcn", "recommender", "loss", false, false, "held-out log loss"},
  };
  return families;
}

namespace {

// The entry of `table` called `name`, or an error naming what there is ("the study has no
// <what> '<name>'; choose from a, b, c").
template <typename Entry>
const Entry& find_named(const std::vector<Entry>& table, const std::string& name,
                        const char* what) {
  for (const Entry& e : table)
    if (e.name == name) return e;
  std::string names;
  for (const Entry& e : table)
    names += (names.empty() ? "" : ", ") + e.name;
  MT_CHECK(false, "the study has no ", what, " '", name, "'; choose from ", names);
  throw;  // unreachable
}

const StudyFamily& family_of(const std::string& name) {
  return find_named(study_families(), name, "model family");
}

const StudyRecipe& recipe_of(const std::string& name) {
  return find_named(study_recipes(), name, "recipe");
}

std::vector<std::string> quick_recipes() {
  return {"fp32", "bf16-O1", "bf16-O2-trunc", "fp16-O1", "fp16-noscale"};
}

std::string text_dir_of(const StudyConfig& s) {
  return s.text_dir.empty() ? (fs::path(s.out_dir) / "text").string() : s.text_dir;
}

// The token shards of the language-model rows: the given directory, or out_dir/text made now
// from the fortunes corpus (byte-level tokens: no tokenizer to train, the same ids anywhere).
// Returns false when there is no corpus (the rows then train on the synthetic stream).
bool ensure_text(const StudyConfig& s, const std::function<void(const std::string&)>& say) {
  const std::string dir = text_dir_of(s);
  if (fs::exists(fs::path(dir) / "train.bin")) return true;
  MT_CHECK(s.text_dir.empty(), "--text ", s.text_dir,
           " holds no train.bin; write it with 'mantissa tokenize --out ", s.text_dir, "'");
  if (!fs::exists(data::kFortunesDir)) return false;
  data::TextCorpus corpus = data::read_text_corpus({data::kFortunesDir}, {.separator = "%"});
  data::DocumentSplit split = data::split_train_val(std::move(corpus.documents), 0.05, 0);
  const data::BpeTokenizer tok;  // byte-level
  fs::create_directories(dir);
  tok.save((fs::path(dir) / "tokenizer.json").string());
  const std::vector<uint32_t> train = tok.encode_documents(split.train);
  const std::vector<uint32_t> val = tok.encode_documents(split.val);
  data::write_token_shard((fs::path(dir) / "val.bin").string(), val, tok.vocab_size(),
                          tok.fingerprint());
  data::write_token_shard((fs::path(dir) / "train.bin").string(), train, tok.vocab_size(),
                          tok.fingerprint());
  if (say)
    say(
        fmt::format("text: the fortunes corpus, byte-level, {} training and {} validation tokens "
                    "in {}",
                    train.size(), val.size(), dir));
  return true;
}

bool has_text(const StudyConfig& s) {
  return fs::exists(fs::path(text_dir_of(s)) / "train.bin");
}

}  // namespace

TrainConfig study_cell_config(const StudyConfig& s, const std::string& family,
                              const std::string& recipe, int seed, bool probe) {
  const StudyFamily& f = family_of(family);
  const StudyRecipe& r = recipe_of(recipe);
  // The model's defaults (the GAN's Adam at 2e-4, the recommender's AdamW without decay, ...),
  // then the study's settings.
  TrainConfig c = defaults_for(f.name);
  c.seed = uint64_t(seed);
  c.threads = s.threads;
  c.device = s.device;
  c.progress = false;
  c.epochs = 1000;  // the steps end every cell
  if (f.name != "dcgan") c.schedule = optim::ScheduleKind::Cosine;
  // Each family's hyper-parameters: what trains it well in fp32 in a few hundred steps on this
  // CPU (docs/study.md); --quick shortens the run and the evaluation.
  int64_t steps = 0;
  if (f.name == "mlp" || f.name == "cnn" || f.name == "resnet") {
    c.data = config::DataKind::FashionMnist;
    c.batch_size = f.name == "mlp" ? 128 : 64;
    c.optimizer = config::OptimizerKind::Sgd;
    c.lr = f.name == "resnet" ? 0.1 : 0.05;
    c.momentum = 0.9;
    c.weight_decay = 5e-4;
    c.eval_batch_size = 500;
    steps = f.name == "mlp" ? 400 : f.name == "cnn" ? 200 : 150;
    if (f.name == "resnet") c.model = "resnet_small";
  } else if (f.name == "lstm" || f.name == "gpt2_tiny") {
    c.data = has_text(s) ? config::DataKind::Text : config::DataKind::SyntheticText;
    if (c.data == config::DataKind::Text) c.data_path = text_dir_of(s);
    if (c.data == config::DataKind::SyntheticText) c.synthetic_size = 200000;
    c.seq_len = 64;
    c.batch_size = 16;
    c.optimizer = config::OptimizerKind::AdamW;
    c.lr = f.name == "lstm" ? 3e-3 : 1e-3;
    c.weight_decay = 0.01;
    c.warmup_steps = 20;
    c.clip_grad_norm = 1.0;
    c.eval_batches = 20;
    steps = 200;
  } else if (f.name == "dcgan") {
    // The DC-GAN's settings (defaults_for: Adam 2e-4, beta1 0.5, no decay, a constant
    // learning rate); the Fréchet distance four times a run.
    c.data = config::DataKind::FashionMnist;
    c.batch_size = 64;
    steps = 400;
  } else if (f.name == "dcn") {
    // The synthetic click log with its planted model (the best log loss is known: the eval
    // records' bayes_log_loss); the recommender's usual AdamW without decay.
    c.data = config::DataKind::SyntheticClicks;
    c.synthetic_size = s.quick ? 50000 : 300000;
    c.eval_batch_size = 4096;
    steps = 500;
  }
  if (s.quick) {
    steps = f.name == "dcn" ? 150 : 30;  // a dcn step takes milliseconds
    // The Fréchet distance's cnn: its epoch took 110 of the 340 seconds of the whole quick
    // study on one core (2-core AVX2 machine); 100 steps is a feature space to compare in.
    if (f.name == "dcgan") c.fd_feature_steps = 100;
    c.warmup_steps = std::min<int64_t>(c.warmup_steps, 3);
    // An image family's first 2,000 test images; 4 validation batches (the GAN's evaluation is
    // its generated images).
    if (f.name != "dcgan") c.eval_batches = 4;
    if (f.name == "lstm" || f.name == "gpt2_tiny") c.batch_size = 8;
  }
  c.max_steps = s.steps > 0 ? s.steps : steps;
  if (c.data == config::DataKind::FashionMnist) c.data_dir = s.data_dir;
  // The GAN's Fréchet distance needs a feature network (the cnn trained one epoch): train_gan
  // keeps it beside the metrics file, so every dcgan cell of a study shares one.
  if (f.name == "dcgan")
    c.metrics_path =
        (fs::path(s.out_dir) / "cells" / "dcgan" /
         fmt::format("{}-seed{}{}.metrics.jsonl", recipe, seed, probe ? "-underflow" : ""))
            .string();
  c.eval_every = std::max<int64_t>(1, c.max_steps / (s.quick ? 2 : 4));
  c.log_every = std::max<int64_t>(1, c.max_steps / 30);
  c.precision = r.precision;
  c.opt_level = r.opt_level;
  c.loss_scale = r.loss_scale;
  c.rounding = r.rounding;
  c.compensation = r.compensation;
  if (r.optim_state != optim::StateFormat::F32) {
    // Where the family's optimizer has state (SGD without momentum has none; the recommender's
    // tables then update densely, every row's state in the format).
    if (c.optimizer != config::OptimizerKind::Sgd || c.momentum != 0) c.optim_state = r.optim_state;
  }
  if (r.precision == amp::Precision::FP8) {  // the other rows leave the fp8 options alone
    c.fp8_recipe = r.fp8_recipe;
    c.fp8_accumulate = r.fp8_accumulate;
  }
  c.fp4_recipe = r.fp4.recipe;
  c.fp4_rht = r.fp4.rht ? config::Switch::On : config::Switch::Off;
  c.fp4_2d = r.fp4.two_d ? config::Switch::On : config::Switch::Off;
  c.fp4_sr = r.fp4.sr ? config::Switch::On : config::Switch::Off;
  if (probe)
    c.underflow_every = std::max<int64_t>(1, c.max_steps / std::max(1, s.underflow_points));
  return c;
}

const std::vector<LadderRung>& ladder_rungs() {
  static const std::vector<LadderRung> rungs = {
      {"fp32",
       "fp32; gradients zeroed in place; batches finished on the host in pageable memory, "
       "each copied with a wait",
       false},
      {"amp", "+ autocast (bf16 where the device has it, else fp16 with loss scaling)", false},
      {"set_to_none", "+ zero_grad(set_to_none): gradients dropped, not zeroed", false},
      {"pinned", "+ pinned memory and non_blocking copies on the compute stream", true},
      {"prefetcher",
       "+ the side-stream prefetcher: raw pixels copied one batch ahead, normalized on the "
       "device",
       true},
  };
  return rungs;
}

std::string ladder_device(const StudyConfig& s) {
  if (s.ladder == "off") return "";
  if (s.ladder == "auto") {
    if (parse_device(s.device).is_cuda()) return s.device;
    return cuda::is_available() ? "cuda:0" : "";
  }
  Device d;
  try {
    d = parse_device(s.ladder);
  } catch (const Error& e) {
    MT_CHECK(false, "--ladder takes auto, off or a device (cpu, cuda, cuda:N): ", e.message());
  }
  if (d.is_cuda()) {
    MT_CHECK(cuda::is_available(), "--ladder ", s.ladder, ": no CUDA device (", cuda_info().status,
             "); use --ladder cpu or --ladder off");
    MT_CHECK(d.index < cuda::device_count(), "--ladder ", s.ladder, ": this machine has ",
             cuda::device_count(), " CUDA device(s)");
  }
  return s.ladder;
}

TrainConfig ladder_cell_config(const StudyConfig& s, size_t rung, const std::string& device) {
  MT_CHECK(rung < ladder_rungs().size(), "the ladder has ", ladder_rungs().size(), " rungs, not ",
           rung + 1);
  const std::string& model = s.ladder_model;
  MT_CHECK(model == "mlp" || model == "cnn" || model == "resnet", "--ladder-model ", model,
           ": the ladder measures the image pipeline (pixels normalized on the device), so it "
           "takes mlp, cnn or resnet");
  MT_CHECK(s.ladder_steps >= 0, "--ladder-steps must be 0 (one epoch) or positive, not ",
           s.ladder_steps);
  // Autocast's type: bf16 on a GPU (every one since Ampere has it at fp16's speed) and on a CPU
  // with native bf16 dot products; else fp16 with dynamic loss scaling.
  const bool bf16 = parse_device(device).is_cuda() || cpu_features().avx512_bf16;
  TrainConfig c = study_cell_config(s, model,
                                    rung == 0 ? "fp32"
                                    : bf16    ? "bf16-O1"
                                              : "fp16-O1",
                                    /*seed=*/0);
  c.device = device;
  c.zero_grad = rung < 2 ? config::ZeroGrad::Zeros : config::ZeroGrad::None;
  c.input_pipeline = rung < 3    ? data::Transfer::Pageable
                     : rung == 3 ? data::Transfer::Pinned
                                 : data::Transfer::Prefetch;
  if (s.ladder_steps > 0 || s.quick) {
    c.max_steps = s.ladder_steps > 0 ? s.ladder_steps : 30;
    c.log_every = std::max<int64_t>(1, c.max_steps / 10);
  } else {
    c.epochs = 1;
    c.max_steps = 0;
    c.log_every = 25;
  }
  // The ladder times training: one evaluation batch at the end (its peak stays below
  // training's: no gradients, no saved activations).
  c.eval_every = 0;
  c.eval_batches = 1;
  c.eval_batch_size = c.batch_size;
  return c;
}

namespace {

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

std::string cell_path(const StudyConfig& s, const std::string& family, const std::string& recipe,
                      int seed, bool probe) {
  return (fs::path(s.out_dir) / "cells" / family /
          fmt::format("{}-seed{}{}.json", recipe, seed, probe ? "-underflow" : ""))
      .string();
}

// The cell's file when it finished with this configuration (same numbers, same data): a rerun of
// the study leaves it be. The stored configuration is read as a TrainConfig, so a file written
// before a new field existed still matches when the field has its default.
std::optional<Json> finished_cell(const std::string& path, const Json& config) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    Json j = Json::parse(in);
    const Json stored =
        Json::parse(TrainConfig::from_json(j.value("config", Json()).dump()).to_json());
    if (stored == config) return j;
  } catch (const nlohmann::json::exception&) {
    // A damaged file is rerun.
  } catch (const Error&) {
    // So is one whose configuration no longer reads (a field since removed).
  }
  return std::nullopt;
}

void write_json(const std::string& path, const Json& j) {
  fs::create_directories(fs::path(path).parent_path());
  io::AtomicFile f(path, "writing '" + path + "'");
  const std::string text = j.dump(1) + "\n";
  f.write(text.data(), text.size());
  f.commit();
}

// One cell: the run with every record it made, its status and its wall time.
Json run_cell(const TrainConfig& config, const std::string& family, const std::string& recipe,
              int seed, bool probe) {
  Json cell;
  cell["model"] = family;
  cell["recipe"] = recipe;
  cell["seed"] = seed;
  cell["probe"] = probe;
  cell["config"] = Json::parse(config.to_json());
  Json train = Json::array(), eval = Json::array(), underflow = Json::array();
  Json summary, fp8 = Json::array();
  auto on_record = [&](const std::string& text) {
    Json r = Json::parse(text);
    const std::string kind = r.value("kind", "");
    if (kind == "train") {
      train.push_back(std::move(r));
    } else if (kind == "eval") {
      eval.push_back(std::move(r));
    } else if (kind == "underflow") {
      underflow.push_back(std::move(r));
    } else if (kind == "summary") {
      summary = std::move(r);
    } else if (kind == "fp8") {
      fp8.push_back(std::move(r));
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::string status = "ok", message;
  try {
    if (family == "dcgan") {
      // An earlier, unfinished run's metrics would be appended to.
      if (!config.metrics_path.empty()) fs::remove(config.metrics_path);
      fs::create_directories(fs::path(config.metrics_path).parent_path());
    }
    Trainer t(config);
    t.set_quiet(true);
    t.set_record_callback(on_record);
    cell["precision"] = t.describe_precision();
    const TrainResult r = t.fit();
    if (!r.diverged.empty()) {
      status = "diverged";
      message = r.diverged;
    }
  } catch (const Error& e) {
    // An fp8 or fp4 recipe that cannot be set up on the model (fewer than three Linear layers:
    // both keep the first and the last in bf16; a task without them) does not apply to it;
    // anything else failed: the study records why and goes on.
    status = amp::low_precision_gemms(config.precision) ? "not_applicable" : "failed";
    message = e.message();
  }
  cell["status"] = status;
  if (!message.empty()) cell["message"] = message;
  cell["wall_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  cell["train"] = std::move(train);
  cell["eval"] = std::move(eval);
  if (!underflow.empty()) cell["underflow"] = std::move(underflow);
  // The last fp8 record: every layer's amax and scale at the end.
  if (!fp8.empty()) cell["fp8"] = fp8.back();
  cell["summary"] = std::move(summary);
  return cell;
}

// The cell at `path` when it finished with this configuration (*reused = true, where given); else
// the cell run now and written there, `say` told as it starts and ends (its status, time, final
// metric).
Json finished_or_run(const std::string& path, const TrainConfig& config, const std::string& family,
                     const std::string& recipe, int seed, bool probe, const std::string& name,
                     const std::function<void(const std::string&)>& say, bool* reused) {
  if (std::optional<Json> old = finished_cell(path, Json::parse(config.to_json()))) {
    if (reused) *reused = true;
    return std::move(*old);
  }
  if (reused) *reused = false;
  if (say) say(name + " ...");
  Json cell = run_cell(config, family, recipe, seed, probe);
  write_json(path, cell);
  if (say) {
    std::string line = fmt::format("{}: {} in {:.1f} s", name, cell["status"].get<std::string>(),
                                   cell["wall_seconds"].get<double>());
    const std::string metric = family_of(family).metric;
    if (!cell["eval"].empty() && cell["eval"].back().contains(metric))
      line += fmt::format(", {} {:.4f}", metric, cell["eval"].back()[metric].get<double>());
    if (cell.contains("message")) line += " (" + cell["message"].get<std::string>() + ")";
    say(line);
  }
  return cell;
}

// The rung's time per step once warmed up (from its first train record to its last, by the
// records' train_seconds: the first steps' kernel selection and allocations left out), or the
// whole run's mean when it logged fewer than two records; its peak memory.
void add_ladder_figures(Json& cell) {
  const Json& train = cell["train"];
  const Json& summary = cell["summary"];
  int64_t first = -1, last = -1;
  for (size_t i = 0; i < train.size(); ++i) {
    if (!train[i].contains("train_seconds")) continue;
    if (first < 0) first = int64_t(i);
    last = int64_t(i);
  }
  if (first >= 0 && last > first) {
    const Json &a = train[size_t(first)], &b = train[size_t(last)];
    const int64_t steps = b["step"].get<int64_t>() - a["step"].get<int64_t>();
    cell["timed_steps"] = steps;
    cell["ms_per_step"] =
        1e3 * (b["train_seconds"].get<double>() - a["train_seconds"].get<double>()) / double(steps);
  } else if (summary.contains("train_seconds") && summary.value("steps", int64_t(0)) > 0) {
    cell["timed_steps"] = summary["steps"];
    cell["ms_per_step"] =
        1e3 * summary["train_seconds"].get<double>() / double(summary["steps"].get<int64_t>());
  }
  if (summary.contains("peak_memory_bytes"))
    cell["peak_memory_bytes"] = summary["peak_memory_bytes"];
}

// The ladder's rungs on `device`: run (or taken from out_dir/cells/ladder when finished with
// the same configuration) one after another.
Json run_ladder(const StudyConfig& s, const std::string& device,
                const std::function<void(const std::string&)>& say) {
  const Device d = parse_device(device);
  Json ladder;
  ladder["model"] = s.ladder_model;
  ladder["device"] = device;
  ladder["device_name"] = d.is_cuda() ? cuda_info().devices.at(size_t(d.index)) : cpu_name();
  std::string tag = device;
  tag.erase(std::remove(tag.begin(), tag.end(), ':'), tag.end());
  const fs::path dir = fs::path(s.out_dir) / "cells" / "ladder" / (s.ladder_model + "-" + tag);
  Json rungs = Json::array();
  const auto& all = ladder_rungs();
  for (size_t k = 0; k < all.size(); ++k) {
    const LadderRung& rung = all[k];
    const TrainConfig config = ladder_cell_config(s, k, device);
    const std::string precision(name_of(config.precision));
    const std::string recipe = precision == "fp32" ? "fp32" : precision + "-O1";
    const std::string name = fmt::format("[ladder {}/{}] {} {} on {}", k + 1, all.size(),
                                         s.ladder_model, rung.name, device);
    Json cell;
    if (rung.copies && !d.is_cuda()) {
      cell["model"] = s.ladder_model;
      cell["recipe"] = recipe;
      cell["status"] = "not_applicable";
      cell["message"] = "on the CPU batches are not copied to a device";
    } else {
      const std::string path = (dir / fmt::format("{}-{}.json", k + 1, rung.name)).string();
      cell = finished_or_run(path, config, s.ladder_model, recipe, 0, false, name, say, nullptr);
      add_ladder_figures(cell);
    }
    cell["rung"] = rung.name;
    cell["rung_index"] = k;
    cell["description"] = rung.description;
    rungs.push_back(std::move(cell));
  }
  ladder["rungs"] = std::move(rungs);
  return ladder;
}

}  // namespace

std::string run_study(const StudyConfig& s, const std::function<void(const std::string&)>& say) {
  MT_CHECK(s.seeds >= 1, "--seeds must be at least 1, not ", s.seeds);
  MT_CHECK(s.steps >= 0, "--steps must be 0 (each model's default) or positive, not ", s.steps);
  MT_CHECK(s.underflow_points >= 1, "--underflow-points must be at least 1, not ",
           s.underflow_points);
  // --models none: the ladder alone.
  const bool no_matrix = s.models.size() == 1 && s.models[0] == "none";
  std::vector<std::string> families = no_matrix ? std::vector<std::string>() : s.models;
  std::vector<std::string> recipes = s.recipes;
  if (families.empty() && !no_matrix)
    for (const StudyFamily& f : study_families())
      families.push_back(f.name);
  if (recipes.empty() && s.quick) recipes = quick_recipes();
  if (recipes.empty())
    for (const StudyRecipe& r : study_recipes())
      recipes.push_back(r.name);
  for (const std::string& f : families)
    (void)family_of(f);
  for (const std::string& r : recipes)
    (void)recipe_of(r);
  // The ladder's settings are checked before anything runs.
  const std::string ladder_on = ladder_device(s);
  if (!ladder_on.empty()) (void)ladder_cell_config(s, 0, ladder_on);
  MT_CHECK(!no_matrix || !ladder_on.empty(), "--models none runs the time/memory ladder alone, ",
           s.ladder == "off" ? std::string("and --ladder is off")
                             : "and this machine has no GPU for --ladder auto",
           "; give --ladder cpu (or cuda) or some --models");
  std::vector<std::string> probes;
  if (s.underflow_models.empty()) {
    // --quick: the picture of the first family only.
    for (const std::string& f : families)
      if (family_of(f).underflow_probe && !(s.quick && !probes.empty())) probes.push_back(f);
  } else if (!(s.underflow_models.size() == 1 && s.underflow_models[0] == "none")) {
    for (const std::string& f : s.underflow_models) {
      MT_CHECK(family_of(f).underflow_probe,
               "--underflow-models: the underflow picture is measured by "
               "the Trainer's models; ",
               f, " trains in its own loop");
      probes.push_back(f);
    }
  }
  const bool text_models = std::any_of(families.begin(), families.end(), [](const std::string& f) {
    return f == "lstm" || f == "gpt2_tiny";
  });
  if (text_models && !ensure_text(s, say) && say)
    say("text: the fortunes corpus is not installed (apt-get install fortunes): the language "
        "models train on the synthetic text stream");

  struct Planned {
    std::string family, recipe;
    int seed;
    bool probe;
  };
  std::vector<Planned> plan;
  for (const std::string& f : families)
    for (int seed = 0; seed < s.seeds; ++seed)
      for (const std::string& r : recipes)
        plan.push_back({f, r, seed, false});
  for (const std::string& f : probes)
    for (const char* r : {"fp16-O1", "fp16-noscale"})
      plan.push_back({f, r, 0, true});

  Json cells = Json::array();
  size_t done = 0, reused = 0;
  for (const Planned& p : plan) {
    ++done;
    const TrainConfig config = study_cell_config(s, p.family, p.recipe, p.seed, p.probe);
    const std::string path = cell_path(s, p.family, p.recipe, p.seed, p.probe);
    const std::string name = fmt::format("[{}/{}] {} {} seed {}{}", done, plan.size(), p.family,
                                         p.recipe, p.seed, p.probe ? " (underflow picture)" : "");
    bool was_finished = false;
    cells.push_back(finished_or_run(path, config, p.family, p.recipe, p.seed, p.probe, name, say,
                                    &was_finished));
    reused += was_finished;
  }
  if (say && reused > 0)
    say(fmt::format("{} of {} cells were finished already (in {}/cells) and not rerun", reused,
                    plan.size(), s.out_dir));
  // Seeds beyond --seeds that an earlier run of the same settings finished (e.g. more seeds for
  // a few recipes) join the results: every cell of these families and recipes that is valid now.
  size_t extra = 0;
  for (const std::string& f : families) {
    for (const std::string& r : recipes) {
      for (int seed = s.seeds;; ++seed) {
        const std::string path = cell_path(s, f, r, seed, false);
        if (!fs::exists(path)) break;
        const Json config = Json::parse(study_cell_config(s, f, r, seed).to_json());
        if (std::optional<Json> old = finished_cell(path, config)) {
          cells.push_back(std::move(*old));
          ++extra;
        }
      }
    }
  }
  if (say && extra > 0)
    say(
        fmt::format("{} cells of further seeds, finished earlier with these settings, join the "
                    "results",
                    extra));

  Json ladder;
  if (!ladder_on.empty()) {
    ladder = run_ladder(s, ladder_on, say);
  } else {
    ladder["skipped"] = s.ladder == "off" ? std::string("--ladder off")
                                          : "no GPU (" + cuda_info().status +
                                                "); --ladder cpu runs the rungs that apply on "
                                                "the CPU";
    if (say && s.ladder == "auto")
      say("the time/memory ladder: " + ladder["skipped"].get<std::string>());
  }

  Json results;
  Json study;
  study["command"] = s.command;
  study["version"] = s.version;
  study["machine"] = {{"cpu", cpu_name()},
                      {"cpu_features", cpu_features().describe()},
                      {"hardware_threads", std::thread::hardware_concurrency()},
                      {"threads", s.threads},
                      {"device", s.device}};
  study["steps"] = s.steps;
  study["seeds"] = s.seeds;
  study["quick"] = s.quick;
  results["study"] = std::move(study);
  Json fams = Json::array();
  for (const std::string& f : families) {
    const StudyFamily& fam = family_of(f);
    fams.push_back({{"name", fam.name},
                    {"kind", fam.kind},
                    {"metric", fam.metric},
                    {"metric_label", fam.metric_label},
                    {"higher_is_better", fam.higher_is_better}});
  }
  results["families"] = std::move(fams);
  Json recs = Json::array();
  for (const std::string& r : recipes) {
    const StudyRecipe& rec = recipe_of(r);
    recs.push_back({{"name", rec.name}, {"description", rec.description}});
  }
  results["recipes"] = std::move(recs);
  results["cells"] = std::move(cells);
  results["ladder"] = std::move(ladder);
  const std::string path = (fs::path(s.out_dir) / "results.json").string();
  write_json(path, results);
  return path;
}

}  // namespace mantissa::study
