// Ten SGD steps of the reference models against PyTorch:
// tests/data/golden/train_<model>.safetensors was written by tools/reference/make_train_golden.py
// (its docstring has the file's layout and the commands that regenerate it), which trained torch.nn
// copies of `mlp` and `cnn` from Mantissa's initial weights on Mantissa's batches. Here Mantissa
// repeats the run:
//   - make_model(model, {.seed}) must reproduce the file's initial weights bit for bit (the
//     same keys, dtypes and shapes: the export -> torch import path is exact);
//   - the batches come from Mantissa's DataLoader over Fashion-MNIST, seeded as the script's
//     were, and must be the file's items (indices, labels, pixels); where the dataset is not
//     installed, a DataLoader over the file's copy of the batch images stands in;
//   - optim::SGD with the file's hyperparameters, one thread, cross_entropy (mean), in the
//     file's precision: float32 for the mlp; float64 for the cnn, whose float32 trajectory no
//     two engines reproduce to 1e-5 (max-pool near-ties flip with float32 rounding; the
//     script's docstring has the numbers). The cnn's float32 run is still checked where it is
//     well defined: its first loss, before any update, to 1e-5.
// Each step's loss must equal PyTorch's to 1e-5 relative, and the final weights must agree to
// the precision's tolerance (kWeightRelTolF32, kWeightRelTolF64).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "mantissa/core/error.h"
#include "mantissa/data/loader.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

#ifndef MANTISSA_GOLDEN_DIR
#error "tests/CMakeLists.txt passes MANTISSA_GOLDEN_DIR, the folder of the golden files"
#endif

