// The one loader over any Dataset: a custom dataset of three fields, the image dataset (bit for
// bit the pixel-table batches of the epoch order), the token windows (bit for bit lm_batch),
// resumption, worker counts and the errors a user's mistakes get.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "mantissa/core/error.h"
#include "mantissa/data/dataset.h"
#include "mantissa/data/images.h"
#include "mantissa/data/loader.h"
#include "mantissa/data/sampler.h"
#include "mantissa/data/tokens.h"
#include "mantissa/numerics/philox.h"

namespace mantissa::data {
namespace {

using testing::error_of;

#define EXPECT_SAYS(message, text)                   \
  EXPECT_NE((message).find(text), std::string::npos) \
      << "'" << (message) << "' lacks '" << (text) << "'"

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  t.copy_to_host(out.data(), out.size());
  return out;
}

// Every field's bytes of every batch of the loader's current epoch.
std::vector<std::vector<std::vector<uint8_t>>> drain(DataLoader& loader) {
  std::vector<std::vector<std::vector<uint8_t>>> out;
  while (auto b = loader.next()) {
    std::vector<std::vector<uint8_t>> fields;
    for (const Tensor& f : b->fields)
      fields.push_back(bytes_of(f));
    out.push_back(std::move(fields));
  }
  return out;
}

// A recommender-like dataset: {dense: F32 (4), categorical: I32 (2), label: I64 scalar}, each a
// function of the index. `odd_one` (>= 0) gives that item a dense field of 5 values.
class Clicks final : public Dataset {
 public:
  explicit Clicks(int64_t n, int64_t odd_one = -1) : n_(n), odd_one_(odd_one) {}
  int64_t size() const override { return n_; }
  FieldNames field_names() const override { return {"dense", "categorical", "label"}; }
  std::string name() const override { return "clicks"; }
  Sample get(int64_t i) const override {
    MT_CHECK(i >= 0 && i < n_, "clicks: index ", i, " out of range");
    std::vector<float> dense(i == odd_one_ ? 5 : 4);
    for (size_t k = 0; k < dense.size(); ++k)
      dense[k] = float(i) + 0.25f * float(k);
    Tensor categorical = Tensor::empty({2}, DType::I32);
    categorical.data<int32_t>()[0] = int32_t(i % 7);
    categorical.data<int32_t>()[1] = int32_t(i * 3);
    return {Tensor::from_vector(dense, {int64_t(dense.size())}), categorical,
            Tensor::from_vector(std::vector<int64_t>{i % 2}, {})};
  }

 private:
  int64_t n_, odd_one_;
};

TEST(GeneralLoader, ACustomDatasetOfThreeFields) {
  DataLoader loader(Clicks(50), {.batch_size = 8, .seed = 4, .num_workers = 2});
  EXPECT_EQ(loader.num_batches(), 7);
  const std::vector<int64_t> order = loader.epoch_order(0);
  EXPECT_EQ(order, ShuffleSampler(50, 4).order(0));
  int64_t k = 0;
  for (Batch& b : loader) {
    const int64_t n = k == 6 ? 2 : 8;
    ASSERT_EQ(b.size(), 3u);
    EXPECT_EQ(b.batch_size(), n);
    EXPECT_EQ(b["dense"].shape(), Shape({n, 4}));
    EXPECT_EQ(b["dense"].dtype(), DType::F32);
    EXPECT_EQ(b["categorical"].shape(), Shape({n, 2}));
    EXPECT_EQ(b["categorical"].dtype(), DType::I32);
    EXPECT_EQ(b["label"].shape(), Shape({n}));
    EXPECT_TRUE(b[0].is_same(b["dense"]));
    // The default collate puts the fields in one allocation (one pinned copy, one transfer).
    EXPECT_TRUE(b[0].shares_storage(b[1]) && b[0].shares_storage(b[2]));
    const std::vector<float> dense = b["dense"].to_vector<float>();
    const std::vector<int64_t> cat = b["categorical"].to_vector<int64_t>();
    const std::vector<int64_t> label = b["label"].to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t item = order[size_t(k * 8 + i)];
      EXPECT_EQ(dense[size_t(i * 4 + 3)], float(item) + 0.75f);
      EXPECT_EQ(cat[size_t(i * 2)], item % 7);
      EXPECT_EQ(cat[size_t(i * 2 + 1)], item * 3);
      EXPECT_EQ(label[size_t(i)], item % 2);
    }
    // Not named x and y: the two-field spelling says so instead of guessing.
    EXPECT_SAYS(error_of([&] { b.x(); }), "no field named 'x'");
    ++k;
  }
  EXPECT_EQ(k, 7);
}

