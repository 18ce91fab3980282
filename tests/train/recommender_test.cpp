// train_recommender: DCN on the synthetic click log learns toward the planted model's log loss,
// in fp32 and bf16 (and fp16 with dynamic loss scaling), with lazy and dense table updates; its
// records follow the Trainer's conventions.
#include "mantissa/train/recommender.h"

#include <gtest/gtest.h>

#include <bit>
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
  mt::train::TrainConfig c = mt::train::defaults_for("dcn");
  c.set("data", "synthetic-clicks");
  c.synthetic_size = 24000;
  c.hash_buckets = 1000;
  c.set("optimizer", "adamw");
  c.lr = 2e-3;
  c.weight_decay = 0;
  c.batch_size = 128;
  c.max_steps = 300;
  c.epochs = 0;
  c.set("precision", precision);
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
  c.set("opt-level", "O2");
  c.set("embedding-update", "dense");
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
  c.set("data", "clicks");
  c.synthetic_size = mt::train::defaults_for("dcn").synthetic_size;  // a file has its own size
  c.data_path = file("clicks.tsv");
  c.max_steps = 20;
  const auto r = mt::train::train_recommender(c);
  EXPECT_TRUE(std::isnan(r.bayes_log_loss));
  EXPECT_EQ(r.held_out_examples, 300);
  EXPECT_EQ(r.steps, 20);
}

TEST(Recommender, RefusesWhatItDoesNotTake) {
  auto c = small_run("fp32");
  c.set("data", "synthetic");
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }),
             "--data synthetic-clicks or clicks");
  c = small_run("fp32");
  c.model = "cnn";
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }), "not one");
  c = small_run("fp32");
  c.set("optimizer", "sgd");
  c.set("embedding-update", "lazy");
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }), "LazyAdam");
  // Options of other tasks are refused by name, not accepted and ignored.
  c = small_run("fp32");
  c.grad_accum = 4;
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }),
             "--grad-accum 4: the recommender (model dcn) does not take it");
  c = small_run("fp32");
  c.checkpoint_activations = true;
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }),
             "--checkpoint-activations true: the recommender");
  c = small_run("fp32");
  c.seq_len = 64;
  EXPECT_HAS(mt::testing::error_of([&] { mt::train::train_recommender(c); }), "--seq-len 64");
}

// What the recommender is given is what runs, an explicit default included: SGD (dense tables,
// the auto rule's choice for SGD) with the default learning rate, and the clipping it is given.
TEST(Recommender, HonoursTheOptimizerAndClippingItIsGiven) {
  auto c = small_run("fp32");
  c.max_steps = 20;
  c.log_every = 10;
  c.set("optimizer", "sgd");
  c.lr = mt::train::TrainConfig{}.lr;
  c.clip_grad_norm = 1e-6;
  std::vector<nlohmann::json> records;
  const auto clipped = mt::train::train_recommender(
      c, [&](const std::string& j) { records.push_back(nlohmann::json::parse(j)); });
  EXPECT_EQ(clipped.embedding_update, "dense");
  EXPECT_EQ(records.front()["config"]["optimizer"], "sgd");
  EXPECT_EQ(records.front()["config"]["lr"], 0.05);
  c.clip_grad_norm = 0;
  const auto free = mt::train::train_recommender(c);
  EXPECT_NE(clipped.log_loss, free.log_loss) << "--clip-grad-norm 1e-6 changed nothing";
}

class RecommenderResume : public mt::testing::TempDirTest {};

// The lazily updated tables' moments, masters and per-row step counts are in the checkpoint: a
// run stopped after its first epoch and resumed takes the straight run's steps bit for bit.
TEST_F(RecommenderResume, ResumesTheSecondEpochBitwise) {
  for (const char* update : {"lazy", "dense"}) {
    SCOPED_TRACE(update);
    auto c = small_run("bf16");
    c.set("opt-level", "O2");
    c.set("embedding-update", update);
    c.synthetic_size = 4000;  // 3600 for training: 28 steps of 128 an epoch
    c.max_steps = 0;
    c.epochs = 2;
    mt::train::Trainer straight(c);
    straight.set_quiet(true);
    straight.fit();
    const std::vector<float> all = straight.step_losses();
    const size_t per_epoch = all.size() / 2;
    ASSERT_GT(per_epoch, 0u);

    auto first = c;
    first.checkpoint_path = file(std::string(update) + ".safetensors");
    mt::train::Trainer a(first);
    a.set_quiet(true);
    a.fit(/*max_epochs=*/1);
    auto resumed = c;
    resumed.resume_path = first.checkpoint_path;
    mt::train::Trainer b(resumed);
    b.set_quiet(true);
    b.fit();
    const std::vector<float>& second = b.step_losses();
    ASSERT_EQ(second.size(), per_epoch);
    for (size_t i = 0; i < per_epoch; ++i)
      EXPECT_EQ(std::bit_cast<uint32_t>(second[i]), std::bit_cast<uint32_t>(all[per_epoch + i]))
          << "step " << per_epoch + i + 1;
    EXPECT_EQ(straight.evaluate().loss, b.evaluate().loss);
  }
}