namespace mantissa {
namespace {

namespace fs = std::filesystem;

// The acceptance bound on each step's loss.
constexpr double kLossRelTol = 1e-5;
// Final weights: |mantissa - torch| <= tol * (|torch| + mean |torch| of the tensor).
// Both runs start from identical bits and see identical inputs; they differ only in rounding
// (summation order in matmul, conv and reductions, FMA contraction in the update), a few ulps
// per operation, which ten steps carry into the weights scaled by the step size. Measured (the
// test prints it): float32 mlp 3.4e-7, float64 cnn 1.5e-13 of the tensor's scale. The bounds
// leave 30x (float32) and 600x (float64) for other CPUs and kernels, and still catch a wrong
// update rule: without weight decay the weights move by 3e-2 (mlp) and 1e-1 (cnn) of their
// scale, with a weight decay 1% too large by 1.4e-5 (mlp) and 1.4e-4 (cnn).
constexpr double kWeightRelTolF32 = 1e-5;
constexpr double kWeightRelTolF64 = 1e-10;

const char* const kRegenerate =
    "regenerate it from the repository root with:\n"
    "  cmake -S . -B build-golden -G Ninja -DMANTISSA_CUDA=OFF -DMANTISSA_BUILD_BENCHMARKS=OFF\n"
    "  ninja -C build-golden export_init\n"
    "  /work/torchenv/bin/python tools/reference/make_train_golden.py "
    "build-golden/tests/export_init\n"
    "(any Python with torch, numpy and safetensors; see the script's docstring)";

// Runs with one thread (PyTorch's reference did too), restoring the caller's count.
class OneThread {
 public:
  OneThread() : saved_(get_num_threads()) { set_num_threads(1); }
  ~OneThread() { set_num_threads(saved_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<uint8_t> out(c.nbytes());
  c.copy_to_host(out.data(), out.size());
  return out;
}

bool have_fashion_mnist() {
  return fs::exists(fs::path(data::kFashionMnistDir) / "train-images-idx3-ubyte.gz");
}

// Elementwise comparison at `tol` of the tensor's scale; returns the largest
// |a - b| / (|b| + mean |b|).
double expect_weights_close(const std::vector<double>& a, const std::vector<double>& b, double tol,
                            const std::string& what) {
  EXPECT_EQ(a.size(), b.size()) << what;
  if (a.size() != b.size() || b.empty()) return 0;
  double mean_abs = 0;
  for (double v : b)
    mean_abs += std::abs(v);
  mean_abs /= double(b.size());
  double worst = 0;
  size_t worst_at = 0, bad = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double scale = std::abs(b[i]) + mean_abs;
    const double rel = scale > 0 ? std::abs(a[i] - b[i]) / scale : std::abs(a[i] - b[i]);
    if (!(rel <= tol)) ++bad;  // NaN fails too
    if (!(rel <= worst)) {
      worst = rel;
      worst_at = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << b.size()
                     << " elements differ from PyTorch by more than " << tol
                     << " of the tensor's scale; worst at flat index " << worst_at << ": got "
                     << a[worst_at] << ", want " << b[worst_at] << " (" << worst << ")";
  return worst;
}

// A golden file and its metadata.
struct Golden {
  std::string path;
  SafetensorsFile file;
  std::string meta(const std::string& key) const {
    const auto it = file.metadata.find(key);
    MT_CHECK(it != file.metadata.end(), path, " has no metadata '", key, "'; ", kRegenerate);
    return it->second;
  }
  int64_t steps() const { return std::stoll(meta("steps")); }
  int64_t batch_size() const { return std::stoll(meta("batch_size")); }
};

// The golden run's batches in `dtype`, from Mantissa's DataLoader: over Fashion-MNIST, shuffled
// with the file's seed (checked against the file's indices and pixels), or where the dataset is
// not installed, over the file's copy of the batch images in order.
data::DataLoader golden_loader(const Golden& g, DType dtype, bool announce) {
  const int64_t steps = g.steps(), batch_size = g.batch_size();
  const Tensor& indices = g.file.at("batch_indices");
  const Tensor& labels = g.file.at("batch_labels");
  const Tensor& images = g.file.at("batch_images");
  MT_CHECK(indices.shape() == Shape({steps, batch_size}) &&
               labels.shape() == Shape({steps, batch_size}) && images.dtype() == DType::U8 &&
               images.dim() == 5 && images.size(0) == steps && images.size(1) == batch_size,
           g.path, ": malformed batch_indices, batch_labels or batch_images; ", kRegenerate);
  data::LoaderOptions options;
  options.batch_size = batch_size;
  data::ImageOptions normalization;
  normalization.mean = std::stof(g.meta("mean"));
  normalization.std = std::stof(g.meta("std"));
  normalization.dtype = dtype;
  EXPECT_EQ(normalization.mean, data::kFashionMnistMean) << "the golden run normalized differently";
  EXPECT_EQ(normalization.std, data::kFashionMnistStd) << "the golden run normalized differently";
  if (have_fashion_mnist()) {
    options.shuffle = true;
    options.seed = std::stoull(g.meta("loader_seed"));
    const data::ImageDataset fashion =
        data::load_fashion_mnist(data::kFashionMnistDir, true).with_options(normalization);
    data::DataLoader loader(fashion, options);
    const std::vector<int64_t> order = loader.epoch_order(0);
    const std::vector<int64_t> want = indices.to_vector<int64_t>();
    EXPECT_TRUE(order.size() >= want.size() && std::equal(want.begin(), want.end(), order.begin()))
        << g.path << ": the DataLoader's shuffle no longer gives the golden batches; "
        << kRegenerate;
    // The file's copy of the pixels is Fashion-MNIST's.
    const int64_t per_image = images.numel() / (steps * batch_size);
    const auto* all = static_cast<const uint8_t*>(fashion.images().data_ptr());
    const std::vector<uint8_t> stored = bytes_of(images);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(all + want[i] * per_image, stored.data() + i * size_t(per_image),
                               size_t(per_image)))
          << "batch_images[" << i << "] is not Fashion-MNIST's image " << want[i];
    }
    return loader;
  }
  if (announce) {
    std::printf("Fashion-MNIST is not installed in %s: the batches come from %s\n",
                data::kFashionMnistDir, g.path.c_str());
  }
  data::ImageDataset copy(
      images.reshape({steps * batch_size, images.size(2), images.size(3), images.size(4)}),
      labels.reshape({steps * batch_size}).clone(), 10, "golden batches", normalization);
  options.shuffle = false;
  return data::DataLoader(std::move(copy), options);
}

// The golden run in Mantissa at one thread: `steps` SGD steps of `model` (already in its
// precision) on the loader's batches. Returns each step's loss.
std::vector<double> train(nn::Module& model, data::DataLoader& loader, const Golden& g,
                          int64_t steps) {
  const OneThread one_thread;
  optim::SGDOptions sgd;
  sgd.lr = std::stod(g.meta("lr"));
  sgd.momentum = std::stod(g.meta("momentum"));
  sgd.weight_decay = std::stod(g.meta("weight_decay"));
  sgd.dampening = std::stod(g.meta("dampening"));
  sgd.nesterov = g.meta("nesterov") == "true";
  optim::SGD optimizer(model.parameters(), sgd);
  model.train();
  const std::vector<int64_t> want_labels = g.file.at("batch_labels").to_vector<int64_t>();
  const auto batch_size = size_t(g.batch_size());
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    std::optional<data::Batch> batch = loader.next();
    MT_CHECK(batch.has_value(), "the loader ran out at step ", step);
    const std::vector<int64_t> y = batch->y().to_vector<int64_t>();
    EXPECT_TRUE(y.size() == batch_size &&
                std::equal(y.begin(), y.end(), want_labels.begin() + step * int64_t(batch_size)))
        << "the labels of batch " << step << " differ from the golden file's";
    optimizer.zero_grad(true);
    const Tensor loss = cross_entropy(model(batch->x()), batch->y());
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item());
  }
  return losses;
}

void run_golden(const std::string& model_name) {
  Golden g;
  g.path = std::string(MANTISSA_GOLDEN_DIR) + "/train_" + model_name + ".safetensors";
  ASSERT_TRUE(fs::exists(g.path)) << "the golden file " << g.path << " is missing; " << kRegenerate;
  g.file = load_safetensors(g.path);
  ASSERT_EQ(g.meta("model"), model_name);
  const int64_t steps = g.steps();
  ASSERT_GT(steps, 0);
  const std::string precision = g.meta("precision");
  ASSERT_TRUE(precision == "f32" || precision == "f64") << g.path << ": precision " << precision;
  const DType dtype = precision == "f32" ? DType::F32 : DType::F64;
  const double weight_tol = dtype == DType::F32 ? kWeightRelTolF32 : kWeightRelTolF64;

  // ---- the initial weights, bit for bit -------------------------------------------------------
  nn::ModelConfig config;
  config.seed = std::stoull(g.meta("seed"));
  const auto model = nn::make_model(model_name, config);
  const NamedTensors init = model->state_dict();
  size_t golden_init = 0;
  for (const auto& [key, t] : g.file.tensors)
    golden_init += key.starts_with("init.") ? 1 : 0;
  EXPECT_EQ(golden_init, init.size())
      << model_name << ": the golden file has " << golden_init << " initial tensors, the model "
      << init.size() << " state_dict entries; if the model changed, " << kRegenerate;
  for (const auto& [key, t] : init) {
    const Tensor* gt = g.file.find("init." + key);
    if (gt == nullptr) {
      ADD_FAILURE() << model_name << ": the golden file has no init." << key << "; " << kRegenerate;
      continue;
    }
    ASSERT_EQ(t.dtype(), gt->dtype()) << key;
    ASSERT_EQ(t.shape(), gt->shape()) << key;
    EXPECT_TRUE(bytes_of(t) == bytes_of(*gt))
        << model_name << ": the initial " << key
        << " differs from the golden file's (the initialisation changed?); " << kRegenerate;
  }
  if (::testing::Test::HasFatalFailure()) return;

  // ---- the run, in the file's precision -------------------------------------------------------
  data::DataLoader loader = golden_loader(g, dtype, /*announce=*/true);
  if (dtype != DType::F32) model->to(dtype);
  const std::vector<double> losses = train(*model, loader, g, steps);
  const std::vector<double> want_losses = g.file.at("losses").to_vector<double>();
  ASSERT_EQ(int64_t(want_losses.size()), steps);
  double worst_loss = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const double got = losses[size_t(step)], want = want_losses[size_t(step)];
    const double rel = std::abs(got - want) / std::abs(want);
    worst_loss = std::max(worst_loss, rel);
    std::printf("%s %s step %lld: loss %.12g, PyTorch's %.12g, relative difference %.3g\n",
                model_name.c_str(), precision.c_str(), static_cast<long long>(step), got, want,
                rel);
    EXPECT_LE(rel, kLossRelTol) << model_name << " step " << step << ": loss " << got
                                << ", PyTorch's " << want;
  }

