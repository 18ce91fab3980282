// The option parser's errors, explained in the command line's words (parse_errors.cpp).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace mantissa::cli {

struct ParseErrorText {
  std::string command;  // "mantissa train", or "mantissa" when no subcommand was named
  std::string message;  // what was wrong, ending with the help to run
};

// What `e` means for the command line `args` (argv as given).
ParseErrorText explain_parse_error(const CLI::App& app, const std::vector<std::string>& args,
                                   const CLI::ParseError& e);

}  // namespace mantissa::cli
