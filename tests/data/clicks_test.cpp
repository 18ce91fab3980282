// Click logs: the reader (good lines, missing values, bad lines), hashing, the synthetic
// generator (determinism, its Bayes log loss, the file round trip) and ClickDataset.
#include "mantissa/data/clicks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/data/loader.h"

namespace mt = mantissa;
using mt::data::ClickFileOptions;
using mt::data::ClickLog;
using mt::testing::error_of;

namespace {

ClickFileOptions layout(int64_t dense, int64_t cat, int64_t buckets = 100) {
  ClickFileOptions o;
  o.n_dense = dense;
  o.n_cat = cat;
  o.hash_buckets = buckets;
  return o;
}

}  // namespace

TEST(ClickHash, IsFnv1a64AndStable) {
  EXPECT_EQ(mt::data::fnv1a64(""), 14695981039346656037ull);
  EXPECT_EQ(mt::data::fnv1a64("a"), 0xaf63dc4c8601ec8cull);  // the published FNV-1a 64 of "a"
  // Pinned: a checkpoint's tables must keep meaning the same tokens across versions.
  EXPECT_EQ(mt::data::hash_token("68fd1e64", 10000), 6975);
  EXPECT_EQ(mt::data::hash_token("", 10000), 0);
  for (const char* t : {"x", "68fd1e64", "a longer token"}) {
    const int64_t id = mt::data::hash_token(t, 7);
    EXPECT_GE(id, 1);
    EXPECT_LT(id, 7);
  }
  EXPECT_HAS(error_of([] { mt::data::hash_token("x", 1); }), "at least 2 rows");
}

TEST(ClickReader, GoodLinesAndMissingValues) {
  // label, 3 dense, 2 categorical; a missing dense value, an empty token, a negative count.
  const std::string text =
      "1\t0\t3\t\tabc\tdef\n"
      "0\t-5\t\t2.5\t\tabc\r\n"
      "\n";
  const ClickLog log = mt::data::parse_click_log(text, "log.tsv", layout(3, 2));
  ASSERT_EQ(log.size(), 2);
  EXPECT_EQ(log.n_dense, 3);
  EXPECT_EQ(log.n_cat, 2);
  EXPECT_EQ(log.labels, (std::vector<float>{1.f, 0.f}));
  EXPECT_EQ(log.dense[0], 0.f);
  EXPECT_EQ(log.dense[1], float(std::log1p(3.0)));
  EXPECT_EQ(log.dense[2], 0.f);  // missing
  EXPECT_EQ(log.dense[3], 0.f);  // max(x, 0)
  EXPECT_EQ(log.dense[4], 0.f);
  EXPECT_EQ(log.dense[5], float(std::log1p(2.5)));
  EXPECT_EQ(log.categorical[0], mt::data::hash_token("abc", 100));
  EXPECT_EQ(log.categorical[1], mt::data::hash_token("def", 100));
  EXPECT_EQ(log.categorical[2], 0);  // the empty token
  EXPECT_EQ(log.categorical[3], log.categorical[0]);
  EXPECT_EQ(log.table_sizes, (std::vector<int64_t>{100, 100}));
}

TEST(ClickReader, CsvByExtensionAndLayoutDetection) {
  // Comma-separated by the .csv name; without a layout, the leading numbers are dense.
  const ClickLog csv =
      mt::data::parse_click_log("0,1,,7,a,b,c\n1,2,3,4,,,\n", "log.csv", ClickFileOptions{});
  EXPECT_EQ(csv.n_dense, 3);
  EXPECT_EQ(csv.n_cat, 3);
  EXPECT_EQ(csv.size(), 2);
  // 40 columns: Criteo's 13 + 26 whatever the first line looks like.
  std::string line = "1";
  for (int i = 0; i < 39; ++i) {
    line += '\t';
    if (i >= 13) line += "tok";
  }
  const ClickLog criteo = mt::data::parse_click_log(line + "\n", "day.tsv", ClickFileOptions{});
  EXPECT_EQ(criteo.n_dense, 13);
  EXPECT_EQ(criteo.n_cat, 26);
  // One given: the other is the rest.
  EXPECT_EQ(mt::data::parse_click_log("1\t2\tx\n", "a.tsv", layout(-1, 1)).n_dense, 1);
}

TEST(ClickReader, BadLinesNameTheFileLineAndColumn) {
  const ClickFileOptions o = layout(2, 1);
  EXPECT_HAS(error_of([&] { mt::data::parse_click_log("1\t2\t3\ta\n0\t1\ta\n", "f.tsv", o); }),
             "f.tsv:2: has 3 tab-separated columns, expected 4");
  EXPECT_HAS(error_of([&] { mt::data::parse_click_log("2\t1\t1\ta\n", "f.tsv", o); }),
             "f.tsv:1: the label (column 1) is '2'");
  EXPECT_HAS(error_of([&] { mt::data::parse_click_log("1\t1\t1\ta\n1\t1\tx7\ta\n", "f.tsv", o); }),
             "f.tsv:2: dense column I2 (column 3) is 'x7', not a number");
  EXPECT_HAS(error_of([&] { mt::data::parse_click_log("1\t1\t1\ta\n", "f.tsv", layout(5, 5)); }),
             "not a label, 5 dense and 5 categorical");
  EXPECT_HAS(error_of([&] { mt::data::parse_click_log("\n\n", "empty.tsv", o); }), "no examples");
  EXPECT_HAS(error_of([] { mt::data::read_click_log("/nonexistent/clicks.tsv"); }),
             "/nonexistent/clicks.tsv");
}