TEST(GeneralLoader, ACustomCollate) {
  // Joins dense and categorical into one F32 "features" field and keeps the label.
  LoaderOptions o{.batch_size = 6, .shuffle = false, .num_workers = 2};
  o.collate = [](const std::vector<Sample>& samples) {
    const auto n = int64_t(samples.size());
    Tensor features = Tensor::empty({n, 6}, DType::F32);
    Tensor label = Tensor::empty({n}, DType::I64);
    for (int64_t i = 0; i < n; ++i) {
      const std::vector<float> d = samples[size_t(i)][0].to_vector<float>();
      const std::vector<float> c = samples[size_t(i)][1].to_vector<float>();
      std::copy(d.begin(), d.end(), features.data<float>() + i * 6);
      std::copy(c.begin(), c.end(), features.data<float>() + i * 6 + 4);
      label.data<int64_t>()[i] = int64_t(samples[size_t(i)][2].item());
    }
    return std::vector<Tensor>{features, label};
  };
  o.collate_names = {"x", "y"};
  o.transform = [](Batch& b) { b.x().mul_(2.0); };  // sees the collate's names
  DataLoader loader(Clicks(20), o);
  std::optional<Batch> b = loader.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->x().shape(), Shape({6, 6}));
  const std::vector<float> x = b->x().to_vector<float>();
  EXPECT_EQ(x[6 * 5 + 0], 2 * 5.0f);   // item 5's dense[0], doubled
  EXPECT_EQ(x[6 * 5 + 5], 2 * 15.0f);  // item 5's categorical[1] = 15, doubled
  EXPECT_EQ(b->y().to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 1, 0, 1}));

  // Without collate_names, a collate that changes the fields is told to name them.
  o.collate_names.clear();
  o.transform = nullptr;
  DataLoader unnamed(Clicks(20), o);
  const std::string m = error_of([&] { unnamed.next(); });
  EXPECT_SAYS(m, "has 2 fields but 3 names (dense, categorical, label)");
  EXPECT_SAYS(m, "LoaderOptions::collate_names");
  // stack_samples as the collate is the default path, byte for byte.
  LoaderOptions stacked{.batch_size = 6, .seed = 2, .num_workers = 0};
  stacked.collate = [](const std::vector<Sample>& s) { return stack_samples(s); };
  DataLoader a(Clicks(20), stacked), d(Clicks(20), {.batch_size = 6, .seed = 2, .num_workers = 0});
  EXPECT_EQ(drain(a), drain(d));
}

TEST(GeneralLoader, ZeroOrTwoWorkersAndResumptionGiveTheSameBatches) {
  const auto clicks = std::make_shared<const Clicks>(300);
  DataLoader sync(clicks, {.batch_size = 16, .seed = 8, .num_workers = 0});
  DataLoader two(clicks, {.batch_size = 16, .seed = 8, .num_workers = 2, .prefetch = 3});
  for (int epoch = 0; epoch < 2; ++epoch) {
    const auto want = drain(sync);
    EXPECT_EQ(drain(two), want) << "epoch " << epoch;
    // Stopped after batch 6 and resumed at 7 by a fresh loader: the rest of the same epoch.
    for (int workers : {0, 2}) {
      DataLoader resumed(clicks, {.batch_size = 16, .seed = 8, .num_workers = workers});
      resumed.start_epoch(epoch, 7);
      EXPECT_EQ(drain(resumed), decltype(want)(want.begin() + 7, want.end()));
    }
  }
}

TEST(GeneralLoader, ShardsOfADistributedSamplerSplitTheEpoch) {
  const auto clicks = std::make_shared<const Clicks>(64);
  auto shuffle = std::make_shared<ShuffleSampler>(64, 3);
  std::multiset<int64_t> seen;
  for (int rank = 0; rank < 2; ++rank) {
    LoaderOptions o{.batch_size = 8};
    o.sampler = std::make_shared<DistributedSampler>(shuffle, rank, 2, Remainder::Drop);
    DataLoader loader(clicks, o);
    EXPECT_EQ(loader.num_batches(), 4);
    loader.set_epoch(1);
    for (Batch& b : loader) {
      for (int64_t v : b["categorical"].select(1, 1).to_vector<int64_t>())
        seen.insert(v / 3);  // categorical[1] = 3 * item
    }
  }
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 64u);
  EXPECT_EQ(seen.size(), 64u);
}

// ---- the image dataset
// ---------------------------------------------------------------------------

bool have_fashion_mnist() {
  return std::filesystem::exists(std::filesystem::path(kFashionMnistDir) /
                                 "train-images-idx3-ubyte.gz");
}

// Fashion-MNIST where it is installed (loaded once), else a synthetic stand-in of its shape.
const ImageDataset& images() {
  static const ImageDataset set = have_fashion_mnist() ? load_fashion_mnist(kFashionMnistDir, true)
                                                       : synthetic_images(6000, 1, 28, 10, 1);
  return set;
}