  // ---- the final weights ----------------------------------------------------------------------
  const int64_t stride = std::stoll(g.meta("sample_stride"));
  double worst_weight = 0;
  for (const auto& [key, t] : model->state_dict()) {
    const std::vector<double> got = t.to_vector<double>();
    if (const Tensor* full = g.file.find("final." + key)) {
      EXPECT_EQ(t.shape(), full->shape()) << key;
      worst_weight = std::max(
          worst_weight, expect_weights_close(got, full->to_vector<double>(), weight_tol, key));
    } else if (const Tensor* sample = g.file.find("final_sample." + key)) {
      std::vector<double> picked;
      for (size_t i = 0; i < got.size(); i += size_t(stride))
        picked.push_back(got[i]);
      worst_weight =
          std::max(worst_weight, expect_weights_close(picked, sample->to_vector<double>(),
                                                      weight_tol, key + " (sampled)"));
    } else {
      ADD_FAILURE() << model_name << ": the golden file has no final " << key;
    }
    // The whole tensor: its sum, sum |x| and sum x^2, at the same tolerance of sum |x| (sum x^2).
    const Tensor* stats_t = g.file.find("final_stats." + key);
    if (stats_t == nullptr || stats_t->numel() != 3) {
      ADD_FAILURE() << model_name << ": the golden file has no final_stats." << key;
      continue;
    }
    const std::vector<double> stats = stats_t->to_vector<double>();
    double sum = 0, sum_abs = 0, sum_sq = 0;
    for (double v : got) {
      sum += v;
      sum_abs += std::abs(v);
      sum_sq += v * v;
    }
    EXPECT_LE(std::abs(sum - stats[0]), weight_tol * stats[1]) << key << " sum";
    EXPECT_LE(std::abs(sum_abs - stats[1]), weight_tol * stats[1]) << key << " sum |x|";
    EXPECT_LE(std::abs(sum_sq - stats[2]), 2 * weight_tol * stats[2]) << key << " sum x^2";
  }
  std::printf(
      "%s (%s) vs PyTorch %s: max relative loss difference %.3g over %lld steps, max "
      "final weight difference %.3g of the tensor's scale\n",
      model_name.c_str(), precision.c_str(), g.meta("torch").c_str(), worst_loss,
      static_cast<long long>(steps), worst_weight);
  ::testing::Test::RecordProperty("max_loss_rel_diff", std::to_string(worst_loss));
  ::testing::Test::RecordProperty("max_weight_rel_diff", std::to_string(worst_weight));

