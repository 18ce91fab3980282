// Image classification data: MNIST-format IDX files (Fashion-MNIST, MNIST), synthetic images for
// benchmarks, and ImageDataset, the Dataset over them (samples {x: image, y: label}).
//
// Every malformed input raises mantissa::Error naming the file and what is wrong with it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mantissa/core/dtype.h"
#include "mantissa/data/dataset.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::data {

// Where the Debian package dataset-fashion-mnist installs the four .gz files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// Per-pixel statistics of the Fashion-MNIST training images scaled to [0, 1].
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// How an ImageDataset presents its pixels in x.
enum class Pixels {
  Normalized,  // (pixel / 255 - mean) / std in ImageOptions::dtype
  Raw,         // the U8 bytes as stored (the consumer normalizes them with pixel_table())
};

struct ImageOptions {
  // Defaults: Fashion-MNIST's statistics, float32.
  float mean = kFashionMnistMean;
  float std = kFashionMnistStd;
  DType dtype = DType::F32;  // a floating dtype
  Pixels pixels = Pixels::Normalized;
};

// U8 images (N, C, H, W) with I64 labels (N), as a Dataset: sample i is {x: (C, H, W), y: I64
// scalar}, named "x" and "y".
//
// Normalization is an option of the dataset rather than a batch transform: it is a 256-entry
// lookup table (pixel_table(): each byte's normalized value, rounded once, RNE, into the output
// dtype) that get_batch applies while gathering a batch's pixels from the dataset, in the same
// pass, straight into the batch's single allocation with the labels; f32, bf16 and f16 batches
// cost the same. A transform would first copy U8 pixels into the batch and then rewrite them into
// a new, larger tensor: a second pass and a second allocation, and x and y would no longer share
// one block (one pinned copy, one transfer). Pixels::Raw is the same dataset with the lookup left
// to the consumer: split_for_device() offers it to the DevicePrefetcher, which applies the table
// on the GPU so that a quarter of the bytes cross the bus, bit for bit the values of the CPU path.
//
// Immutable once made (the table is built from the options, the labels are checked once), and
// cheap to copy: copies share the image and label tensors.
class ImageDataset final : public Dataset {
 public:
  ImageDataset() = default;  // empty (size 0)
  // Checks that images are U8 (N, C, H, W) in host memory, labels I64 (N) and each label in
  // [0, num_classes) (num_classes <= 0: only >= 0), and the options (a floating dtype, finite
  // mean, positive std); a mantissa::Error says which is wrong.
  ImageDataset(Tensor images, Tensor labels, int64_t num_classes, std::string name,
               ImageOptions options = {});

  const Tensor& images() const { return images_; }  // U8 (N, C, H, W), contiguous
  const Tensor& labels() const { return labels_; }  // I64 (N)
  int64_t num_classes() const { return num_classes_; }
  const ImageOptions& options() const { return options_; }
  int64_t channels() const { return images_.size(1); }
  int64_t height() const { return images_.size(2); }
  int64_t width() const { return images_.size(3); }

  // The same images with other options (sharing the tensors).
  ImageDataset with_options(ImageOptions options) const;
  // Items start .. start + count - 1 (views of the same storage).
  ImageDataset slice(int64_t start, int64_t count) const;
  // The normalization as a lookup: (256) in options().dtype, entry v = (v / 255 - mean) / std
  // rounded once (RNE). A normalized x is exactly pixel_table()[raw pixels].
  Tensor pixel_table() const;

  int64_t size() const override { return images_.defined() ? images_.size(0) : 0; }
  FieldNames field_names() const override { return {"x", "y"}; }
  std::string name() const override { return name_; }
  Sample get(int64_t index) const override;
  // x (B, C, H, W) and y (B) in one allocation, x gathered through the pixel table.
  std::vector<Tensor> get_batch(std::span<const int64_t> indices) const override;
  // With Pixels::Normalized: load the Raw dataset, look the pixels up on the device.
  std::optional<DeviceSplit> split_for_device(Device device) const override;

 private:
  void check_index(int64_t index) const;
  // The images `items`, one after another, into x's storage (through the table unless Raw).
  void gather_pixels(std::span<const int64_t> items, void* out) const;

  Tensor images_;
  Tensor labels_;
  int64_t num_classes_ = 0;
  std::string name_;
  ImageOptions options_;
  std::shared_ptr<const std::vector<uint8_t>> table_;  // 256 values in options_.dtype
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

// The first n images (views of the same storage): dataset.slice(0, n).
ImageDataset head(const ImageDataset& dataset, int64_t n);

}  // namespace mantissa::data
