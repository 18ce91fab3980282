// `mantissa eval`: a checkpoint's evaluation, as the run that wrote it evaluates.
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/trainer.h"

namespace mantissa::cli {

Command add_eval_command(CLI::App& app) {
  struct EvalArgs {
    std::string checkpoint;
    train::EvalOptions options;
    int threads = 0;
    bool json = false;
  };
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "A checkpoint's evaluation: test loss and accuracy of an image model, validation loss and "
      "perplexity of a language model, held-out log loss and AUC of a recommender, the Frechet "
      "distance of a GAN");
  cmd->add_option("--checkpoint", args->checkpoint, "A checkpoint written by mantissa train")
      ->required();
  cmd->add_option("--data-dir", args->options.data_dir,
                  "Directory of the Fashion-MNIST .gz files (default: the run's)");
  cmd->add_option("--data-path", args->options.data_path,
                  "Language models: the token shards' directory, or a click log (default: the "
                  "run's)");
  cmd->add_option("--val-path", args->options.val_path,
                  "The held-out shard or log (default: the run's)");
  cmd->add_option("--tokenizer", args->options.tokenizer,
                  "Language models: the tokenizer JSON (default: the run's)");
  cmd->add_option("--device", args->options.device,
                  "cpu, cuda or cuda:N (any device, whichever the run trained on)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Compute threads (0: every core)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print JSON");
  return [args] {
    MT_CHECK(args->threads >= 0, "--threads must be >= 0 (0: every core), got ", args->threads);
    train::require_device(args->options.device);
    if (args->threads > 0) set_num_threads(args->threads);
    const train::Checkpoint ckpt = train::load_checkpoint(args->checkpoint);
    const train::EvalResult r = train::evaluate_checkpoint(args->checkpoint, args->options);
    const std::string& model = ckpt.config.model;
    if (args->json) {
      nlohmann::ordered_json j;
      j["checkpoint"] = args->checkpoint;
      j["model"] = model;
      for (const auto& [name, v] : r.metrics)
        j[name] = v;
      j["samples"] = r.samples;
      j["device"] = args->options.device;
      fmt::print("{}\n", json_line(j));
      return 0;
    }
    fmt::print("{} ({} after {} steps): {} on {} {}\n", args->checkpoint, model, ckpt.state.step,
               r.text, r.samples, r.unit);
    return 0;
  };
}

}  // namespace mantissa::cli
