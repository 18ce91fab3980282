// BpeTokenizer: the GPT-2 pre-split (against GPT-2's regular expression), training (against a
// naive reference), encode/decode round trips on any bytes, the JSON file and its errors.
#include "mantissa/data/tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/core/error.h"
#include "mantissa/data/text_corpus.h"

namespace mantissa::data {
namespace {

namespace fs = std::filesystem;
using Merges = std::vector<std::pair<uint32_t, uint32_t>>;

using testing::error_of;

std::vector<std::string> strings(const std::vector<std::string_view>& v) {
  return {v.begin(), v.end()};
}

std::string random_bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s)
    c = char(rng() & 0xFF);
  return s;
}

// Text from a small vocabulary of words (Zipf-like counts), so that training has real pairs;
// with invalid UTF-8 and runs of one letter ("aaaa": overlapping occurrences of a pair).
std::vector<std::string> made_up_corpus(uint32_t seed, int documents) {
  static const char* kWords[] = {"the",   "then",  "there",    "these", "in",     "ing",
                                 "thing", "sing",  "aaaa",     "aaa",   "banana", "bandana",
                                 "don't", "we'll", "42",       "1234",  "!!",     "...",
                                 "café",  "naïve", "\xff\xfe", "日本"};
  std::mt19937 rng(seed);
  std::vector<std::string> docs;
  for (int d = 0; d < documents; ++d) {
    std::string doc;
    const int n = 5 + int(rng() % 30);
    for (int i = 0; i < n; ++i) {
      const size_t k = std::min<size_t>(std::size(kWords) - 1, size_t(rng() % 8 + rng() % 16));
      doc += kWords[k];
      doc += (rng() % 7 == 0) ? "\n" : (rng() % 9 == 0 ? "  " : " ");
    }
    docs.push_back(doc);
  }
  return docs;
}

// ---- the naive reference: recount every pair for every merge ---------------------------------

Merges naive_train(const std::vector<std::string>& docs, int64_t num_merges, int64_t min_freq) {
  std::map<std::string, int64_t> counts;
  for (const std::string& d : docs) {
    for (std::string_view p : pretokenize(d))
      ++counts[std::string(p)];
  }
  std::vector<std::pair<std::vector<uint32_t>, int64_t>> words;
  for (const auto& [w, c] : counts) {
    std::vector<uint32_t> ids;
    for (unsigned char ch : w)
      ids.push_back(ch);
    words.emplace_back(ids, c);
  }
  Merges merges;
  while (int64_t(merges.size()) < num_merges) {
    std::map<std::pair<uint32_t, uint32_t>, int64_t> pairs;  // ordered: the lowest pair first
    for (const auto& [ids, c] : words) {
      for (size_t i = 0; i + 1 < ids.size(); ++i)
        pairs[{ids[i], ids[i + 1]}] += c;
    }
    std::pair<uint32_t, uint32_t> best{};
    int64_t best_count = 0;
    for (const auto& [p, c] : pairs) {
      if (c > best_count) best = p, best_count = c;
    }
    if (best_count < min_freq || best_count == 0) break;
    const auto x = uint32_t(256 + merges.size());
    merges.push_back(best);
    for (auto& [ids, c] : words) {
      std::vector<uint32_t> out;
      for (size_t i = 0; i < ids.size();) {
        if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) {
          out.push_back(x);
          i += 2;
        } else {
          out.push_back(ids[i++]);
        }
      }
      ids = out;
    }
  }
  return merges;
}

// Merges applied one after another, in rank order, to one pre-token.
std::vector<uint32_t> naive_encode_word(std::string_view word, const Merges& merges) {
  std::vector<uint32_t> ids;
  for (unsigned char c : word)
    ids.push_back(c);
  for (size_t r = 0; r < merges.size(); ++r) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < ids.size();) {
      if (i + 1 < ids.size() && ids[i] == merges[r].first && ids[i + 1] == merges[r].second) {
        out.push_back(uint32_t(256 + r));
        i += 2;
      } else {
        out.push_back(ids[i++]);
      }
    }
    ids = out;
  }
  return ids;
}

