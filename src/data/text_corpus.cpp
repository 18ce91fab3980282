#include "mantissa/data/text_corpus.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "data/file_io.h"
#include "data/random.h"
#include "mantissa/core/error.h"

namespace mantissa::data {
namespace {

namespace fs = std::filesystem;

// The document split's stream, after the token generator's 4..6 (tokens.cpp).
constexpr uint64_t kDocumentSplit = 7;

bool looks_binary(const std::vector<uint8_t>& bytes) {
  return data::looks_binary(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

void add_file(TextCorpus& corpus, const std::string& path, const std::vector<uint8_t>& bytes,
              const CorpusOptions& options) {
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  for (std::string& d : split_documents(text, options.separator))
    corpus.documents.push_back(std::move(d));
  corpus.files.push_back(path);
}

void add_directory(TextCorpus& corpus, const fs::path& dir, const CorpusOptions& options) {
  std::vector<fs::path> entries;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    // symlink_status: a link is skipped, not followed (fortune directories link every file twice).
    const fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (fs::is_directory(st)) continue;
    if (fs::is_regular_file(st)) {
      entries.push_back(it->path());
    } else {
      corpus.skipped.push_back(it->path().string());
    }
  }
  MT_CHECK(!ec, "cannot list the directory '", dir.string(), "': ", ec.message());
  std::sort(entries.begin(), entries.end());
  for (const fs::path& p : entries) {
    const std::vector<uint8_t> bytes = read_file(p.string());
    if (looks_binary(bytes)) {
      corpus.skipped.push_back(p.string());
      continue;
    }
    add_file(corpus, p.string(), bytes, options);
  }
  std::sort(corpus.skipped.begin(), corpus.skipped.end());
}

}  // namespace

int64_t TextCorpus::bytes() const {
  int64_t n = 0;
  for (const std::string& d : documents)
    n += int64_t(d.size());
  return n;
}

std::vector<std::string> split_documents(std::string_view text, std::string_view separator) {
  std::vector<std::string> docs;
  if (separator.empty()) {
    if (!text.empty()) docs.emplace_back(text);
    return docs;
  }
  size_t start = 0;  // of the current document
  for (size_t line = 0; line < text.size();) {
    const size_t nl = text.find('\n', line);
    const size_t end = nl == std::string_view::npos ? text.size() : nl;
    std::string_view content = text.substr(line, end - line);
    if (!content.empty() && content.back() == '\r') content.remove_suffix(1);
    const size_t next = nl == std::string_view::npos ? text.size() : nl + 1;
    if (content == separator) {
      if (line > start) docs.emplace_back(text.substr(start, line - start));
      start = next;
    }
    line = next;
  }
  if (text.size() > start) docs.emplace_back(text.substr(start));
  return docs;
}

TextCorpus read_text_corpus(const std::vector<std::string>& paths, const CorpusOptions& options) {
  MT_CHECK(!paths.empty(), "read_text_corpus: no input paths");
  TextCorpus corpus;
  for (const std::string& path : paths) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    MT_CHECK(fs::exists(st), "the corpus path '", path, "' does not exist");
    const size_t docs_before = corpus.documents.size();
    if (fs::is_directory(st)) {
      add_directory(corpus, path, options);
      MT_CHECK(corpus.documents.size() > docs_before, "the corpus directory '", path,
               "' holds no text: ",
               corpus.files.empty() ? "no regular text files in it (links, binary files and "
                                      "special files are skipped)"
                                    : "its files are empty");
    } else {
      const std::vector<uint8_t> bytes = read_file(path);
      MT_CHECK(!looks_binary(bytes), "the corpus file '", path,
               "' is binary (a NUL byte in its first 8000 bytes), not text; tokenize reads "
               "text files (a directory's binary files are skipped)");
      add_file(corpus, path, bytes, options);
      MT_CHECK(corpus.documents.size() > docs_before, "the corpus file '", path,
               "' holds no text (it is empty",
               options.separator.empty() ? "" : " or holds only separator lines", ")");
    }
  }
  return corpus;
}

DocumentSplit split_train_val(std::vector<std::string> documents, double val_fraction,
                              uint64_t seed) {
  MT_CHECK(val_fraction >= 0 && val_fraction < 1, "the validation fraction must be in [0, 1), not ",
           val_fraction);
  const size_t n = documents.size();
  size_t n_val = size_t(std::llround(val_fraction * double(n)));
  if (val_fraction > 0 && n >= 2) n_val = std::clamp<size_t>(n_val, 1, n - 1);
  if (n < 2) n_val = 0;
  // The first n_val positions of a seeded Fisher-Yates permutation (swap i drawn at counter i).
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t(0));
  for (size_t i = 0; i < n_val; ++i) {
    const size_t j = i + size_t(below(draw64(seed, kDocumentSplit, i), n - i));
    std::swap(order[i], order[j]);
  }
  std::vector<char> is_val(n, 0);
  for (size_t i = 0; i < n_val; ++i)
    is_val[order[i]] = 1;
  DocumentSplit split;
  split.val.reserve(n_val);
  split.train.reserve(n - n_val);
  for (size_t i = 0; i < n; ++i)
    (is_val[i] ? split.val : split.train).push_back(std::move(documents[i]));
  return split;
}

}  // namespace mantissa::data
