// train_recommender: DCN on the synthetic click log learns toward the planted model's log loss,
// in fp32 and bf16 (and fp16 with dynamic loss scaling), with lazy and dense table updates; its
// records follow the Trainer's conventions.
#include "mantissa/train/recommender.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/data/clicks.h"

namespace mt = mantissa;

namespace {

// A small, quick run: 24,000 examples, tables of 1,000 rows, 300 steps of 128.
mt::train::TrainConfig small_run(const std::string& precision) {
  mt::train::TrainConfig c;
  c.model = "dcn";
  c.data = "synthetic-clicks";
  c.synthetic_size = 24000;
  c.hash_buckets = 1000;
  c.optimizer = "adamw";
  c.lr = 2e-3;
  c.weight_decay = 0;
  c.batch_size = 128;
  c.max_steps = 300;
  c.epochs = 0;
  c.precision = precision;
  c.log_every = 100;
  c.workers = 0;
  c.threads = 2;
  c.progress = false;
  return c;
}

void expect_learns(const mt::train::RecommenderResult& r, const char* what) {
  EXPECT_EQ(r.steps, 300) << what;
  EXPECT_TRUE(std::isfinite(r.log_loss)) << what;
  // Better than predicting the base rate, and not (much) better than the planted model: the
  // held-out loss sits between the two, moving toward the Bayes log loss.
  EXPECT_LT(r.log_loss, r.constant_log_loss - 0.02) << what;
  EXPECT_GT(r.log_loss, r.bayes_log_loss - 0.02) << what;
  EXPECT_GT(r.auc, 0.7) << what;
  std::printf(
      "%s: held-out log loss %.4f (Bayes %.4f, constant %.4f), AUC %.4f, %.2f s, "
      "tables %.3f s, other params %.3f s\n",
      what, r.log_loss, r.bayes_log_loss, r.constant_log_loss, r.auc, r.seconds,
      r.table_update_seconds, r.optimizer_seconds_rest);
}

}  // namespace

TEST(Recommender, Fp32LearnsTowardTheBayesLogLoss) {
  expect_learns(mt::train::train_recommender(small_run("fp32")), "fp32 lazy");
}

TEST(Recommender, Bf16LearnsTowardTheBayesLogLoss) {
  const auto r = mt::train::train_recommender(small_run("bf16"));
  EXPECT_EQ(r.embedding_update, "lazy");
  expect_learns(r, "bf16 O1 lazy");
}

TEST(Recommender, Bf16O2WithDenseTables) {
  auto c = small_run("bf16");
  c.opt_level = "O2";
  c.embedding_update = "dense";
  const auto r = mt::train::train_recommender(c);
  EXPECT_EQ(r.embedding_update, "dense");
  expect_learns(r, "bf16 O2 dense");
}

TEST(Recommender, Fp16DynamicLossScaleAndBf16Pure) {
  const auto r = mt::train::train_recommender(small_run("fp16"));
  expect_learns(r, "fp16 O1 lazy");
  EXPECT_GT(r.loss_scale, 1.0);
  auto c = small_run("bf16-pure");
  const auto p = mt::train::train_recommender(c);
  expect_learns(p, "bf16-pure lazy");
}

class RecommenderRecords : public mt::testing::TempDirTest {};

TEST_F(RecommenderRecords, ConfigTrainEvalSummary) {
  auto c = small_run("fp32");
  c.max_steps = 40;
  c.log_every = 10;
  c.eval_every = 20;
  c.metrics_path = file("metrics.jsonl");
  std::vector<nlohmann::json> records;
  const auto r = mt::train::train_recommender(
      c, [&](const std::string& j) { records.push_back(nlohmann::json::parse(j)); });
  ASSERT_GE(records.size(), 7u);
  EXPECT_EQ(records.front()["kind"], "config");
  EXPECT_EQ(records.front()["config"]["model"], "dcn");
  EXPECT_EQ(records.back()["kind"], "summary");
  EXPECT_EQ(records.back()["log_loss"].get<double>(), r.log_loss);
  int train = 0, eval = 0;
  for (const auto& j : records) {
    if (j["kind"] == "train") {
      ++train;
      EXPECT_EQ(j["step"].get<int64_t>() % 10, 0);
      EXPECT_TRUE(j.contains("loss") && j.contains("loss_scale") && j.contains("skipped_steps"));
    }
    if (j["kind"] == "eval") {
      ++eval;
      EXPECT_TRUE(j.contains("loss") && j.contains("auc") && j.contains("bayes_log_loss"));
    }
  }
  EXPECT_EQ(train, 4);
  EXPECT_EQ(eval, 2);  // step 20, and the end (40)
  // The metrics file holds the same records.
  std::ifstream in(file("metrics.jsonl"));
  std::string line;
  size_t lines = 0;
  while (std::getline(in, line))
    ++lines;
  EXPECT_EQ(lines, records.size());
}

TEST_F(RecommenderRecords, TrainsOnAClickLogFile) {
  mt::data::SyntheticClickOptions o;
  o.examples = 3000;
  o.hash_buckets = 1000;
  mt::data::write_synthetic_clicks(file("clicks.tsv"), o);
  auto c = small_run("fp32");
  c.data = "clicks";
  c.data_path = file("clicks.tsv");
  c.max_steps = 20;
  const auto r = mt::train::train_recommender(c);
  EXPECT_TRUE(std::isnan(r.bayes_log_loss));
  EXPECT_EQ(r.held_out_examples, 300);
  EXPECT_EQ(r.steps, 20);
}

TEST(Recommender, RefusesWhatItDoesNotTake) {
  auto c = small_run("fp32");
  c.data = "synthetic";
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }),
             "--data synthetic-clicks");
  c = small_run("fp32");
  c.model = "cnn";
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }), "not one");
  c = small_run("fp32");
  c.optimizer = "sgd";
  c.embedding_update = "lazy";
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }), "LazyAdam");
  c = small_run("fp32");
  c.checkpoint_path = "x.safetensors";
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }), "--checkpoint");
}
