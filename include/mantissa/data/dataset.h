// The data interface: a Dataset maps an index to a sample (an ordered list of tensors, its
// fields), a collate function turns the samples of a batch into the batch's fields, and a Batch
// carries those fields to the training loop. Samplers (sampler.h) choose the indices of each
// epoch and the DataLoader (loader.h) runs the three on worker threads.
//
// The library's own datasets are implementations of this one interface: ImageDataset (images.h:
// {x, y} = image, label) and TokenWindows (tokens.h: {x, y} = a window of tokens and the same
// window shifted by one). A recommender's {dense, categorical, label} or a GAN's {image} are
// further implementations, not further loaders.
//
//   class Pairs final : public mt::data::Dataset {        // your own dataset
//    public:
//     int64_t size() const override { return n_; }
//     mt::data::Sample get(int64_t i) const override { return {features(i), label(i)}; }
//     mt::data::FieldNames field_names() const override { return {"x", "y"}; }
//   };
//   mt::data::DataLoader loader(Pairs(...), {.batch_size = 32});
//   for (mt::data::Batch& b : loader) train(b.x(), b.y());   // or b["x"], b[0]
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mantissa/core/device.h"
#include "mantissa/core/dtype.h"
#include "mantissa/core/shape.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::data {

// One item of a dataset: its fields in the dataset's order (e.g. {image (C, H, W), label ()}).
using Sample = std::vector<Tensor>;
// The names of a dataset's fields, in the same order ({"x", "y"}); empty for unnamed fields.
using FieldNames = std::vector<std::string>;

// A batch as the training loop sees it: each field with a leading batch dimension, the names of
// the fields (shared with every batch of the dataset) and where the batch sits in its epoch.
struct Batch {
  std::vector<Tensor> fields;               // each (B, ...sample shape)
  std::shared_ptr<const FieldNames> names;  // null or empty: the fields have no names
  int64_t index = 0;                        // batch number within its epoch
  int64_t epoch = 0;

  size_t size() const { return fields.size(); }
  // Checked: a position past the last field or an unknown name is a mantissa::Error that lists
  // the batch's fields.
  Tensor& operator[](size_t i);
  const Tensor& operator[](size_t i) const;
  Tensor& operator[](std::string_view name);
  const Tensor& operator[](std::string_view name) const;
  // The fields named "x" and "y" (inputs and targets): the spelling of the common two-field case,
  // by name rather than by position, so that a dataset whose fields are {dense, categorical,
  // label} is not silently read as x = dense, y = categorical.
  Tensor& x() { return (*this)["x"]; }
  const Tensor& x() const { return (*this)["x"]; }
  Tensor& y() { return (*this)["y"]; }
  const Tensor& y() const { return (*this)["y"]; }
  // The batch size: the leading dimension of the first field.
  int64_t batch_size() const;
};

// Turns the samples of one batch into the batch's fields (what PyTorch calls collate_fn).
using Collate = std::function<std::vector<Tensor>(const std::vector<Sample>& samples)>;

// The default collate: field f of the batch is the samples' field f stacked along a new leading
// dimension. Every sample must have as many fields as the first, and each field the first
// sample's shape and dtype, in host memory; otherwise a mantissa::Error names the sample (its
// dataset index when `indices` are given), the field (by name when `names` are given) and both
// shapes. The fields share one allocation (see allocate_batch).
std::vector<Tensor> stack_samples(const std::vector<Sample>& samples, const FieldNames& names = {},
                                  std::span<const int64_t> indices = {});

// Tensors of these shapes and dtypes in ONE host allocation, each starting at a 64-byte boundary:
// a batch made of them is pinned with one copy and crosses to a GPU in one transfer. What
// stack_samples and the library's fast get_batch implementations fill; use it in your own.
struct FieldSpec {
  Shape shape;
  DType dtype = DType::F32;
};
std::vector<Tensor> allocate_batch(const std::vector<FieldSpec>& fields);

// Work a dataset can leave to the device its batches go to (Dataset::split_for_device): the
// DevicePrefetcher loads `host` instead of the dataset (e.g. raw U8 pixels: a quarter of the
// bytes of f32 cross the bus) and runs `finish` on each batch once it is on the device (e.g. the
// normalization lookup), on the prefetcher's side stream, without autograd.
class Dataset;
struct DeviceSplit {
  std::shared_ptr<const Dataset> host;
  std::function<void(Batch&)> finish;
};

// A map-style dataset: `size()` items, item i is `get(i)`.
//
// get and get_batch are called concurrently from the loader's worker threads: they must be safe
// to call at the same time (no mutable state, or guarded state). They should be deterministic
// in the index, so that a run is reproducible and a resumed run sees the same batches.
class Dataset {
 public:
  virtual ~Dataset() = default;

  virtual int64_t size() const = 0;
  // Item `index` in [0, size()): a mantissa::Error otherwise (say which index, and the size).
  virtual Sample get(int64_t index) const = 0;
  // Names of the fields get() returns ({"x", "y"}); empty: unnamed (Batch::operator[] by position).
  virtual FieldNames field_names() const { return {}; }
  // For messages ("dataset 'fashion-mnist/train' is empty").
  virtual std::string name() const { return "dataset"; }

  // The fields of the batch of these items. Default: get() each, then stack_samples. Override it
  // to fetch a batch faster than item by item (PyTorch's __getitems__): the image dataset gathers
  // and normalizes a whole batch straight into one allocation. The loader calls it when no
  // LoaderOptions::collate is set (a custom collate gets the samples of get() instead).
  virtual std::vector<Tensor> get_batch(std::span<const int64_t> indices) const;

  // What DevicePrefetcher may do on the device instead of the host for `device`; nullopt (the
  // default): batches cross as get_batch makes them.
  virtual std::optional<DeviceSplit> split_for_device(Device device) const;

 protected:
  Dataset() = default;
  Dataset(const Dataset&) = default;
  Dataset& operator=(const Dataset&) = default;
};

}  // namespace mantissa::data
