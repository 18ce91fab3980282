#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/vector_isa.h"
#include "harness/op_harness.h"

namespace mantissa {
namespace {

using testing::check_op;
using testing::OpCase;
using testing::random_f64;

// Reduces (A, B, C) over the given axes with f applied to each group's values.
Tensor reduce_ref(const Tensor& x, std::vector<bool> reduce_axis,
                  double (*f)(const std::vector<double>&), bool keepdim) {
  const std::vector<double> v = x.contiguous().to_vector<double>();
  const Shape s = x.shape();
  Shape out_shape, keep_shape;
  for (int d = 0; d < s.size(); ++d) {
    keep_shape.push_back(reduce_axis[size_t(d)] ? 1 : s[d]);
    if (!reduce_axis[size_t(d)]) out_shape.push_back(s[d]);
  }
  std::vector<std::vector<double>> groups(size_t(keep_shape.numel()));
  const Shape ks = contiguous_strides(keep_shape);
  for (int64_t i = 0; i < s.numel(); ++i) {
    int64_t rem = i, key = 0;
    for (int d = s.size() - 1; d >= 0; --d) {
      const int64_t idx = rem % s[d];
      rem /= s[d];
      if (!reduce_axis[size_t(d)]) key += idx * ks[d];
    }
    groups[size_t(key)].push_back(v[size_t(i)]);
  }
  std::vector<double> r;
  for (auto& g : groups)
    r.push_back(f(g));
  return Tensor::from_vector(r, keepdim ? keep_shape : out_shape, DType::F64);
}

double sum_of(const std::vector<double>& g) {
  double s = 0;
  for (double v : g)
    s += v;
  return s;
}
double mean_of(const std::vector<double>& g) {
  return sum_of(g) / double(g.size());
}
double var_of(const std::vector<double>& g) {
  const double m = mean_of(g);
  double s = 0;
  for (double v : g)
    s += (v - m) * (v - m);
  return s / double(g.size() - 1);
}
double max_of(const std::vector<double>& g) {
  return *std::max_element(g.begin(), g.end());
}

TEST(Reduce, SumMeanVarMaxOverDims) {
  const Tensor x = random_f64({4, 5, 6}, 31, -1, 1);
  struct R {
    const char* name;
    std::vector<int64_t> dims;
    std::vector<bool> axes;
    bool keepdim;
  };
  for (const R& r :
       {R{"dim1", {1}, {false, true, false}, false},
        R{"dims0,2 keepdim", {0, 2}, {true, false, true}, true},
        R{"last", {-1}, {false, false, true}, false}, R{"all", {}, {true, true, true}, false}}) {
    SCOPED_TRACE(r.name);
    OpCase s;
    s.name = std::string("sum ") + r.name;
    s.inputs = {x};
    s.fn = [r](const std::vector<Tensor>& in) { return sum(in[0], r.dims, r.keepdim); };
    s.reference = [r](const std::vector<Tensor>& in) {
      return reduce_ref(in[0], r.axes, sum_of, r.keepdim);
    };
    check_op(s);
    OpCase m = s;
    m.name = std::string("mean ") + r.name;
    m.fn = [r](const std::vector<Tensor>& in) { return mean(in[0], r.dims, r.keepdim); };
    m.reference = [r](const std::vector<Tensor>& in) {
      return reduce_ref(in[0], r.axes, mean_of, r.keepdim);
    };
    check_op(m);
    OpCase v = s;
    v.name = std::string("var ") + r.name;
    v.fn = [r](const std::vector<Tensor>& in) { return var(in[0], r.dims, 1, r.keepdim); };
    v.reference = [r](const std::vector<Tensor>& in) {
      return reduce_ref(in[0], r.axes, var_of, r.keepdim);
    };
    v.k_forward = 8;
    check_op(v);
  }
  OpCase mx;
  mx.name = "max dim 1";
  mx.inputs = {x};
  mx.fn = [](const std::vector<Tensor>& in) { return max(in[0], 1).values; };
  mx.reference = [](const std::vector<Tensor>& in) {
    return reduce_ref(in[0], {false, true, false}, max_of, false);
  };
  check_op(mx);
}

TEST(Reduce, ArgmaxAndIndices) {
  const Tensor x = Tensor::from_vector(std::vector<double>{1, 9, 3, 7, 2, 8}, {2, 3});
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(argmax(x, 1, true).shape(), (Shape{2, 1}));
  const auto m = max(x, 0);
  EXPECT_EQ(m.values.to_vector<double>(), (std::vector<double>{7, 9, 8}));
  EXPECT_EQ(m.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  // Ties: the first one wins (as PyTorch).
  const Tensor t = Tensor::from_vector(std::vector<double>{5, 5, 1}, {3});
  EXPECT_EQ(argmax(t, 0).item<int64_t>(), 0);
  EXPECT_EQ(max(t).item(), 5.0);
}

TEST(Reduce, HalfSumsAccumulateInFp32) {
  // 4096 ones: a bf16 accumulator would stop at 256; fp32 accumulation gives 4096 exactly.
  const Tensor ones = Tensor::ones({4096}, DType::BF16);
  EXPECT_EQ(sum(ones).item(), 4096.0);
  EXPECT_EQ(sum(ones).dtype(), DType::BF16);
  const Tensor h = Tensor::full({3000}, 0.1, DType::F16);
  EXPECT_NEAR(sum(h).item(), 3000 * double(float(half(0.1f))), 1.0);
}

// Sums over the leading dim (bias gradients) split their columns over the threads: every column
// is still summed in row order, so any thread count gives the same bits, and they match float64.
TEST(Reduce, LeadingSumsAreTheSameForAnyThreadCount) {
  const int saved = get_num_threads();
  for (const int64_t cols :
       {int64_t(64), int64_t(200), int64_t(256), int64_t(513), int64_t(1500)}) {
    for (const DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::to_string(cols) + " columns, " + std::string(dtype_name(dtype)));
      const Tensor x = Tensor::normal({1000, cols}, 0, 1, 5).to(dtype);
      set_num_threads(1);
      const auto one = sum(x, {0}).to_vector<float>();
      const auto one_mean = mean(x, {0}).to_vector<float>();
      for (const int threads : {2, 3}) {
        set_num_threads(threads);
        EXPECT_EQ(sum(x, {0}).to_vector<float>(), one) << threads << " threads";
        EXPECT_EQ(mean(x, {0}).to_vector<float>(), one_mean) << threads << " threads";
      }
      // Every vector build (the rows read and widened inside the loop) gives the plain loop's
      // bits: each column's rows added in order in fp32.
      for (const backend::cpu::VectorIsa isa :
           {backend::cpu::VectorIsa::Baseline, backend::cpu::VectorIsa::Avx2,
            backend::cpu::VectorIsa::Avx512}) {
        if (!backend::cpu::vector_isa_supported(isa)) continue;
        backend::cpu::force_vector_isa(isa);
        EXPECT_EQ(sum(x, {0}).to_vector<float>(), one) << backend::cpu::vector_isa_name(isa);
      }
      backend::cpu::force_vector_isa(std::nullopt);
      const auto v = x.to_vector<double>();
      for (int64_t j = 0; j < cols; ++j) {
        float in_order = 0;
        for (int64_t r = 0; r < 1000; ++r)
          in_order += float(v[size_t(r * cols + j)]);
        const float expected = dtype == DType::F32 ? in_order : float(bfloat16(in_order));
        ASSERT_EQ(one[size_t(j)], expected) << "column " << j;
        double ref = 0;
        for (int64_t r = 0; r < 1000; ++r)
          ref += v[size_t(r * cols + j)];
        // 1000 fp32 additions of terms below ~4: a bound of 1000 * 4 * 2^-24 each, then the
        // result rounded to the dtype.
        const double tol = 1000 * 4 * std::ldexp(1.0, -24) +
                           std::abs(ref) * (dtype == DType::BF16 ? std::ldexp(1.0, -8) : 0.0);
        ASSERT_NEAR(one[size_t(j)], ref, tol) << "column " << j;
      }
    }
  }
  set_num_threads(saved);
}

TEST(Reduce, LargeSumIsDeterministicAcrossThreadCounts) {
  const Tensor x = Tensor::normal({1 << 20}, 0, 1, 77);
  const int saved = get_num_threads();
  set_num_threads(1);
  const double one = sum(x).item();
  set_num_threads(2);
  const double two = sum(x).item();
  set_num_threads(saved);
  EXPECT_EQ(one, two);
  double ref = 0;
  for (float v : x.to_vector<float>())
    ref += v;
  EXPECT_NEAR(one, ref, 1e-3);
}

TEST(Reduce, SumToShapeInvertsBroadcasting) {
  const Tensor g = Tensor::ones({4, 3, 5});
  EXPECT_EQ(sum_to_shape(g, {3, 1}).to_vector<float>(), (std::vector<float>{20, 20, 20}));
  EXPECT_EQ(sum_to_shape(g, {5}).shape(), (Shape{5}));
  EXPECT_EQ(sum_to_shape(g, {}).item(), 60.0);
}

}  // namespace
}  // namespace mantissa
