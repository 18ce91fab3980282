// The precision study (`mantissa study`, docs/study.md): every model family trained with every
// precision recipe from the same seed, data order and hyper-parameters, each run ("cell") kept as
// a JSON file so that an interrupted study resumes where it stopped; results.json gathers the
// cells for the report (tools/study_report.py: report.md and its plots).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mantissa/train/trainer.h"

namespace mantissa::study {

using train::kDefaultFashionMnistDir;
using train::TrainConfig;

// A precision recipe: what it sets in a cell's TrainConfig.
struct StudyRecipe {
  std::string name;  // e.g. "bf16-O2-trunc"
  std::string description;
  amp::Precision precision = amp::Precision::FP32;
  std::optional<amp::OptLevel> opt_level;
  config::LossScale loss_scale;
  std::optional<config::StoreRounding> rounding;
  amp::Fp8Recipe fp8_recipe = amp::Fp8Options{}.recipe;
  amp::Fp4Options fp4{};  // Precision::FP4: the recipe and its ablations (the seed: the run's)
  amp::Fp8Accumulation fp8_accumulate{};
  // Memory per parameter (docs/memory.md): the optimizer state's format and the weights'
  // compensation.
  optim::StateFormat optim_state = optim::StateFormat::F32;
  optim::Compensation compensation = optim::Compensation::None;
};

// fp32, tf32, bf16-O1, bf16-O2, bf16-O2-trunc, bf16-pure, fp16-O1, fp16-O2, fp16-noscale,
// fp8-delayed, fp8-current, fp8-mxfp8, fp8-rowwise, fp8-rowwise-gw-hp, fp8-fast-accumulate,
// fp8-fast-accumulate-128, fp4-nvfp4, fp4-nvfp4-no-rht, fp4-nvfp4-no-2d,
// fp4-nvfp4-no-sr, fp4-mxfp4, state-bf16, state-fp8, state-8bit, bf16-pure-kahan,
// bf16-pure-kahan-8bit: in this order.
const std::vector<StudyRecipe>& study_recipes();

// A model family of the study: the model, its data and hyper-parameters, and the number it is
// judged by (a key of its eval records).
struct StudyFamily {
  std::string name;               // the study's name for the row, e.g. "cnn", "lstm"
  std::string kind;               // "CNN", "RNN", "transformer", "GAN", "recommender", "MLP"
  std::string metric;             // e.g. "test_accuracy", "test_loss", "frechet_distance"
  bool higher_is_better = false;  // accuracy, AUC: true; losses, distances: false
  bool underflow_probe = true;    // its cells may measure fp16 underflow (the supervised tasks)
  std::string metric_label;       // for the report, e.g. "held-out log loss"
};

// mlp, cnn, resnet, lstm, gpt2_tiny, dcgan, dcn.
const std::vector<StudyFamily>& study_families();

struct StudyConfig {
  std::vector<std::string> models;  // empty: every family; {"none"}: the ladder alone
  // Empty: every recipe (--quick: fp32, bf16-O1, bf16-O2-trunc, fp16-O1, fp16-noscale).
  std::vector<std::string> recipes;
  int64_t steps = 0;  // optimizer steps per cell; 0: each family's own default
  int seeds = 1;      // seeds 0 .. seeds-1 of every cell
  std::string out_dir = "study";
  // Fewer steps and smaller data for a run of minutes (CI): --quick.
  bool quick = false;
  std::string data_dir = kDefaultFashionMnistDir;  // Fashion-MNIST (image families, the GAN)
  // Token shards for the language models (a `mantissa tokenize --out` directory). Empty:
  // out_dir/text, made on first use from the fortunes corpus, byte-level; without the corpus,
  // the synthetic text stream.
  std::string text_dir;
  // The gradient-underflow picture: the families whose fp16-O1 and fp16-noscale cells are also
  // run once (seed 0) with the measurement every steps/underflow_points steps. Empty: every
  // family the Trainer runs (--quick: the first). "none": no picture.
  std::vector<std::string> underflow_models;
  int underflow_points = 8;
  int threads = 0;  // 0: every core
  std::string device = "cpu";
  // The time/memory ladder (ladder_rungs()): auto (on a GPU when there is one: the study's
  // device when it is CUDA, else cuda:0; none without a GPU), off, or the device to run it on
  // (cpu, cuda, cuda:N; on the CPU the rungs that copy batches to a device do not apply).
  std::string ladder = "auto";
  std::string ladder_model = "cnn";  // an image family: mlp, cnn or resnet
  int64_t ladder_steps = 0;          // steps of each rung; 0: one epoch (--quick: 30)
  // Written into results.json: how the study was run and by which build.
  std::string command, version;
};

// The TrainConfig of one cell (the family's defaults, the recipe's precision, the seed). A
// probe cell measures the gradient underflow (the picture) on top.
TrainConfig study_cell_config(const StudyConfig& study, const std::string& family,
                              const std::string& recipe, int seed, bool probe = false);

// The time/memory ladder: one model trained the same steps once per rung, each rung adding one
// thing to the one before, so that its time and peak memory show what that thing buys:
// fp32 (gradients zeroed in place, batches finished on the host in pageable memory and copied
// with a wait) -> +AMP (autocast, bf16 where the device has it, else fp16 with loss scaling) ->
// +zero_grad(set_to_none) -> +pinned memory and non_blocking copies -> +the side-stream
// prefetcher with on-device normalization (TrainConfig::zero_grad, input_pipeline).
struct LadderRung {
  std::string name;         // "fp32", "amp", "set_to_none", "pinned", "prefetcher"
  std::string description;  // what it adds
  bool copies = false;      // measures the host-to-device copy: not applicable on the CPU
};
const std::vector<LadderRung>& ladder_rungs();

// The device the ladder runs on ("" when it does not run: off, or auto without a GPU). Throws a
// mantissa::Error for a device that is not there.
std::string ladder_device(const StudyConfig& study);

// The TrainConfig of rung `rung` (an index of ladder_rungs()) on `device`.
TrainConfig ladder_cell_config(const StudyConfig& study, size_t rung, const std::string& device);

// Runs every cell of the matrix not already finished in out_dir/cells (a finished cell whose
// configuration is the same is not rerun), then writes out_dir/results.json: these cells, and
// the cells of further seeds (consecutive from `seeds`) that an earlier run with the same
// settings finished. `say` gets one line
// per cell as it starts and ends. Returns the path of results.json. A cell that fails (diverges,
// or the recipe does not apply to the model) is recorded with its status and message; the study
// goes on. Then the ladder (ladder_device()), its rungs kept in out_dir/cells/ladder the same
// way, in results.json's "ladder".
std::string run_study(const StudyConfig& study, const std::function<void(const std::string&)>& say);

}  // namespace mantissa::study
