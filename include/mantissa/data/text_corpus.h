// Text corpora for tokenizers: files and directories read into documents, and a seeded split of
// whole documents into training and validation sets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mantissa::data {

// The Debian package `fortunes` (apt-get install fortunes): about 2.5 MB of plain-text fortune
// files whose entries are separated by lines holding only "%". The default example corpus.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// git's rule for a binary file: a NUL byte among the first 8000 bytes (text readers refuse or
// skip such a file instead of reading it as text).
inline constexpr size_t kBinarySniffBytes = 8000;
inline bool looks_binary(std::string_view bytes) {
  return bytes.substr(0, kBinarySniffBytes).find('\0') != std::string_view::npos;
}

struct CorpusOptions {
  // A line holding only this text (a trailing \r allowed) separates documents inside a file; the
  // default is the fortune format's "%". A file without such a line is one document; empty
  // means every file is one document.
  std::string separator = "%";
};

struct TextCorpus {
  std::vector<std::string> documents;  // in file order, then order in the file; none is empty
  std::vector<std::string> files;      // the files read, in order
  // Entries of directories that were not read: symbolic links (fortune directories link each
  // file a second time as *.u8), anything that is not a regular file, and binary files (a NUL byte
  // in their first 8000 bytes, git's rule: the fortune *.dat index files).
  std::vector<std::string> skipped;

  int64_t bytes() const;  // of the documents
};

// Reads each path: a file as it is (whatever its content), a directory recursively in sorted path
// order. Fails, naming the path, for a missing path, and when no document results (nothing but
// empty files, an empty directory).
TextCorpus read_text_corpus(const std::vector<std::string>& paths,
                            const CorpusOptions& options = {});

// The documents of one file's text (see CorpusOptions::separator); empty documents are dropped.
// Separator lines are not part of any document; every other byte is.
std::vector<std::string> split_documents(std::string_view text, std::string_view separator);

struct DocumentSplit {
  std::vector<std::string> train, val;  // each in the corpus's order
};

// A seeded choice of whole documents for validation: round(val_fraction * documents) of them (a
// fraction of the documents, not of the bytes), at least 1 when val_fraction > 0 and at least 1
// left for training. A pure function of (documents, val_fraction, seed); train and val share no
// document. One document and val_fraction > 0 gives an empty validation set.
DocumentSplit split_train_val(std::vector<std::string> documents, double val_fraction,
                              uint64_t seed);

}  // namespace mantissa::data
