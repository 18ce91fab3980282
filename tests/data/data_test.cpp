#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "harness/temp_dir.h"
#include "mantissa/core/error.h"
#include "mantissa/data/images.h"
#include "mantissa/data/loader.h"
#include "mantissa/data/tokens.h"

namespace mantissa::data {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool have_fashion_mnist() {
  return fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz");
}

// Loaded once for the whole program (about half a second).
const ImageDataset& fashion(bool train) {
  if (train) {
    static const ImageDataset train_set = load_fashion_mnist(kFashionMnistDir, true);
    return train_set;
  }
  static const ImageDataset test_set = load_fashion_mnist(kFashionMnistDir, false);
  return test_set;
}

#define SKIP_WITHOUT_FASHION_MNIST()                                       \
  if (!have_fashion_mnist())                                               \
  GTEST_SKIP() << "Fashion-MNIST is not installed in " << kFashionMnistDir \
               << " (apt-get install dataset-fashion-mnist)"

// Message of the mantissa::Error that `fn` throws ("" and a test failure if none).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a mantissa::Error";
  return "";
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string be32(uint32_t v) {
  return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

// An uncompressed IDX file of bytes.
std::string idx(uint32_t magic, const std::vector<uint32_t>& dims,
                const std::vector<uint8_t>& data) {
  std::string s = be32(magic);
  for (uint32_t d : dims)
    s += be32(d);
  s.append(data.begin(), data.end());
  return s;
}

class DataFiles : public testing::TempDirTest {
 protected:
  std::string write(const std::string& name, const std::string& bytes) const {
    write_bytes(file(name), bytes);
    return file(name);
  }
};

// ---- Fashion-MNIST ------------------------------------------------------------------------------

TEST(FashionMnist, TrainSet) {
  SKIP_WITHOUT_FASHION_MNIST();
  const auto t0 = Clock::now();
  const ImageDataset& ds = fashion(true);
  std::printf("[ info ] Fashion-MNIST train set load (60000 images): %.3f s\n", seconds_since(t0));
  ASSERT_EQ(ds.images().shape(), Shape({60000, 1, 28, 28}));
  EXPECT_EQ(ds.images().dtype(), DType::U8);
  ASSERT_EQ(ds.labels().shape(), Shape({60000}));
  EXPECT_EQ(ds.labels().dtype(), DType::I64);
  EXPECT_EQ(ds.num_classes(), 10);
  EXPECT_EQ(ds.labels().data<int64_t>()[0], 9);  // Ankle boot
  EXPECT_EQ(fashion_mnist_class_name(9), "Ankle boot");
  std::vector<int64_t> histogram(10, 0);
  for (int64_t l : ds.labels().to_vector<int64_t>())
    histogram[size_t(l)] += 1;
  EXPECT_EQ(histogram, std::vector<int64_t>(10, 6000));
  // The published statistics of the training pixels: the bytes were decoded in the right place.
  double sum = 0, sum2 = 0;
  const uint8_t* p = ds.images().data<uint8_t>();
  for (int64_t i = 0; i < ds.images().numel(); ++i) {
    const double v = p[i] / 255.0;
    sum += v;
    sum2 += v * v;
  }
  const double mean = sum / double(ds.images().numel());
  EXPECT_NEAR(mean, kFashionMnistMean, 5e-4);
  EXPECT_NEAR(std::sqrt(sum2 / double(ds.images().numel()) - mean * mean), kFashionMnistStd, 5e-4);
}

TEST(FashionMnist, TestSet) {
  SKIP_WITHOUT_FASHION_MNIST();
  const ImageDataset& ds = fashion(false);
  ASSERT_EQ(ds.images().shape(), Shape({10000, 1, 28, 28}));
  EXPECT_EQ(ds.labels().data<int64_t>()[0], 9);
  EXPECT_EQ(ds.labels().data<int64_t>()[1], 2);  // Pullover
  std::vector<int64_t> histogram(10, 0);
  for (int64_t l : ds.labels().to_vector<int64_t>())
    histogram[size_t(l)] += 1;
  EXPECT_EQ(histogram, std::vector<int64_t>(10, 1000));
  EXPECT_EQ(ds.name(), "fashion-mnist/test");
}

TEST(FashionMnist, OneEpochOfBatches) {
  SKIP_WITHOUT_FASHION_MNIST();
  for (int workers : {2, 0}) {
    DataLoader loader(fashion(true), {.batch_size = 128, .seed = 1, .num_workers = workers});
    const auto t0 = Clock::now();
    int64_t batches = 0, samples = 0;
    for (const Batch& b : loader) {
      ++batches;
      samples += b.y().numel();
    }
    std::printf("[ info ] one Fashion-MNIST epoch, batch 128, %d workers: %.3f s (%lld batches)\n",
                workers, seconds_since(t0), static_cast<long long>(batches));
    EXPECT_EQ(batches, 469);
    EXPECT_EQ(samples, 60000);
  }
}

TEST_F(DataFiles, MissingFashionMnistSaysHowToGetIt) {
  const std::string msg = error_of([&] { load_fashion_mnist(file("nowhere"), true); });
  EXPECT_NE(msg.find("nowhere"), std::string::npos) << msg;
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data-dir"), std::string::npos) << msg;
  // A directory without the files names the missing one.
  const std::string msg2 = error_of([&] { load_fashion_mnist(dir_.string(), false); });
  EXPECT_NE(msg2.find("t10k-images-idx3-ubyte.gz"), std::string::npos) << msg2;
}

// ---- IDX files ----------------------------------------------------------------------------------

TEST_F(DataFiles, RawIdxFilesLoad) {
  std::vector<uint8_t> pixels(3 * 2 * 4);
  for (size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = uint8_t(i * 10);
  const std::string images = write("img", idx(0x803, {3, 2, 4}, pixels));
  const std::string labels = write("lab", idx(0x801, {3}, {7, 0, 9}));
  const ImageDataset ds = load_mnist_format(images, labels);
  ASSERT_EQ(ds.images().shape(), Shape({3, 1, 2, 4}));
  EXPECT_EQ(ds.images().to_vector<int64_t>()[5], 50);
  EXPECT_EQ(ds.labels().to_vector<int64_t>(), (std::vector<int64_t>{7, 0, 9}));
}

TEST_F(DataFiles, GunzippedFashionMnistFilesLoad) {
  SKIP_WITHOUT_FASHION_MNIST();
  // The raw labels of the test set, made from the real file by read_idx and written back raw.
  const IdxArray labels = read_idx(std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz", 1);
  ASSERT_EQ(labels.dims, std::vector<int64_t>{10000});
  const std::string raw = write("t10k-labels-idx1-ubyte", idx(0x801, {10000}, labels.data));
  EXPECT_EQ(read_idx(raw, 1).data, labels.data);
}

TEST_F(DataFiles, CorruptFilesNameTheFileAndTheProblem) {
  struct Case {
    std::string name;
    std::string bytes;
    int dims;
    std::string says;
  };
  std::vector<Case> cases = {
      {"wrong_magic", idx(0x12345678, {3}, {1, 2, 3}), 1, "wrong magic"},
      {"swapped", idx(0x803, {1, 1, 1}, {0}), 1, "swapped"},
      {"truncated_raw", idx(0x801, {5}, {1, 2, 3}), 1, "truncated"},
      {"short_header", be32(0x803) + be32(2), 3, "truncated"},
      {"trailing", idx(0x801, {2}, {1, 2, 3}), 1, "after the data"},
      {"zero_dim", idx(0x803, {2, 0, 28}, {}), 3, "is 0"},
      {"empty", "", 1, "empty"},
      {"not_bytes", idx(0x0d01, {1}, {0, 0, 0, 0}), 1, "not unsigned bytes"},
  };
  if (have_fashion_mnist()) {
    const std::string gz = read_bytes(std::string(kFashionMnistDir) + "/t10k-labels-idx1-ubyte.gz");
    cases.push_back({"truncated.gz", gz.substr(0, gz.size() / 2), 1, "truncated"});
    std::string flipped = gz;
    for (size_t i = 100; i < 200; ++i)
      flipped[i] = char(flipped[i] ^ 0x5a);
    cases.push_back({"corrupt.gz", flipped, 1, "corrupt gzip"});
    cases.push_back({"trailing_garbage.gz", gz + "garbage", 1, "corrupt gzip"});
  }
  for (const Case& c : cases) {
    const std::string path = write(c.name, c.bytes);
    const std::string msg = error_of([&] { read_idx(path, c.dims); });
    EXPECT_NE(msg.find(path), std::string::npos) << c.name << ": " << msg;
    EXPECT_NE(msg.find(c.says), std::string::npos) << c.name << ": " << msg;
  }
  const std::string missing = file("missing");
  const std::string msg = error_of([&] { read_idx(missing, 1); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("no such file"), std::string::npos) << msg;
}

TEST_F(DataFiles, ImageAndLabelCountsMustAgree) {
  const std::string images = write("img", idx(0x803, {3, 2, 2}, std::vector<uint8_t>(12, 1)));
  const std::string labels = write("lab", idx(0x801, {4}, {1, 2, 3, 4}));
  const std::string msg = error_of([&] { load_mnist_format(images, labels); });
  EXPECT_NE(msg.find(images), std::string::npos) << msg;
  EXPECT_NE(msg.find(labels), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 images"), std::string::npos) << msg;
  EXPECT_NE(msg.find("4 labels"), std::string::npos) << msg;
}

TEST_F(DataFiles, LabelOutOfRange) {
  const std::string images = write("img", idx(0x803, {2, 2, 2}, std::vector<uint8_t>(8, 1)));
  const std::string labels = write("lab", idx(0x801, {2}, {3, 10}));
  const std::string msg = error_of([&] { load_mnist_format(images, labels, 10); });
  EXPECT_NE(msg.find(labels), std::string::npos) << msg;
  EXPECT_NE(msg.find("label 1 is 10"), std::string::npos) << msg;
  EXPECT_NO_THROW(load_mnist_format(images, labels, 11));
}

// ---- synthetic images ---------------------------------------------------------------------------

TEST(Synthetic, DeterministicAndLearnable) {
  const ImageDataset a = synthetic_images(2000, 2, 12, 5, 42);
  const ImageDataset b = synthetic_images(2000, 2, 12, 5, 42);
  const ImageDataset c = synthetic_images(2000, 2, 12, 5, 43);
  ASSERT_EQ(a.images().shape(), Shape({2000, 2, 12, 12}));
  EXPECT_EQ(a.num_classes(), 5);
  EXPECT_EQ(a.images().to_vector<int64_t>(), b.images().to_vector<int64_t>());
  EXPECT_EQ(a.labels().to_vector<int64_t>(), b.labels().to_vector<int64_t>());
  EXPECT_NE(a.images().to_vector<int64_t>(), c.images().to_vector<int64_t>());
  // Nearest class mean, fitted on the first half, classifies the second half well.
  const int64_t d = 2 * 12 * 12;
  const uint8_t* x = a.images().data<uint8_t>();
  const int64_t* y = a.labels().data<int64_t>();
  std::vector<double> mean(size_t(5 * d), 0.0);
  std::vector<int64_t> count(5, 0);
  for (int64_t i = 0; i < 1000; ++i) {
    count[size_t(y[i])] += 1;
    for (int64_t j = 0; j < d; ++j)
      mean[size_t(y[i] * d + j)] += x[i * d + j];
  }
  for (int64_t k = 0; k < 5; ++k) {
    ASSERT_GT(count[size_t(k)], 100);
    for (int64_t j = 0; j < d; ++j)
      mean[size_t(k * d + j)] /= double(count[size_t(k)]);
  }
  int64_t right = 0;
  for (int64_t i = 1000; i < 2000; ++i) {
    int64_t best = 0;
    double best_dist = 1e300;
    for (int64_t k = 0; k < 5; ++k) {
      double dist = 0;
      for (int64_t j = 0; j < d; ++j) {
        const double e = x[i * d + j] - mean[size_t(k * d + j)];
        dist += e * e;
      }
      if (dist < best_dist) best_dist = dist, best = k;
    }
    right += best == y[i];
  }
  EXPECT_GT(right, 950);
}

// ---- DataLoader ---------------------------------------------------------------------------------

// n images of 1x2x2 whose label is their own index, so a batch's y says which items it holds.
ImageDataset indexed(int64_t n) {
  Tensor images = Tensor::empty({n, 1, 2, 2}, DType::U8);
  Tensor labels = Tensor::empty({n}, DType::I64);
  uint8_t* p = images.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) {
    p[4 * i] = uint8_t(i);
    p[4 * i + 1] = uint8_t(i >> 8);
    p[4 * i + 2] = uint8_t(255);
    p[4 * i + 3] = uint8_t(i * 7);
    labels.data<int64_t>()[i] = i;
  }
  return ImageDataset(images, labels, n, "indexed");
}

std::vector<int64_t> labels_of(const Batch& b) {
  return b.y().to_vector<int64_t>();
}

// Every batch of the loader's current epoch: (y values, x values) per batch.
std::vector<std::pair<std::vector<int64_t>, std::vector<float>>> drain(DataLoader& loader) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<float>>> out;
  while (auto b = loader.next())
    out.emplace_back(labels_of(*b), b->x().to_vector<float>());
  return out;
}

TEST(DataLoader, EveryItemOncePerEpoch) {
  DataLoader loader(indexed(1000), {.batch_size = 64, .seed = 3, .num_workers = 2});
  EXPECT_EQ(loader.num_batches(), 16);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    int64_t index = 0;
    for (Batch& b : loader) {
      EXPECT_EQ(b.index, index++);
      EXPECT_EQ(b.epoch, epoch);
      EXPECT_EQ(b.x().shape(), Shape({b.y().numel(), 1, 2, 2}));
      EXPECT_EQ(b.y().numel(), b.index == 15 ? 1000 - 15 * 64 : 64);
      for (int64_t v : labels_of(b))
        seen.push_back(v);
    }
    EXPECT_EQ(index, 16);
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(1000);
    std::iota(all.begin(), all.end(), int64_t(0));
    EXPECT_EQ(seen, all);
  }
  EXPECT_EQ(loader.epoch(), 2);  // two loops, two epochs
}

TEST(DataLoader, OrderDependsOnSeedAndEpochOnly) {
  std::vector<std::vector<std::pair<std::vector<int64_t>, std::vector<float>>>> runs;
  for (int workers : {0, 1, 3}) {
    for (int prefetch : {1, 4}) {
      DataLoader loader(
          indexed(500),
          {.batch_size = 32, .seed = 11, .num_workers = workers, .prefetch = prefetch});
      loader.set_epoch(4);
      runs.push_back(drain(loader));
    }
  }
  for (size_t i = 1; i < runs.size(); ++i)
    EXPECT_EQ(runs[i], runs[0]) << "run " << i;

  DataLoader loader(indexed(500), {.batch_size = 32, .seed = 11});
  loader.set_epoch(5);
  EXPECT_NE(drain(loader), runs[0]);  // another epoch, another order
  DataLoader other_seed(indexed(500), {.batch_size = 32, .seed = 12});
  other_seed.set_epoch(4);
  EXPECT_NE(drain(other_seed), runs[0]);
  EXPECT_NE(loader.epoch_order(4), other_seed.epoch_order(4));
  std::vector<int64_t> sorted = loader.epoch_order(4);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 500; ++i)
    ASSERT_EQ(sorted[size_t(i)], i);

  DataLoader sequential(indexed(100), {.batch_size = 30, .shuffle = false});
  std::vector<int64_t> seen;
  for (Batch& b : sequential) {
    for (int64_t v : labels_of(b))
      seen.push_back(v);
  }
  std::vector<int64_t> all(100);
  std::iota(all.begin(), all.end(), int64_t(0));
  EXPECT_EQ(seen, all);
}

TEST(DataLoader, DropLast) {
  DataLoader loader(indexed(1000), {.batch_size = 64, .drop_last = true, .num_workers = 1});
  EXPECT_EQ(loader.num_batches(), 15);
  EXPECT_EQ(loader.num_samples(), 960);
  std::set<int64_t> seen;
  int64_t batches = 0;
  for (Batch& b : loader) {
    ++batches;
    EXPECT_EQ(b.y().numel(), 64);
    for (int64_t v : labels_of(b))
      seen.insert(v);
  }
  EXPECT_EQ(batches, 15);
  EXPECT_EQ(seen.size(), 960u);
  // A loader over the first 100 items sees only those.
  DataLoader first(head(indexed(1000), 100), {.batch_size = 64});
  EXPECT_EQ(first.num_batches(), 2);
  for (Batch& b : first) {
    for (int64_t v : labels_of(b))
      EXPECT_LT(v, 100);
  }
  // Fewer items than one batch: no batches at all.
  DataLoader tiny(indexed(10), {.batch_size = 64, .drop_last = true});
  EXPECT_EQ(tiny.num_batches(), 0);
  EXPECT_FALSE(tiny.next().has_value());
}

TEST(DataLoader, StartEpochResumesExactly) {
  DataLoader full(indexed(700), {.batch_size = 50, .seed = 5, .num_workers = 2});
  full.set_epoch(3);
  const auto all = drain(full);
  ASSERT_EQ(all.size(), 14u);
  for (int workers : {0, 3}) {
    DataLoader resumed(indexed(700), {.batch_size = 50, .seed = 5, .num_workers = workers});
    resumed.start_epoch(3, 9);
    EXPECT_EQ(resumed.next_index(), 9);
    const auto rest = drain(resumed);
    EXPECT_EQ(rest, decltype(all)(all.begin() + 9, all.end())) << workers << " workers";
    EXPECT_EQ(resumed.epoch(), 4);  // the epoch ended and the next one is up
  }
  // make_batch is the same function the workers run.
  EXPECT_EQ(labels_of(full.make_batch(3, 5)), all[5].first);
  // Restarting mid-epoch discards the prefetched batches.
  DataLoader loader(indexed(700), {.batch_size = 50, .seed = 5, .num_workers = 2});
  loader.set_epoch(3);
  loader.next();
  loader.next();
  loader.start_epoch(3, 12);
  EXPECT_EQ(labels_of(*loader.next()), all[12].first);
  EXPECT_THROW(loader.start_epoch(3, 15), Error);
}

TEST(DataLoader, NormalizationValuesAndOneBuffer) {
  const ImageDataset ds = indexed(300);
  const std::vector<int64_t> pixels = ds.images().to_vector<int64_t>();
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    DataLoader loader(ds.with_options({.mean = 0.5f, .std = 0.25f, .dtype = dtype}),
                      {.batch_size = 16});
    const std::vector<int64_t> order = loader.epoch_order(0);
    std::optional<Batch> b = loader.next();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->x().dtype(), dtype);
    EXPECT_TRUE(b->x().is_contiguous());
    EXPECT_TRUE(b->x().shares_storage(b->y()));  // one allocation per batch
    const std::vector<float> x = b->x().to_vector<float>();
    for (int64_t i = 0; i < 16; ++i) {
      for (int64_t j = 0; j < 4; ++j) {
        const float want = (float(pixels[size_t(order[size_t(i)] * 4 + j)]) / 255.f - 0.5f) / 0.25f;
        const float want_rounded = Tensor::from_vector(std::vector<float>{want}, {1}, DType::F32)
                                       .to(dtype)
                                       .to_vector<float>()[0];
        EXPECT_EQ(x[size_t(i * 4 + j)], want_rounded) << dtype_name(dtype) << " " << i << "," << j;
      }
    }
  }
  // Pixel 255 with the Fashion-MNIST defaults.
  DataLoader loader(ds, {.batch_size = 1, .shuffle = false, .num_workers = 0});
  EXPECT_FLOAT_EQ(loader.next()->x().to_vector<float>()[2], (1.0f - 0.2860f) / 0.3530f);
}

