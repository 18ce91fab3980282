// The CUDA elementwise family against the CPU backend, the reference: the same inputs on both
// devices, outputs compared element by element (bit for bit where the arithmetic is exact or
// counter-based, within a few units of the dtype's epsilon where libm and CUDA's math differ).
// Every floating output is filled with NaN first, so an element the kernel never wrote fails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_test_util.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

using backend::BinaryOp;
using backend::Scalars;
using backend::UnaryOp;

backend::Backend& cpu() {
  return backend::cpu_backend();
}
backend::Backend& gpu() {
  return backend::backend_for(Device::cuda());
}

Tensor on_gpu(const Tensor& t) {
  return t.to(Device::cuda());
}

// An output for each device, pre-filled so that unwritten elements show: NaN for floats, the
// given sentinel otherwise.
Tensor prefilled(const Shape& shape, DType dtype, Device device, double sentinel = 0) {
  const double v = is_floating(dtype) ? std::numeric_limits<double>::quiet_NaN() : sentinel;
  return Tensor::full(shape, v, dtype, device);
}

// Raw storage bytes, row-major.
std::vector<uint8_t> raw(const Tensor& t) {
  const Tensor c = t.contiguous().to(Device::cpu());
  std::vector<uint8_t> out(c.nbytes());
  if (!out.empty()) std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

void expect_same_bits(const Tensor& want, const Tensor& got, const std::string& what) {
  ASSERT_EQ(want.dtype(), got.dtype()) << what;
  ASSERT_EQ(want.shape(), got.shape()) << what;
  const std::vector<uint8_t> a = raw(want), b = raw(got);
  const size_t es = want.element_size();
  for (size_t i = 0; i < a.size(); i += es) {
    if (std::memcmp(&a[i], &b[i], es) != 0) {
      const std::vector<double> wv = want.to(Device::cpu()).to_vector<double>();
      const std::vector<double> gv = got.to(Device::cpu()).to_vector<double>();
      FAIL() << what << ": element " << i / es << " cpu " << wv[i / es] << " cuda " << gv[i / es];
    }
  }
}

// Within `ulps` units of the dtype's epsilon, relative to max(|value|, floor). NaN must match NaN,
// infinities their sign. Derivatives pass floor 1: where one vanishes (silu, gelu) it is a
// difference of O(1) terms, each a few ulps apart between libm and CUDA's math.
void expect_close(const Tensor& want, const Tensor& got, const std::string& what, double ulps = 8,
                  double floor = 1e-3) {
  ASSERT_EQ(want.dtype(), got.dtype()) << what;
  ASSERT_EQ(want.shape(), got.shape()) << what;
  const double eps =
      want.dtype() == DType::F64 ? 0x1p-52 : format_info(*dtype_format(want.dtype())).epsilon;
  const std::vector<double> a = want.to(Device::cpu()).to_vector<double>();
  const std::vector<double> b = got.to(Device::cpu()).to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i]) || std::isinf(a[i]) || std::isinf(b[i])) {
      const bool same = (std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i];
      ASSERT_TRUE(same) << what << ": element " << i << " cpu " << a[i] << " cuda " << b[i];
      continue;
    }
    const double tol = ulps * eps * std::max(std::abs(a[i]), floor);
    ASSERT_NEAR(a[i], b[i], tol) << what << ": element " << i;
  }
}

const DType kFloats[] = {DType::F32, DType::F16, DType::BF16};

std::string name_of(DType d) {
  return std::string(dtype_name(d));
}

struct UnaryCase {
  UnaryOp op;
  const char* name;
  Scalars s;
  bool positive;  // domain: inputs > 0
};
const UnaryCase kUnary[] = {
    {UnaryOp::Neg, "neg", {}, false},
    {UnaryOp::Exp, "exp", {}, false},
    {UnaryOp::Log, "log", {}, true},
    {UnaryOp::Sqrt, "sqrt", {}, true},
    {UnaryOp::Rsqrt, "rsqrt", {}, true},
    {UnaryOp::Abs, "abs", {}, false},
    {UnaryOp::Sign, "sign", {}, false},
    {UnaryOp::Reciprocal, "reciprocal", {}, true},
    {UnaryOp::Square, "square", {}, false},
    {UnaryOp::Relu, "relu", {}, false},
    {UnaryOp::LeakyRelu, "leaky_relu", {0.2, 0}, false},
    {UnaryOp::Gelu, "gelu", {}, false},
    {UnaryOp::GeluTanh, "gelu_tanh", {}, false},
    {UnaryOp::Silu, "silu", {}, false},
    {UnaryOp::Sigmoid, "sigmoid", {}, false},
    {UnaryOp::Tanh, "tanh", {}, false},
    {UnaryOp::PowScalar, "pow2", {2.0, 0}, false},
    {UnaryOp::PowScalar, "pow1.5", {1.5, 0}, true},
    {UnaryOp::ClampScalar, "clamp", {-0.5, 0.7}, false},
    {UnaryOp::AddScalar, "add_scalar", {0.3, 0}, false},
    {UnaryOp::MulScalar, "mul_scalar", {-1.7, 0}, false},
    {UnaryOp::RsubScalar, "rsub_scalar", {2.5, 0}, false},
};

