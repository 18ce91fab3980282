// The `mantissa` command line.
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "build_info.h"
#include "commands.h"
#include "mantissa/core/error.h"
#include "mantissa/dist/communicator.h"
#include "parse_errors.h"

namespace {

// CLI11 reads "-inf" and "-nan" as bundles of short flags; a leading space makes them plain
// arguments again (parse_number trims it). Negative decimals like -1.5 it already accepts.
std::vector<std::string> protect_negative_words(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string lower = args[i];
    for (auto& c : lower)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "-inf" || lower == "-infinity" || lower == "-nan") args[i] = " " + args[i];
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  namespace cli = mantissa::cli;
  CLI::App app{"Mantissa: mixed-precision training engine", "mantissa"};
  app.require_subcommand(1);
  app.set_version_flag("--version", cli::version_text,
                       "Show the version, git commit, build type, CPU features and which of "
                       "CUDA, cuDNN, NCCL and MPI are built in, then exit");

  std::map<const CLI::App*, cli::Command> commands;
  auto add = [&](cli::Command (*adder)(CLI::App&)) {
    cli::Command run = adder(app);
    commands[app.get_subcommands({}).back()] = std::move(run);
  };
  add(cli::add_train_command);
  add(cli::add_eval_command);
  add(cli::add_bench_command);
  add(cli::add_tokenize_command);
  add(cli::add_generate_command);
  add(cli::add_study_command);
  add(cli::add_clicks_command);
  add(cli::add_formats_command);
  add(cli::add_info_command);

  std::vector<std::string> args = protect_negative_words(argc, argv);
  std::vector<char*> argp;
  for (auto& a : args)
    argp.push_back(a.data());
  try {
    app.parse(static_cast<int>(argp.size()), argp.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // "mantissa train: unknown option --bach-size; did you mean --batch-size?"
    const cli::ParseErrorText text = cli::explain_parse_error(app, args, e);
    std::fprintf(stderr, "%s: %s\n", text.command.c_str(), text.message.c_str());
    return cli::kUsageError;
  }

  for (const CLI::App* sub : app.get_subcommands()) {
    try {
      return commands.at(sub)();
    } catch (const mantissa::Error& e) {
      const int code = e.internal() ? 1 : cli::kUsageError;
      // Under mpirun the other ranks would wait for this one forever: stop the whole job.
      if (mantissa::dist::launched_by_mpi()) {
        mantissa::dist::abort_job(sub->get_name() + ": " + e.message(), code);
      }
      std::fprintf(stderr, "mantissa %s: %s\n", sub->get_name().c_str(), e.message().c_str());
      return code;
    } catch (const std::exception& e) {
      if (mantissa::dist::launched_by_mpi())
        mantissa::dist::abort_job(sub->get_name() + ": " + e.what());
      std::fprintf(stderr, "mantissa %s: %s\n", sub->get_name().c_str(), e.what());
      return 1;
    }
  }
  return 0;
}
