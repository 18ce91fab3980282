// Text corpora: documents from fortune files and plain files, directories walked in order
// (links, binary and special files skipped), the seeded validation split of whole documents.
#include "mantissa/data/text_corpus.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/core/error.h"

namespace mantissa::data {
namespace {

namespace fs = std::filesystem;
using V = std::vector<std::string>;

using testing::error_of;

TEST(SplitDocuments, FortuneFormat) {
  EXPECT_EQ(split_documents("one\nline\n%\ntwo\n%\nthree", "%"),
            (V{"one\nline\n", "two\n", "three"}));
  // Leading, trailing and repeated separators make no empty documents; CRLF lines are separators
  // too; a "%" inside a line is text.
  EXPECT_EQ(split_documents("%\na 100%\n%\r\n%\nb\r\n%\n", "%"), (V{"a 100%\n", "b\r\n"}));
  EXPECT_EQ(split_documents("no separator\n", "%"), V{"no separator\n"});
  EXPECT_EQ(split_documents("a\n%\nb\n", ""), V{"a\n%\nb\n"});
  EXPECT_EQ(split_documents("a\n---\nb", "---"), (V{"a\n", "b"}));
  EXPECT_TRUE(split_documents("", "%").empty());
  EXPECT_TRUE(split_documents("%\n%\n", "%").empty());
  // Invalid UTF-8 passes through untouched.
  EXPECT_EQ(split_documents("\xff\xfe\n%\n\x80", "%"), (V{"\xff\xfe\n", "\x80"}));
}

class Corpus : public testing::TempDirTest {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    fs::create_directories(fs::path(file(name)).parent_path());
    std::ofstream(file(name), std::ios::binary) << bytes;
    return file(name);
  }
};

TEST_F(Corpus, DirectoriesInSortedOrderSkippingLinksAndBinaryFiles) {
  write("d/b", "b1\n%\nb2\n");
  write("d/a", "a1\n%\na2\n%\n");
  write("d/sub/c.txt", "c\n");
  write("d/empty", "");
  write("d/a.dat", std::string("\0\0\0\2index", 10));  // strfile's index: binary
  fs::create_symlink(file("d/a"), file("d/a.u8"));     // fortunes links every file twice
  ::mkfifo(file("d/fifo").c_str(), 0600);
  const TextCorpus c = read_text_corpus({file("d")});
  EXPECT_EQ(c.documents, (V{"a1\n", "a2\n", "b1\n", "b2\n", "c\n"}));
  EXPECT_EQ(c.files, (V{file("d/a"), file("d/b"), file("d/empty"), file("d/sub/c.txt")}));
  EXPECT_EQ(c.skipped, (V{file("d/a.dat"), file("d/a.u8"), file("d/fifo")}));
  EXPECT_EQ(c.bytes(), 3 + 3 + 3 + 3 + 2);
  // Files given by name are read as they are, links followed; the separator is an option.
  const TextCorpus f = read_text_corpus({file("d/a.u8"), file("d/b")}, {.separator = ""});
  EXPECT_EQ(f.documents, (V{"a1\n%\na2\n%\n", "b1\n%\nb2\n"}));
}

TEST_F(Corpus, MissingAndEmptyInputsAreNamed) {
  EXPECT_HAS(error_of([&] { read_text_corpus({file("nowhere")}); }),
             file("nowhere") + "' does not exist");
  write("empty.txt", "");
  EXPECT_HAS(error_of([&] { read_text_corpus({file("empty.txt")}); }), "holds no text");
  write("seps.txt", "%\n%\n");
  EXPECT_HAS(error_of([&] { read_text_corpus({file("seps.txt")}); }), "only separator lines");
  fs::create_directory(file("void"));
  EXPECT_HAS(error_of([&] { read_text_corpus({file("void")}); }), "no regular text files");
  write("hollow/x", "");
  EXPECT_HAS(error_of([&] { read_text_corpus({file("hollow")}); }), "its files are empty");
  EXPECT_THROW(read_text_corpus({}), Error);
}

TEST(SplitTrainVal, SeededWholeDocuments) {
  V docs;
  for (int i = 0; i < 200; ++i)
    docs.push_back("doc " + std::to_string(i));
  const DocumentSplit s = split_train_val(docs, 0.05, 1);
  EXPECT_EQ(s.val.size(), 10u);
  EXPECT_EQ(s.train.size(), 190u);
  std::set<std::string> all(s.train.begin(), s.train.end());
  for (const std::string& v : s.val)
    EXPECT_TRUE(all.insert(v).second) << v << " is in both";
  EXPECT_EQ(all.size(), 200u);
  // Each side keeps the corpus's order.
  auto index = [](const std::string& d) { return std::stoi(d.substr(4)); };
  EXPECT_TRUE(std::is_sorted(s.val.begin(), s.val.end(),
                             [&](auto& a, auto& b) { return index(a) < index(b); }));
  EXPECT_TRUE(std::is_sorted(s.train.begin(), s.train.end(),
                             [&](auto& a, auto& b) { return index(a) < index(b); }));
  // A pure function of (documents, fraction, seed).
  EXPECT_EQ(split_train_val(docs, 0.05, 1).val, s.val);
  EXPECT_NE(split_train_val(docs, 0.05, 2).val, s.val);
  // At least one document each way; none held out at 0; one document cannot be split.
  EXPECT_EQ(split_train_val(V{"a", "b", "c"}, 0.01, 0).val.size(), 1u);
  EXPECT_EQ(split_train_val(V{"a", "b"}, 0.9, 0).train.size(), 1u);
  EXPECT_TRUE(split_train_val(docs, 0, 0).val.empty());
  EXPECT_TRUE(split_train_val(V{"only"}, 0.5, 0).val.empty());
  EXPECT_THROW(split_train_val(docs, 1.0, 0), Error);
  EXPECT_THROW(split_train_val(docs, -0.1, 0), Error);
}

}  // namespace
}  // namespace mantissa::data
