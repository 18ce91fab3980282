#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda_test_util.h"
#include "harness/errors.h"
#include "mantissa/core/cuda.h"
#include "mantissa/core/error.h"
#include "mantissa/data/images.h"
#include "mantissa/data/loader.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::data {
namespace {

ImageDataset small_set(int64_t n = 70, DType dtype = DType::F32) {
  return synthetic_images(n, 1, 8, 10, 5).with_options({.dtype = dtype});
}

LoaderOptions small_options() {
  LoaderOptions o;
  o.batch_size = 16;  // 70 images: 4 full batches and one of 6
  o.seed = 11;
  o.num_workers = 2;
  o.prefetch = 2;
  return o;
}

// How the image dataset a loader loads presents its pixels.
Pixels pixels_of(const DataLoader& loader) {
  return dynamic_cast<const ImageDataset&>(loader.dataset()).options().pixels;
}

// The bytes of a tensor's elements in row-major order, from any device.
std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  t.copy_to_host(out.data(), out.size());
  return out;
}

void expect_same_batch(const Batch& got, const Batch& want, Device device) {
  EXPECT_EQ(got.epoch, want.epoch);
  EXPECT_EQ(got.index, want.index);
  EXPECT_EQ(got.x().device(), device);
  EXPECT_EQ(got.y().device(), device);
  EXPECT_EQ(got.x().dtype(), want.x().dtype());
  EXPECT_EQ(got.x().shape(), want.x().shape());
  EXPECT_EQ(got.y().dtype(), DType::I64);
  EXPECT_EQ(got.y().shape(), want.y().shape());
  EXPECT_EQ(bytes_of(got.x()), bytes_of(want.x()))
      << "epoch " << want.epoch << " batch " << want.index;
  EXPECT_EQ(bytes_of(got.y()), bytes_of(want.y()))
      << "epoch " << want.epoch << " batch " << want.index;
}

// Two epochs through `p` (the first left at batch 2 and resumed there with start_epoch, the
// second by range-for), each batch compared with the DataLoader's own make_batch.
void expect_loader_batches(DevicePrefetcher& p, const DataLoader& reference) {
  const Device device = p.device();
  EXPECT_EQ(p.num_batches(), reference.num_batches());
  EXPECT_EQ(p.epoch(), 0);
  EXPECT_EQ(p.next_index(), 0);
  for (int64_t k = 0; k < 2; ++k) {
    std::optional<Batch> b = p.next();
    ASSERT_TRUE(b.has_value());
    expect_same_batch(*b, reference.make_batch(0, k), device);
  }
  EXPECT_EQ(p.epoch(), 0);
  EXPECT_EQ(p.next_index(), 2);
  p.start_epoch(0, 2);
  for (int64_t k = 2; k < reference.num_batches(); ++k) {
    std::optional<Batch> b = p.next();
    ASSERT_TRUE(b.has_value());
    expect_same_batch(*b, reference.make_batch(0, k), device);
  }
  EXPECT_FALSE(p.next().has_value()) << "the epoch ends once";
  EXPECT_EQ(p.epoch(), 1);
  int64_t k = 0;
  for (auto& b : p)
    expect_same_batch(b, reference.make_batch(1, k++), device);
  EXPECT_EQ(k, reference.num_batches());
  // Jumping elsewhere drops what was in flight.
  p.start_epoch(3, 4);
  std::optional<Batch> b = p.next();
  ASSERT_TRUE(b.has_value());
  expect_same_batch(*b, reference.make_batch(3, 4), device);
  EXPECT_FALSE(p.next().has_value());
}

TEST(DevicePrefetcherTest, CpuIsAPassThroughOfTheLoader) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const DataLoader reference(small_set(70, dtype), small_options());
    DevicePrefetcher p(small_set(70, dtype), small_options(), Device::cpu());
    EXPECT_EQ(pixels_of(p.loader()), Pixels::Normalized)
        << "the CPU gets the loader's batches as they are";
    EXPECT_FALSE(p.loader().options().pin_memory);
    expect_loader_batches(p, reference);
  }
}

TEST(DevicePrefetcherTest, EveryTransferIsAPassThroughOnTheCpu) {
  for (Transfer t : {Transfer::Prefetch, Transfer::Pinned, Transfer::Pageable}) {
    SCOPED_TRACE(int(t));
    const DataLoader reference(small_set(), small_options());
    DevicePrefetcher p(small_set(), small_options(), Device::cpu(), t);
    EXPECT_EQ(p.transfer(), t);
    EXPECT_EQ(pixels_of(p.loader()), Pixels::Normalized);
    EXPECT_FALSE(p.loader().options().pin_memory);
    expect_loader_batches(p, reference);
  }
}

