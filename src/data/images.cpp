// ImageDataset (the Dataset of labelled U8 images, normalized through a 256-entry table) and the
// synthetic images of the benchmarks.
#include "mantissa/data/images.h"

#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "data/random.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::data {
namespace {

// The images `items` one after another into out, each pixel through the 256-entry table of
// elements of one size: normalization is a lookup, which also makes every output dtype (rounded
// once, RNE, when the table is built) equally cheap. The table is copied to the stack once per
// batch, not per image.
template <typename T>
void gather(const uint8_t* images, int64_t per_image, std::span<const int64_t> items,
            const uint8_t* table_bytes, uint8_t* out_bytes) {
  T table[256];
  std::memcpy(table, table_bytes, sizeof(table));
  T* out = reinterpret_cast<T*>(out_bytes);
  for (const int64_t item : items) {
    const uint8_t* in = images + item * per_image;
    for (int64_t i = 0; i < per_image; ++i)
      out[i] = table[in[i]];
    out += per_image;
  }
}

void check_options(const ImageOptions& o) {
  MT_CHECK(is_floating(o.dtype), "ImageDataset: ImageOptions::dtype must be a floating type, not ",
           dtype_name(o.dtype), " (Pixels::Raw gives the U8 bytes)");
  MT_CHECK(std::isfinite(o.mean) && std::isfinite(o.std) && o.std > 0,
           "ImageDataset: normalization needs a finite mean and a positive std, got mean=", o.mean,
           " std=", o.std);
}

// Entry v: (v / 255 - mean) / std computed in float, rounded once (RNE) into dtype.
std::shared_ptr<const std::vector<uint8_t>> make_table(const ImageOptions& o) {
  std::vector<float> values(256);
  for (int v = 0; v < 256; ++v)
    values[size_t(v)] = (float(v) / 255.f - o.mean) / o.std;
  const Tensor table = Tensor::from_vector(values, {256}, DType::F32).to(o.dtype);
  auto bytes = std::make_shared<std::vector<uint8_t>>(table.nbytes());
  table.copy_to_host(bytes->data(), bytes->size());
  return bytes;
}

}  // namespace

ImageDataset::ImageDataset(Tensor images, Tensor labels, int64_t num_classes, std::string name,
                           ImageOptions options)
    : num_classes_(num_classes), name_(std::move(name)), options_(options) {
  MT_CHECK(images.defined() && images.dim() == 4 && images.dtype() == DType::U8, "ImageDataset '",
           name_, "' needs U8 images of shape (N, C, H, W), got ",
           images.defined() ? images.describe() : std::string("no images"));
  const int64_t n = images.size(0);
  MT_CHECK(
      labels.defined() && labels.dim() == 1 && labels.dtype() == DType::I64 && labels.size(0) == n,
      "ImageDataset '", name_, "' needs I64 labels of shape (", n, ") for ", n, " images, got ",
      labels.defined() ? labels.describe() : std::string("no labels"));
  MT_CHECK(images.device().is_cpu() && labels.device().is_cpu(), "ImageDataset '", name_,
           "': images and labels must be in host memory (batches reach a GPU through "
           "DevicePrefetcher), got ",
           images.device().str(), " and ", labels.device().str());
  check_options(options_);
  images_ = images.contiguous();
  labels_ = labels.contiguous();
  const int64_t* l = labels_.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    MT_CHECK(l[i] >= 0 && (num_classes_ <= 0 || l[i] < num_classes_), "ImageDataset '", name_,
             "': label ", i, " is ", l[i], ", out of range for ", num_classes_,
             " classes; fix the labels or pass the right num_classes");
  }
  table_ = make_table(options_);
}

ImageDataset ImageDataset::with_options(ImageOptions options) const {
  check_options(options);
  ImageDataset out = *this;
  out.options_ = options;
  out.table_ = make_table(options);
  return out;
}

ImageDataset ImageDataset::slice(int64_t start, int64_t count) const {
  MT_CHECK(start >= 0 && count >= 0 && start + count <= size(), "ImageDataset '", name_,
           "': items ", start, " .. ", start + count - 1, " asked for, but it holds ", size(),
           " (0 .. ", size() - 1, ")");
  ImageDataset out = *this;
  out.images_ = images_.narrow(0, start, count);
  out.labels_ = labels_.narrow(0, start, count);
  return out;
}