// Inputs in float dtype d: normal values (or |normal| + 0.1), as a (33, 61) matrix and its
// transposed (61, 33) view.
Tensor input(DType d, bool positive, uint64_t seed) {
  Tensor x = Tensor::normal({33, 61}, 0.0, 1.5, seed, DType::F64);
  if (positive) x = add(abs(x), 0.1);
  return x.to(d);
}

TEST(CudaElementwise, UnaryMatchesCpu) {
  MT_REQUIRE_CUDA();
  for (const DType d : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (const UnaryCase& c : kUnary) {
      const Tensor x = input(d, c.positive, 1);
      for (const Tensor& in : {x, x.t()}) {
        const std::string what =
            std::string(c.name) + " " + name_of(d) + (in.is_contiguous() ? "" : " strided");
        Tensor want = prefilled(in.shape(), d, Device::cpu());
        cpu().unary(c.op, in, want, c.s);
        Tensor got = prefilled(in.shape(), d, Device::cuda());
        gpu().unary(c.op, on_gpu(in), got, c.s);
        // gelu, gelu_tanh and silu are x times a factor that cancels for negative x (1 + erf,
        // a sigmoid near 0): their error is that of the O(1) terms, so the floor is 1.
        const bool cancels =
            c.op == UnaryOp::Gelu || c.op == UnaryOp::GeluTanh || c.op == UnaryOp::Silu;
        expect_close(want, got, what, 8, cancels ? 1.0 : 1e-3);
      }
    }
  }
}

TEST(CudaElementwise, IntegerUnaryIsExact) {
  MT_REQUIRE_CUDA();
  const Tensor base = Tensor::uniform({5, 37}, -50, 50, 2, DType::F64);
  for (const DType d : {DType::I64, DType::I32, DType::U8}) {
    const Tensor x = (d == DType::U8 ? add(base, 50.0) : base).to(d);
    for (const UnaryCase& c : kUnary) {
      if (c.op == UnaryOp::Exp || c.op == UnaryOp::Log || c.op == UnaryOp::Sqrt ||
          c.op == UnaryOp::Rsqrt || c.op == UnaryOp::Reciprocal || c.op == UnaryOp::Gelu ||
          c.op == UnaryOp::GeluTanh || c.op == UnaryOp::Silu || c.op == UnaryOp::Sigmoid ||
          c.op == UnaryOp::Tanh || c.op == UnaryOp::PowScalar) {
        continue;
      }
      const Scalars s{std::round(c.s.a * 10), std::round(c.s.b * 10)};
      Tensor want = prefilled(x.shape(), d, Device::cpu(), 77);
      cpu().unary(c.op, x, want, s);
      Tensor got = prefilled(x.shape(), d, Device::cuda(), 77);
      gpu().unary(c.op, on_gpu(x), got, s);
      expect_same_bits(want, got, std::string(c.name) + " " + name_of(d));
    }
  }
  Tensor out = Tensor::empty({5, 37}, DType::I32, Device::cuda());
  EXPECT_THROW(gpu().unary(UnaryOp::Exp, on_gpu(base.to(DType::I32)), out, {}), Error);
}

TEST(CudaElementwise, UnaryBackwardMatchesCpu) {
  MT_REQUIRE_CUDA();
  for (const DType d : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (const UnaryCase& c : kUnary) {
      const Tensor x = input(d, c.positive, 3);
      const Tensor g = Tensor::normal({33, 61}, 0.0, 1.0, 4, DType::F64).to(d);
      Tensor y = Tensor::empty(x.shape(), d);
      cpu().unary(c.op, x, y, c.s);
      const std::string what = std::string(c.name) + " backward " + name_of(d);
      Tensor want = prefilled(x.shape(), d, Device::cpu());
      cpu().unary_backward(c.op, g, x, y, want, c.s);
      Tensor got = prefilled(x.shape(), d, Device::cuda());
      gpu().unary_backward(c.op, on_gpu(g), on_gpu(x), on_gpu(y), got, c.s);
      expect_close(want, got, what, 8, 1.0);
      // Strided gradient input.
      const Tensor gt = g.t().contiguous().t();
      Tensor got2 = prefilled(x.shape(), d, Device::cuda());
      gpu().unary_backward(c.op, on_gpu(gt), on_gpu(x), on_gpu(y), got2, c.s);
      expect_close(want, got2, what + " strided", 8, 1.0);
    }
  }
}