// The loader's shuffle as it has always been (DataLoader::epoch_order before the general
// interface): Fisher-Yates, the swap partner of position i drawn from Philox(seed) at
// (epoch, i) as 64 bits scaled to [0, i].
std::vector<int64_t> original_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> o(static_cast<size_t>(n));
  std::iota(o.begin(), o.end(), int64_t(0));
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t bits = uint64_t(random_bits(seed, uint64_t(epoch), 2 * uint64_t(i))) << 32 |
                          random_bits(seed, uint64_t(epoch), 2 * uint64_t(i) + 1);
    std::swap(o[size_t(i)], o[size_t((unsigned __int128)bits * uint64_t(i + 1) >> 64)]);
  }
  return o;
}

TEST(ImageLoader, BatchesAreThePixelTableOfTheEpochOrder) {
  const ImageDataset& ds = images();
  const int64_t per_image = ds.channels() * ds.height() * ds.width();
  const auto* pixels = ds.images().data<uint8_t>();
  const auto* labels = ds.labels().data<int64_t>();
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ImageDataset set = ds.with_options({.dtype = dtype});
    const Tensor table = set.pixel_table();
    const auto* entry = static_cast<const uint8_t*>(table.data_ptr());
    const size_t esize = dtype_size(dtype);
    DataLoader loader(set, {.batch_size = 128, .seed = 1, .num_workers = 2});
    loader.set_epoch(3);
    const std::vector<int64_t> order = original_order(ds.size(), 1, 3);
    ASSERT_EQ(loader.epoch_order(3), order);
    int64_t k = 0;
    for (Batch& b : loader) {
      const int64_t n = b.batch_size();
      ASSERT_EQ(b.x().shape(), Shape({n, ds.channels(), ds.height(), ds.width()}));
      ASSERT_EQ(b.x().dtype(), dtype);
      ASSERT_TRUE(b.x().shares_storage(b.y()));
      const auto* x = static_cast<const uint8_t*>(b.x().data_ptr());
      const auto* y = b.y().data<int64_t>();
      std::vector<uint8_t> want(size_t(per_image) * esize);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t item = order[size_t(k * 128 + i)];
        ASSERT_EQ(y[i], labels[item]) << "batch " << k << " row " << i;
        for (int64_t p = 0; p < per_image; ++p)
          std::memcpy(&want[size_t(p) * esize],
                      entry + size_t(pixels[item * per_image + p]) * esize, esize);
        ASSERT_EQ(0, std::memcmp(x + size_t(i * per_image) * esize, want.data(), want.size()))
            << "batch " << k << " row " << i << ": not pixel_table()[image " << item << "]";
      }
      ++k;
    }
    EXPECT_EQ(k, (ds.size() + 127) / 128);
  }
}

TEST(ImageLoader, TheBatchedFetchEqualsSampleBySample) {
  // get_batch (one gather into one block) against get() of each item + stack_samples.
  const ImageDataset ds = head(images(), 1000).with_options({.dtype = DType::BF16});
  LoaderOptions by_sample{.batch_size = 100, .seed = 6, .num_workers = 2};
  by_sample.collate = [](const std::vector<Sample>& s) { return stack_samples(s); };
  DataLoader fast(ds, {.batch_size = 100, .seed = 6, .num_workers = 2});
  DataLoader slow(ds, by_sample);
  EXPECT_EQ(drain(fast), drain(slow));
  const Sample s = ds.get(17);
  EXPECT_EQ(s[0].shape(), Shape({1, 28, 28}));
  EXPECT_EQ(s[1].shape(), Shape({}));
  EXPECT_EQ(int64_t(s[1].item()), ds.labels().data<int64_t>()[17]);
  EXPECT_EQ(ds.with_options({.pixels = Pixels::Raw}).get(17)[0].dtype(), DType::U8);
}

// ---- token windows
// -------------------------------------------------------------------------------

