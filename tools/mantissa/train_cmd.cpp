// `mantissa train`: the run's configuration from the table's options, a run config file, a stored
// run or a checkpoint to resume; the Trainer; the result.
#include <fmt/core.h>
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "mantissa/config/run_config.h"
#include "mantissa/core/error.h"
#include "mantissa/core/stop_signals.h"
#include "mantissa/train/trainer.h"
#include "train_options.h"

namespace mantissa::cli {
namespace {

struct TrainArgs {
  std::unique_ptr<TrainOptions> options;
  bool json = false;
  std::string config_file, config_from;
  bool print_config = false;
};

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  MT_CHECK(in.good(), what, ": cannot read '", path, "': ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Ctrl-C and SIGTERM during `train`: the first asks the trainer to stop after the step under way
// and write a checkpoint (Trainer::set_stop_flag); a second one ends the process at once, by the
// signal's default action (the last checkpoint was written atomically, so it stays whole).
std::atomic<int> g_stop{0};
std::atomic<bool> g_announce{true};  // false on ranks other than 0: one message per job
std::atomic<bool> g_distributed{false};

void on_stop_signal(int sig) {
  if (g_stop.load() != 0) {
    std::signal(sig, SIG_DFL);
    raise(sig);
    return;
  }
  g_stop.store(sig);
  if (!g_announce.load()) return;
  static const char kSay[] =
      "\nmantissa: stopping after this step and writing a checkpoint (again to quit at once)\n";
  // Data parallel, the ranks agree on the step first: a rank that died (the launcher's SIGTERM
  // to the others) leaves the job to end without one.
  static const char kSayRanks[] =
      "\nmantissa: stopping after a step every rank agrees on, then writing a checkpoint (if a "
      "rank has died, the job ends without one; again to quit at once)\n";
  const bool ranks = g_distributed.load();
  [[maybe_unused]] const ssize_t n = ranks ? write(STDERR_FILENO, kSayRanks, sizeof kSayRanks - 1)
                                           : write(STDERR_FILENO, kSay, sizeof kSay - 1);
}

// The run's configuration: a resumed run's from its checkpoint and this command's options by
// their resume policies; otherwise the model's defaults (or --config-from's stored run), the
// file's options, then the command line's.
config::TrainConfig configuration(const TrainArgs& a) {
  const config::GivenOptions given = a.options->given();
  if (const auto it = given.find(config::Field::resume_path); it != given.end()) {
    MT_CHECK(a.config_file.empty() && a.config_from.empty(),
             "--resume continues a run as its checkpoint stores it and takes no --config or "
             "--config-from; give the options that may change (--steps, --epochs, outputs) on "
             "the command line");
    const std::string& path = it->second.text;
    return config::merge_resume(train::load_checkpoint(path).config, given, path);
  }
  config::ConfigSources sources;
  if (!a.config_from.empty()) sources.stored = train::stored_run_config(a.config_from);
  if (!a.config_file.empty()) {
    sources.file = config::read_toml(read_text_file(a.config_file, "--config"), a.config_file);
  }
  sources.command_line = given;
  return config::resolve(sources, train::defaults_for);
}

// The command that continues an interrupted run: this program, the checkpoint, and what a
// resumed run takes from the command line rather than the checkpoint (the Launch options).
std::string resume_command(const train::Trainer& trainer, const std::string& checkpoint) {
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec || self.empty()) self = "mantissa";
  std::string launch = fmt::format("{} train --resume {}", self, checkpoint);
  const config::TrainConfig& run = trainer.config();
  const config::TrainConfig defaults;
  for (const config::OptionInfo& o : config::options()) {
    if (o.resume != config::Resume::Launch || o.field == config::Field::resume_path ||
        config::same_value(run, defaults, o.field))
      continue;
    const std::string value = config::value_text(run, o.field);
    if (o.kind == config::ValueKind::Bool) {
      launch += value == "true" ? fmt::format(" --{}", o.key) : fmt::format(" --no-{}", o.key);
    } else {
      launch += fmt::format(" --{} {}", o.key, value);
    }
  }
  if (trainer.world_size() > 1)
    launch = fmt::format("mpirun -n {} {}", trainer.world_size(), launch);
  return launch;
}

// The result as JSON: the summary record, the precision's description and the epochs.
void print_json(const train::TrainResult& r, const train::Trainer& trainer) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(trainer.summary_json(r));
  j["amp"] = trainer.describe_precision();
  nlohmann::ordered_json epochs = nlohmann::ordered_json::array();
  for (const auto& e : r.epochs) {
    nlohmann::ordered_json ej = {{"epoch", e.epoch}, {"train_loss", e.train_loss}};
    for (const auto& [name, v] : e.test.metrics)
      ej[name] = v;
    ej["seconds"] = e.seconds;
    ej[trainer.language_model() ? "tokens_per_s" : "samples_per_s"] = e.samples_per_s;
    epochs.push_back(ej);
  }
  j["epochs"] = epochs;
  fmt::print("{}\n", json_line(j));
}

int report_diverged(const train::TrainResult& r, const train::Trainer& trainer) {
  if (trainer.rank() != 0) return kDivergedExit;
  const config::TrainConfig& run = trainer.config();
  const std::string last =
      !r.last_good_checkpoint.empty() ? fmt::format("the last good state is step {} in {}",
                                                    r.last_good_step, r.last_good_checkpoint)
      : run.checkpoint_path.empty()
          ? std::string("there is no checkpoint (--checkpoint FILE --checkpoint-every N keeps one)")
          : "no checkpoint of a healthy state had been written yet";
  std::string help = "a smaller --lr or a --warmup, --clip-grad-norm";
  if (run.precision == amp::Precision::FP16)
    help += ", bf16 instead of fp16 (no loss scale to outgrow)";
  if (run.on_divergence != config::OnDivergence::Rollback)
    help += ", --on-divergence rollback (back to the last checkpoint with half the learning rate)";
  fmt::print(stderr,
             "mantissa train: the run diverged: {}. Training stopped after step {} and wrote "
             "nothing more; {}. What may help: {}.\n",
             r.diverged, r.steps, last, help);
  return kDivergedExit;
}

int run_training(const config::TrainConfig& config, bool json) {
  train::Trainer trainer(config);
  g_announce = trainer.rank() == 0;
  g_distributed = trainer.world_size() > 1;
  const StopSignals stop_signals(on_stop_signal);  // on its own stack: stop_signals.h
  trainer.set_stop_flag(&g_stop);
  const train::TrainResult r = trainer.fit();
  if (r.interrupted != 0) {
    if (trainer.rank() == 0) {
      fmt::print(stderr,
                 "mantissa train: stopped by {} after step {}; the state is in {}. Continue "
                 "with:\n  {}\n",
                 r.interrupted == SIGTERM ? "SIGTERM" : "Ctrl-C", r.steps, r.checkpoint,
                 resume_command(trainer, r.checkpoint));
    }
    return 128 + r.interrupted;  // 130 for SIGINT, 143 for SIGTERM, as a shell reports them
  }
  if (!r.diverged.empty()) return report_diverged(r, trainer);
  if (trainer.rank() != 0) return 0;
  if (json) {
    print_json(r, trainer);
  } else {
    fmt::print("{}\n", trainer.result_line(r));
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model (default: the cnn on Fashion-MNIST)");
  args->options = std::make_unique<TrainOptions>(*cmd);
  const std::string group = "Run configs and output";
  cmd->add_flag("--json", args->json, "Print the final result as JSON")->group(group);
  cmd->add_option("--config", args->config_file,
                  "Read the run's options from a TOML file: keys are these options' names "
                  "(batch-size = 64, precision = \"bf16\"); the command line overrides it "
                  "(examples in configs/)")
      ->group(group);
  cmd->add_option("--config-from", args->config_from,
                  "Start from the configuration a run stored in its checkpoint or metrics file "
                  "(its outputs are not taken: give new ones); --config and the command line "
                  "override it")
      ->group(group);
  cmd->add_flag("--print-config", args->print_config,
                "Print the effective configuration as TOML (a file --config reads) and exit")
      ->group(group);
  return [args] {
    const config::TrainConfig config = configuration(*args);
    if (args->print_config) {
      train::check_supported(config);
      fmt::print("# mantissa train --config FILE reads this back\n{}", config::to_toml(config));
      return 0;
    }
    return run_training(config, args->json);
  };
}

}  // namespace mantissa::cli
