// Language-model data: token streams (token shards, flat uint16 files, a byte-level tokenizer,
// synthetic streams) and TokenWindows, the Dataset of a stream's training windows (samples {x, y}:
// T tokens and the same T shifted by one).
//
// Every malformed input raises mantissa::Error naming the file and what is wrong with it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mantissa/data/dataset.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::data {

// A token stream in host memory. Ids are uint32 so that vocabularies beyond 65536 fit; the files
// store them as uint16 where the vocabulary allows (half the bytes on disk).
struct TokenDataset {
  std::vector<uint32_t> tokens;
  int64_t vocab_size = 0;  // every token is < vocab_size
  std::string name;
  // Of the tokenizer that encoded the stream (BpeTokenizer::fingerprint(), tokenizer.h), as the
  // shard recorded it; 0 when unknown (headerless files, synthetic streams).
  uint64_t tokenizer_fingerprint = 0;

  int64_t size() const { return int64_t(tokens.size()); }
};

// A flat file of little-endian uint16 tokens, no header. vocab_size is the largest token + 1
// unless `vocab_size` > 0 is given (then every token must be below it). Prefer token shards
// (below): they record the vocabulary, the count and the tokenizer, and hold ids >= 65536.
TokenDataset load_tokens(const std::string& path, int64_t vocab_size = 0);
// Atomic (a failure leaves an earlier file intact); every token must be < 65536.
void write_tokens(const std::string& path, std::span<const uint32_t> tokens);

// ---- token shards ------------------------------------------------------------------------------
//
// A token shard is a 64-byte little-endian header followed by the tokens:
//
//   offset  size  field
//        0     8  magic "MTTOKENS"
//        8     4  version (1)
//       12     4  header size in bytes (64): where the tokens start
//       16     4  vocabulary size V (every token < V)
//       20     4  bytes per token: 2 (uint16) when V <= 65536, else 4 (uint32)
//       24     8  token count N
//       32     8  fingerprint of the tokenizer that encoded them (0: not recorded)
//       40    24  reserved, written as zeros
//       64  N*2|4 the tokens, little-endian
//
// The file is exactly 64 + N * (bytes per token) long; the tokens are 4-byte aligned.

inline constexpr char kTokenShardMagic[8] = {'M', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr uint32_t kTokenShardHeaderBytes = 64;

struct TokenShardHeader {
  uint32_t version = kTokenShardVersion;
  uint32_t header_bytes = kTokenShardHeaderBytes;
  int64_t vocab_size = 0;
  int token_bytes = 2;  // 2 or 4
  int64_t token_count = 0;
  uint64_t tokenizer_fingerprint = 0;
};

// Writes `tokens` atomically (temporary file + rename: a failure leaves an earlier file at `path`
// intact). vocab_size in 1..2^32 - 1 picks the width; every token must be below it. An empty stream
// is a valid shard (e.g. a validation split of nothing).
void write_token_shard(const std::string& path, std::span<const uint32_t> tokens,
                       int64_t vocab_size, uint64_t tokenizer_fingerprint = 0);
// The header alone, checked (magic, version, sizes, the file's length against the count).
TokenShardHeader read_token_shard_header(const std::string& path);
// The whole shard, every token checked < its vocabulary. expected_vocab > 0 and
// expected_fingerprint != 0 (a tokenizer's) must match what the shard recorded; a fingerprint of 0
// in the shard is not compared. Every failure names the file and what is wrong.
TokenDataset load_token_shard(const std::string& path, int64_t expected_vocab = 0,
                              uint64_t expected_fingerprint = 0);

// Bytes as tokens: vocabulary 0..255, lossless for any input (UTF-8 or not). The document-aware
// path (an end-of-text token between documents, shards, a tokenizer file) is
// BpeTokenizer::byte_level() in tokenizer.h.
struct ByteTokenizer {
  static constexpr int64_t kVocabSize = 256;
  static std::vector<uint32_t> encode(std::string_view text);
  // Throws for a token >= 256.
  static std::string decode(std::span<const uint32_t> tokens);
};

// A text file through the ByteTokenizer (vocab_size 256).
TokenDataset tokenize_text_file(const std::string& path);

// A learnable token stream for benchmarks: mostly a fixed seeded successor table
// (next = table[prev]) with a `noise` fraction of uniformly random tokens. vocab_size is at most
// 2^24 (the table holds one entry per token).
TokenDataset synthetic_tokens(int64_t n, int64_t vocab_size, uint64_t seed, double noise = 0.1);

// The first (1 - val_fraction) of the tokens and the rest (train, validation).
std::pair<TokenDataset, TokenDataset> split_tokens(const TokenDataset& dataset,
                                                   double val_fraction);

// The windows of T + 1 consecutive tokens of a stream, as a Dataset: sample i is the window
// starting at token i * stride, {x: I64 (T) its first T tokens, y: I64 (T) its last T}, so
// y[t] == x[t + 1]. Stride 1 (every offset) with a ReplacementSampler is random-window training
// (what token_loader and lm_batch do); stride T with a SequentialSampler walks the stream once
// in non-overlapping windows (evaluation).
class TokenWindows final : public Dataset {
 public:
  // The stream must hold at least seq_len + 1 tokens.
  TokenWindows(std::shared_ptr<const TokenDataset> tokens, int64_t seq_len, int64_t stride = 1);
  TokenWindows(TokenDataset tokens, int64_t seq_len, int64_t stride = 1)
      : TokenWindows(std::make_shared<const TokenDataset>(std::move(tokens)), seq_len, stride) {}

  const TokenDataset& tokens() const { return *tokens_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t stride() const { return stride_; }
  int64_t vocab_size() const { return tokens_->vocab_size; }

  int64_t size() const override { return size_; }
  FieldNames field_names() const override { return {"x", "y"}; }
  std::string name() const override { return tokens_->name; }
  Sample get(int64_t index) const override;
  // x (B, T) and y (B, T) in one allocation, copied straight from the stream.
  std::vector<Tensor> get_batch(std::span<const int64_t> indices) const override;

 private:
  void check_index(int64_t index) const;

  std::shared_ptr<const TokenDataset> tokens_;
  int64_t seq_len_, stride_, size_;
};

// Language-model batch number `index` of a seeded stream: B windows of T + 1 tokens at random
// offsets, fields {x: I64 (B, T), y: I64 (B, T)}. A pure function of its arguments (a resumed
// run asks for the same index and gets the same batch). It is TokenWindows(dataset, T) sampled by
// ReplacementSampler(windows, B, seed, /*draws_per_stream=*/B) at epoch `index`: batch k of
// epoch e of token_loader (loader.h) is lm_batch(dataset, B, T, seed, e * num_batches + k).
Batch lm_batch(const TokenDataset& dataset, int64_t batch_size, int64_t seq_len, uint64_t seed,
               int64_t index);

}  // namespace mantissa::data
