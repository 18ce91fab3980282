// Click logs for recommenders (the Criteo layout), a synthetic click log with a planted model,
// and ClickDataset, the Dataset over them (samples {dense, categorical, label}).
//
// The file format: one example per line, tab-separated (or comma-separated for a .csv file),
//   label  I1 .. In  C1 .. Cm
// label 0 or 1; I (dense) a number or empty (missing); C (categorical) any token, or empty.
// Criteo's layout is n = 13, m = 26 (40 columns). Reading turns each line into the numbers a
// model takes:
//   dense        log(1 + max(x, 0)) (the DCN/DLRM convention); missing -> 0
//   categorical  id = hash_token(token, buckets): 0 for the empty token, else
//                1 + FNV-1a-64(token) mod (buckets - 1), one table of `buckets` rows per field
// Every malformed line raises mantissa::Error naming the file, the line and what is wrong.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mantissa/data/dataset.h"

namespace mantissa::data {

inline constexpr int64_t kCriteoDense = 13;
inline constexpr int64_t kCriteoCategorical = 26;
inline constexpr int64_t kDefaultHashBuckets = 10000;

// FNV-1a, 64 bits (offset basis 14695981039346656037, prime 1099511628211), of the token's bytes.
uint64_t fnv1a64(std::string_view bytes);
// A categorical token's row in a table of `buckets` rows (>= 2): 0 for the empty token, else
// 1 + fnv1a64(token) % (buckets - 1). Stable across runs, machines and versions: a checkpoint's
// embeddings stay valid for new logs.
int64_t hash_token(std::string_view token, int64_t buckets);
// log(1 + max(x, 0)) in double, rounded once to float; NaN (missing) -> 0.
float transform_dense(double x);

// A click log as a model reads it: N examples, row-major.
struct ClickLog {
  int64_t n_dense = 0;
  int64_t n_cat = 0;
  std::vector<float> dense;          // (N, n_dense), transformed
  std::vector<int64_t> categorical;  // (N, n_cat), field f's ids in [0, table_sizes[f])
  std::vector<float> labels;         // (N), 0 or 1
  std::vector<int64_t> table_sizes;  // (n_cat): rows of each field's embedding table
  std::string name;
  int64_t size() const { return int64_t(labels.size()); }
  // Examples [start, start + count) as a new log (copies).
  ClickLog slice(int64_t start, int64_t count) const;
  // The fraction of examples with label 1, and the log loss of predicting it for every example
  // (the constant predictor: the entropy of the base rate).
  double click_rate() const;
  double constant_log_loss() const;
};

struct ClickFileOptions {
  // Columns after the label: dense then categorical. -1: from the first line. With both -1, a
  // 40-column line is Criteo's 13 + 26; another width takes the leading columns after the label
  // that are numbers in the first line as dense and the rest as categorical. With one given,
  // the other is the rest of the first line's columns.
  int64_t n_dense = -1;
  int64_t n_cat = -1;
  int64_t hash_buckets = kDefaultHashBuckets;  // rows of every categorical table, >= 2
  // 0: by the file name (".csv" -> ',', otherwise '\t').
  char delimiter = 0;
};

// Reads a click log file (format above). Empty lines are skipped; a '\r' before the newline is
// dropped. Errors name "path:line" and the column.
ClickLog read_click_log(const std::string& path, const ClickFileOptions& options = {});
// The same from text already in memory (`name` stands for the path in messages).
ClickLog parse_click_log(std::string_view text, const std::string& name,
                         const ClickFileOptions& options = {});

// ---- the synthetic click log -----------------------------------------------------------------

struct SyntheticClickOptions {
  int64_t examples = 100000;
  uint64_t seed = 0;
  int64_t n_dense = kCriteoDense;
  // The number of distinct values of each categorical field (its length is n_cat). Empty: 26
  // fields, 8 of 10 values, 8 of 100, 6 of 1,000 and 4 of 10,000.
  std::vector<int64_t> cardinalities = {};
  double zipf = 1.1;      // value k of a field is drawn with weight 1 / (k + 1)^zipf
  double missing = 0.05;  // probability that a field (dense or categorical) is empty
  int64_t hash_buckets = kDefaultHashBuckets;
  double held_out = 0.1;  // the last fraction of the examples: the held-out split
  // The planted model's bias is set so that the mean click probability of examples 0 .. 4095
  // is this (Criteo's logs click about 26% of the time).
  double click_rate = 0.25;
};

// The synthetic log and what the planted model knows about it.
//
// Example i (a pure function of (options, i): counter-based draws, any thread count): each
// categorical field f takes value k in [0, cardinalities[f]) with Zipf frequencies (or is empty
// with probability `missing`), its token the 8 hex digits of a 32-bit mix of (f, k); each dense
// field j is a count, floor(exp(N(mu_j, 1))) - 1 clipped at 0 (or missing). The true logit is
//   bias + sum_f w_f[k_f] + sum over 4 planted crosses (a, b) of c_ab[k_a, k_b]
//        + sum_j u_j (log(1 + x_j) - 1)
// (an empty field contributes 0; w, c, u are normal draws from the seed), and the label is
// Bernoulli(sigmoid(logit)) (the bias: see click_rate). `log` is exactly what read_click_log
// returns for the file write_synthetic_clicks writes (same tokens, same hashing, integers written
// exactly).
struct SyntheticClicks {
  ClickLog log;
  std::vector<double> probability;  // the true click probability of each example
  int64_t train_size = 0;           // examples [0, train_size) train, the rest are held out
  // The true model's log loss on the held-out split's labels: the best any model can do there
  // (up to the sampling of those labels). And the constant predictor's (the base rate entropy).
  double bayes_log_loss = 0;
  double constant_log_loss = 0;
};
SyntheticClicks synthetic_clicks(const SyntheticClickOptions& options = {});
// Writes the synthetic log in the file format (tab-separated, or comma for a .csv path).
void write_synthetic_clicks(const std::string& path, const SyntheticClickOptions& options = {});

// ---- the Dataset -----------------------------------------------------------------------------

// Examples of a ClickLog: sample i is {dense: F32 (n_dense), categorical: I64 (n_cat), label: F32
// scalar}, named "dense", "categorical" and "label"; get_batch fills the three (B, n_dense),
// (B, n_cat), (B) in one allocation. Cheap to copy (the log is shared).
class ClickDataset final : public Dataset {
 public:
  ClickDataset() = default;
  ClickDataset(std::shared_ptr<const ClickLog> log, int64_t start, int64_t count);
  explicit ClickDataset(ClickLog log);

  const ClickLog& log() const { return *log_; }
  int64_t start() const { return start_; }
  int64_t size() const override { return count_; }
  FieldNames field_names() const override { return {"dense", "categorical", "label"}; }
  std::string name() const override { return log_ ? log_->name : "clicks"; }
  Sample get(int64_t index) const override;
  std::vector<Tensor> get_batch(std::span<const int64_t> indices) const override;

 private:
  std::shared_ptr<const ClickLog> log_;
  int64_t start_ = 0, count_ = 0;
};

}  // namespace mantissa::data