// ---- the pre-split -----------------------------------------------------------------------------

TEST(Pretokenize, Gpt2ByHand) {
  using V = std::vector<std::string>;
  EXPECT_EQ(strings(pretokenize("Hello world's  test 123!!")),
            (V{"Hello", " world", "'s", " ", " test", " 123", "!!"}));
  // Contractions are lower-case only; an apostrophe that starts none is punctuation.
  EXPECT_EQ(strings(pretokenize("I'll they're DON'T 'quote'")),
            (V{"I", "'ll", " they", "'re", " DON", "'", "T", " '", "quote", "'"}));
  // A whitespace run before a word leaves its last space to the word; at the end it stays whole.
  EXPECT_EQ(strings(pretokenize("a\n\nb  \t c   ")),
            (V{"a", "\n", "\n", "b", "  \t", " c", "   "}));
  EXPECT_EQ(strings(pretokenize("x   y")), (V{"x", "  ", " y"}));
  EXPECT_EQ(strings(pretokenize("3.14 is pi, 1000000 $")),
            (V{"3", ".", "14", " is", " pi", ",", " 1000000", " $"}));
  // Non-ASCII letters join words; punctuation blocks and emoji do not; U+3000 is a space.
  EXPECT_EQ(strings(pretokenize("naïve café—“ok” 😀\u3000日本")),
            (V{"naïve", " café", "—“", "ok", "”", " 😀", "\u3000", "日本"}));
  EXPECT_TRUE(pretokenize("").empty());
  EXPECT_EQ(strings(pretokenize(" ")), V{" "});
}

TEST(Pretokenize, MatchesGpt2Regex) {
  // tools/reference/make_pretokenize_golden.py: the pieces of GPT-2's own pattern (regex module).
  std::ifstream in(std::string(MANTISSA_GOLDEN_DIR) + "/pretokenize_gpt2.json");
  ASSERT_TRUE(in) << "missing golden file pretokenize_gpt2.json";
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_GT(golden["cases"].size(), 100u);
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(strings(pretokenize(text)), c["pieces"].get<std::vector<std::string>>())
        << "text: " << nlohmann::json(text).dump();
  }
}

TEST(Pretokenize, AnyBytesSplitLosslesslyAndKeepCharactersWhole) {
  std::mt19937 rng(1);
  for (int t = 0; t < 300; ++t) {
    const std::string s = random_bytes(rng, rng() % 64);
    std::string joined;
    for (std::string_view p : pretokenize(s)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s);
  }
  // Invalid bytes (a lone continuation byte, a truncated sequence, an overlong '/', a surrogate)
  // are punctuation: they run together with other punctuation, never with letters.
  using V = std::vector<std::string>;
  EXPECT_EQ(strings(pretokenize("ab\x80\xc3!cd \xe6\x97 \xc0\xaf\xed\xa0\x80z")),
            (V{"ab", "\x80\xc3!", "cd", " \xe6\x97", " \xc0\xaf\xed\xa0\x80", "z"}));
  // A valid character is never cut: "é" is 2 bytes, "日" 3, "😀" 4.
  for (std::string_view p : pretokenize("aé日😀 é日 😀!é")) {
    EXPECT_NE(uint8_t(p.front()) & 0xC0, 0x80) << "a piece starts inside a character";
  }
}

// ---- training ----------------------------------------------------------------------------------