Tensor ImageDataset::pixel_table() const {
  MT_CHECK(table_ != nullptr, "ImageDataset: an empty (default-constructed) dataset has no table");
  const Tensor t = Tensor::empty({256}, options_.dtype);
  std::memcpy(t.data_ptr(), table_->data(), table_->size());
  return t;
}

void ImageDataset::check_index(int64_t index) const {
  MT_CHECK(index >= 0 && index < size(), "ImageDataset '", name_, "': index ", index,
           " out of range: it holds ", size(), " images (indices 0 .. ", size() - 1,
           "); a sampler over this dataset must be built with its size()");
}

void ImageDataset::gather_pixels(std::span<const int64_t> items, void* out) const {
  const int64_t per_image = channels() * height() * width();
  const uint8_t* images = images_.data<uint8_t>();
  auto* dst = static_cast<uint8_t*>(out);
  if (options_.pixels == Pixels::Raw) {
    for (const int64_t item : items) {
      std::memcpy(dst, images + item * per_image, size_t(per_image));
      dst += per_image;
    }
    return;
  }
  const uint8_t* table = table_->data();
  switch (dtype_size(options_.dtype)) {
    case 1:
      gather<uint8_t>(images, per_image, items, table, dst);
      break;
    case 2:
      gather<uint16_t>(images, per_image, items, table, dst);
      break;
    case 4:
      gather<uint32_t>(images, per_image, items, table, dst);
      break;
    case 8:
      gather<uint64_t>(images, per_image, items, table, dst);
      break;
    default:
      MT_ASSERT(false, "no pixel gather for elements of ", dtype_size(options_.dtype), " bytes");
  }
}

Sample ImageDataset::get(int64_t index) const {
  check_index(index);
  const DType x_dtype = options_.pixels == Pixels::Raw ? DType::U8 : options_.dtype;
  Tensor x = Tensor::empty({channels(), height(), width()}, x_dtype);
  gather_pixels(std::span<const int64_t>(&index, 1), x.data_ptr());
  Tensor y = Tensor::empty({}, DType::I64);
  *y.data<int64_t>() = labels_.data<int64_t>()[index];
  return {std::move(x), std::move(y)};
}

std::vector<Tensor> ImageDataset::get_batch(std::span<const int64_t> indices) const {
  const auto b = int64_t(indices.size());
  for (const int64_t item : indices)
    check_index(item);
  const DType x_dtype = options_.pixels == Pixels::Raw ? DType::U8 : options_.dtype;
  std::vector<Tensor> out =
      allocate_batch({{{b, channels(), height(), width()}, x_dtype}, {{b}, DType::I64}});
  gather_pixels(indices, out[0].data_ptr());
  auto* y = out[1].data<int64_t>();
  const int64_t* labels = labels_.data<int64_t>();
  for (int64_t i = 0; i < b; ++i)
    y[i] = labels[indices[size_t(i)]];
  return out;
}

std::optional<DeviceSplit> ImageDataset::split_for_device(Device device) const {
  if (options_.pixels == Pixels::Raw) return std::nullopt;
  ImageOptions raw = options_;
  raw.pixels = Pixels::Raw;
  DeviceSplit split;
  split.host = std::make_shared<const ImageDataset>(with_options(raw));
  const Tensor table = pixel_table().to(device);
  split.finish = [table](Batch& batch) {
    // x = table[pixel]: this dataset's own lookup, so the values are the CPU path's bit for bit.
    Tensor& x = batch["x"];
    const Tensor pixels = x.contiguous().reshape({x.numel()}).to(DType::I64);
    x = index_select(table, 0, pixels).view(x.shape());
  };
  return split;
}

// ---- synthetic images --------------------------------------------------------------------------

namespace {
// Streams of the synthetic generator (so that no two uses of one seed draw the same bits; the
// token generator's streams follow these in tokens.cpp).
enum Stream : uint64_t { kPattern = 1, kLabel, kNoise };
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

  Tensor images = Tensor::empty({n, channels, size, size}, DType::U8);
  Tensor labels = Tensor::empty({n}, DType::I64);
  uint8_t* img = images.data<uint8_t>();
  int64_t* lab = labels.data<int64_t>();
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
  return ImageDataset(std::move(images), std::move(labels), classes, "synthetic");
}

ImageDataset head(const ImageDataset& dataset, int64_t n) {
  MT_CHECK(n >= 0 && n <= dataset.size(), "head: asked for ", n, " items of a dataset of ",
           dataset.size());
  return dataset.slice(0, n);
}

}  // namespace mantissa::data