TEST(DevicePrefetcherTest, TransferNamesAreTheConfigsAndAMistakeSaysWhatThereIs) {
  EXPECT_EQ(find_word<Transfer>("prefetch"), Transfer::Prefetch);
  EXPECT_EQ(find_word<Transfer>("pinned"), Transfer::Pinned);
  EXPECT_EQ(find_word<Transfer>("pageable"), Transfer::Pageable);
  EXPECT_HAS(testing::error_of([] { (void)parse_word<Transfer>("async", "--input-pipeline"); }),
             "unknown --input-pipeline 'async'");
  EXPECT_HAS(testing::error_of([] { (void)parse_word<Transfer>("async", "--input-pipeline"); }),
             "prefetch: the loader's workers pin raw pixels");
}

TEST(DevicePrefetcherTest, RawPixelsThroughThePixelTableAreTheNormalizedBatch) {
  // What the prefetcher does on the GPU, run here: U8 batches looked up in pixel_table() give
  // the normalized batch bit for bit, in every dtype.
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ImageDataset raw_set =
        small_set(70, dtype).with_options({.dtype = dtype, .pixels = Pixels::Raw});
    const DataLoader normalized(small_set(70, dtype), small_options());
    const DataLoader raw(raw_set, small_options());
    const Tensor table = raw_set.pixel_table();
    EXPECT_EQ(table.dtype(), dtype);
    EXPECT_EQ(table.shape(), Shape({256}));
    for (int64_t k = 0; k < raw.num_batches(); ++k) {
      const Batch r = raw.make_batch(2, k);
      const Batch n = normalized.make_batch(2, k);
      EXPECT_EQ(r.x().dtype(), DType::U8);
      const Tensor looked_up =
          index_select(table, 0, r.x().contiguous().reshape({r.x().numel()}).to(DType::I64))
              .view(r.x().shape());
      EXPECT_EQ(bytes_of(looked_up), bytes_of(n.x())) << "batch " << k;
      EXPECT_EQ(bytes_of(r.y()), bytes_of(n.y())) << "batch " << k;
    }
  }
}

TEST(DevicePrefetcherTest, PixelTableIsTheNormalization) {
  const ImageDataset set = small_set().with_options({.mean = 0.25f, .std = 0.5f});
  const std::vector<float> table = set.pixel_table().to_vector<float>();
  ASSERT_EQ(table.size(), 256u);
  for (int v : {0, 1, 128, 255})
    EXPECT_EQ(table[size_t(v)], (float(v) / 255.f - 0.25f) / 0.5f) << v;
}

