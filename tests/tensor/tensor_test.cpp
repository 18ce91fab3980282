#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

TEST(Tensor, FactoriesAndMetadata) {
  const Tensor z = Tensor::zeros({2, 3}, DType::BF16);
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Shape{3, 1}));
  EXPECT_EQ(z.dtype(), DType::BF16);
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.nbytes(), 12u);
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(Tensor::full({2}, 2.5).to_vector<float>(), (std::vector<float>{2.5f, 2.5f}));
  EXPECT_EQ(Tensor::arange(4).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(Tensor::scalar(3.0).dim(), 0);
  EXPECT_EQ(Tensor::scalar(3.0).item(), 3.0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data_ptr()) % 64, 0u) << "64-byte aligned";
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, ViewsShareStorage) {
  Tensor x = Tensor::from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3});
  const Tensor t = x.t();
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.shares_storage(x));
  EXPECT_EQ(t.contiguous().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(x.reshape({3, 2}).to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(x.view({-1}).shares_storage(x));
  EXPECT_EQ(x.narrow(1, 1, 2).to_vector<float>(), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(x.slice(1, 0, 3, 2).to_vector<float>(), (std::vector<float>{0, 2, 3, 5}));
  EXPECT_EQ(x.select(0, 1).to_vector<float>(), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(x.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(x.unsqueeze(-1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(x.unsqueeze(0).squeeze().shape(), (Shape{2, 3}));
  EXPECT_EQ(x.permute({1, 0}).shape(), (Shape{3, 2}));
  EXPECT_EQ(x.flatten().shape(), (Shape{6}));
  const Tensor e = Tensor::from_vector(std::vector<double>{1, 2}, {2, 1}).expand({2, 4});
  EXPECT_EQ(e.strides()[1], 0);
  EXPECT_EQ(e.contiguous().to_vector<float>(), (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2}));
  // A transposed tensor cannot be viewed flat; reshape copies.
  EXPECT_THROW(t.view({6}), Error);
  EXPECT_EQ(t.reshape({6}).to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  // Writing through a view writes the base.
  Tensor row = x.select(0, 0);
  row.fill_(7);
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{7, 7, 7, 3, 4, 5}));
}

// copy_ into a strided view: from a contiguous source straight into place, and from one that
// shares bytes with the view as though the source were read whole first.
TEST(Tensor, CopyIntoAStridedViewEvenWhenItOverlapsTheSource) {
  for (const DType dtype : {DType::F32, DType::BF16, DType::F64, DType::I64}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    Tensor t = Tensor::arange(16, dtype).reshape({4, 4});
    Tensor column = t.select(1, 0);  // elements 0, 4, 8, 12
    ASSERT_FALSE(column.is_contiguous());
    // Elements 1..4: element 4 is written (from element 2) before it is read, unless the source
    // is read whole first.
    column.copy_(t.flatten().narrow(0, 1, 4));
    EXPECT_EQ(t.to_vector<double>(),
              (std::vector<double>{1, 1, 2, 3, 2, 5, 6, 7, 3, 9, 10, 11, 4, 13, 14, 15}));
    // Disjoint: a (2, 2, 3) source into a permuted view of another tensor.
    Tensor big = Tensor::zeros({3, 2, 2}, dtype);
    const Tensor src = Tensor::arange(12, dtype).reshape({2, 2, 3});
    Tensor view = big.permute({1, 2, 0});  // (2, 2, 3), strides (2, 1, 4)
    view.copy_(src);
    EXPECT_EQ(view.to_vector<double>(), src.to_vector<double>());
    EXPECT_EQ(big.to_vector<double>(), (std::vector<double>{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11}));
  }
}

// A large copy into a strided view (attention's q/k/v gradients stacked into the projection's)
// spreads its rows over the threads; a broadcast destination, whose elements share addresses,
// keeps one thread. Every thread count writes the same elements.
TEST(Tensor, LargeStridedCopiesAreTheSameForAnyThreadCount) {
  const int saved = get_num_threads();
  for (const DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor src = Tensor::uniform({16, 4, 50, 16}, -1, 1, 3, dtype);  // (B, H, T, D)
    std::vector<double> first;
    for (const int threads : {1, 2, 3}) {
      set_num_threads(threads);
      Tensor qkv = Tensor::zeros({16, 50, 3, 4, 16}, dtype);  // (B, T, 3, H, D)
      Tensor k_slot = qkv.select(2, 1).permute({0, 2, 1, 3});
      ASSERT_FALSE(k_slot.is_contiguous());
      k_slot.copy_(src);
      EXPECT_EQ(k_slot.to_vector<double>(), src.to_vector<double>()) << threads << " threads";
      // The other two slots are untouched.
      EXPECT_EQ(sum(abs(qkv.select(2, 0))).item(), 0.0);
      EXPECT_EQ(sum(abs(qkv.select(2, 2))).item(), 0.0);
      if (threads == 1) first = qkv.to_vector<double>();
      EXPECT_EQ(qkv.to_vector<double>(), first) << threads << " threads";
      // Into a broadcast row: written in row order, so the source's last row is what stays.
      std::vector<double> values(2048 * 64);
      for (size_t i = 0; i < values.size(); ++i)
        values[i] = double(i % 251);  // exact in bf16
      Tensor row = Tensor::zeros({64}, dtype);
      row.expand({2048, 64}).copy_(Tensor::from_vector(values, {2048, 64}, dtype));
      EXPECT_EQ(row.to_vector<double>(), std::vector<double>(values.end() - 64, values.end()))
          << threads << " threads";
    }
  }
  set_num_threads(saved);
}

// A transposed view made contiguous (fp8's block recipes quantize transposed gradients) takes
// the tiled transpose: every element size, ragged against its 32 x 32 tiles, batched, any thread
// count, and an empty one; the values are those of the element-by-element path (a permuted view
// that is not a plain transpose).
TEST(Tensor, ContiguousCopiesOfTransposesAreTheTranspose) {
  const int saved = get_num_threads();
  for (const DType dtype : {DType::U8, DType::BF16, DType::F32, DType::F64}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    for (const Shape& shape : {Shape{70, 45}, Shape{3, 33, 130}, Shape{1, 200}, Shape{0, 5}}) {
      const int64_t n = shape.numel();
      std::vector<double> vals(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        vals[size_t(i)] = dtype == DType::U8 ? double(i % 251) : double(i) - 97.5;
      const Tensor base = Tensor::from_vector(vals, shape).to(dtype);
      const Tensor view = base.transpose(-1, -2);
      // The reference: element (.., r, c) of the view is base's (.., c, r).
      std::vector<double> want;
      const std::vector<double> b = base.to_vector<double>();
      const int64_t R = shape[shape.size() - 1], C = shape[shape.size() - 2];
      for (int64_t batch = 0; batch < (R * C == 0 ? 0 : n / (R * C)); ++batch)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t c = 0; c < C; ++c)
            want.push_back(b[size_t(batch * R * C + c * R + r)]);
      for (const int threads : {1, 2, 3}) {
        set_num_threads(threads);
        const Tensor got = view.contiguous();
        EXPECT_TRUE(got.is_contiguous());
        EXPECT_EQ(got.to_vector<double>(), want) << shape.str() << ", " << threads << " threads";
      }
    }
  }
  set_num_threads(saved);
}

TEST(Tensor, CastsRoundToNearestEven) {
  const Tensor x = Tensor::from_vector(
      std::vector<double>{1.0 + std::ldexp(1.0, -8), 1.0 + 3 * std::ldexp(1.0, -8), 70000}, {3});
  EXPECT_EQ(x.to(DType::BF16).to_vector<float>(),
            (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -6), 70144.0f}));
  EXPECT_TRUE(std::isinf(x.to(DType::F16).to_vector<float>()[2]));
  // f64 -> half rounds once (no double rounding through f32).
  const Tensor d = Tensor::from_vector(
      std::vector<double>{1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)}, {1}, DType::F64);
  EXPECT_EQ(d.to(DType::F16).to_vector<float>()[0], 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(Tensor::full({1}, 2.7).to(DType::I64).item<int64_t>(), 2);
  EXPECT_EQ(Tensor::full({1}, 3).to(DType::FP8_E4M3).to_vector<float>()[0], 3.0f);
}

TEST(Tensor, SeededRandomIsReproducibleAndDistributed) {
  const Tensor a = Tensor::normal({200000}, 1.0, 2.0, 42);
  EXPECT_EQ(a.to_vector<float>(), Tensor::normal({200000}, 1.0, 2.0, 42).to_vector<float>());
  EXPECT_NE(a.to_vector<float>(), Tensor::normal({200000}, 1.0, 2.0, 43).to_vector<float>());
  EXPECT_NEAR(mean(a).item(), 1.0, 5 * 2.0 / std::sqrt(2e5));
  EXPECT_NEAR(std::sqrt(var(a, {0}).item()), 2.0, 0.02);
  const Tensor u = Tensor::uniform({200000}, -3, 5, 7, DType::BF16);
  const auto v = u.to_vector<float>();
  EXPECT_GE(*std::min_element(v.begin(), v.end()), -3.0f);
  EXPECT_LE(*std::max_element(v.begin(), v.end()), 5.0f);
  EXPECT_NEAR(mean(u.to(DType::F32)).item(), 1.0, 0.05);
  // The values do not depend on the thread count.
  const int saved = get_num_threads();
  set_num_threads(1);
  const auto one = Tensor::normal({100000}, 0, 1, 9).to_vector<float>();
  set_num_threads(2);
  EXPECT_EQ(one, Tensor::normal({100000}, 0, 1, 9).to_vector<float>());
  set_num_threads(saved);
}

TEST(Tensor, HostCopiesAndPrinting) {
  Tensor t = Tensor::empty({2, 2});
  const float src[4] = {1, 2, 3, 4};
  t.copy_from_host(src, sizeof src);
  float dst[4] = {};
  t.t().copy_to_host(dst, sizeof dst);
  EXPECT_EQ(dst[1], 3.0f);
  EXPECT_THROW(t.copy_from_host(src, 8), Error);
  std::ostringstream os;
  os << t;
  EXPECT_EQ(os.str(), "tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], dtype=f32)");
  EXPECT_EQ(Tensor::arange(3).str(), "tensor([0, 1, 2], dtype=i64)");
  EXPECT_NE(Tensor::zeros({100}).str().find("..."), std::string::npos) << "long dims summarized";
}

TEST(Tensor, InPlaceOpsBumpTheVersion) {
  Tensor t = Tensor::zeros({3});
  const uint32_t v0 = t.version();
  t.add_(Tensor::ones({3}), 2.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2, 2, 2}));
  t.mul_(0.5);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 1, 1}));
  t.copy_(Tensor::full({1}, 4.0, DType::BF16));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{4, 4, 4}));
  EXPECT_EQ(t.version(), v0 + 3);
}

}  // namespace
}  // namespace mantissa
