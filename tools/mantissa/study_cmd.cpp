// `mantissa study`: the precision study (include/mantissa/study/study.h, docs/study.md), then its
// report (tools/study_report.py: report.md and the plots).
#include <fmt/core.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "build_info.h"
#include "commands.h"
#include "mantissa/core/error.h"
#include "mantissa/study/study.h"

namespace mantissa::cli {
namespace {

namespace fs = std::filesystem;

struct StudyArgs {
  study::StudyConfig config;
  std::string models, recipes, underflow_models;
  bool no_report = false;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Where tools/study_report.py is: $MANTISSA_STUDY_REPORT, beside an installed binary
// (../share/mantissa), or in the source tree this binary was built from.
std::string report_script() {
  if (const char* env = std::getenv("MANTISSA_STUDY_REPORT")) return env;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path installed = exe.parent_path().parent_path() / "share/mantissa/study_report.py";
    if (fs::exists(installed)) return installed.string();
  }
  const fs::path source = fs::path(MANTISSA_SOURCE_DIR) / "tools/study_report.py";
  return fs::exists(source) ? source.string() : std::string();
}

// A Python that has numpy and matplotlib: $MANTISSA_PYTHON, python3 on the PATH, or the
// system's (where Debian's python3-matplotlib is, when python3 is another installation).
std::string report_python() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MANTISSA_PYTHON")) candidates.push_back(env);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const std::string& py : candidates) {
    const std::string probe = py + " -c 'import numpy, matplotlib' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return py;
  }
  return "";
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// This process's command line, as typed (argv[0] as "mantissa"), for results.json.
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  size_t start = 0;
  for (int i = 0; start < all.size(); ++i) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    const std::string arg = i == 0 ? std::string("mantissa") : all.substr(start, end - start);
    out += (out.empty() ? "" : " ") + arg;
    start = end + 1;
  }
  return out;
}

int run(StudyArgs& a) {
  study::StudyConfig& c = a.config;
  c.models = split_list(a.models);
  c.recipes = split_list(a.recipes);
  c.underflow_models = split_list(a.underflow_models);
  c.command = command_line();
  c.version = version_number();
  const std::string results = study::run_study(
      c, [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  std::fprintf(stderr, "results: %s\n", results.c_str());
  if (a.no_report) return 0;
  const std::string script = report_script();
  const std::string how =
      fmt::format("python3 {} {} --out {}", script.empty() ? "tools/study_report.py" : script,
                  results, c.out_dir);
  MT_CHECK(!script.empty(), "the report script study_report.py is neither installed nor in ",
           MANTISSA_SOURCE_DIR, "/tools; the results are in ", results,
           "; make the report from a source tree with: ", how);
  const std::string py = report_python();
  MT_CHECK(!py.empty(),
           "the report needs Python with numpy and matplotlib (apt-get install "
           "python3-matplotlib); the results are in ",
           results, "; then run: ", how);
  const int rc = std::system(fmt::format("{} {} {} --out {}", py, shell_quoted(script),
                                         shell_quoted(results), shell_quoted(c.out_dir))
                                 .c_str());
  MT_CHECK(rc == 0, "the report script failed (exit ", rc, "); the results are kept in ", results,
           "; rerun it with: ", how);
  return 0;
}

}  // namespace

Command add_study_command(CLI::App& app) {
  auto a = std::make_shared<StudyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "study",
      "The precision study: every model family trained with every precision recipe (same seed, "
      "data order and hyper-parameters), the gradient-underflow picture, results.json and a "
      "report with plots (docs/study.md). Resumable: finished cells are not rerun");
  std::string models, recipes;
  for (const study::StudyFamily& f : study::study_families())
    models += (models.empty() ? "" : ",") + f.name;
  for (const study::StudyRecipe& r : study::study_recipes())
    recipes += (recipes.empty() ? "" : ",") + r.name;
  cmd->add_option(
      "--models", a->models,
      "Comma-separated model families (default: " + models + "; none: the ladder alone)");
  cmd->add_option("--recipes", a->recipes,
                  "Comma-separated precision recipes (default: " + recipes + ")");
  cmd->add_option("--steps", a->config.steps,
                  "Optimizer steps per cell (0: each family's default, docs/study.md)")
      ->capture_default_str();
  cmd->add_option("--seeds", a->config.seeds, "Seeds per cell (0 .. N-1)")->capture_default_str();
  cmd->add_option("--out", a->config.out_dir,
                  "Output directory: cells/, results.json, report.md, "
                  "the plots")
      ->capture_default_str();
  cmd->add_flag("--quick", a->config.quick, "A CI-sized run: 30 steps per cell, short evaluations");
  cmd->add_option("--data-dir", a->config.data_dir, "Fashion-MNIST IDX files")
      ->capture_default_str();
  cmd->add_option("--text", a->config.text_dir,
                  "Token shards for the language models (mantissa tokenize --out DIR); default: "
                  "OUT/text, made from the fortunes corpus, byte-level");
  cmd->add_option(
      "--underflow-models", a->underflow_models,
      "Families whose fp16-O1 and fp16-noscale runs are repeated once with the "
      "gradient-underflow measurement (default: every Trainer family; none: no picture)");
  cmd->add_option("--underflow-points", a->config.underflow_points,
                  "Underflow measurements over a run")
      ->capture_default_str();
  cmd->add_option("--threads", a->config.threads, "Compute threads (0: every core)")
      ->capture_default_str();
  cmd->add_option("--device", a->config.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--ladder", a->config.ladder,
                  "The time/memory ladder (fp32, +AMP, +set_to_none, +pinned non_blocking "
                  "copies, +side-stream prefetcher): auto (on a GPU when there is one), off, or "
                  "the device to run it on (cpu runs the rungs that apply there)")
      ->capture_default_str();
  cmd->add_option("--ladder-model", a->config.ladder_model,
                  "The ladder's model: mlp, cnn or resnet")
      ->capture_default_str();
  cmd->add_option("--ladder-steps", a->config.ladder_steps,
                  "Steps of each ladder rung (0: one epoch; --quick: 30)")
      ->capture_default_str();
  cmd->add_flag("--no-report", a->no_report, "Write results.json only, not the report");
  return [a, &app]() {
    (void)app;
    return run(*a);
  };
}

}  // namespace mantissa::cli