TEST(BpeTrain, MatchesNaiveReference) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<std::string> docs = made_up_corpus(seed, 40);
    for (int64_t min_freq : {1, 2, 5}) {
      const BpeTokenizer tok =
          BpeTokenizer::train(docs, {.vocab_size = 256 + 120 + 1, .min_frequency = min_freq});
      const Merges expected = naive_train(docs, 120, min_freq);
      EXPECT_EQ(tok.merges(), expected) << "seed " << seed << " min_frequency " << min_freq;
      EXPECT_EQ(tok.vocab_size(), int64_t(256 + expected.size() + 1));
      EXPECT_EQ(tok.eot_id(), uint32_t(256 + expected.size()));
    }
  }
}

TEST(BpeTrain, DeterministicAndIndependentOfDocumentOrder) {
  std::vector<std::string> docs = made_up_corpus(7, 60);
  const BpeTokenizer a = BpeTokenizer::train(docs, {.vocab_size = 400});
  const BpeTokenizer b = BpeTokenizer::train(docs, {.vocab_size = 400});
  EXPECT_EQ(a.merges(), b.merges());
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  std::reverse(docs.begin(), docs.end());
  EXPECT_EQ(BpeTokenizer::train(docs, {.vocab_size = 400}).merges(), a.merges());
  // The first merge is the most frequent pair, ties to the lowest (left, right): the pre-tokens
  // of "ab ba ab ba" are "ab", " ba", " ab", " ba", where (a, b), (" ", b) and (b, a) occur twice
  // each; (" ", b) = (32, 98) is the lowest.
  const BpeTokenizer tie = BpeTokenizer::train(std::vector<std::string>{"ab ba ab ba"},
                                               {.vocab_size = 258, .min_frequency = 1});
  ASSERT_EQ(tie.num_merges(), 1);
  EXPECT_EQ(tie.merges()[0], std::make_pair(uint32_t(' '), uint32_t('b')));
}

TEST(BpeTrain, StopsWhenNoPairIsFrequentEnough) {
  const std::vector<std::string> docs = {"abcabc xyz"};
  const BpeTokenizer tok = BpeTokenizer::train(docs, {.vocab_size = 4096});
  // "ab", "bc", then "abc"... only pairs seen twice: (a,b), then (ab,c).
  EXPECT_EQ(tok.merges(), (Merges{{'a', 'b'}, {256, 'c'}}));
  EXPECT_EQ(tok.vocab_size(), 256 + 2 + 1);
  EXPECT_EQ(tok.encode("abcabc"), (std::vector<uint32_t>{257, 257}));
  // Special tokens never come out of merges, even when their text is in the corpus.
  const BpeTokenizer sp = BpeTokenizer::train(
      std::vector<std::string>(50, "<|endoftext|><|endoftext|>"), {.vocab_size = 300});
  for (uint32_t id : sp.encode("<|endoftext|>"))
    EXPECT_NE(id, sp.eot_id());
}

TEST(BpeTrain, RejectsBadOptions) {
  const std::vector<std::string> docs = {"some text"};
  EXPECT_HAS(error_of([&] { BpeTokenizer::train(docs, {.vocab_size = 256}); }), "at least 257");
  EXPECT_HAS(error_of([&] { BpeTokenizer::train(docs, {.min_frequency = 0}); }), "min_frequency");
  EXPECT_HAS(error_of([&] { BpeTokenizer::train(docs, {.special_tokens = {"<pad>"}}); }),
             "<|endoftext|>");
  EXPECT_HAS(error_of([&] {
               BpeTokenizer::train(docs, {.special_tokens = {"<|endoftext|>", "<|endoftext|>"}});
             }),
             "twice");
  EXPECT_HAS(error_of([&] {
               BpeTokenizer::train(docs, {.special_tokens = {"<|endoftext|>", "\xff"}});
             }),
             "UTF-8");
  // No documents, or only empty ones: a tokenizer of bytes alone.
  EXPECT_EQ(BpeTokenizer::train(std::vector<std::string>{}, {}).vocab_size(), 257);
}

// ---- encoding and decoding ---------------------------------------------------------------------