  // ---- a float64 golden run's float32 losses: the first one, before any update, to 1e-5 -------
  if (const Tensor* f32 = g.file.find("losses_f32")) {
    const std::vector<double> want = f32->to_vector<double>();
    const auto fresh = nn::make_model(model_name, config);
    data::DataLoader loader32 = golden_loader(g, DType::F32, /*announce=*/false);
    const std::vector<double> got = train(*fresh, loader32, g, steps);
    ASSERT_EQ(want.size(), got.size());
    for (size_t step = 0; step < got.size(); ++step) {
      std::printf("%s f32 step %zu: loss %.9g, PyTorch's %.9g, relative difference %.3g%s\n",
                  model_name.c_str(), step, got[step], want[step],
                  std::abs(got[step] - want[step]) / std::abs(want[step]),
                  step == 0 ? "" : " (not checked)");
    }
    EXPECT_LE(std::abs(got[0] - want[0]), kLossRelTol * std::abs(want[0]))
        << model_name << ": the float32 loss before any update";
  }
}

TEST(GoldenTrain, MlpMatchesPyTorchForTenSgdSteps) {
  run_golden("mlp");
}

TEST(GoldenTrain, CnnMatchesPyTorchForTenSgdSteps) {
  run_golden("cnn");
}

}  // namespace
}  // namespace mantissa
