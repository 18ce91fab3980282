// Synthetic image and token data, token files, the byte tokenizer and LM batches.
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numbers>
#include <string>
#include <system_error>
#include <vector>

#include "data/file_io.h"
#include "mantissa/core/error.h"
#include "mantissa/data/dataset.h"
#include "mantissa/numerics/philox.h"

namespace mantissa::data {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian uint16, read here without swapping");

namespace {

// 64 random bits for element i of stream `stream` under `seed` (counter-based: no state).
uint64_t draw64(uint64_t seed, uint64_t stream, uint64_t i) {
  return uint64_t(random_bits(seed, stream, 2 * i)) << 32 | random_bits(seed, stream, 2 * i + 1);
}

// Uniform in [0, n) (multiply-shift; the bias is n / 2^64).
uint64_t below(uint64_t bits, uint64_t n) {
  return uint64_t((unsigned __int128)bits * n >> 64);
}

double unit(uint64_t bits) {
  return double(bits >> 11) * 0x1.0p-53;
}

// Streams of the synthetic generators (so that no two uses of one seed draw the same bits).
enum Stream : uint64_t { kPattern = 1, kLabel, kNoise, kSuccessor, kTokenNoise, kTokenPick };

}  // namespace

ImageDataset synthetic_images(int64_t n, int64_t channels, int64_t size, int64_t classes,
                              uint64_t seed) {
  MT_CHECK(n > 0 && channels > 0 && size > 0 && classes > 0,
           "synthetic_images: n, channels, size and classes must be positive, got n=", n,
           " channels=", channels, " size=", size, " classes=", classes);
  const int64_t plane = size * size;
  const int64_t per_image = channels * plane;
  // Each class and channel: a plane wave of its own direction, frequency and phase (values
  // 128 ± 80), so the classes differ in structure a linear layer or a conv can pick up.
  std::vector<float> pattern(size_t(classes * per_image));
  for (int64_t c = 0; c < classes; ++c) {
    for (int64_t ch = 0; ch < channels; ++ch) {
      const uint64_t k = uint64_t(c * channels + ch);
      const double angle = 2 * std::numbers::pi * unit(draw64(seed, kPattern, 3 * k));
      const double freq = (0.5 + 2.5 * unit(draw64(seed, kPattern, 3 * k + 1))) * 2 *
                          std::numbers::pi / double(size);  // 0.5 .. 3 periods across the image
      const double phase = 2 * std::numbers::pi * unit(draw64(seed, kPattern, 3 * k + 2));
      float* p = pattern.data() + c * per_image + ch * plane;
      for (int64_t y = 0; y < size; ++y) {
        for (int64_t x = 0; x < size; ++x) {
          const double t = freq * (std::cos(angle) * double(x) + std::sin(angle) * double(y));
          p[y * size + x] = float(128 + 80 * std::sin(t + phase));
        }
      }
    }
  }

  ImageDataset ds;
  ds.num_classes = classes;
  ds.name = "synthetic";
  ds.images = Tensor::empty({n, channels, size, size}, DType::U8);
  ds.labels = Tensor::empty({n}, DType::I64);
  uint8_t* img = ds.images.data<uint8_t>();
  int64_t* lab = ds.labels.data<int64_t>();
  // Counter-based draws: the result does not depend on the thread count.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t label = int64_t(below(draw64(seed, kLabel, uint64_t(i)), uint64_t(classes)));
    lab[i] = label;
    const float* p = pattern.data() + label * per_image;
    uint8_t* out = img + i * per_image;
    for (int64_t j = 0; j < per_image; ++j) {
      // Uniform noise in [-56, 56): one 32-bit draw per pixel.
      const uint32_t r = random_bits(seed, kNoise, uint64_t(i * per_image + j));
      const float v = p[j] + float(int(r % 112) - 56);
      out[j] = uint8_t(std::lround(std::fmin(255.f, std::fmax(0.f, v))));
    }
  }
  return ds;
}

ImageDataset head(const ImageDataset& dataset, int64_t n) {
  MT_CHECK(n >= 0 && n <= dataset.size(), "head: asked for ", n, " items of a dataset of ",
           dataset.size());
  ImageDataset out = dataset;
  out.images = dataset.images.narrow(0, 0, n);
  out.labels = dataset.labels.narrow(0, 0, n);
  return out;
}

// ---- tokens
// --------------------------------------------------------------------------------------