TEST(BpeEncode, RoundTripsAnyBytes) {
  const std::vector<std::string> docs = made_up_corpus(3, 80);
  const BpeTokenizer trained = BpeTokenizer::train(docs, {.vocab_size = 320});
  ASSERT_EQ(trained.vocab_size(), 320);
  const BpeTokenizer bytes = BpeTokenizer::byte_level();
  EXPECT_EQ(bytes.vocab_size(), 257);
  EXPECT_EQ(bytes.eot_id(), 256u);
  std::mt19937 rng(5);
  std::vector<std::string> inputs = {"", "\xff", "\xc3", "\xed\xa0\x80", " ", "\n\n\n"};
  std::string all;
  for (int c = 0; c < 256; ++c)
    all += char(c);
  inputs.push_back(all);
  for (int t = 0; t < 200; ++t)
    inputs.push_back(random_bytes(rng, rng() % 200));
  inputs.insert(inputs.end(), docs.begin(), docs.end());
  for (const BpeTokenizer* tok : {&trained, &bytes}) {
    for (const std::string& s : inputs) {
      const std::vector<uint32_t> ids = tok->encode(s);
      for (uint32_t id : ids)
        ASSERT_LT(id, uint32_t(tok->eot_id()));  // text never encodes to a special token
      ASSERT_EQ(tok->decode(ids), s);
    }
  }
  // Merges compress the text they were trained on.
  size_t n_bytes = 0, n_ids = 0;
  for (const std::string& d : docs)
    n_bytes += d.size(), n_ids += trained.encode(d).size();
  EXPECT_LT(double(n_ids), 0.5 * double(n_bytes));
}

TEST(BpeEncode, AppliesMergesInRankOrderAsTrainingDid) {
  const std::vector<std::string> docs = made_up_corpus(11, 60);
  const BpeTokenizer tok = BpeTokenizer::train(docs, {.vocab_size = 450, .min_frequency = 1});
  std::mt19937 rng(2);
  std::vector<std::string> words = {"aaaaaaa", "bandanas", "thethethe", "café", "    "};
  for (const std::string& d : docs) {
    for (std::string_view p : pretokenize(d))
      words.emplace_back(p);
  }
  for (int t = 0; t < 100; ++t)
    words.push_back(random_bytes(rng, 2 + rng() % 10));
  BpeEncoder cached = tok.encoder();
  for (const std::string& w : words) {
    std::vector<uint32_t> expected;
    for (std::string_view p : pretokenize(w)) {
      const std::vector<uint32_t> part = naive_encode_word(p, tok.merges());
      expected.insert(expected.end(), part.begin(), part.end());
    }
    EXPECT_EQ(tok.encode(w), expected) << ::testing::PrintToString(w);
    EXPECT_EQ(cached.encode(w), expected);  // first a miss, later hits
    EXPECT_EQ(cached.encode(w), expected);
  }
  EXPECT_GT(cached.cache_size(), 10u);
}

TEST(BpeEncode, DocumentsAndSpecialTokens) {
  const BpeTokenizer tok = BpeTokenizer::train(made_up_corpus(4, 30), {.vocab_size = 300});
  const std::vector<std::string> docs = {"the thing", "", "banana\n"};
  const std::vector<uint32_t> ids = tok.encode_documents(docs);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.eot_id()), 3);
  EXPECT_EQ(ids.back(), tok.eot_id());
  EXPECT_EQ(tok.decode(ids), "the thing<|endoftext|><|endoftext|>banana\n<|endoftext|>");
  EXPECT_EQ(tok.token_bytes(tok.eot_id()), "<|endoftext|>");
  EXPECT_TRUE(tok.is_special(tok.eot_id()));
  EXPECT_FALSE(tok.is_special(255));
  EXPECT_EQ(tok.token_bytes('A'), "A");
  const std::vector<uint32_t> bad = {65, uint32_t(tok.vocab_size())};
  EXPECT_HAS(error_of([&] { tok.decode(bad); }), "out of range");
  EXPECT_HAS(error_of([&] { tok.token_bytes(uint32_t(tok.vocab_size())); }), "out of range");
  // Several special tokens: appended after the merges in the order given.
  const BpeTokenizer two = BpeTokenizer::train(
      made_up_corpus(4, 30), {.vocab_size = 300, .special_tokens = {"<|pad|>", "<|endoftext|>"}});
  EXPECT_EQ(two.eot_id(), 299u);
  EXPECT_EQ(two.token_bytes(298), "<|pad|>");
}