TEST(SyntheticClicks, DeterministicInTheSeed) {
  mt::data::SyntheticClickOptions o;
  o.examples = 3000;
  o.seed = 7;
  const auto a = mt::data::synthetic_clicks(o);
  const auto b = mt::data::synthetic_clicks(o);
  EXPECT_EQ(a.log.dense, b.log.dense);
  EXPECT_EQ(a.log.categorical, b.log.categorical);
  EXPECT_EQ(a.log.labels, b.log.labels);
  EXPECT_EQ(a.probability, b.probability);
  EXPECT_EQ(a.bayes_log_loss, b.bayes_log_loss);
  o.seed = 8;
  const auto c = mt::data::synthetic_clicks(o);
  EXPECT_NE(a.log.labels, c.log.labels);
  // Criteo's layout, ids inside the tables, the last 10% held out.
  EXPECT_EQ(a.log.n_dense, 13);
  EXPECT_EQ(a.log.n_cat, 26);
  EXPECT_EQ(a.train_size, 2700);
  for (const int64_t id : a.log.categorical) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 10000);
  }
}

TEST(SyntheticClicks, BayesLogLossBelowTheBaseRateEntropy) {
  mt::data::SyntheticClickOptions o;
  o.examples = 20000;
  const auto s = mt::data::synthetic_clicks(o);
  const double rate = s.log.slice(s.train_size, s.log.size() - s.train_size).click_rate();
  const double entropy = -(rate * std::log(rate) + (1 - rate) * std::log1p(-rate));
  EXPECT_NEAR(s.constant_log_loss, entropy, 1e-9);
  EXPECT_GT(rate, 0.05);
  EXPECT_LT(rate, 0.6);
  // The planted features explain a good part of the labels: a clear gap to learn.
  EXPECT_LT(s.bayes_log_loss, entropy - 0.05);
  EXPECT_GT(s.bayes_log_loss, 0.1);
}

class SyntheticClickFile : public mt::testing::TempDirTest {};

TEST_F(SyntheticClickFile, TheFileIsTheSameData) {
  mt::data::SyntheticClickOptions o;
  o.examples = 2000;
  o.seed = 3;
  o.hash_buckets = 500;
  for (const char* name : {"clicks.tsv", "clicks.csv"}) {
    mt::data::write_synthetic_clicks(file(name), o);
    ClickFileOptions fo;
    fo.hash_buckets = 500;
    const ClickLog read = mt::data::read_click_log(file(name), fo);
    const ClickLog made = mt::data::synthetic_clicks(o).log;
    EXPECT_EQ(read.n_dense, made.n_dense) << name;
    EXPECT_EQ(read.n_cat, made.n_cat) << name;
    EXPECT_EQ(read.dense, made.dense) << name;
    EXPECT_EQ(read.categorical, made.categorical) << name;
    EXPECT_EQ(read.labels, made.labels) << name;
  }
}

TEST(ClickDataset, BatchesOfThreeFields) {
  mt::data::SyntheticClickOptions o;
  o.examples = 100;
  o.hash_buckets = 50;
  auto log = std::make_shared<const ClickLog>(mt::data::synthetic_clicks(o).log);
  const mt::data::ClickDataset ds(log, 10, 80);
  EXPECT_EQ(ds.size(), 80);
  mt::data::LoaderOptions lo;
  lo.batch_size = 32;
  lo.shuffle = false;
  lo.num_workers = 0;
  mt::data::DataLoader loader(ds, lo);
  std::optional<mt::data::Batch> b = loader.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)["dense"].shape(), mt::Shape({32, 13}));
  EXPECT_EQ((*b)["dense"].dtype(), mt::DType::F32);
  EXPECT_EQ((*b)["categorical"].shape(), mt::Shape({32, 26}));
  EXPECT_EQ((*b)["categorical"].dtype(), mt::DType::I64);
  EXPECT_EQ((*b)["label"].shape(), mt::Shape({32}));
  // Item 0 of the dataset is example 10 of the log.
  EXPECT_EQ((*b)["label"].to_vector<float>()[0], log->labels[10]);
  EXPECT_EQ((*b)["categorical"].to_vector<int64_t>()[5], log->categorical[10 * 26 + 5]);
  const mt::data::Sample s = ds.get(79);
  EXPECT_EQ(s[1].shape(), mt::Shape({26}));
  EXPECT_EQ(s[2].item(), double(log->labels[89]));
  EXPECT_HAS(error_of([&] { ds.get(80); }), "out of range");
}