TEST(DevicePrefetcherTest, CudaWithoutAGpuIsRefusedInOneLine) {
  if (cuda::is_available()) GTEST_SKIP() << "this machine has a GPU";
  try {
    DevicePrefetcher p(small_set(), small_options(), Device::cuda(0));
    FAIL() << "a CUDA prefetcher without a GPU";
  } catch (const Error& e) {
    const std::string m = e.message();
    EXPECT_NE(m.find("no CUDA device"), std::string::npos) << m;
    EXPECT_NE(m.find("--device cpu"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  LoaderOptions pinned = small_options();
  pinned.pin_memory = true;
  EXPECT_THROW(DataLoader(small_set(), pinned), Error);
}

// A dataset of the general interface that is not an image dataset: {a: F32 (3), b: I32 (2, 2)}.
class Pairs final : public Dataset {
 public:
  int64_t size() const override { return 45; }
  FieldNames field_names() const override { return {"a", "b"}; }
  Sample get(int64_t i) const override {
    const auto v = float(i);
    return {
        Tensor::from_vector(std::vector<float>{v, v + 0.5f, -v}, {3}),
        Tensor::from_vector(std::vector<int64_t>{i, 2 * i, 3 * i, 4 * i}, {2, 2}).to(DType::I32)};
  }
};

// Every batch of two epochs through `p`, field by field, against the loader's make_batch.
void expect_general_batches(DevicePrefetcher& p, const DataLoader& reference) {
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    int64_t k = 0;
    for (auto& b : p) {
      const Batch want = reference.make_batch(epoch, k++);
      ASSERT_EQ(b.size(), want.size());
      EXPECT_EQ(b.epoch, epoch);
      for (size_t f = 0; f < b.size(); ++f) {
        EXPECT_EQ(b[f].device(), p.device());
        EXPECT_EQ(b[f].shape(), want[f].shape());
        EXPECT_EQ(bytes_of(b[f]), bytes_of(want[f])) << "field " << f << " batch " << k - 1;
      }
      EXPECT_EQ(bytes_of(b["b"]), bytes_of(want["b"]));
      EXPECT_TRUE(b[0].shares_storage(b[1])) << "one block, one transfer";
    }
    EXPECT_EQ(k, reference.num_batches());
  }
}

TEST(DevicePrefetcherTest, AnyDatasetPassesThroughOnTheCpu) {
  const DataLoader reference(Pairs(), small_options());
  DevicePrefetcher p(Pairs(), small_options(), Device::cpu());
  expect_general_batches(p, reference);
}

// ---- on a GPU ----------------------------------------------------------------------------------

TEST(DevicePrefetcherCudaTest, AnyDatasetCrossesInOneBlock) {
  MT_REQUIRE_CUDA();
  const DataLoader reference(Pairs(), small_options());
  DevicePrefetcher p(Pairs(), small_options(), Device::cuda(0));
  expect_general_batches(p, reference);
}

TEST(DevicePrefetcherCudaTest, DeviceBatchesEqualTheLoaders) {
  MT_REQUIRE_CUDA();
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const DataLoader reference(small_set(70, dtype), small_options());
    DevicePrefetcher p(small_set(70, dtype), small_options(), Device::cuda(0));
    EXPECT_EQ(pixels_of(p.loader()), Pixels::Raw) << "pixels cross as bytes";
    EXPECT_TRUE(p.loader().options().pin_memory);
    expect_loader_batches(p, reference);
  }
}

TEST(DevicePrefetcherCudaTest, PinnedAndPageableBatchesAreFinishedOnTheHostAndEqualTheLoaders) {
  MT_REQUIRE_CUDA();
  for (Transfer t : {Transfer::Pinned, Transfer::Pageable}) {
    SCOPED_TRACE(t == Transfer::Pinned ? "pinned" : "pageable");
    const DataLoader reference(small_set(), small_options());
    DevicePrefetcher p(small_set(), small_options(), Device::cuda(0), t);
    EXPECT_EQ(pixels_of(p.loader()), Pixels::Normalized) << "no pixel table on the device";
    EXPECT_EQ(p.loader().options().pin_memory, t == Transfer::Pinned);
    expect_loader_batches(p, reference);
  }
}

TEST(DevicePrefetcherCudaTest, WithATransformNormalizedBatchesCross) {
  MT_REQUIRE_CUDA();
  LoaderOptions o = small_options();
  // In place: x and y stay views of the loader's block (one pinned copy, one transfer).
  o.transform = [](Batch& b) { b.x().mul_(2.0); };
  const DataLoader reference(small_set(), o);
  DevicePrefetcher p(small_set(), o, Device::cuda(0));
  EXPECT_EQ(pixels_of(p.loader()), Pixels::Normalized);
  expect_loader_batches(p, reference);
  // Replaced tensors are pinned and copied one by one.
  o.transform = [](Batch& b) { b.x() = add(b.x(), 1.0); };
  const DataLoader reference2(small_set(), o);
  DevicePrefetcher p2(small_set(), o, Device::cuda(0));
  expect_loader_batches(p2, reference2);
}

TEST(DevicePrefetcherCudaTest, BatchesOnASideStreamAreOrderedBeforeTheConsumersWork) {
  MT_REQUIRE_CUDA();
  // The consumer on a stream of its own: each batch must be complete when its work runs, and
  // reusing the memory of consumed batches must not corrupt later ones. Pinned: non_blocking
  // copies queued on that stream, their page-locked sources not reused while a copy is queued.
  for (Transfer t : {Transfer::Prefetch, Transfer::Pinned}) {
    SCOPED_TRACE(t == Transfer::Pinned ? "pinned" : "prefetch");
    const cuda::Stream main = cuda::Stream::create(0);
    cuda::StreamGuard guard(main);
    const DataLoader reference(small_set(200), small_options());
    DevicePrefetcher p(small_set(200), small_options(), Device::cuda(0), t);
    std::vector<Tensor> sums;
    std::vector<double> want;
    for (int epoch = 0; epoch < 3; ++epoch) {
      for (auto& b : p) {
        sums.push_back(sum(b.x().to(DType::F64)));
        want.push_back(sum(reference.make_batch(b.epoch, b.index).x().to(DType::F64)).item());
      }
    }
    main.synchronize();
    ASSERT_EQ(sums.size(), want.size());
    for (size_t i = 0; i < sums.size(); ++i)
      EXPECT_EQ(sums[i].item(), want[i]) << "batch " << i;
  }
}

TEST(DevicePrefetcherCudaTest, ATransformErrorReachesTheNextThatWouldReturnItsBatch) {
  MT_REQUIRE_CUDA();
  LoaderOptions o = small_options();
  o.transform = [](Batch& b) { MT_CHECK(b.index != 2, "bad batch 2"); };
  DevicePrefetcher p(small_set(), o, Device::cuda(0));
  EXPECT_TRUE(p.next().has_value());
  EXPECT_TRUE(p.next().has_value());
  EXPECT_THROW(p.next(), Error);
}

}  // namespace
}  // namespace mantissa::data