TokenDataset load_tokens(const std::string& path, int64_t vocab_size) {
  MT_CHECK(vocab_size >= 0 && vocab_size <= 65536,
           "load_tokens: vocab_size must be in 0..65536 "
           "(tokens are uint16), not ",
           vocab_size);
  const std::vector<uint8_t> bytes = read_file(path);
  MT_CHECK(bytes.size() % 2 == 0, "'", path, "' is not a uint16 token file: its length ",
           bytes.size(), " is odd (truncated?)");
  MT_CHECK(!bytes.empty(), "'", path, "' is an empty token file");
  TokenDataset ds;
  ds.tokens.resize(bytes.size() / 2);
  std::memcpy(ds.tokens.data(), bytes.data(), bytes.size());
  uint16_t max = 0;
  for (uint16_t t : ds.tokens)
    max = t > max ? t : max;
  if (vocab_size > 0) {
    MT_CHECK(int64_t(max) < vocab_size, "'", path, "' holds token ", max,
             ", out of range for a vocabulary of ", vocab_size);
    ds.vocab_size = vocab_size;
  } else {
    ds.vocab_size = int64_t(max) + 1;
  }
  ds.name = path;
  return ds;
}

void write_tokens(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  MT_CHECK(f != nullptr, "cannot create '", path, "': ", std::system_category().message(errno));
  const size_t wrote = std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f);
  const int err = wrote == tokens.size() ? 0 : errno;
  const bool closed = std::fclose(f) == 0;
  MT_CHECK(wrote == tokens.size() && closed, "cannot write '", path,
           "': ", std::system_category().message(err ? err : errno));
}

std::vector<uint16_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<uint16_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(const std::vector<uint16_t>& tokens) {
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
  MT_CHECK(n > 0 && vocab_size > 0 && vocab_size <= 65536,
           "synthetic_tokens: need n > 0 and vocab_size in 1..65536, got n=", n,
           " vocab_size=", vocab_size);
  MT_CHECK(noise >= 0 && noise <= 1, "synthetic_tokens: noise is a fraction in [0, 1], not ",
           noise);
  const auto v = uint64_t(vocab_size);
  std::vector<uint16_t> successor(v);
  for (uint64_t t = 0; t < v; ++t)
    successor[t] = uint16_t(below(draw64(seed, kSuccessor, t), v));
  TokenDataset ds;
  ds.tokens.resize(size_t(n));
  ds.tokens[0] = uint16_t(below(draw64(seed, kTokenPick, 0), v));
  for (int64_t i = 1; i < n; ++i) {
    const bool random = unit(draw64(seed, kTokenNoise, uint64_t(i))) < noise;
    ds.tokens[size_t(i)] = random ? uint16_t(below(draw64(seed, kTokenPick, uint64_t(i)), v))
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
  out.first.name = dataset.name + "/train";
  out.second.name = dataset.name + "/val";
  return out;
}

LMBatch lm_batch(const TokenDataset& dataset, int64_t batch_size, int64_t seq_len, uint64_t seed,
                 int64_t index) {
  MT_CHECK(batch_size > 0 && seq_len > 0, "lm_batch: batch_size and seq_len must be positive, got ",
           batch_size, " and ", seq_len);
  MT_CHECK(dataset.size() >= seq_len + 1, "lm_batch: '", dataset.name, "' has ", dataset.size(),
           " tokens, too few for windows of seq_len + 1 = ", seq_len + 1);
  MT_CHECK(index >= 0, "lm_batch: the batch index must be >= 0, not ", index);
  // One buffer holds x and y: (2, B, T), so a device copy is a single transfer.
  Tensor buf = Tensor::empty({2, batch_size, seq_len}, DType::I64);
  int64_t* x = buf.data<int64_t>();
  int64_t* y = x + batch_size * seq_len;
  const auto starts = uint64_t(dataset.size() - seq_len);  // windows of T+1 tokens
  for (int64_t b = 0; b < batch_size; ++b) {
    const uint64_t bits = draw64(seed, uint64_t(index), uint64_t(b));
    const uint16_t* w = dataset.tokens.data() + below(bits, starts);
    for (int64_t t = 0; t < seq_len; ++t) {
      x[b * seq_len + t] = w[t];
      y[b * seq_len + t] = w[t + 1];
    }
  }
  return {buf.select(0, 0), buf.select(0, 1), index, 0};
}

}  // namespace mantissa::data
