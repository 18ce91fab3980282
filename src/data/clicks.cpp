// Click logs: the synthetic log with its planted model, and ClickDataset (the reader:
// click_log.cpp).
#include "mantissa/data/clicks.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "data/click_format.h"
#include "data/random.h"
#include "mantissa/core/error.h"

namespace mantissa::data {

namespace {

// Streams of the synthetic click generator, after the image (1..3) and token (4..6) generators'.
enum Stream : uint64_t {
  kClickValue = 7,
  kClickMissing,
  kClickDense,
  kClickLabel,
  kClickWeight,
  kClickCross,
  kClickDenseWeight
};

// The number of planted crosses: fields (0, 1), (2, 3), (4, 5), (6, 7) where they exist.
constexpr int64_t kCrosses = 4;
// Examples 0 .. kCalibration - 1 set the bias (whatever the log's length).
constexpr int64_t kCalibration = 4096;
constexpr double kCrossStd = 0.6;
constexpr double kDenseWeightStd = 0.25;

// A normal draw (Box-Muller) from two 64-bit draws at `index` of `stream`.
double normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = 1.0 - unit(draw64(seed, stream, 2 * index));  // (0, 1]
  const double u2 = unit(draw64(seed, stream, 2 * index + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The token of value k of field f: 8 hex digits, like Criteo's.
std::string token_of(int64_t f, int64_t k) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x",
                unsigned(splitmix64(uint64_t(f) << 32 | uint64_t(k)) >> 32));
  return buf;
}

std::vector<int64_t> default_cardinalities() {
  std::vector<int64_t> c;
  for (const auto& [count, card] : {std::pair{8, 10}, {8, 100}, {6, 1000}, {4, 10000}})
    c.insert(c.end(), size_t(count), int64_t(card));
  return c;
}

// The planted model and the value distributions of one set of options.
struct Planted {
  SyntheticClickOptions o;
  std::vector<std::vector<double>> cdf;  // per field: cumulative Zipf weights
  std::vector<double> field_std;         // per field: the std of its value weights
  std::vector<double> dense_mu, dense_w;

  explicit Planted(SyntheticClickOptions options) : o(std::move(options)) {
    if (o.cardinalities.empty()) o.cardinalities = default_cardinalities();
    MT_CHECK(o.examples > 0, "synthetic clicks: --examples must be positive, got ", o.examples);
    MT_CHECK(o.n_dense >= 0, "synthetic clicks: n_dense must be >= 0, got ", o.n_dense);
    MT_CHECK(o.zipf >= 0 && std::isfinite(o.zipf), "synthetic clicks: zipf must be >= 0, got ",
             o.zipf);
    MT_CHECK(o.missing >= 0 && o.missing < 1, "synthetic clicks: missing must be in [0, 1), got ",
             o.missing);
    MT_CHECK(o.held_out > 0 && o.held_out < 1, "synthetic clicks: held_out must be in (0, 1), got ",
             o.held_out);
    MT_CHECK(o.click_rate > 0 && o.click_rate < 1,
             "synthetic clicks: click_rate must be in (0, 1), got ", o.click_rate);
    MT_CHECK(o.hash_buckets >= 2, "synthetic clicks: hash_buckets must be >= 2, got ",
             o.hash_buckets);
    for (size_t f = 0; f < o.cardinalities.size(); ++f) {
      const int64_t k = o.cardinalities[f];
      MT_CHECK(k >= 1 && k <= (int64_t(1) << 24), "synthetic clicks: field ", f,
               " has cardinality ", k, "; use 1 .. 2^24");
      std::vector<double> c(static_cast<size_t>(k));
      double total = 0;
      for (int64_t v = 0; v < k; ++v)
        c[size_t(v)] = total += std::pow(double(v + 1), -o.zipf);
      cdf.push_back(std::move(c));
      field_std.push_back(k <= 10 ? 0.5 : k <= 100 ? 0.35 : k <= 1000 ? 0.25 : 0.15);
    }
    for (int64_t j = 0; j < o.n_dense; ++j) {
      dense_mu.push_back(0.5 + 2.5 * double(j) / double(std::max<int64_t>(o.n_dense, 1)));
      dense_w.push_back(kDenseWeightStd * normal(o.seed, kClickDenseWeight, uint64_t(j)));
    }
    // The bias that gives the first kCalibration examples a mean click probability of
    // click_rate (bisection): the planted weights alone would move the rate with the seed.
    std::vector<double> z;
    std::vector<int64_t> d, c;
    std::vector<float> t;
    for (int64_t i = 0; i < kCalibration; ++i) {
      raw(i, d, c);
      transformed(d, t);
      z.push_back(logit(t, c));
    }
    double lo = -30, hi = 30;
    for (int it = 0; it < 60; ++it) {
      const double mid = 0.5 * (lo + hi);
      double mean = 0;
      for (const double zi : z)
        mean += 1.0 / (1.0 + std::exp(-(zi + mid)));
      (mean / double(z.size()) < o.click_rate ? lo : hi) = mid;
    }
    bias = 0.5 * (lo + hi);
  }
  double bias = 0;  // added to logit()'s sum

