// Fashion-MNIST and other MNIST-format datasets: two IDX files (idx.cpp) as an ImageDataset.
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "mantissa/core/error.h"
#include "mantissa/data/images.h"

namespace mantissa::data {

ImageDataset load_mnist_format(const std::string& images_path, const std::string& labels_path,
                               int64_t num_classes, std::string name) {
  MT_CHECK(num_classes >= 1 && num_classes <= 256,
           "load_mnist_format: num_classes must be in "
           "1..256 (labels are bytes), not ",
           num_classes);
  const IdxArray img = read_idx(images_path, 3);
  const IdxArray lab = read_idx(labels_path, 1);
  const int64_t n = img.dims[0];
  MT_CHECK(lab.dims[0] == n, "image and label counts differ: '", images_path, "' holds ", n,
           " images but '", labels_path, "' holds ", lab.dims[0], " labels");

  Tensor images = Tensor::empty({n, 1, img.dims[1], img.dims[2]}, DType::U8);
  images.copy_from_host(img.data.data(), img.data.size());
  Tensor labels = Tensor::empty({n}, DType::I64);
  int64_t* l = labels.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = lab.data[size_t(i)];
    // Checked here too, to name the file (ImageDataset's own check cannot).
    MT_CHECK(v < num_classes, "'", labels_path, "': label ", i, " is ", v, ", out of range for ",
             num_classes, " classes");
    l[i] = v;
  }
  return ImageDataset(std::move(images), std::move(labels), num_classes, std::move(name));
}

ImageDataset load_fashion_mnist(const std::string& dir, bool train) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string how =
      "Install it with `apt-get install dataset-fashion-mnist` (files in " +
      std::string(kFashionMnistDir) +
      "), or download the four *-ubyte.gz files from "
      "https://github.com/zalandoresearch/fashion-mnist and pass their folder with --data-dir";
  MT_CHECK(fs::is_directory(dir, ec), "Fashion-MNIST not found: '", dir, "' is not a directory. ",
           how);
  const std::string prefix = train ? "train" : "t10k";
  // The .gz file as distributed, else the same name gunzipped.
  auto find = [&](const std::string& stem) {
    const fs::path gz = fs::path(dir) / (stem + ".gz");
    if (fs::exists(gz, ec)) return gz.string();
    const fs::path raw = fs::path(dir) / stem;
    if (fs::exists(raw, ec)) return raw.string();
    MT_CHECK(false, "Fashion-MNIST not found: '", gz.string(), "' is missing. ", how);
    return std::string();
  };
  const std::string images = find(prefix + "-images-idx3-ubyte");
  const std::string labels = find(prefix + "-labels-idx1-ubyte");
  ImageDataset ds =
      load_mnist_format(images, labels, 10, train ? "fashion-mnist/train" : "fashion-mnist/test");
  MT_CHECK(ds.height() == 28 && ds.width() == 28, "'", images, "' holds ", ds.height(), "x",
           ds.width(), " images; Fashion-MNIST's are 28x28");
  return ds;
}

std::string_view fashion_mnist_class_name(int64_t label) {
  static constexpr std::string_view kNames[] = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                                "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                                "Bag",         "Ankle boot"};
  MT_CHECK(label >= 0 && label < 10, "Fashion-MNIST labels are 0..9, not ", label);
  return kNames[label];
}

}  // namespace mantissa::data