struct BinaryCase {
  BinaryOp op;
  const char* name;
};
const BinaryCase kBinary[] = {
    {BinaryOp::Add, "add"},     {BinaryOp::Sub, "sub"}, {BinaryOp::Mul, "mul"},
    {BinaryOp::Div, "div"},     {BinaryOp::Pow, "pow"}, {BinaryOp::Maximum, "max"},
    {BinaryOp::Minimum, "min"}, {BinaryOp::Eq, "eq"},   {BinaryOp::Ne, "ne"},
    {BinaryOp::Lt, "lt"},       {BinaryOp::Le, "le"},   {BinaryOp::Gt, "gt"},
    {BinaryOp::Ge, "ge"},
};

// 4x, truncated to integers (as f64).
Tensor coarse(const Tensor& x) {
  return mul(x, 4.0).to(DType::I64).to(DType::F64);
}

Tensor positive(const Tensor& x) {
  return gt(x, Tensor::zeros({1}, x.dtype()));
}

// out = op(a, b) on both devices; comparisons run twice, with the Bool output pre-filled true and
// then false, so an unwritten element fails one of the runs.
void check_binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& shape,
                  const std::string& what) {
  const bool comparison = op >= BinaryOp::Eq;
  const DType od = comparison ? DType::Bool : a.dtype();
  for (const double sentinel : {1.0, 0.0}) {
    Tensor want = prefilled(shape, od, Device::cpu(), sentinel);
    cpu().binary(op, a, b, want);
    Tensor got = prefilled(shape, od, Device::cuda(), sentinel);
    gpu().binary(op, on_gpu(a), on_gpu(b), got);
    if (comparison || !is_floating(od)) {
      expect_same_bits(want, got, what);
    } else {
      expect_close(want, got, what);
    }
    if (!comparison) break;
  }
}

TEST(CudaElementwise, BinaryMatchesCpu) {
  MT_REQUIRE_CUDA();
  for (const DType d : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (const BinaryCase& c : kBinary) {
      const bool pow = c.op == BinaryOp::Pow;
      // Rounded to a coarse grid so that comparisons see equal values too.
      Tensor a = div(coarse(Tensor::normal({6, 1, 35}, 0.0, 2.0, 5, DType::F64)), 4.0);
      Tensor b = div(coarse(Tensor::normal({4, 1}, 0.0, 2.0, 6, DType::F64)), 4.0);
      if (pow) a = add(abs(a), 0.5);
      a = a.to(d);
      b = b.to(d);
      const std::string what = std::string(c.name) + " " + name_of(d);
      check_binary(c.op, a, b, {6, 4, 35}, what + " broadcast");
      const Tensor full_b = Tensor::normal({35, 6}, 0.0, 2.0, 7, DType::F64).to(d).t();  // strided
      const Tensor a2 = (pow ? add(abs(full_b), 0.5) : full_b).contiguous();
      check_binary(c.op, a2, full_b, {6, 35}, what + " strided");
    }
  }
  // Integers compute in their own type; bool compares.
  const Tensor ia = Tensor::uniform({7, 33}, -40, 40, 8, DType::F64).to(DType::I32);
  const Tensor ib = add(abs(Tensor::uniform({33}, -9, 9, 9, DType::F64)), 1.0).to(DType::I32);
  for (const BinaryCase& c : kBinary) {
    if (c.op == BinaryOp::Pow) continue;
    check_binary(c.op, ia, ib, {7, 33}, std::string(c.name) + " i32");
  }
  const Tensor ba = positive(Tensor::normal({40}, 0, 1, 10));
  const Tensor bb = positive(Tensor::normal({40}, 0, 1, 11));
  check_binary(BinaryOp::Lt, ba, bb, {40}, "lt bool");
}

