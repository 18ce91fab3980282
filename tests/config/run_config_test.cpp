// A run's configuration from its sources (config/run_config.h): TOML run configs, the command
// line over the file over the defaults, --resume's policies, and the keys' names.
#include "mantissa/config/run_config.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/errors.h"
#include "mantissa/core/error.h"

namespace mantissa::config {
namespace {

using testing::error_of;

// The defaults every model has here (the train layer's defaults_for is the CLI's).
TrainConfig plain_defaults(const std::string& model) {
  TrainConfig c;
  c.model = model;
  return c;
}

// A configuration from a TOML text (and command-line options), as `mantissa train --config`.
TrainConfig from_toml(const std::string& toml, const std::string& origin = "run.toml",
                      GivenOptions cli = {}) {
  ConfigSources s;
  s.file = read_toml(toml, origin);
  s.command_line = std::move(cli);
  return resolve(s, plain_defaults);
}

GivenOptions cli(std::initializer_list<std::pair<std::string, std::string>> options) {
  GivenOptions g;
  for (const auto& [key, text] : options) {
    const Field f = *find_option(key);
    g[f] = {text, "--" + key, false};
  }
  return g;
}

TEST(RunConfig, EveryOptionHasAKeyThatNamesItBack) {
  for (const OptionInfo& o : options()) {
    EXPECT_EQ(o.key.find('_'), std::string::npos) << o.key;
    EXPECT_EQ(find_option(o.key), o.field) << o.key;
    EXPECT_EQ(find_option(o.name), o.field) << o.name;  // underscores stand for dashes
  }
  EXPECT_EQ(option(Field::warmup_steps).key, "warmup");
  EXPECT_EQ(option(Field::max_steps).key, "steps");
  EXPECT_EQ(option(Field::tensorboard_dir).key, "tensorboard");
  EXPECT_EQ(find_option("batch_size"), Field::batch_size);
  EXPECT_FALSE(find_option("bach-size").has_value());
}

TEST(RunConfig, PrintedConfigReadsBackToTheSameRun) {
  TrainConfig c;
  c.model = "gpt2_tiny";
  c.data = DataKind::SyntheticText;
  c.lr = 3e-4;
  c.eps = 1e-8;
  c.beta2 = 0.95;
  c.weight_decay = 0.1;
  c.init_scale = 1024;
  c.precision = amp::Precision::FP16;
  c.opt_level = amp::OptLevel::O2;
  c.seed = 12345678901ull;
  c.metrics_path = "out/with \"quotes\" and \\ and\nnewline.jsonl";
  c.checkpoint_activations = true;
  const std::string text = to_toml(c);
  const TrainConfig back = from_toml(text, "printed.toml");
  EXPECT_EQ(back.to_json(), c.to_json()) << text;
  EXPECT_NE(text.find("lr = 3e-04\n"), std::string::npos) << text;
  EXPECT_NE(text.find("init-scale = 1024.0\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("resume"), std::string::npos);
}

TEST(RunConfig, TheCommandLineWinsOverTheFileWhichWinsOverTheBase) {
  TrainConfig base;
  base.model = "mlp";
  base.epochs = 3;
  base.lr = 0.2;
  ConfigSources s;
  s.stored = base;
  s.file = read_toml("batch-size = 64\nepochs = 2\nseed = 9\n", "run.toml");
  s.command_line = cli({{"batch-size", "16"}});
  const TrainConfig c = resolve(s, plain_defaults);
  EXPECT_EQ(c.model, "mlp");               // the base
  EXPECT_EQ(c.lr, 0.2);                    // the base: lr not given on the command line
  EXPECT_EQ(c.epochs, 2);                  // the file
  EXPECT_EQ(c.seed, 9u);                   // the file
  EXPECT_EQ(c.batch_size, 16);             // the command line
  EXPECT_EQ(from_toml("lr = 1").lr, 1.0);  // an integer float
}

// Without --config-from the model's defaults are the base: a task's own defaults stand under what
// the file and the command line give, and a value given equal to a general default is kept.
TEST(RunConfig, TheModelsDefaultsAreTheBaseAndGivenValuesStand) {
  const auto gan_like = [](const std::string& model) {
    TrainConfig c;
    c.model = model;
    if (model == "dcgan") c.lr = 2e-4;
    return c;
  };
  ConfigSources s;
  s.command_line = cli({{"model", "dcgan"}});
  EXPECT_EQ(resolve(s, gan_like).lr, 2e-4);
  s.command_line = cli({{"model", "dcgan"}, {"lr", "0.05"}});
  EXPECT_EQ(resolve(s, gan_like).lr, 0.05) << "an explicit --lr equal to the general default";
  s.command_line = {};
  s.file = read_toml("model = \"dcgan\"\n", "f.toml");
  EXPECT_EQ(resolve(s, gan_like).lr, 2e-4) << "the model named by the file picks the defaults";
}

// --steps without --epochs runs that many steps over as many epochs as they take.
TEST(RunConfig, StepsAloneAreNotCutShortByTheDefaultEpochs) {
  ConfigSources s;
  s.command_line = cli({{"steps", "1000"}});
  TrainConfig c = resolve(s, plain_defaults);
  EXPECT_EQ(c.max_steps, 1000);
  EXPECT_EQ(c.epochs, 0);
  s.command_line = cli({{"steps", "1000"}, {"epochs", "2"}});
  c = resolve(s, plain_defaults);
  EXPECT_EQ(c.epochs, 2) << "both given: both are limits";
  EXPECT_EQ(from_toml("steps = 10\n").epochs, 0);
}

TEST(RunConfig, MistakesNameTheFileTheLineAndTheKey) {
  auto err = [](const std::string& toml) { return error_of([&] { from_toml(toml); }); };
  const std::string typo = err("model = \"mlp\"\n\nbach-size = 32\n");
  EXPECT_NE(typo.find("run.toml:3: unknown key 'bach-size'; did you mean 'batch-size'?"),
            std::string::npos)
      << typo;
  EXPECT_NE(err("optimiser = \"adamw\"").find("did you mean 'optimizer'?"), std::string::npos);
  EXPECT_EQ(err("zzzzzzzzzz = 1").find("did you mean"), std::string::npos) << err("zzzzzzzzzz = 1");
  EXPECT_NE(
      err("batch-size = \"32\"").find("run.toml:1: 'batch-size' must be an integer, not a string"),
      std::string::npos);
  EXPECT_NE(err("lr = \"fast\"").find("'lr' must be a number"), std::string::npos);
  EXPECT_NE(err("nesterov = 1").find("'nesterov' must be true or false"), std::string::npos);
  EXPECT_NE(
      err("\n\nbatch-size = -3").find("run.toml:3: 'batch-size': --batch-size must be positive"),
      std::string::npos)
      << err("\n\nbatch-size = -3");
  EXPECT_NE(err("optimizer = \"adam\"").find("run.toml:1: 'optimizer': unknown --optimizer 'adam'"),
            std::string::npos)
      << err("optimizer = \"adam\"");
  EXPECT_NE(err("threads = 99999999999").find("run.toml:1: 'threads'"), std::string::npos);
  EXPECT_NE(err("seed = -1").find("run.toml:1: 'seed'"), std::string::npos) << err("seed = -1");
  EXPECT_NE(err("model = \"mlp").find("run.toml:1:"), std::string::npos);
  EXPECT_NE(err("model = \"mlp").find("not valid TOML"), std::string::npos);
  EXPECT_NE(err("[train]\nmodel = \"mlp\"").find("run.toml:1: 'train' is a table"),
            std::string::npos);
  EXPECT_NE(err("batch-size = 8\nbatch_size = 16")
                .find("run.toml:2: 'batch_size' sets 'batch-size' again (line 1)"),
            std::string::npos);
  EXPECT_NE(err("resume = \"x.safetensors\"").find("--resume CHECKPOINT on the command line"),
            std::string::npos);
  // A rule between options names the file's line of the option it is about.
  EXPECT_HAS(err("precision = \"fp32\"\nopt-level = \"O2\"\n"),
             "run.toml:2: 'opt-level': --opt-level O2");
  // A value the command line set is the command line's to answer for: no line is named.
  const std::string from_cli = error_of([&] {
    from_toml("batch-size = 4", "run.toml", cli({{"batch-size", "-1"}}));
  });
  EXPECT_NE(from_cli.find("--batch-size must be positive, got -1"), std::string::npos) << from_cli;
  EXPECT_EQ(from_cli.find("run.toml"), std::string::npos) << from_cli;
}

// One rule for a number, whoever gives it: the command line, a file or JSON.
TEST(RunConfig, NumbersOutsideTheirRangeAreRefusedFromEverySource) {
  for (const auto& [key, text, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"seed", "-1", "--seed must be an integer in [0, 18446744073709551615]"},
           {"steps", "-1", "--steps must be 0 or more, got -1"},
           {"batch-size", "9223372036854775807", "--batch-size must be at most 1073741824"},
           {"lr", "inf", "--lr must be a finite number"},
           {"lr", "0", "--lr must be positive, got 0"},
           {"momentum", "1", "--momentum must be in [0, 1), got 1"},
           {"grad-accum", "0", "--grad-accum must be positive, got 0"},
           {"zero", "4", "--zero must be in [0, 3], got 4"}}) {
    ConfigSources s;
    s.command_line = cli({{key, text}});
    EXPECT_HAS(error_of([&] { resolve(s, plain_defaults); }), says);
    s.command_line = {};
    const std::string toml_value = text == "inf" ? "inf" : text;
    const std::string from_file = error_of([&] { from_toml(key + " = " + toml_value + "\n"); });
    EXPECT_HAS(from_file, "run.toml:1: '" + key + "'");
  }
}

TEST(RunConfig, ResumeAppliesEachOptionsPolicy) {
  TrainConfig stored;
  stored.model = "mlp";
  stored.lr = 0.1;
  stored.metrics_path = "old.jsonl";
  stored.checkpoint_path = "elsewhere/run.safetensors";
  stored.distributed = true;
  stored.zero = 1;
  stored.epochs = 4;
  // Tunable and Output options given are applied; a Launch one not given is the default's; the
  // checkpoint written is the one resumed from.
  TrainConfig r =
      merge_resume(stored, cli({{"epochs", "6"}, {"metrics", "new.jsonl"}}), "copy.safetensors");
  EXPECT_EQ(r.epochs, 6);
  EXPECT_EQ(r.metrics_path, "new.jsonl");
  EXPECT_EQ(r.lr, 0.1);
  EXPECT_FALSE(r.distributed);
  EXPECT_EQ(r.zero, 0);
  EXPECT_EQ(r.checkpoint_path, "copy.safetensors") << "never a path this command did not name";
  EXPECT_EQ(r.resume_path, "copy.safetensors");
  r = merge_resume(stored, cli({{"checkpoint", "next.safetensors"}}), "copy.safetensors");
  EXPECT_EQ(r.checkpoint_path, "next.safetensors");
  // A Fixed option given with the stored value is taken; with another, refused by name.
  EXPECT_NO_THROW(merge_resume(stored, cli({{"lr", "0.1"}}), "copy.safetensors"));
  EXPECT_HAS(error_of([&] {
               merge_resume(stored, cli({{"lr", "0.2"}}), "copy.safetensors");
             }),
             "whose --lr is 0.1; this run's is 0.2: drop --lr or start a new run");
}

// toml++ 3.3 met these with undefined behaviour (fuzz/regressions/run_config): now a syntax error
// where TOML allows no such character, and the text itself in strings and comments.
TEST(RunConfig, NonAsciiIsTextInStringsAndASyntaxErrorElsewhere) {
  const std::string cafe = "caf\xC3\xA9", u0459 = "\xD1\x99", ufefd = "\xEF\xBB\xBD";
  const TrainConfig c =
      from_toml("\xEF\xBB\xBF# " + cafe + "\ndata-path = \"" + cafe + u0459 + ufefd + "\"\n", "f");
  EXPECT_EQ(c.data_path, cafe + u0459 + ufefd);
  for (const std::string& bad : {ufefd + "model = \"mlp\"", "metrics = -\"a" + u0459 + "\"",
                                 "model = \"mlp\"\n" + cafe + " = 1", "lr = 1" + u0459}) {
    const std::string e = error_of([&] { from_toml(bad); });
    EXPECT_NE(e.find("not valid TOML"), std::string::npos) << bad << ": " << e;
  }
}

}  // namespace
}  // namespace mantissa::config
