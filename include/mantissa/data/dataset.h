// Datasets held in host memory: MNIST-format IDX files (Fashion-MNIST, MNIST), synthetic image
// and token data for benchmarks, flat uint16 token files and a byte-level tokenizer.
//
// Every malformed input raises mantissa::Error naming the file and what is wrong with it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mantissa/tensor/tensor.h"

namespace mantissa::data {

// Where the Debian package dataset-fashion-mnist installs the four .gz files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// Per-pixel statistics of the Fashion-MNIST training images scaled to [0, 1].
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// ---- images ------------------------------------------------------------------------------------

struct ImageDataset {
  Tensor images;  // U8 (N, C, H, W), contiguous
  Tensor labels;  // I64 (N), each in [0, num_classes)
  int64_t num_classes = 0;
  std::string name;

  int64_t size() const { return images.defined() ? images.size(0) : 0; }
  int64_t channels() const { return images.size(1); }
  int64_t height() const { return images.size(2); }
  int64_t width() const { return images.size(3); }
};

// One array of an IDX file (the MNIST container): unsigned bytes and their dims.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // prod(dims) bytes, row-major
};

// Reads an IDX file of unsigned bytes, gzip-compressed or raw (told apart by the gzip magic
// 0x1f8b). `expected_dims` (1 for labels, 3 for images) is checked against the magic
// 0x0000080<dims>; the file length must match the dims exactly.
IdxArray read_idx(const std::string& path, int expected_dims);

// Images (magic 0x00000803, N x rows x cols) and labels (magic 0x00000801, N) from two IDX files;
// the counts must agree and every label must be < num_classes.
ImageDataset load_mnist_format(const std::string& images_path, const std::string& labels_path,
                               int64_t num_classes = 10, std::string name = "mnist-format");

// The 60,000 training or 10,000 test images of Fashion-MNIST from `dir` (the four
// *-idx?-ubyte.gz files, or the same names without .gz). A missing directory or file raises an
// Error that says how to install the dataset or point at it (--data-dir).
ImageDataset load_fashion_mnist(const std::string& dir = kFashionMnistDir, bool train = true);

// "T-shirt/top", "Trouser", ..., "Ankle boot" for labels 0..9.
std::string_view fashion_mnist_class_name(int64_t label);

// A learnable stand-in for benchmarks: each class has its own smooth pattern (per-class spatial
// frequencies and phases); each image is its class pattern plus uniform noise, as U8
// (n, channels, size, size). Labels are drawn uniformly. Deterministic in the seed (and
// independent of the thread count).
ImageDataset synthetic_images(int64_t n, int64_t channels, int64_t size, int64_t classes,
                              uint64_t seed);

// The first n images (views of the same storage).
ImageDataset head(const ImageDataset& dataset, int64_t n);

// ---- tokens ------------------------------------------------------------------------------------

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

// Language-model batch: row b is a window of T+1 consecutive tokens starting at a seeded random
// offset; x is its first T tokens, y its last T (y[b, t] == x[b, t + 1]).
struct LMBatch {
  Tensor x;           // I64 (B, T)
  Tensor y;           // I64 (B, T)
  int64_t index = 0;  // the batch number it was drawn for (within its epoch from a TokenLoader)
  int64_t epoch = 0;  // set by TokenLoader
};

// Batch number `index` of the stream (seed): a pure function of its arguments, so a resumed run
// asks for the same index and gets the same batch.
LMBatch lm_batch(const TokenDataset& dataset, int64_t batch_size, int64_t seq_len, uint64_t seed,
                 int64_t index);

}  // namespace mantissa::data
