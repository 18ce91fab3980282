// The option table walked end to end: every option of `mantissa train`, given on the command line
// (tools/mantissa/train_options.h, the CLI's own parser), reaches the struct, goes out as TOML
// (--print-config) and back (--config), into a checkpoint's metadata and back (--config-from),
// and meets --resume by its declared policy: a Fixed option given with another value is refused
// naming it, the others are applied. A new row is walked without a line added here.
#include "train_options.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/config/run_config.h"
#include "mantissa/train/checkpoint.h"

namespace mantissa::config {
namespace {

using Options = std::vector<std::pair<std::string, std::string>>;

// A value of the option other than its default, as the command line spells it, that validate()
// takes with the options of `enablers_of`.
std::string other_value(const OptionInfo& o) {
  const TrainConfig d;
  const std::string def = value_text(d, o.field);
  switch (o.field) {
    case Field::model:
      return "mlp";
    case Field::device:
      return "cuda:1";  // parsed, not opened: no Trainer is built here
    case Field::loss_scale:
      return "512";
    case Field::fp8_accumulate:
      return "fast:128";
    case Field::state_block:
      return "512";  // a power of two
    default:
      break;
  }
  switch (o.kind) {
    case ValueKind::Bool:
      return def == "true" ? "false" : "true";
    case ValueKind::Integer:
    case ValueKind::Unsigned: {
      const double v = std::stod(def) + 1;
      return std::to_string(int64_t(v <= o.range.hi ? v : o.range.lo));
    }
    case ValueKind::Real: {
      const double v = std::stod(def);
      return fmt::format("{}", v > 0 ? v / 2 : 0.25);  // the shortest exact form
    }
    case ValueKind::Text:
      return "walk/" + std::string(o.key);
    case ValueKind::Word: {
      // The word after the default's.
      for (size_t i = 0; i < o.words.size(); ++i)
        if (o.words[i].name == def) return std::string(o.words[(i + 1) % o.words.size()].name);
      ADD_FAILURE() << o.key << ": the default '" << def << "' is not one of its words";
      return def;
    }
    case ValueKind::OptionalWord:
      return std::string(o.words.front().name);
  }
  return def;
}

// The options another option's other value needs beside it (validate()'s rules between options).
Options enablers_of(Field f) {
  switch (f) {
    case Field::loss_scale:
    case Field::init_scale:
    case Field::underflow_every:
      return {{"precision", "fp16"}};

    case Field::grad_comm:
    case Field::zero:
      return {{"distributed", "true"}};
    case Field::checkpoint_every:
      return {{"checkpoint", "walk/run.safetensors"}};
    case Field::embedding_update:
    case Field::exp_avg_state:
    case Field::exp_avg_sq_state:
      return {{"optimizer", "adamw"}};
    case Field::compensation:
      return {{"precision", "bf16-pure"}};
    default:
      return {};
  }
}

TrainConfig plain_defaults(const std::string& model) {
  TrainConfig c;
  c.model = model;
  return c;
}

// `mantissa train` with these options, parsed by the CLI's own option objects.
GivenOptions parse_command_line(const Options& options) {
  CLI::App app;
  CLI::App* cmd = app.add_subcommand("train");
  cli::TrainOptions train_options(*cmd);
  std::vector<std::string> args{"mantissa", "train"};
  for (const auto& [key, text] : options) {
    const OptionInfo& o = option(*find_option(key));
    if (o.kind == ValueKind::Bool) {
      // A flag: --key to turn on an option off by default, --no-key for one on by default.
      args.push_back(text == "true" ? "--" + key : "--no-" + key);
    } else {
      args.push_back("--" + key);
      args.push_back(text);
    }
  }
  std::vector<const char*> argv;
  for (const std::string& a : args)
    argv.push_back(a.c_str());
  app.parse(int(argv.size()), argv.data());
  return train_options.given();
}

class OptionTableWalk : public testing::TempDirTest {};

TEST_F(OptionTableWalk, EveryOptionRoundTripsAndMeetsResumeByItsPolicy) {
  ASSERT_EQ(options().size(), kNumOptions);
  for (const OptionInfo& o : options()) {
    SCOPED_TRACE("--" + std::string(o.key));
    EXPECT_FALSE(o.help.empty());
    EXPECT_EQ(cli::option_help(o).find("(fixed on --resume)") != std::string::npos,
              o.resume == Resume::Fixed)
        << "--help says which options a resumed run keeps";
    const std::string alt = other_value(o);
    Options given = enablers_of(o.field);
    given.emplace_back(o.key, alt);

    // The command line, into the struct.
    const GivenOptions cli = parse_command_line(given);
    ASSERT_TRUE(cli.contains(o.field));
    TrainConfig c;
    ASSERT_EQ(set_value_text(c, o.field, alt), "");
    const std::string value = value_json(c, o.field);  // the value, as it is stored
    ASSERT_NE(value, value_json(TrainConfig{}, o.field)) << alt << " is the default";
    if (o.field == Field::resume_path) {
      // --resume is not an option of the configuration's sources: it names the checkpoint.
      EXPECT_EQ(cli.at(o.field).text, alt);
      continue;
    }
    ConfigSources sources;
    sources.command_line = cli;
    const TrainConfig from_cli = resolve(sources, plain_defaults);
    EXPECT_EQ(value_json(from_cli, o.field), value);

    // --print-config's TOML, read back by --config.
    ConfigSources from_file;
    from_file.file = read_toml(to_toml(from_cli), "printed.toml");
    EXPECT_EQ(resolve(from_file, plain_defaults).to_json(), from_cli.to_json());

    // A checkpoint's metadata, and --config-from (which leaves the outputs behind).
    const std::string ckpt = file(std::string(o.key) + ".safetensors");
    train::save_checkpoint(ckpt, from_cli, train::TrainState{}, {}, {});
    EXPECT_EQ(train::load_checkpoint(ckpt).config.to_json(), from_cli.to_json());
    const TrainConfig rerun = train::stored_run_config(ckpt);
    EXPECT_EQ(value_json(rerun, o.field),
              o.resume == Resume::Output ? value_json(TrainConfig{}, o.field) : value);

    // --resume of a run stored with the defaults (and the enablers), this option given.
    GivenOptions stored_options = parse_command_line(enablers_of(o.field));
    ConfigSources stored_sources;
    stored_sources.command_line = stored_options;
    const TrainConfig stored = resolve(stored_sources, plain_defaults);
    if (o.resume == Resume::Fixed) {
      const std::string e =
          testing::error_of([&] { merge_resume(stored, cli, "walk/run.safetensors"); });
      EXPECT_HAS(e, "whose --" + std::string(o.key) + " is ");
      EXPECT_HAS(e, "drop --" + std::string(o.key));
      // Given with the stored value, it is taken.
      EXPECT_NO_THROW(merge_resume(stored, stored_options, "walk/run.safetensors"));
    } else {
      const TrainConfig resumed = merge_resume(stored, cli, "walk/run.safetensors");
      EXPECT_EQ(value_json(resumed, o.field), value) << "given on --resume, it is applied";
      if (o.resume == Resume::Launch) {
        // Not given, it is this launch's default, whatever the checkpoint holds.
        const TrainConfig again = merge_resume(from_cli, stored_options, "walk/run.safetensors");
        EXPECT_EQ(value_json(again, o.field), value_json(stored, o.field));
      } else if (o.field != Field::checkpoint_path) {
        // Not given, the checkpoint's stands.
        const TrainConfig again = merge_resume(from_cli, stored_options, "walk/run.safetensors");
        EXPECT_EQ(value_json(again, o.field), value);
      }
    }
  }
}

// The command line's mistakes name the option and what it takes, from the same checks as every
// other source.
TEST(TrainOptions, ABadValueOnTheCommandLineIsTheTablesMessage) {
  ConfigSources s;
  s.command_line = parse_command_line({{"batch-size", "0"}});
  EXPECT_HAS(testing::error_of([&] { resolve(s, plain_defaults); }),
             "--batch-size must be positive, got 0");
  s.command_line = parse_command_line({{"schedule", "cosin"}});
  EXPECT_HAS(testing::error_of([&] { resolve(s, plain_defaults); }),
             "unknown --schedule 'cosin'; did you mean 'cosine'?");
}

}  // namespace
}  // namespace mantissa::config