  // Dense counts (-1: missing) transformed as the reader does.
  void transformed(const std::vector<int64_t>& dense, std::vector<float>& t) const {
    t.resize(dense.size());
    for (size_t j = 0; j < dense.size(); ++j)
      t[j] = transform_dense(dense[j] < 0 ? std::numeric_limits<double>::quiet_NaN()
                                          : double(dense[j]));
  }
  int64_t n_cat() const { return int64_t(o.cardinalities.size()); }
  int64_t width() const { return o.n_dense + n_cat(); }
  int64_t crosses() const { return std::min(kCrosses, n_cat() / 2); }

  // Example i's raw values: dense counts (-1: missing) and category values (-1: empty).
  void raw(int64_t i, std::vector<int64_t>& dense, std::vector<int64_t>& cat) const {
    dense.resize(size_t(o.n_dense));
    cat.resize(size_t(n_cat()));
    const auto base = uint64_t(i) * uint64_t(width());
    for (int64_t j = 0; j < o.n_dense; ++j) {
      const uint64_t at = base + uint64_t(j);
      if (unit(draw64(o.seed, kClickMissing, at)) < o.missing) {
        dense[size_t(j)] = -1;
        continue;
      }
      const double x = std::floor(std::exp(dense_mu[size_t(j)] + normal(o.seed, kClickDense, at)));
      dense[size_t(j)] = int64_t(std::clamp(x - 1.0, 0.0, 1e9));
    }
    for (int64_t f = 0; f < n_cat(); ++f) {
      const uint64_t at = base + uint64_t(o.n_dense + f);
      if (unit(draw64(o.seed, kClickMissing, at)) < o.missing) {
        cat[size_t(f)] = -1;
        continue;
      }
      const std::vector<double>& c = cdf[size_t(f)];
      const double u = unit(draw64(o.seed, kClickValue, at)) * c.back();
      const auto it = std::upper_bound(c.begin(), c.end(), u);
      cat[size_t(f)] = std::min<int64_t>(int64_t(it - c.begin()), int64_t(c.size()) - 1);
    }
  }

  // The true logit of raw values whose dense part was transformed into `t`.
  double logit(std::span<const float> t, const std::vector<int64_t>& cat) const {
    double z = bias;
    for (int64_t f = 0; f < n_cat(); ++f) {
      if (cat[size_t(f)] < 0) continue;
      z += field_std[size_t(f)] *
           normal(o.seed, kClickWeight, uint64_t(f) << 40 | uint64_t(cat[size_t(f)]));
    }
    for (int64_t p = 0; p < crosses(); ++p) {
      const int64_t a = cat[size_t(2 * p)], b = cat[size_t(2 * p + 1)];
      if (a < 0 || b < 0) continue;
      z += kCrossStd *
           normal(o.seed, kClickCross, uint64_t(p) << 56 | uint64_t(a) << 28 | uint64_t(b));
    }
    for (int64_t j = 0; j < o.n_dense; ++j)
      z += dense_w[size_t(j)] * (double(t[size_t(j)]) - 1.0);
    return z;
  }

