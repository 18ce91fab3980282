// Click logs as files: the reader, the hashing of tokens and the dense transform (no tensors:
// the fuzz target links this file alone, fuzz/click_log_fuzz.cpp).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "data/click_format.h"
#include "data/file_io.h"
#include "mantissa/core/error.h"
#include "mantissa/data/clicks.h"
#include "mantissa/data/text_corpus.h"

namespace mantissa::data {

namespace {

std::vector<std::string_view> split_columns(std::string_view line, char delimiter) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t at = line.find(delimiter, start);
    if (at == std::string_view::npos) {
      out.push_back(line.substr(start));
      return out;
    }
    out.push_back(line.substr(start, at - start));
    start = at + 1;
  }
}

// The whole column as a finite number (from_chars: no locale, no leading spaces or '+').
bool parse_number(std::string_view s, double* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  const auto r = std::from_chars(s.data(), end, *out);
  return r.ec == std::errc() && r.ptr == end && std::isfinite(*out);
}
}  // namespace

char click_delimiter(const std::string& path, char given) {
  if (given != 0) return given;
  const bool csv = path.size() >= 4 && (path.compare(path.size() - 4, 4, ".csv") == 0 ||
                                        path.compare(path.size() - 4, 4, ".CSV") == 0);
  return csv ? ',' : '\t';
}

double binary_log_loss(double p, float y) {
  const double q = std::clamp(p, 1e-15, 1 - 1e-15);
  return y > 0.5f ? -std::log(q) : -std::log1p(-q);
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (const char c : bytes)
    h = (h ^ uint64_t(static_cast<unsigned char>(c))) * 1099511628211ull;
  return h;
}

int64_t hash_token(std::string_view token, int64_t buckets) {
  MT_CHECK(buckets >= 2,
           "hash_token: a table needs at least 2 rows (one for the empty token), got ", buckets);
  if (token.empty()) return 0;
  return 1 + int64_t(fnv1a64(token) % uint64_t(buckets - 1));
}

float transform_dense(double x) {
  if (std::isnan(x)) return 0.f;
  return float(std::log1p(std::max(x, 0.0)));
}

ClickLog ClickLog::slice(int64_t start, int64_t count) const {
  MT_CHECK(start >= 0 && count >= 0 && start + count <= size(), "click log '", name, "': examples ",
           start, " .. ", start + count - 1, " asked for, but it holds ", size());
  ClickLog out;
  out.n_dense = n_dense;
  out.n_cat = n_cat;
  out.table_sizes = table_sizes;
  out.name = name;
  out.dense.assign(dense.begin() + start * n_dense, dense.begin() + (start + count) * n_dense);
  out.categorical.assign(categorical.begin() + start * n_cat,
                         categorical.begin() + (start + count) * n_cat);
  out.labels.assign(labels.begin() + start, labels.begin() + start + count);
  return out;
}

double ClickLog::click_rate() const {
  double s = 0;
  for (const float y : labels)
    s += y;
  return labels.empty() ? 0.0 : s / double(labels.size());
}

double ClickLog::constant_log_loss() const {
  const double p = click_rate();
  double s = 0;
  for (const float y : labels)
    s += binary_log_loss(p, y);
  return labels.empty() ? 0.0 : s / double(labels.size());
}

// ---- the reader ------------------------------------------------------------------------------

ClickLog parse_click_log(std::string_view text, const std::string& name,
                         const ClickFileOptions& options) {
  MT_CHECK(options.hash_buckets >= 2, "click log '", name,
           "': the hash table size must be at least 2 (row 0 is the empty token), got ",
           options.hash_buckets);
  MT_CHECK(options.n_dense >= -1 && options.n_cat >= -1, "click log '", name,
           "': the numbers of dense and categorical columns must be >= 0 (or -1: detect them)");
  MT_CHECK(!looks_binary(text), "click log '", name,
           "' is binary (a NUL byte in its first 8000 bytes), not a text file of label, dense "
           "and categorical columns");
  const char delim = click_delimiter(name, options.delimiter);
  const char* delim_name = delim == '\t' ? "tab" : delim == ',' ? "comma" : "delimiter";
  ClickLog log;
  log.name = name;
  int64_t n_dense = options.n_dense, n_cat = options.n_cat, columns = -1;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::vector<std::string_view> cols = split_columns(line, delim);
    const auto where = [&] { return name + ":" + std::to_string(line_no) + ": "; };
    if (columns < 0) {
      // The layout, from the first line.
      const auto have = int64_t(cols.size()) - 1;
      MT_CHECK(have >= 1, where(), "a line needs a label and at least one feature column (",
               delim_name, "-separated); this one has ", cols.size(), " column(s)");
      if (n_dense < 0 && n_cat < 0) {
        if (have == kCriteoDense + kCriteoCategorical) {
          n_dense = kCriteoDense;
        } else {
          int64_t lead = 0, last_number = 0;
          double v = 0;
          while (lead < have &&
                 (cols[size_t(lead + 1)].empty() || parse_number(cols[size_t(lead + 1)], &v))) {
            if (!cols[size_t(lead + 1)].empty()) last_number = lead + 1;
            ++lead;
          }
          n_dense = last_number;
        }
        n_cat = have - n_dense;
      } else if (n_dense < 0) {
        n_dense = have - n_cat;
      } else if (n_cat < 0) {
        n_cat = have - n_dense;
      }
      MT_CHECK(
          n_dense >= 0 && n_cat >= 0 && n_dense + n_cat == have, where(), "the first line has ",
          cols.size(), " ", delim_name, "-separated columns, which is not a label, ",
          options.n_dense < 0 ? std::string("some") : std::to_string(options.n_dense),
          " dense and ", options.n_cat < 0 ? std::string("some") : std::to_string(options.n_cat),
          " categorical columns");
      columns = 1 + n_dense + n_cat;
      log.n_dense = n_dense;
      log.n_cat = n_cat;
      log.table_sizes.assign(size_t(n_cat), options.hash_buckets);
    }
    MT_CHECK(int64_t(cols.size()) == columns, where(), "has ", cols.size(), " ", delim_name,
             "-separated columns, expected ", columns, " (label, ", n_dense, " dense, ", n_cat,
             " categorical)");
    double label = 0;
    MT_CHECK(parse_number(cols[0], &label) && (label == 0 || label == 1), where(),
             "the label (column 1) is '", printable(cols[0]), "'; it must be 0 or 1");
    log.labels.push_back(float(label));
    for (int64_t j = 0; j < n_dense; ++j) {
      const std::string_view s = cols[size_t(1 + j)];
      double x = std::numeric_limits<double>::quiet_NaN();
      MT_CHECK(s.empty() || parse_number(s, &x), where(), "dense column I", j + 1, " (column ",
               j + 2, ") is '", printable(s), "', not a number (leave it empty when missing)");
      log.dense.push_back(transform_dense(x));
    }
    for (int64_t f = 0; f < n_cat; ++f)
      log.categorical.push_back(hash_token(cols[size_t(1 + n_dense + f)], options.hash_buckets));
  }
  MT_CHECK(!log.labels.empty(), "click log '", name, "' has no examples");
  return log;
}

ClickLog read_click_log(const std::string& path, const ClickFileOptions& options) {
  const std::vector<uint8_t> bytes = read_file(path);
  ClickFileOptions o = options;
  o.delimiter = click_delimiter(path, options.delimiter);
  return parse_click_log(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path, o);
}

}  // namespace mantissa::data
