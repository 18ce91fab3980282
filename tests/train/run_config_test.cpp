// TOML run configs (train/run_config.h) and the log2 histogram of the underflow measurement.
#include "mantissa/train/run_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/errors.h"
#include "mantissa/core/error.h"
#include "train/run_log.h"

namespace mantissa::train {
namespace {

using testing::error_of;

TEST(RunConfig, EveryFieldHasAKeyThatNamesItBack) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(TrainConfig{}.to_json());
  for (const auto& [field, value] : j.items()) {
    const std::string key = config_key_of_field(field);
    EXPECT_EQ(key.find('_'), std::string::npos) << key;
    EXPECT_EQ(field_of_config_key(key), field) << key;
  }
  EXPECT_EQ(config_key_of_field("warmup_steps"), "warmup");
  EXPECT_EQ(config_key_of_field("max_steps"), "steps");
  EXPECT_EQ(config_key_of_field("tensorboard_dir"), "tensorboard");
  EXPECT_EQ(field_of_config_key("batch_size"), "batch_size");  // underscores stand for dashes
  EXPECT_EQ(field_of_config_key("bach-size"), "");
}

TEST(RunConfig, PrintedConfigReadsBackToTheSameRun) {
  TrainConfig c;
  c.model = "gpt2_tiny";
  c.data = "synthetic-text";
  c.lr = 3e-4;
  c.eps = 1e-8;
  c.beta2 = 0.95;
  c.weight_decay = 0.1;
  c.init_scale = 1024;
  c.precision = "fp16";
  c.opt_level = "O2";
  c.seed = 12345678901ull;
  c.metrics_path = "out/with \"quotes\" and \\ and\nnewline.jsonl";
  c.checkpoint_activations = true;
  const std::string text = to_toml(c);
  const TrainConfig back = resolve_run_config(TrainConfig{}, text, "printed.toml");
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
  TrainConfig cli;
  cli.batch_size = 16;
  cli.lr = 0.01;
  const TrainConfig c = resolve_run_config(base, "batch-size = 64\nepochs = 2\nseed = 9\n",
                                           "run.toml", cli, {"batch_size"});
  EXPECT_EQ(c.model, "mlp");    // the base
  EXPECT_EQ(c.lr, 0.2);         // the base: lr not given on the command line
  EXPECT_EQ(c.epochs, 2);       // the file
  EXPECT_EQ(c.seed, 9u);        // the file
  EXPECT_EQ(c.batch_size, 16);  // the command line
  EXPECT_EQ(resolve_run_config(TrainConfig{}, "lr = 1", "f").lr, 1.0);  // an integer float
}

TEST(RunConfig, MistakesNameTheFileTheLineAndTheKey) {
  auto err = [](const std::string& toml) {
    return error_of([&] { resolve_run_config(TrainConfig{}, toml, "run.toml"); });
  };
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
  EXPECT_NE(err("optimizer = \"adam\"").find("run.toml:1: 'optimizer': unknown optimizer 'adam'"),
            std::string::npos)
      << err("optimizer = \"adam\"");
  EXPECT_NE(err("threads = 99999999999").find("run.toml:1: 'threads'"), std::string::npos);
  EXPECT_NE(err("seed = -1").find("run.toml:1: 'seed'"), std::string::npos) << err("seed = -1");
  EXPECT_NE(err("model = \"mlp").find("run.toml:1:"), std::string::npos);
  EXPECT_NE(err("model = \"mlp").find("not valid TOML"), std::string::npos);
  EXPECT_NE(err("[train]\nmodel = \"mlp\"").find("run.toml:1: 'train' is a table"),
            std::string::npos);
  EXPECT_NE(err("batch-size = 8\nbatch_size = 16")
                .find("run.toml:2: 'batch_size' sets "
                      "'batch-size' again (line 1)"),
            std::string::npos);
  EXPECT_NE(err("resume = \"x.safetensors\"").find("--resume CHECKPOINT on the command line"),
            std::string::npos);
  // A value the command line set is the command line's to answer for: no line is named.
  TrainConfig cli;
  cli.batch_size = -1;
  const std::string from_cli = error_of([&] {
    resolve_run_config(TrainConfig{}, "batch-size = 4", "run.toml", cli, {"batch_size"});
  });
  EXPECT_NE(from_cli.find("--batch-size must be positive"), std::string::npos);
  EXPECT_EQ(from_cli.find("run.toml"), std::string::npos) << from_cli;
}

// toml++ 3.3 met these with undefined behaviour (fuzz/regressions/run_config): now a syntax error
// where TOML allows no such character, and the text itself in strings and comments.
TEST(RunConfig, NonAsciiIsTextInStringsAndASyntaxErrorElsewhere) {
  const std::string cafe = "caf\xC3\xA9", u0459 = "\xD1\x99", ufefd = "\xEF\xBB\xBD";
  const TrainConfig c = resolve_run_config(
      {}, "\xEF\xBB\xBF# " + cafe + "\ndata-path = \"" + cafe + u0459 + ufefd + "\"\n", "f");
  EXPECT_EQ(c.data_path, cafe + u0459 + ufefd);
  for (const std::string& bad : {ufefd + "model = \"mlp\"", "metrics = -\"a" + u0459 + "\"",
                                 "model = \"mlp\"\n" + cafe + " = 1", "lr = 1" + u0459}) {
    const std::string e = error_of([&] { resolve_run_config({}, bad, "run.toml"); });
    EXPECT_NE(e.find("not valid TOML"), std::string::npos) << bad << ": " << e;
  }
}

TEST(Log2Histogram, OneBucketPerBinaryExponent) {
  const float tiny = std::numeric_limits<float>::denorm_min();  // 2^-149
  const std::vector<float> v = {1.0f,  1.5f, -1.99f, 2.0f,
                                0.25f, 0.0f, tiny,   std::numeric_limits<float>::infinity()};
  const io::Histogram h = log2_histogram(v);
  EXPECT_EQ(h.num, 6);  // zero and inf left out
  EXPECT_EQ(h.min, -149);
  EXPECT_EQ(h.max, 2);
  ASSERT_EQ(h.limits.size(), size_t(1 - (-149) + 1));
  EXPECT_EQ(h.limits.front(), -148);
  EXPECT_EQ(h.counts.front(), 1);            // 2^-149
  EXPECT_EQ(h.counts[size_t(-2 + 149)], 1);  // 0.25
  EXPECT_EQ(h.counts[size_t(0 + 149)], 3);   // 1, 1.5, -1.99
  EXPECT_EQ(h.counts.back(), 1);             // 2
  EXPECT_EQ(h.limits.back(), 2);
}

}  // namespace
}  // namespace mantissa::train