TEST(BpeEncode, LongPreTokensAreNotQuadratic) {
  const BpeTokenizer tok =
      BpeTokenizer::train(std::vector<std::string>(4, std::string(64, '=')), {.vocab_size = 270});
  const std::string text(1 << 20, '=');
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uint32_t> ids = tok.encode(text);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_LT(ids.size(), text.size() / 16);
  EXPECT_EQ(tok.decode(ids), text);
}

// ---- the file ----------------------------------------------------------------------------------

class BpeFile : public testing::TempDirTest {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }
  // The saved JSON of a small tokenizer with `edit` applied.
  std::string edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(saved_));
    edit(j);
    return write(name, j.dump());
  }
  void SetUp() override {
    TempDirTest::SetUp();
    saved_ = file("tok.json");
    BpeTokenizer::train(made_up_corpus(9, 30), {.vocab_size = 280}).save(saved_);
  }
  std::string saved_;
};

TEST_F(BpeFile, SaveLoadRoundTrip) {
  const BpeTokenizer tok = BpeTokenizer::train(made_up_corpus(9, 30), {.vocab_size = 280});
  const BpeTokenizer back = BpeTokenizer::load(saved_);
  EXPECT_EQ(back.merges(), tok.merges());
  EXPECT_EQ(back.special_tokens(), tok.special_tokens());
  EXPECT_EQ(back.vocab_size(), 280);
  EXPECT_EQ(back.fingerprint(), tok.fingerprint());
  EXPECT_EQ(back.encode("the thing's banana"), tok.encode("the thing's banana"));
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(saved_));
  EXPECT_EQ(j["format"], "mantissa-bpe");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["merges"].size(), 23u);
  EXPECT_EQ(j["special_tokens"][0]["id"], 279);
  // Byte level: no merges.
  BpeTokenizer::byte_level().save(file("bytes.json"));
  EXPECT_EQ(BpeTokenizer::load(file("bytes.json")).vocab_size(), 257);
  EXPECT_NE(BpeTokenizer::byte_level().fingerprint(), tok.fingerprint());
  // The save is atomic: only the file itself is left.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 2);
}

TEST_F(BpeFile, EveryBadFileIsNamedWithWhatIsWrong) {
  struct Case {
    std::string path, expected;
  };
  using J = nlohmann::json;
  const std::vector<Case> cases = {
      {file("missing.json"), "no such file"},
      {write("empty.json", ""), "empty"},
      {write("broken.json", "{\"format\": \"mantissa-bpe\", "), "not valid JSON"},
      {write("array.json", "[1, 2]"), "not an object"},
      {write("hf.json", R"({"model": {"type": "BPE"}})"), "Hugging Face"},
      {edited("format.json", [](J& j) { j["format"] = "sentencepiece"; }), "\"sentencepiece\""},
      {edited("version.json", [](J& j) { j["version"] = 2; }), "version 2"},
      {edited("pre.json", [](J& j) { j["pre_tokenizer"] = "llama3"; }), "llama3"},
      {edited("nomerges.json", [](J& j) { j.erase("merges"); }), "no \"merges\""},
      {edited("unknown.json",
              [](J& j) {
                j["merges"][3] = {65, 900};
              }),
       "refers to id 900"},
      {edited("later.json",
              [](J& j) {
                j["merges"][0] = {65, 256};
              }),
       "unknown at that point"},
      {edited("pair.json", [](J& j) { j["merges"][1] = {65}; }), "not a pair"},
      {edited("negative.json",
              [](J& j) {
                j["merges"][1] = {-1, 65};
              }),
       "non-negative"},
      {edited("dup.json", [](J& j) { j["merges"][5] = j["merges"][2]; }), "repeats merge 2"},
      {edited("vocab.json", [](J& j) { j["vocab_size"] = 4096; }), "declares vocab_size 4096"},
      {edited("specialid.json", [](J& j) { j["special_tokens"][0]["id"] = 5; }), "must be 279"},
      {edited("noeot.json", [](J& j) { j["special_tokens"][0]["content"] = "<pad>"; }),
       "no <|endoftext|>"},
      // Found by fuzz/tokenizer_fuzz.cpp: a number beyond a double's range is JSON's out_of_range,
      // not its parse_error, and escaped as a foreign exception.
      {write("huge.json", "4e5111"), "not valid JSON"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { BpeTokenizer::load(c.path); });
    EXPECT_HAS(msg, c.path);
    EXPECT_HAS(msg, c.expected);
  }
}