TEST(DataLoader, InOrderWhateverTheWorkerTiming) {
  // Later batches finish first: batch i sleeps (7 - i % 8) ms.
  LoaderOptions options{.batch_size = 10, .seed = 9, .num_workers = 4, .prefetch = 6};
  options.transform = [](Batch& b) {
    std::this_thread::sleep_for(std::chrono::milliseconds(7 - b.index % 8));
  };
  DataLoader slow(indexed(400), options);
  DataLoader sync(indexed(400), {.batch_size = 10, .seed = 9, .num_workers = 0});
  EXPECT_EQ(drain(slow), drain(sync));
}

TEST(DataLoader, WorkerExceptionReachesTheConsumer) {
  for (int workers : {0, 2}) {
    LoaderOptions options{.batch_size = 10, .num_workers = workers};
    options.transform = [](Batch& b) {
      MT_CHECK(b.index != 5, "augmentation failed on batch ", b.index);
    };
    DataLoader loader(indexed(200), options);
    for (int i = 0; i < 5; ++i)
      EXPECT_EQ(loader.next()->index, i);
    const std::string msg = error_of([&] { loader.next(); });
    EXPECT_NE(msg.find("augmentation failed on batch 5"), std::string::npos) << msg;
    EXPECT_EQ(loader.next_index(), 5);
    // The loader is still usable: another epoch runs.
    loader.start_epoch(1, 6);
    EXPECT_EQ(loader.next()->index, 6);
  }
}