TEST(CudaElementwise, AddScaledIsExact) {
  MT_REQUIRE_CUDA();
  for (const DType d : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    const Tensor a = Tensor::normal({129, 17}, 0, 1, 12, d);
    const Tensor b = Tensor::normal({17}, 0, 1, 13, d);
    Tensor want = prefilled(a.shape(), d, Device::cpu());
    cpu().add_scaled(a, b, -0.37, want);
    Tensor got = prefilled(a.shape(), d, Device::cuda());
    gpu().add_scaled(on_gpu(a), on_gpu(b), -0.37, got);
    expect_same_bits(want, got, "add_scaled " + name_of(d));
    // In place (out is a), contiguous: the vectorized path.
    const Tensor c = Tensor::normal({129, 17}, 0, 1, 14, d);
    Tensor in_place = on_gpu(a);
    gpu().add_scaled(in_place, on_gpu(c), 2.5, in_place);
    Tensor want2 = Tensor::empty(a.shape(), d);
    cpu().add_scaled(a, c, 2.5, want2);
    expect_same_bits(want2, in_place, "add_scaled in place " + name_of(d));
  }
}

TEST(CudaElementwise, WhereMatchesCpu) {
  MT_REQUIRE_CUDA();
  const Tensor cond = positive(Tensor::normal({5, 1, 9}, 0, 1, 15));
  for (const DType d : {DType::F32, DType::F16, DType::BF16, DType::I64, DType::U8}) {
    const Tensor a = Tensor::uniform({3, 9}, 0, 100, 16, DType::F64).to(d);
    const Tensor b = Tensor::uniform({5, 3, 1}, 0, 100, 17, DType::F64).to(d);
    Tensor want = prefilled({5, 3, 9}, d, Device::cpu(), 255);
    cpu().where(cond, a, b, want);
    Tensor got = prefilled({5, 3, 9}, d, Device::cuda(), 255);
    gpu().where(on_gpu(cond), on_gpu(a), on_gpu(b), got);
    expect_same_bits(want, got, "where " + name_of(d));
  }
}

TEST(CudaElementwise, CopyBetweenEveryDtypePair) {
  MT_REQUIRE_CUDA();
  const DType all[] = {DType::F64,      DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3,
                       DType::FP8_E5M2, DType::I64, DType::I32, DType::U8,   DType::Bool};
  // Values every dtype can hold without overflow: [0, 200) with fractions, some zeros.
  Tensor v = Tensor::uniform({23, 19}, 0, 200, 18, DType::F64);
  v = where(lt(v, Tensor::full({1}, 20.0, DType::F64)), Tensor::zeros({1}, DType::F64), v);
  for (const DType from : all) {
    const Tensor src = v.to(from);
    for (const DType to : all) {
      const std::string what = "copy " + name_of(from) + " -> " + name_of(to);
      for (const bool strided : {false, true}) {
        const Tensor s = strided ? src.t() : src;
        Tensor want = prefilled(s.shape(), to, Device::cpu(), 1);
        cpu().copy(s, want);
        // Strided destination: a transposed view of a NaN-filled buffer.
        Tensor got = strided ? prefilled({s.size(1), s.size(0)}, to, Device::cuda(), 1).t()
                             : prefilled(s.shape(), to, Device::cuda(), 1);
        gpu().copy(on_gpu(s), got);
        expect_same_bits(want, got, what + (strided ? " strided" : ""));
      }
    }
  }
  // f64 into the narrow formats rounds once, from double: 1 + 2^-11 + 2^-40 rounds up in f16,
  // where rounding through float first would tie to even (down).
  const Tensor tricky =
      Tensor::full({3}, 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40), DType::F64);
  Tensor h = Tensor::empty({3}, DType::F16, Device::cuda());
  gpu().copy(on_gpu(tricky), h);
  EXPECT_EQ(h.to_vector<double>()[0], 1.0 + std::ldexp(1.0, -10));
}

TEST(CudaElementwise, FillEveryDtype) {
  MT_REQUIRE_CUDA();
  for (const DType d : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::FP8_E4M3,
                        DType::FP8_E5M2, DType::I64, DType::I32, DType::U8, DType::Bool}) {
    for (const double value : {0.0, 1.3, 3.0}) {
      Tensor want = prefilled({7, 5}, d, Device::cpu(), 9);
      cpu().fill(want, value);
      Tensor got = prefilled({7, 5}, d, Device::cuda(), 9);
      gpu().fill(got, value);
      expect_same_bits(want, got, "fill " + name_of(d));
      // A strided view: only its elements change.
      Tensor base_cpu = prefilled({7, 6}, d, Device::cpu(), 9);
      Tensor base_gpu = prefilled({7, 6}, d, Device::cuda(), 9);
      Tensor vc = base_cpu.slice(1, 0, 6, 2), vg = base_gpu.slice(1, 0, 6, 2);
      cpu().fill(vc, value);
      gpu().fill(vg, value);
      expect_same_bits(base_cpu, base_gpu, "strided fill " + name_of(d));
    }
  }
}

