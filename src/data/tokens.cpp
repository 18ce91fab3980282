// Token streams (the byte tokenizer, synthetic streams), TokenWindows (the Dataset of a stream's LM
// windows) and lm_batch. Token files and shards are read and written in token_files.cpp.
#include "mantissa/data/tokens.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "data/file_io.h"
#include "data/random.h"
#include "mantissa/core/error.h"
#include "mantissa/data/sampler.h"

namespace mantissa::data {

namespace {

// Streams of the synthetic token generator, after the image generator's 1..3 (images.cpp): no two
// uses of one seed draw the same bits.
enum Stream : uint64_t { kSuccessor = 4, kTokenNoise = 5, kTokenPick = 6 };

}  // namespace

// ---- the byte tokenizer ------------------------------------------------------------------------

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<uint32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    MT_CHECK(tokens[i] < kVocabSize, "ByteTokenizer::decode: token ", tokens[i], " at position ", i,
             " is not a byte (the vocabulary is 0..255)");
    text[i] = static_cast<char>(tokens[i]);
  }
  return text;
}

TokenDataset tokenize_text_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path);
  MT_CHECK(!bytes.empty(), "'", path, "' is empty: nothing to tokenize");
  TokenDataset ds;
  ds.tokens.assign(bytes.begin(), bytes.end());
  ds.vocab_size = ByteTokenizer::kVocabSize;
  ds.name = path;
  return ds;
}

TokenDataset synthetic_tokens(int64_t n, int64_t vocab_size, uint64_t seed, double noise) {
  MT_CHECK(n > 0 && vocab_size > 0 && vocab_size <= (int64_t(1) << 24),
           "synthetic_tokens: need n > 0 and vocab_size in 1..2^24, got n=", n,
           " vocab_size=", vocab_size);
  MT_CHECK(noise >= 0 && noise <= 1, "synthetic_tokens: noise is a fraction in [0, 1], not ",
           noise);
  const auto v = uint64_t(vocab_size);
  std::vector<uint32_t> successor(v);
  for (uint64_t t = 0; t < v; ++t)
    successor[t] = uint32_t(below(draw64(seed, kSuccessor, t), v));
  TokenDataset ds;
  ds.tokens.resize(size_t(n));
  ds.tokens[0] = uint32_t(below(draw64(seed, kTokenPick, 0), v));
  for (int64_t i = 1; i < n; ++i) {
    const bool random = unit(draw64(seed, kTokenNoise, uint64_t(i))) < noise;
    ds.tokens[size_t(i)] = random ? uint32_t(below(draw64(seed, kTokenPick, uint64_t(i)), v))
                                  : successor[ds.tokens[size_t(i - 1)]];
  }
  ds.vocab_size = vocab_size;
  ds.name = "synthetic-tokens";
  return ds;
}

std::pair<TokenDataset, TokenDataset> split_tokens(const TokenDataset& dataset,
                                                   double val_fraction) {
  MT_CHECK(val_fraction >= 0 && val_fraction < 1,
           "split_tokens: val_fraction must be in [0, 1), "
           "not ",
           val_fraction);
  const auto n_val = size_t(double(dataset.tokens.size()) * val_fraction);
  const size_t n_train = dataset.tokens.size() - n_val;
  std::pair<TokenDataset, TokenDataset> out;
  out.first.tokens.assign(dataset.tokens.begin(), dataset.tokens.begin() + std::ptrdiff_t(n_train));
  out.second.tokens.assign(dataset.tokens.begin() + std::ptrdiff_t(n_train), dataset.tokens.end());
  out.first.vocab_size = out.second.vocab_size = dataset.vocab_size;
  out.first.tokenizer_fingerprint = out.second.tokenizer_fingerprint =
      dataset.tokenizer_fingerprint;
  out.first.name = dataset.name + "/train";
  out.second.name = dataset.name + "/val";
  return out;
}

// ---- windows -----------------------------------------------------------------------------------

TokenWindows::TokenWindows(std::shared_ptr<const TokenDataset> tokens, int64_t seq_len,
                           int64_t stride)
    : tokens_(std::move(tokens)), seq_len_(seq_len), stride_(stride) {
  MT_CHECK(tokens_ != nullptr, "TokenWindows: needs a token stream");
  MT_CHECK(seq_len >= 1 && stride >= 1, "TokenWindows: seq_len and stride must be >= 1, got ",
           seq_len, " and ", stride);
  MT_CHECK(tokens_->size() >= seq_len + 1, "TokenWindows: '", tokens_->name, "' has ",
           tokens_->size(), " tokens, too few for windows of seq_len + 1 = ", seq_len + 1,
           "; use a shorter seq_len or more data");
  size_ = (tokens_->size() - seq_len - 1) / stride + 1;
}

void TokenWindows::check_index(int64_t index) const {
  MT_CHECK(index >= 0 && index < size_, "TokenWindows '", tokens_->name, "': window ", index,
           " out of range: there are ", size_, " windows (0 .. ", size_ - 1, ") of ", seq_len_,
           " + 1 tokens at stride ", stride_, "; a sampler over it must be built with its size()");
}

Sample TokenWindows::get(int64_t index) const {
  check_index(index);
  Tensor x = Tensor::empty({seq_len_}, DType::I64);
  Tensor y = Tensor::empty({seq_len_}, DType::I64);
  const uint32_t* w = tokens_->tokens.data() + index * stride_;
  int64_t* px = x.data<int64_t>();
  int64_t* py = y.data<int64_t>();
  for (int64_t t = 0; t < seq_len_; ++t) {
    px[t] = w[t];
    py[t] = w[t + 1];
  }
  return {std::move(x), std::move(y)};
}

std::vector<Tensor> TokenWindows::get_batch(std::span<const int64_t> indices) const {
  const auto b = int64_t(indices.size());
  std::vector<Tensor> out =
      allocate_batch({{{b, seq_len_}, DType::I64}, {{b, seq_len_}, DType::I64}});
  int64_t* x = out[0].data<int64_t>();
  int64_t* y = out[1].data<int64_t>();
  for (int64_t r = 0; r < b; ++r) {
    const int64_t index = indices[size_t(r)];
    check_index(index);
    const uint32_t* w = tokens_->tokens.data() + index * stride_;
    for (int64_t t = 0; t < seq_len_; ++t) {
      x[r * seq_len_ + t] = w[t];
      y[r * seq_len_ + t] = w[t + 1];
    }
  }
  return out;
}

Batch lm_batch(const TokenDataset& dataset, int64_t batch_size, int64_t seq_len, uint64_t seed,
               int64_t index) {
  MT_CHECK(batch_size > 0 && seq_len > 0, "lm_batch: batch_size and seq_len must be positive, got ",
           batch_size, " and ", seq_len);
  MT_CHECK(index >= 0, "lm_batch: the batch index must be >= 0, not ", index);
  // The caller's stream, not a copy of it: a non-owning pointer (the windows live only here).
  const TokenWindows windows(std::shared_ptr<const TokenDataset>(std::shared_ptr<void>(), &dataset),
                             seq_len);
  const ReplacementSampler sampler(windows.size(), batch_size, seed, batch_size);
  Batch b;
  b.fields = windows.get_batch(sampler.order(index));
  b.names = std::make_shared<const FieldNames>(windows.field_names());
  b.index = index;
  return b;
}

}  // namespace mantissa::data