TEST(DataLoader, DestroyedMidEpochWithoutHanging) {
  const auto t0 = Clock::now();
  for (int workers : {1, 3, 8}) {
    LoaderOptions options{.batch_size = 8, .num_workers = workers, .prefetch = 2};
    options.transform = [](Batch&) { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
    {
      DataLoader loader(indexed(1000), options);
      loader.next();
      loader.next();
    }  // workers blocked on a full queue and workers mid-batch both stop
    {
      DataLoader loader(indexed(1000), options);
      loader.set_epoch(2);  // started, never consumed
    }
    DataLoader moved_from(indexed(1000), options);
    moved_from.next();
    DataLoader moved_to(std::move(moved_from));
    EXPECT_EQ(moved_to.next()->index, 1);
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(DataLoader, RejectsBadOptions) {
  const ImageDataset ds = indexed(10);
  EXPECT_THROW(DataLoader(ds, {.batch_size = 0}), Error);
  EXPECT_THROW(DataLoader(ds, {.prefetch = 0}), Error);
  EXPECT_THROW(DataLoader(ds, {.num_workers = -1}), Error);
  // The normalization and the labels are the image dataset's, checked when it is made.
  EXPECT_THROW(ds.with_options({.std = 0.f}), Error);
  EXPECT_THROW(ds.with_options({.dtype = DType::I32}), Error);
  EXPECT_THROW(ImageDataset(ds.images(), Tensor::zeros({9}, DType::I64), 10, "bad"), Error);
  EXPECT_THROW(ImageDataset(ds.images(), ds.labels(), 5, "bad"), Error);  // labels go up to 9
}

// ---- tokens -------------------------------------------------------------------------------------

TEST_F(DataFiles, TokenFileRoundTrip) {
  std::vector<uint32_t> tokens = {0, 1, 255, 256, 65535, 50256, 7};
  const std::string path = file("tokens.bin");
  write_tokens(path, tokens);
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes.size(), 14u);
  EXPECT_EQ(uint8_t(bytes[6]), 0x00);  // 256 little-endian
  EXPECT_EQ(uint8_t(bytes[7]), 0x01);
  const TokenDataset ds = load_tokens(path);
  EXPECT_EQ(ds.tokens, tokens);
  EXPECT_EQ(ds.vocab_size, 65536);
  EXPECT_EQ(load_tokens(path, 65536).vocab_size, 65536);

  write_tokens(path, std::vector<uint32_t>{1, 2, 3});
  const std::string msg = error_of([&] { load_tokens(path, 3); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  const std::string odd = write("odd.bin", "abc");
  const std::string msg2 = error_of([&] { load_tokens(odd); });
  EXPECT_NE(msg2.find(odd), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("odd"), std::string::npos) << msg2;
  EXPECT_THROW(load_tokens(file("missing.bin")), Error);
}

TEST_F(DataFiles, ByteTokenizerRoundTrip) {
  std::string text = "Mixed precision — ✓ ünïcødé\n";
  for (int c = 0; c < 256; ++c)
    text += char(c);
  const std::vector<uint32_t> tokens = ByteTokenizer::encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (uint32_t t : tokens)
    EXPECT_LT(t, ByteTokenizer::kVocabSize);
  EXPECT_EQ(ByteTokenizer::decode(tokens), text);
  EXPECT_THROW(ByteTokenizer::decode(std::vector<uint32_t>{65, 256}), Error);

  const std::string path = write("text.txt", text);
  const TokenDataset ds = tokenize_text_file(path);
  EXPECT_EQ(ds.tokens, tokens);
  EXPECT_EQ(ds.vocab_size, 256);
  // Through a token file and back.
  write_tokens(file("text.bin"), ds.tokens);
  EXPECT_EQ(ByteTokenizer::decode(load_tokens(file("text.bin")).tokens), text);
}

TEST(Tokens, LmBatchTargetsAreInputsShiftedByOne) {
  const TokenDataset ds = synthetic_tokens(5000, 100, 1);
  EXPECT_EQ(ds.vocab_size, 100);
  const Batch b = lm_batch(ds, 8, 32, 7, 3);
  ASSERT_EQ(b.x().shape(), Shape({8, 32}));
  ASSERT_EQ(b.y().shape(), Shape({8, 32}));
  EXPECT_EQ(b.x().dtype(), DType::I64);
  const std::vector<int64_t> x = b.x().to_vector<int64_t>();
  const std::vector<int64_t> y = b.y().to_vector<int64_t>();
  for (int64_t r = 0; r < 8; ++r) {
    for (int64_t t = 0; t + 1 < 32; ++t)
      EXPECT_EQ(y[size_t(r * 32 + t)], x[size_t(r * 32 + t + 1)]);
    // The row is a window of the stream.
    auto it = std::search(ds.tokens.begin(), ds.tokens.end(), x.begin() + r * 32,
                          x.begin() + r * 32 + 32);
    ASSERT_NE(it, ds.tokens.end());
    EXPECT_EQ(y[size_t(r * 32 + 31)], *(it + 32));
  }
  // Same arguments, same batch; another index, another batch.
  EXPECT_EQ(lm_batch(ds, 8, 32, 7, 3).x().to_vector<int64_t>(), x);
  EXPECT_NE(lm_batch(ds, 8, 32, 7, 4).x().to_vector<int64_t>(), x);
  EXPECT_THROW(lm_batch(ds, 1, 5000, 7, 0), Error);  // no window of 5001 tokens
  // The synthetic stream is mostly predictable: next = table[prev].
  int64_t agree = 0, total = 0;
  std::vector<int> succ(100, -1);
  for (size_t i = 1; i < ds.tokens.size(); ++i) {
    const auto prev = size_t(ds.tokens[i - 1]);
    if (succ[prev] < 0) succ[prev] = int(ds.tokens[i]);
    agree += succ[prev] == int(ds.tokens[i]);
    ++total;
  }
  EXPECT_GT(double(agree) / double(total), 0.8);
}

TEST(Tokens, TokenLoaderEpochsAndResume) {
  const auto [train, val] = split_tokens(synthetic_tokens(10000, 50, 2), 0.1);
  EXPECT_EQ(train.size(), 9000);
  EXPECT_EQ(val.size(), 1000);
  DataLoader loader = token_loader(train, {.batch_size = 4, .seq_len = 16, .seed = 3});
  EXPECT_EQ(loader.num_batches(), 9000 / 64);
  EXPECT_EQ(dynamic_cast<const TokenWindows&>(loader.dataset()).vocab_size(), 50);
  std::vector<std::vector<int64_t>> epoch0, epoch1;
  for (Batch& b : loader)
    epoch0.push_back(b.x().to_vector<int64_t>());
  for (Batch& b : loader) {
    EXPECT_EQ(b.epoch, 1);
    epoch1.push_back(b.x().to_vector<int64_t>());
  }
  ASSERT_EQ(epoch0.size(), size_t(loader.num_batches()));
  EXPECT_NE(epoch0, epoch1);
  DataLoader resumed = token_loader(train, {.batch_size = 4, .seq_len = 16, .seed = 3});
  resumed.start_epoch(1, 100);
  std::vector<std::vector<int64_t>> rest;
  while (auto b = resumed.next())
    rest.push_back(b->x().to_vector<int64_t>());
  EXPECT_EQ(rest, decltype(epoch1)(epoch1.begin() + 100, epoch1.end()));
}

}  // namespace
}  // namespace mantissa::data