TEST(CudaElementwise, RandomFillsAreBitIdenticalToCpu) {
  MT_REQUIRE_CUDA();
  const int64_t n = 10007;  // odd: partial Philox blocks at the end
  for (const DType d : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::FP8_E4M3}) {
    Tensor want = prefilled({n}, d, Device::cpu());
    cpu().uniform(want, -2.0, 3.0, 42, 5);
    Tensor got = prefilled({n}, d, Device::cuda());
    gpu().uniform(got, -2.0, 3.0, 42, 5);
    expect_same_bits(want, got, "uniform " + name_of(d));

    Tensor nwant = prefilled({n}, d, Device::cpu());
    cpu().normal(nwant, 0.5, 2.0, 43, 6);
    Tensor ngot = prefilled({n}, d, Device::cuda());
    gpu().normal(ngot, 0.5, 2.0, 43, 6);
    if (d == DType::F64) {
      // log and cos differ in the last bits of a double between libm and CUDA; mean + stddev
      // r cos(t) cancels near 0, so the error is that of its O(1) terms (floor 1).
      expect_close(nwant, ngot, "normal f64", 16, 1.0);
    } else {
      expect_same_bits(nwant, ngot, "normal " + name_of(d));
    }
  }
}

TEST(CudaElementwise, DropoutMasksAgreeBitForBit) {
  MT_REQUIRE_CUDA();
  const int64_t n = 4099;
  for (const DType d : kFloats) {
    const Tensor x = Tensor::normal({n}, 0, 1, 19, d);
    Tensor want = prefilled({n}, d, Device::cpu());
    Tensor want_mask = Tensor::empty({n}, DType::Bool);
    cpu().dropout(x, 0.3, 77, 3, want, want_mask);
    for (const double sentinel : {1.0, 0.0}) {
      Tensor got = prefilled({n}, d, Device::cuda());
      Tensor got_mask = prefilled({n}, DType::Bool, Device::cuda(), sentinel);
      gpu().dropout(on_gpu(x), 0.3, 77, 3, got, got_mask);
      expect_same_bits(want, got, "dropout " + name_of(d));
      expect_same_bits(want_mask, got_mask, "dropout mask " + name_of(d));
    }
  }
}

TEST(CudaElementwise, CopyRoundedIsBitIdenticalToCpu) {
  MT_REQUIRE_CUDA();
  const RoundingOptions options[] = {
      {.mode = RoundingMode::Stochastic, .seed = 5, .offset = 9, .index = 3},
      {.mode = RoundingMode::Stochastic, .overflow = Overflow::Saturate, .seed = 6},
      {.mode = RoundingMode::TowardZero, .overflow = Overflow::Saturate},
      {},
  };
  const DType targets[] = {DType::BF16, DType::F16, DType::FP8_E4M3, DType::FP8_E5M2, DType::F32};
  for (const DType from : {DType::F32, DType::F64, DType::BF16, DType::I32}) {
    const Tensor base = Tensor::normal({37, 41}, 0, 300, 20, DType::F64).to(from);
    for (const Tensor& src : {base, base.t()}) {
      for (const RoundingOptions& r : options) {
        for (const DType to : targets) {
          const std::string what = "copy_rounded " + name_of(from) + " -> " + name_of(to) +
                                   " mode " + std::to_string(int(r.mode)) +
                                   (src.is_contiguous() ? "" : " strided");
          Tensor want = prefilled(src.shape(), to, Device::cpu());
          cpu().copy_rounded(src, want, r);
          Tensor got = prefilled(src.shape(), to, Device::cuda());
          gpu().copy_rounded(on_gpu(src), got, r);
          expect_same_bits(want, got, what);
        }
      }
    }
  }
  // The op, on the device.
  const Tensor x = Tensor::normal({1000}, 0, 1, 21);
  expect_same_bits(cast(x, DType::BF16, options[0]), cast(on_gpu(x), DType::BF16, options[0]),
                   "cast with rounding");
}

TEST(CudaElementwise, RoundToFormatMatchesCpu) {
  MT_REQUIRE_CUDA();
  const Tensor x = Tensor::normal({5003}, 0, 1000, 22);
  for (const Format f : {Format::FP32, Format::TF32, Format::FP16, Format::BF16, Format::FP8_E4M3,
                         Format::FP8_E5M2}) {
    Tensor want = x.clone();
    cpu().round_to_format(want, f);
    Tensor got = on_gpu(x);
    gpu().round_to_format(got, f);
    expect_same_bits(want, got, "round_to_format " + std::string(format_name(f)));
  }
}

}  // namespace
}  // namespace mantissa
