// Byte-level BPE (GPT-2's scheme): text is split into pre-tokens (words, numbers, punctuation
// runs, whitespace), each pre-token's bytes are the base alphabet (ids 0..255, so any byte string
// encodes, UTF-8 or not), and learned merges of adjacent ids, applied by rank, make the longer
// tokens (ids 256 + rank). Special tokens come after the merges; `<|endoftext|>` separates
// documents and ends generation, and never comes out of merges.
//
//   auto tok = BpeTokenizer::train(documents, {.vocab_size = 4096});
//   std::vector<uint32_t> ids = tok.encode("Hello world");   // merges by rank in each pre-token
//   tok.decode(ids) == "Hello world";                          // for every byte string
//   tok.save("tokenizer.json");  BpeTokenizer::load("tokenizer.json");
//
// The pre-split is GPT-2's regular expression, written by hand:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Character classes (an approximation of Unicode's, stated here because it decides where merges
// may not cross): ASCII by its category (letters, digits 0-9, whitespace \t \n \v \f \r and space,
// the rest punctuation); non-ASCII code points decoded from UTF-8 and classed by block: the
// Unicode spaces (U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000)
// as whitespace, the Latin-1 symbols and punctuation, general punctuation, currency, arrows,
// mathematical and technical symbols, box drawing, dingbats, CJK punctuation and emoji as
// punctuation, everything else as a letter (so non-ASCII digits are letters); a byte that is not
// part of valid UTF-8 is punctuation. Pre-tokens therefore never split a valid UTF-8 character.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mantissa::data {

inline constexpr std::string_view kEndOfText = "<|endoftext|>";
// The most bytes one token may have, and all tokens together. Real vocabularies are far below
// (GPT-2's 50,257 tokens hold about 0.4 MB); the limits keep a hostile tokenizer file, whose
// merges could double a token's length each, from asking for terabytes.
inline constexpr size_t kMaxTokenBytes = size_t(1) << 16;
inline constexpr size_t kMaxVocabularyBytes = size_t(1) << 28;

// The GPT-2 pre-tokens of `text`, in order; they concatenate back to `text`.
std::vector<std::string_view> pretokenize(std::string_view text);

struct BpeTrainOptions {
  // Bytes (256) + merges + special tokens. Training stops earlier when no pair of adjacent
  // tokens occurs min_frequency times; the tokenizer's vocab_size() says where it stopped.
  int64_t vocab_size = 4096;
  // A pair seen fewer times than this is never merged (1 merges down to single occurrences).
  int64_t min_frequency = 2;
  // Appended after the merges, in this order; must hold kEndOfText.
  std::vector<std::string> special_tokens = {std::string(kEndOfText)};
};

// Applies a tokenizer's merges with a cache of pre-token -> ids (most pre-tokens repeat: the cache
// turns encoding into a pre-split and hash lookups). Not thread-safe: one per thread. Holds a
// pointer to its tokenizer, which must outlive it.
class BpeEncoder;

class BpeTokenizer {
 public:
  static constexpr int64_t kByteTokens = 256;

  // The byte-level tokenizer: no merges, bytes and <|endoftext|> (vocab_size 257).
  BpeTokenizer();
  static BpeTokenizer byte_level() { return {}; }

  // Learns merges from `documents` (each pre-split on its own; no merge crosses a document or a
  // pre-token). Deterministic: each step merges the most frequent pair of adjacent ids (counted
  // over all pre-tokens with their multiplicity), ties broken by the lowest (left id, right id);
  // an occurrence is merged left to right, as encode() does. Pair counts are updated
  // incrementally: a merge touches only the distinct pre-tokens that contain the pair.
  static BpeTokenizer train(std::span<const std::string> documents,
                            const BpeTrainOptions& options = {});

  // One JSON file: {"format": "mantissa-bpe", "version": 1, "vocab_size", "pre_tokenizer":
  // "gpt2", "merges": [[left, right], ...] in rank order (merge r makes id 256 + r),
  // "special_tokens": [{"id", "content"}, ...]}. Written atomically.
  void save(const std::string& path) const;
  // Checks everything (format, version, each merge's ids defined before it, no duplicate merge,
  // the tokens' lengths, the special tokens' ids and text, the vocabulary size) and names the
  // file in every error.
  static BpeTokenizer load(const std::string& path);

  // Text is bytes: a special token's text inside `text` encodes as ordinary bytes (a document
  // cannot forge an end-of-text).
  std::vector<uint32_t> encode(std::string_view text) const;
  // Each document followed by eot_id(), in one stream (one cache across the documents).
  std::vector<uint32_t> encode_documents(std::span<const std::string> documents) const;
  // The tokens' bytes concatenated: decode(encode(x)) == x for every byte string x. A special
  // token decodes to its text. Throws for an id >= vocab_size().
  std::string decode(std::span<const uint32_t> ids) const;
  // The bytes of one token (a special token's text).
  std::string_view token_bytes(uint32_t id) const;

  int64_t vocab_size() const { return int64_t(offsets_.size()) - 1; }
  int64_t num_merges() const { return int64_t(merges_.size()); }
  uint32_t eot_id() const { return eot_; }
  const std::vector<std::pair<uint32_t, uint32_t>>& merges() const { return merges_; }
  const std::vector<std::string>& special_tokens() const { return specials_; }
  bool is_special(uint32_t id) const { return int64_t(id) >= kByteTokens + num_merges(); }
  // A 64-bit hash of the merges and the special tokens (never 0): token shards record it, so a
  // shard read with another tokenizer of the same size is caught (load_token_shard).
  uint64_t fingerprint() const { return fingerprint_; }

  BpeEncoder encoder() const;

 private:
  friend class BpeEncoder;
  // Builds the tables; the parts must be valid (train and load check them).
  BpeTokenizer(std::vector<std::pair<uint32_t, uint32_t>> merges,
               std::vector<std::string> specials);
  // The ids of one pre-token of two or more bytes, merges applied by rank, appended to `out`.
  void merge_word(std::string_view word, std::vector<uint32_t>& out) const;
  uint32_t rank_of(uint32_t left, uint32_t right) const;

  std::vector<std::pair<uint32_t, uint32_t>> merges_;
  std::vector<std::string> specials_;
  std::unordered_map<uint64_t, uint32_t> ranks_;  // (left << 32 | right) -> rank
  std::string bytes_;                             // every token's bytes, back to back
  std::vector<uint64_t> offsets_;                 // token i is bytes_[offsets_[i], offsets_[i + 1])
  uint32_t eot_ = 0;
  uint64_t fingerprint_ = 0;
};

class BpeEncoder {
 public:
  explicit BpeEncoder(const BpeTokenizer& tokenizer) : tok_(&tokenizer) {}
  // Appends the ids of `text` to `out`.
  void encode(std::string_view text, std::vector<uint32_t>& out);
  std::vector<uint32_t> encode(std::string_view text) {
    std::vector<uint32_t> out;
    encode(text, out);
    return out;
  }
  // Entries in the cache (it is emptied when it reaches kMaxCacheEntries).
  size_t cache_size() const { return cache_.size(); }
  static constexpr size_t kMaxCacheEntries = size_t(1) << 20;

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Span {
    uint32_t begin, size;  // in ids_
  };
  const BpeTokenizer* tok_;
  std::unordered_map<std::string, Span, Hash, std::equal_to<>> cache_;
  std::vector<uint32_t> ids_;
};

}  // namespace mantissa::data
