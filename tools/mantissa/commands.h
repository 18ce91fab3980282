// Each subcommand registers its options on the app and returns the function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace mantissa::cli {

// Returns the process exit code: 0 success, 2 a user's mistake.
using Command = std::function<int()>;

Command add_formats_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_eval_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_study_command(CLI::App& app);
Command add_clicks_command(CLI::App& app);

// One JSON line of a result: bytes that are not UTF-8 (a path, a completion cut inside a
// character) as U+FFFD instead of an exception.
template <typename Json>
std::string json_line(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Exit code for a user's mistake (bad flag, bad number, bad file).
inline constexpr int kUsageError = 2;
// Exit code of `train` when the run diverged and stopped (TrainConfig::on_divergence); 1 is an
// internal error, 130/143 a run stopped by Ctrl-C/SIGTERM.
inline constexpr int kDivergedExit = 3;

}  // namespace mantissa::cli