// Found by fuzz/tokenizer_fuzz.cpp (fuzz/regressions/tokenizer/merges-that-double-a-token): each
// merge of the last token with itself doubles its length, so a 1 KB file of 41 merges asked for
// 2^41 bytes. The lengths are now checked before any byte is stored.
TEST_F(BpeFile, RefusesMergesThatMakeATokenTooLong) {
  nlohmann::json merges = nlohmann::json::array({{97, 97}});
  for (int i = 0; i < 40; ++i)
    merges.push_back({256 + i, 256 + i});
  const nlohmann::json doc = {
      {"format", "mantissa-bpe"},
      {"version", 1},
      {"vocab_size", 256 + 41 + 1},
      {"merges", merges},
      {"special_tokens", {{{"id", 256 + 41}, {"content", "<|endoftext|>"}}}}};
  const std::string path = write("doubling.json", doc.dump());
  const std::string msg = error_of([&] { BpeTokenizer::load(path); });
  EXPECT_HAS(msg, path);
  // Merge 16 makes the first token over 65,536 bytes: 2^17.
  EXPECT_HAS(msg, "merge 16");
  EXPECT_HAS(msg, "131072 bytes");
  // The same merges up to the limit load.
  nlohmann::json fits = doc;
  fits["merges"] = nlohmann::json(std::vector<nlohmann::json>(merges.begin(), merges.begin() + 16));
  fits["vocab_size"] = 256 + 16 + 1;
  fits["special_tokens"][0]["id"] = 256 + 16;
  const BpeTokenizer tok = BpeTokenizer::load(write("fits.json", fits.dump()));
  EXPECT_EQ(tok.token_bytes(256 + 15).size(), kMaxTokenBytes);
}

// ---- the real corpus ---------------------------------------------------------------------------

TEST(BpeFortunes, TrainsAndRoundTripsEveryDocument) {
  if (!fs::exists(kFortunesDir))
    GTEST_SKIP() << kFortunesDir << " missing (apt-get install fortunes)";
  const TextCorpus corpus = read_text_corpus({kFortunesDir});
  ASSERT_GT(corpus.documents.size(), 1000u);
  const BpeTokenizer tok = BpeTokenizer::train(corpus.documents, {.vocab_size = 1024});
  EXPECT_EQ(tok.vocab_size(), 1024);
  BpeEncoder enc = tok.encoder();
  size_t ids = 0;
  for (const std::string& d : corpus.documents) {
    const std::vector<uint32_t> t = enc.encode(d);
    ASSERT_EQ(tok.decode(t), d);
    ids += t.size();
  }
  // English at a 1k vocabulary: well over 2 bytes per token.
  EXPECT_GT(double(corpus.bytes()) / double(ids), 2.0);
}

}  // namespace
}  // namespace mantissa::data