  bool label(int64_t i, double p) const {
    return unit(draw64(o.seed, kClickLabel, uint64_t(i))) < p;
  }
};

}  // namespace

// ---- the synthetic log -----------------------------------------------------------------------

SyntheticClicks synthetic_clicks(const SyntheticClickOptions& options) {
  const Planted m(options);
  const int64_t n = m.o.examples, nd = m.o.n_dense, nc = m.n_cat();
  SyntheticClicks out;
  ClickLog& log = out.log;
  log.n_dense = nd;
  log.n_cat = nc;
  log.name = "synthetic-clicks";
  log.table_sizes.assign(size_t(nc), m.o.hash_buckets);
  log.dense.resize(size_t(n * nd));
  log.categorical.resize(size_t(n * nc));
  log.labels.resize(size_t(n));
  out.probability.resize(size_t(n));
  // Each field's tokens hashed once (the values a field can take), as reading the file does.
  std::vector<std::vector<int64_t>> ids(static_cast<size_t>(nc));
  for (int64_t f = 0; f < nc; ++f) {
    for (int64_t k = 0; k < m.o.cardinalities[size_t(f)]; ++k)
      ids[size_t(f)].push_back(hash_token(token_of(f, k), m.o.hash_buckets));
  }
  std::vector<int64_t> dense, cat;
  for (int64_t i = 0; i < n; ++i) {
    m.raw(i, dense, cat);
    float* t = log.dense.data() + i * nd;
    for (int64_t j = 0; j < nd; ++j)
      t[j] = transform_dense(dense[size_t(j)] < 0 ? std::numeric_limits<double>::quiet_NaN()
                                                  : double(dense[size_t(j)]));
    for (int64_t f = 0; f < nc; ++f)
      log.categorical[size_t(i * nc + f)] =
          cat[size_t(f)] < 0 ? 0 : ids[size_t(f)][size_t(cat[size_t(f)])];
    const double p = 1.0 / (1.0 + std::exp(-m.logit(std::span<const float>(t, size_t(nd)), cat)));
    out.probability[size_t(i)] = p;
    log.labels[size_t(i)] = m.label(i, p) ? 1.f : 0.f;
  }
  out.train_size = n - std::max<int64_t>(1, int64_t(std::llround(double(n) * m.o.held_out)));
  MT_CHECK(out.train_size >= 1, "synthetic clicks: ", n,
           " examples leave none to train on after the held-out split; use more");
  double bayes = 0;
  for (int64_t i = out.train_size; i < n; ++i)
    bayes += binary_log_loss(out.probability[size_t(i)], log.labels[size_t(i)]);
  out.bayes_log_loss = bayes / double(n - out.train_size);
  out.constant_log_loss = log.slice(out.train_size, n - out.train_size).constant_log_loss();
  return out;
}

void write_synthetic_clicks(const std::string& path, const SyntheticClickOptions& options) {
  const Planted m(options);
  const char delim = click_delimiter(path, 0);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  MT_CHECK(f != nullptr, "cannot write the click log '", path, "': ", std::strerror(errno));
  std::vector<std::vector<std::string>> tokens(size_t(m.n_cat()));
  for (int64_t c = 0; c < m.n_cat(); ++c) {
    for (int64_t k = 0; k < m.o.cardinalities[size_t(c)]; ++k)
      tokens[size_t(c)].push_back(token_of(c, k));
  }
  std::vector<int64_t> dense, cat;
  std::vector<float> t(size_t(m.o.n_dense));
  std::string line;
  bool ok = true;
  for (int64_t i = 0; i < m.o.examples && ok; ++i) {
    m.raw(i, dense, cat);
    for (int64_t j = 0; j < m.o.n_dense; ++j)
      t[size_t(j)] = transform_dense(dense[size_t(j)] < 0 ? std::numeric_limits<double>::quiet_NaN()
                                                          : double(dense[size_t(j)]));
    const double p = 1.0 / (1.0 + std::exp(-m.logit(t, cat)));
    line.clear();
    line += m.label(i, p) ? '1' : '0';
    for (int64_t j = 0; j < m.o.n_dense; ++j) {
      line += delim;
      if (dense[size_t(j)] >= 0) line += std::to_string(dense[size_t(j)]);
    }
    for (int64_t c = 0; c < m.n_cat(); ++c) {
      line += delim;
      if (cat[size_t(c)] >= 0) line += tokens[size_t(c)][size_t(cat[size_t(c)])];
    }
    line += '\n';
    ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  }
  ok = std::fclose(f) == 0 && ok;
  MT_CHECK(ok, "writing the click log '", path, "' failed: ", std::strerror(errno));
}

// ---- the Dataset -----------------------------------------------------------------------------

ClickDataset::ClickDataset(std::shared_ptr<const ClickLog> log, int64_t start, int64_t count)
    : log_(std::move(log)), start_(start), count_(count) {
  MT_CHECK(log_ != nullptr, "ClickDataset: no click log");
  MT_CHECK(start >= 0 && count >= 0 && start + count <= log_->size(), "ClickDataset '", log_->name,
           "': examples ", start, " .. ", start + count - 1, " asked for, but the log holds ",
           log_->size());
  MT_CHECK(int64_t(log_->dense.size()) == log_->size() * log_->n_dense &&
               int64_t(log_->categorical.size()) == log_->size() * log_->n_cat &&
               int64_t(log_->table_sizes.size()) == log_->n_cat,
           "ClickDataset '", log_->name,
           "': the log's arrays do not match its sizes (dense N x n_dense, categorical N x n_cat, "
           "table_sizes n_cat)");
  for (int64_t i = 0; i < int64_t(log_->categorical.size()); ++i) {
    const int64_t v = log_->categorical[size_t(i)];
    const int64_t rows = log_->table_sizes[size_t(i % std::max<int64_t>(log_->n_cat, 1))];
    MT_CHECK(v >= 0 && v < rows, "ClickDataset '", log_->name, "': example ", i / log_->n_cat,
             " field ", i % log_->n_cat, " has id ", v, ", outside its table of ", rows, " rows");
  }
}

ClickDataset::ClickDataset(ClickLog log)
    : ClickDataset(std::make_shared<const ClickLog>(std::move(log)), 0, 0) {
  count_ = log_->size();
}

Sample ClickDataset::get(int64_t index) const {
  const std::vector<int64_t> one{index};
  std::vector<Tensor> b = get_batch(one);
  return {b[0].reshape({log_->n_dense}), b[1].reshape({log_->n_cat}), b[2].reshape({})};
}

std::vector<Tensor> ClickDataset::get_batch(std::span<const int64_t> indices) const {
  MT_CHECK(log_ != nullptr, "ClickDataset: an empty (default-constructed) dataset has no examples");
  const auto b = int64_t(indices.size());
  const int64_t nd = log_->n_dense, nc = log_->n_cat;
  std::vector<Tensor> out =
      allocate_batch({{{b, nd}, DType::F32}, {{b, nc}, DType::I64}, {{b}, DType::F32}});
  auto* dense = out[0].data<float>();
  auto* cat = out[1].data<int64_t>();
  auto* label = out[2].data<float>();
  for (int64_t r = 0; r < b; ++r) {
    const int64_t i = indices[size_t(r)];
    MT_CHECK(i >= 0 && i < count_, "ClickDataset '", log_->name, "': index ", i,
             " out of range: it holds ", count_, " examples");
    const int64_t at = start_ + i;
    std::memcpy(dense + r * nd, log_->dense.data() + at * nd, size_t(nd) * sizeof(float));
    std::memcpy(cat + r * nc, log_->categorical.data() + at * nc, size_t(nc) * sizeof(int64_t));
    label[r] = log_->labels[size_t(at)];
  }
  return out;
}

}  // namespace mantissa::data
