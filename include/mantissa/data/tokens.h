// Language-model data: token streams (flat uint16 files, a byte-level tokenizer, synthetic
// streams) and TokenWindows, the Dataset of a stream's training windows (samples {x, y}: T tokens
// and the same T shifted by one).
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

// A token stream in host memory.
struct TokenDataset {
  std::vector<uint16_t> tokens;
  int64_t vocab_size = 0;  // every token is < vocab_size
  std::string name;

  int64_t size() const { return int64_t(tokens.size()); }
};

// A flat file of little-endian uint16 tokens, no header. vocab_size is the largest token + 1
// unless `vocab_size` > 0 is given (then every token must be below it).
TokenDataset load_tokens(const std::string& path, int64_t vocab_size = 0);
void write_tokens(const std::string& path, const std::vector<uint16_t>& tokens);

// Bytes as tokens: vocabulary 0..255, lossless for any input (UTF-8 or not).
struct ByteTokenizer {
  static constexpr int64_t kVocabSize = 256;
  static std::vector<uint16_t> encode(std::string_view text);
  // Throws for a token >= 256.
  static std::string decode(const std::vector<uint16_t>& tokens);
};

// A text file through the ByteTokenizer (vocab_size 256).
TokenDataset tokenize_text_file(const std::string& path);

// A learnable token stream for benchmarks: mostly a fixed seeded successor table
// (next = table[prev]) with a `noise` fraction of uniformly random tokens.
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