TEST(TokenLoader, WindowsThroughTheGeneralLoaderAreLmBatch) {
  const TokenDataset tokens = synthetic_tokens(20000, 300, 4);
  const int64_t B = 6, T = 24;
  const auto windows = std::make_shared<const TokenWindows>(tokens, T);
  EXPECT_EQ(windows->size(), 20000 - T);
  const int64_t num_batches = 40;
  for (int workers : {0, 2}) {
    LoaderOptions o{.batch_size = B, .num_workers = workers};
    o.sampler = std::make_shared<ReplacementSampler>(windows->size(), num_batches * B, 77, B);
    DataLoader loader(windows, o);
    EXPECT_EQ(loader.num_batches(), num_batches);
    for (int64_t epoch : {0, 2}) {
      loader.set_epoch(epoch);
      for (Batch& b : loader) {
        const Batch want = lm_batch(tokens, B, T, 77, epoch * num_batches + b.index);
        ASSERT_EQ(b.x().shape(), Shape({B, T}));
        EXPECT_EQ(bytes_of(b.x()), bytes_of(want.x())) << epoch << "/" << b.index;
        EXPECT_EQ(bytes_of(b.y()), bytes_of(want.y())) << epoch << "/" << b.index;
      }
    }
  }
  // token_loader is that loader.
  DataLoader convenient = token_loader(tokens, {.batch_size = B, .seq_len = T, .seed = 77});
  const int64_t nb = 20000 / (B * T);
  EXPECT_EQ(convenient.num_batches(), nb);
  convenient.start_epoch(1, nb - 3);
  while (auto b = convenient.next())
    EXPECT_EQ(bytes_of(b->x()), bytes_of(lm_batch(tokens, B, T, 77, nb + b->index).x()));
}

TEST(TokenLoader, WindowSamplesAndStrides) {
  const TokenDataset tokens = synthetic_tokens(1000, 50, 2);
  const TokenWindows windows(tokens, 10, /*stride=*/10);
  EXPECT_EQ(windows.size(), 99);  // windows of 11 tokens at 0, 10, ..., 980
  const Sample s = windows.get(98);
  const std::vector<int64_t> x = s[0].to_vector<int64_t>(), y = s[1].to_vector<int64_t>();
  for (int64_t t = 0; t < 10; ++t) {
    EXPECT_EQ(x[size_t(t)], tokens.tokens[size_t(980 + t)]);
    EXPECT_EQ(y[size_t(t)], tokens.tokens[size_t(981 + t)]);
  }
  // The batched copy equals sample by sample.
  LoaderOptions by_sample{.batch_size = 7, .shuffle = false, .num_workers = 0};
  by_sample.collate = [](const std::vector<Sample>& v) { return stack_samples(v); };
  DataLoader fast(windows, {.batch_size = 7, .shuffle = false, .num_workers = 0});
  DataLoader slow(windows, by_sample);
  EXPECT_EQ(drain(fast), drain(slow));
  EXPECT_SAYS(error_of([&] { windows.get(99); }), "window 99 out of range: there are 99 windows");
  EXPECT_SAYS(error_of([&] { TokenWindows(tokens, 1000); }), "too few for windows");
}

// ---- a user's mistakes
// ---------------------------------------------------------------------------

TEST(LoaderErrors, SayWhatWasWrongAndWhatToDo) {
  const ImageDataset small = synthetic_images(10, 1, 4, 3, 1);
  EXPECT_SAYS(error_of([&] { small.get(10); }), "index 10 out of range: it holds 10 images");
  EXPECT_SAYS(error_of([&] { small.get(-1); }), "index -1 out of range");
  EXPECT_SAYS(error_of([&] { DataLoader(small, {.batch_size = 0}); }),
              "batch_size must be >= 1, not 0");
  EXPECT_SAYS(error_of([&] { DataLoader(head(small, 0), {}); }), "is empty");
  EXPECT_SAYS(error_of([&] { DataLoader(std::shared_ptr<const Dataset>(), {}); }), "null");

  // A sample whose field differs from the first sample's, through the default collate.
  DataLoader odd(Clicks(20, /*odd_one=*/13), {.batch_size = 20, .shuffle = false});
  const std::string m = error_of([&] { odd.next(); });
  EXPECT_SAYS(m, "field 0 ('dense') of sample 13 of the batch (dataset index 13)");
  EXPECT_SAYS(m, "is f32 tensor of shape (5,)");
  EXPECT_SAYS(m, "it is f32 tensor of shape (4,)");
  EXPECT_SAYS(m, "LoaderOptions::collate");
  EXPECT_EQ(odd.next_index(), 0) << "the failed batch stays next";

  // A sampler for another dataset size.
  LoaderOptions o{.batch_size = 4};
  o.sampler = std::make_shared<SequentialSampler>(12);
  DataLoader wrong(small, o);
  for (int i = 0; i < 2; ++i)
    EXPECT_TRUE(wrong.next().has_value());
  const std::string s = error_of([&] { wrong.next(); });
  EXPECT_SAYS(s, "the sampler gave index 10 in batch 2");
  EXPECT_SAYS(s, "holds 10 items");

  // A batch without the asked-for field lists the ones it has.
  Batch b;
  b.fields = {Tensor::zeros({2, 3})};
  EXPECT_SAYS(error_of([&] { b.y(); }),
              "no field named 'y' (its fields: 0: f32 tensor of shape (2, 3))");
  EXPECT_SAYS(error_of([&] { (void)b[1]; }), "field 1 of a batch of 1 fields");
}

}  // namespace
}  // namespace mantissa::data
