// The options of `mantissa train`, made from the option table (config/train_config.h): one CLI
// option per row, in its --help section, with its help, its words and its default; what the
// command line set comes back as config::GivenOptions for config::resolve / merge_resume.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>

#include "mantissa/config/run_config.h"

namespace mantissa::cli {

class TrainOptions {
 public:
  // Adds every option of the table to `cmd`.
  explicit TrainOptions(CLI::App& cmd);
  // The options given on this command line, as text, after the parse.
  config::GivenOptions given() const;

 private:
  CLI::App& cmd_;
  std::map<config::Field, std::pair<CLI::Option*, std::unique_ptr<std::string>>> options_;
};

// The text of an option's --help: its help, its words (with theirs) and its default.
std::string option_help(const config::OptionInfo& o);

}  // namespace mantissa::cli
