// cpu/vec_math.h against float64 in ulps over a sweep of every float bit pattern (one in 127,
// plus every float of the ranges where the approximations change form), its special values,
// and the CPU kernels' builds (baseline, AVX2 and AVX-512, cpu/vector_isa.h) giving the same
// values (to the bit, every NaN taken as one) for every unary and binary op, forward and
// backward, the LSTM step, and the layer-norm, softmax, log_softmax and cross-entropy rows; and
// the loops that read and write bf16 themselves (elementwise ops, batch norm's channels-last
// blocks) giving the f32 kernels' values rounded once.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vec_math.h"
#include "backend/cpu/vector_isa.h"
#include "backend/forced_isa.h"
#include "backend/op_tables.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend::cpu {
namespace {

// |got - ref| in units of the float ulp at ref (subnormal spacing below the normal range);
// infinities and NaN must match exactly (0 or a huge error).
double ulp_error(float got, double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0 : 1e30;
  const float rounded = float(ref);
  if (std::isinf(rounded)) return got == rounded ? 0 : 1e30;
  if (std::isinf(got) || std::isnan(got)) return 1e30;
  int e = 0;
  std::frexp(ref == 0 ? std::numeric_limits<float>::min() : ref, &e);
  const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  return std::abs(double(got) - ref) / ulp;
}

struct Worst {
  double ulps = 0;
  float x = 0;
};

// The error over the allowance: ulps - allowance(x) (the functions of e^(-x^2 / 2) are allowed
// x^2 / 2 ulp more, what the rounding of x^2 becomes through the exponential).
double no_allowance(double) {
  return 0;
}
double half_square(double x) {
  return std::isfinite(x) ? x * x / 2 : 0;
}

template <typename F, typename R>
void sweep(Worst& w, uint32_t first, uint32_t last, uint32_t step, F f, R ref,
           double (*allowance)(double)) {
  for (uint64_t b = first; b <= last; b += step) {
    const float x = std::bit_cast<float>(uint32_t(b));
    const double e = ulp_error(f(x), ref(double(x))) - allowance(double(x));
    if (e > w.ulps) w = {e, x};
  }
}

template <typename F, typename R>
Worst measure(F f, R ref, float dense_lo, float dense_hi,
              double (*allowance)(double) = no_allowance) {
  Worst w;
  sweep(w, 0, 0xffffffffu, 127, f, ref, allowance);
  // Every float where the approximation changes form, both signs.
  for (const float s : {1.0f, -1.0f}) {
    const float a = s * dense_lo, b = s * dense_hi;
    const uint32_t lo = std::bit_cast<uint32_t>(s > 0 ? a : b);
    const uint32_t hi = std::bit_cast<uint32_t>(s > 0 ? b : a);
    sweep(w, std::min(lo, hi), std::max(lo, hi), 1, f, ref, allowance);
  }
  return w;
}

double normal_cdf_ref(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}
double normal_pdf_ref(double x) {
  return std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi);
}

// The bounds the header states.
TEST(VecMath, UlpBoundsAgainstFloat64) {
  const Worst e = measure([](float x) { return vm::exp(x); }, [](double x) { return std::exp(x); },
                          80.0f, 89.0f);
  const Worst l =
      measure([](float x) { return vm::log(x); }, [](double x) { return std::log(x); }, 0.6f, 1.5f);
  const Worst t = measure([](float x) { return vm::tanh(x); },
                          [](double x) { return std::tanh(x); }, 0.5f, 0.75f);
  // Dense over the middle of GELU's working range (the stride sweep covers the tails).
  const Worst c =
      measure([](float x) { return vm::normal_cdf(x); }, normal_cdf_ref, 0.25f, 1.0f, half_square);
  const Worst p =
      measure([](float x) { return vm::normal_pdf(x); }, normal_pdf_ref, 0.25f, 1.0f, half_square);
  EXPECT_LE(e.ulps, 1.0) << "exp at " << e.x;
  EXPECT_LE(l.ulps, 1.0) << "log at " << l.x;
  EXPECT_LE(t.ulps, 1.5) << "tanh at " << t.x;
  EXPECT_LE(c.ulps, 7.0) << "normal_cdf at " << c.x << " (ulps beyond x^2 / 2)";
  EXPECT_LE(p.ulps, 2.0) << "normal_pdf at " << p.x << " (ulps beyond x^2 / 2)";
  std::printf(
      "worst ulps: exp %.3f (x=%.9g), log %.3f (x=%.9g), tanh %.3f (x=%.9g); beyond x^2 / 2: "
      "normal_cdf %.3f (x=%.9g), normal_pdf %.3f (x=%.9g)\n",
      e.ulps, double(e.x), l.ulps, double(l.x), t.ulps, double(t.x), c.ulps, double(c.x), p.ulps,
      double(p.x));
}

TEST(VecMath, SpecialValuesAsTheCLibrary) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float max = std::numeric_limits<float>::max();
  const std::vector<float> xs = {0.0f,        -0.0f,   inf,     -inf,   nan,
                                 tiny,        -tiny,   max,     -max,   88.7228317f,
                                 88.7228394f, -103.9f, -104.5f, 1e-20f, -1e-20f};
  auto same = [](float a, float b) {
    return (std::isnan(a) && std::isnan(b)) ||
           std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
  };
  for (const float x : xs) {
    SCOPED_TRACE(x);
    // exp and log exact at the edges; tanh keeps the sign of zero, tanh and the normal CDF
    // saturate.
    if (std::isinf(x) || std::isnan(x) || x == 0 || x > 88.73f || x < -104.0f) {
      EXPECT_TRUE(same(vm::exp(x), std::exp(x))) << vm::exp(x) << " vs " << std::exp(x);
    }
    if (std::isinf(x) || std::isnan(x) || x <= 0) {
      EXPECT_TRUE(same(vm::log(x), std::log(x))) << vm::log(x) << " vs " << std::log(x);
    }
    if (std::isinf(x) || std::isnan(x) || x == 0 || std::abs(x) > 10) {
      EXPECT_TRUE(same(vm::tanh(x), std::tanh(x))) << vm::tanh(x) << " vs " << std::tanh(x);
    }
    if (std::isinf(x) || std::isnan(x) || std::abs(x) > 15) {
      const float c = vm::normal_cdf(x), p = vm::normal_pdf(x);
      EXPECT_TRUE(same(c, float(normal_cdf_ref(x)))) << c << " vs " << normal_cdf_ref(x);
      EXPECT_TRUE(same(p, float(normal_pdf_ref(x)))) << p << " vs " << normal_pdf_ref(x);
    }
    if (std::abs(x) < 1e-10f) {  // Phi = 1/2 and phi = 1 / sqrt(2 pi) to the ulp
      EXPECT_LE(ulp_error(vm::normal_cdf(x), 0.5), 1.0);
      EXPECT_LE(ulp_error(vm::normal_pdf(x), normal_pdf_ref(0)), 0.5);
    }
    if (x != 0 && std::abs(x) < 1e-10f) {
      EXPECT_EQ(vm::tanh(x), x);  // tanh x = x
    }
  }
  EXPECT_LE(ulp_error(vm::log(tiny), std::log(double(tiny))), 1.0) << "subnormal input";
  EXPECT_LE(ulp_error(vm::exp(-100.0f), std::exp(-100.0)), 1.0) << "subnormal result";
}

// Inputs that cover the ops' ranges and their edges: a ramp over [-12, 12], special values, and
// values at the forms' switch points.
Tensor probe(int64_t n, DType dtype, bool reversed = false) {
  std::vector<float> v(static_cast<size_t>(n));
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            0.625f,
                            -0.625f,
                            1.0f,
                            -1.0f,
                            4.0f,
                            -4.0f,
                            88.8f,
                            -104.5f,
                            1e-40f};
  for (int64_t i = 0; i < n; ++i) {
    v[size_t(i)] = i % 97 < 14 ? specials[i % 97] : -12.0f + 24.0f * float(i) / float(n);
  }
  if (reversed) std::reverse(v.begin(), v.end());
  return Tensor::from_vector(v, {n}).to(dtype);
}

#define MT_UNARY_VALUE(e, ...) UnaryOp::e,
#define MT_BINARY_VALUE(e, ...) BinaryOp::e,
constexpr UnaryOp kUnaryOps[] = {MT_FORALL_UNARY_OPS(MT_UNARY_VALUE)};
constexpr BinaryOp kBinaryOps[] = {MT_FORALL_BINARY_OPS(MT_BINARY_VALUE)};
#undef MT_UNARY_VALUE
#undef MT_BINARY_VALUE

// A tensor's values as bit patterns, exact (signed zeros apart) except that every NaN is one:
// which NaN's sign an operation on two NaNs keeps depends on the operands' order, which the
// compiler picks per build (and per optimization level: the sanitizer build differs here).
std::vector<uint64_t> values(const Tensor& t) {
  std::vector<uint64_t> v;
  for (const double d : t.to_vector<double>())
    v.push_back(std::isnan(d) ? 0x7ff8000000000000ull : std::bit_cast<uint64_t>(d));
  return v;
}

// "" when equal, else the first differing element of both.
std::string first_difference(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) {
      return "element " + std::to_string(i) + ": " + std::to_string(std::bit_cast<double>(a[i])) +
             " vs " + std::to_string(std::bit_cast<double>(b[i]));
    }
  }
  return a.size() == b.size() ? "" : "different sizes";
}

// Every build of the loops this CPU runs (AVX2, AVX-512) against the baseline's, bit for bit.
TEST(VectorIsa, EveryBuildGivesTheBaselinesValues) {
  std::vector<VectorIsa> isas{VectorIsa::Baseline};
  for (const VectorIsa isa : {VectorIsa::Avx2, VectorIsa::Avx512}) {
    if (vector_isa_supported(isa)) isas.push_back(isa);
  }
  if (isas.size() == 1) GTEST_SKIP() << "this CPU runs only the baseline build";
  Backend& cpu = cpu_backend();
  const int64_t n = 5000;  // more than two chunks, a ragged tail
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    const Tensor x = probe(n, dtype), g = probe(n, dtype, true);
    for (const UnaryOp u : kUnaryOps) {
      SCOPED_TRACE(std::string(unary_info(u).name) + " " + std::string(dtype_name(dtype)));
      const Scalars s{2.5, 0.5};
      std::vector<uint64_t> out[3], grad[3];
      for (const VectorIsa isa : isas) {
        ForcedIsa forced(isa);
        Tensor y = Tensor::empty({n}, dtype), gx = Tensor::empty({n}, dtype);
        cpu.unary(u, x, y, s);
        cpu.unary_backward(u, g, x, y, gx, s);
        out[int(isa)] = values(y);
        grad[int(isa)] = values(gx);
      }
      for (const VectorIsa isa : isas) {
        EXPECT_EQ(first_difference(out[0], out[int(isa)]), "")
            << "forward, " << vector_isa_name(isa);
        EXPECT_EQ(first_difference(grad[0], grad[int(isa)]), "")
            << "backward, " << vector_isa_name(isa);
      }
    }
    for (const BinaryOp b : kBinaryOps) {
      SCOPED_TRACE(std::string(binary_info(b).name) + " " + std::string(dtype_name(dtype)));
      std::vector<uint64_t> out[3];
      for (const VectorIsa isa : isas) {
        ForcedIsa forced(isa);
        Tensor o = Tensor::empty({n}, is_comparison(b) ? DType::Bool : dtype);
        cpu.binary(b, x, g, o);
        out[int(isa)] = values(o);
      }
      for (const VectorIsa isa : isas)
        EXPECT_EQ(first_difference(out[0], out[int(isa)]), "") << vector_isa_name(isa);
    }
    // Softmax and log_softmax rows (their sums and maxima in fixed lanes), forward and backward,
    // rows of 1000 (full lanes and a tail) and of 10 (a tail only); cross-entropy over 125
    // classes with smoothing, forward and backward. The probe's infinities and NaN are in
    // some rows.
    for (const int64_t row : {int64_t(1000), int64_t(10)}) {
      for (const bool log : {false, true}) {
        SCOPED_TRACE(std::string(log ? "log_softmax " : "softmax ") + std::to_string(row) + " " +
                     std::string(dtype_name(dtype)));
        const Tensor xs = x.reshape({n / row, row}), gs = g.reshape({n / row, row});
        std::vector<uint64_t> got[3];
        for (const VectorIsa isa : isas) {
          ForcedIsa forced(isa);
          Tensor y = Tensor::empty(xs.shape(), dtype), gx = Tensor::empty(xs.shape(), dtype);
          cpu.softmax(xs, 1, log, y);
          cpu.softmax_backward(gs, y, 1, log, gx);
          got[int(isa)] = values(y);
          const std::vector<uint64_t> gv = values(gx);
          got[int(isa)].insert(got[int(isa)].end(), gv.begin(), gv.end());
        }
        for (const VectorIsa isa : isas)
          EXPECT_EQ(first_difference(got[0], got[int(isa)]), "") << vector_isa_name(isa);
      }
    }
    // Layer norm (sums in fixed lanes), forward and backward with all three gradients, rows of
    // 1000 and of 10, with a weight and a bias.
    for (const int64_t row : {int64_t(1000), int64_t(10)}) {
      SCOPED_TRACE("layer_norm " + std::to_string(row) + " " + std::string(dtype_name(dtype)));
      const Tensor xs = x.reshape({n / row, row}), gs = g.reshape({n / row, row});
      const Tensor w = g.narrow(0, 7, row), b = x.narrow(0, 3, row);
      const DType stats = dtype == DType::F64 ? DType::F64 : DType::F32;
      std::vector<uint64_t> got[3];
      for (const VectorIsa isa : isas) {
        ForcedIsa forced(isa);
        Tensor y = Tensor::empty(xs.shape(), dtype), gx = Tensor::empty(xs.shape(), dtype);
        Tensor mean = Tensor::empty({n / row}, stats), rstd = Tensor::empty({n / row}, stats);
        Tensor gw = Tensor::empty({row}, dtype), gb = Tensor::empty({row}, dtype);
        cpu.layer_norm(xs, &w, &b, 1e-5, y, mean, rstd);
        cpu.layer_norm_backward(gs, xs, &w, mean, rstd, &gx, &gw, &gb);
        for (const Tensor* r : {&y, &mean, &rstd, &gx, &gw, &gb}) {
          const std::vector<uint64_t> v = values(*r);
          got[int(isa)].insert(got[int(isa)].end(), v.begin(), v.end());
        }
      }
      for (const VectorIsa isa : isas)
        EXPECT_EQ(first_difference(got[0], got[int(isa)]), "") << vector_isa_name(isa);
    }
    {
      SCOPED_TRACE(std::string("cross_entropy ") + std::string(dtype_name(dtype)));
      const Tensor logits = x.reshape({40, 125});
      std::vector<int64_t> t(40);
      for (size_t i = 0; i < t.size(); ++i)
        t[i] = int64_t(i * 37 % 125);
      const Tensor target = Tensor::from_vector(t, {40}, DType::I64);
      const DType stats = dtype == DType::F64 ? DType::F64 : DType::F32;
      const Tensor grad_loss = g.narrow(0, 0, 40).to(stats);
      std::vector<uint64_t> got[3];
      for (const VectorIsa isa : isas) {
        ForcedIsa forced(isa);
        Tensor loss = Tensor::empty({40}, stats), lp = Tensor::empty({40, 125}, stats);
        Tensor gl = Tensor::empty({40, 125}, dtype);
        cpu.cross_entropy(logits, target, -100, 0.1, loss, lp);
        cpu.cross_entropy_backward(grad_loss, lp, target, -100, 0.1, gl);
        for (const Tensor* r : {&loss, &lp, &gl}) {
          const std::vector<uint64_t> v = values(*r);
          got[int(isa)].insert(got[int(isa)].end(), v.begin(), v.end());
        }
      }
      for (const VectorIsa isa : isas)
        EXPECT_EQ(first_difference(got[0], got[int(isa)]), "") << vector_isa_name(isa);
    }
    // The LSTM step (50 rows of 4 x 25 gates), with and without a previous state; with a
    // previous state also with the recurrent GEMM's (compute-dtype) gates and dh added in.
    SCOPED_TRACE(std::string("lstm_cell ") + std::string(dtype_name(dtype)));
    const Tensor gates = x.reshape({50, 100}), dh = g.narrow(0, 0, 1250).reshape({50, 25});
    const Tensor c_prev = x.narrow(0, 100, 1250).reshape({50, 25});
    for (const bool has_prev : {true, false}) {
      std::vector<uint64_t> got[3];
      for (const VectorIsa isa : isas) {
        ForcedIsa forced(isa);
        Tensor acts = Tensor::empty({50, 100}, dtype), c = Tensor::empty({50, 25}, dtype);
        Tensor h = Tensor::empty({50, 25}, dtype), dz = Tensor::empty({50, 100}, dtype);
        Tensor dcp = Tensor::empty({50, 25}, dtype);
        const Tensor prev = has_prev ? c_prev : Tensor();
        const DType cdt = dtype == DType::F64 ? DType::F64 : DType::F32;
        const Tensor gates_add = has_prev ? mul(gates, -0.5).to(cdt) : Tensor();
        const Tensor dh_add = has_prev ? mul(dh, 0.25).to(cdt) : Tensor();
        cpu.lstm_cell(gates, gates_add, prev, acts, c, h);
        cpu.lstm_cell_backward(acts, c, prev, dh, dh_add, dh, dz, dcp);
        for (const Tensor* t : {&acts, &c, &h, &dz, &dcp}) {
          const std::vector<uint64_t> v = values(*t);
          got[int(isa)].insert(got[int(isa)].end(), v.begin(), v.end());
        }
      }
      for (const VectorIsa isa : isas) {
        EXPECT_EQ(first_difference(got[0], got[int(isa)]), "")
            << (has_prev ? "with" : "without") << " a previous state, " << vector_isa_name(isa);
      }
    }
  }
}

// bf16 state and gates are read and written inside the LSTM row loops (no conversion pass): the
// results are the f32 kernel's on the same values, rounded once, bit for bit, forward and
// backward, with and without a previous state and the float adds, NaN, infinities and a
// subnormal among the inputs.
TEST(LstmCellKernel, Bf16StorageIsTheF32KernelRoundedOnce) {
  Backend& cpu = cpu_backend();
  const int64_t rows = 50, n = 25;
  const Tensor x = probe(rows * 4 * n, DType::BF16), g = probe(rows * 4 * n, DType::BF16, true);
  const Tensor gates = x.reshape({rows, 4 * n});
  const Tensor c_prev = g.narrow(0, 0, rows * n).reshape({rows, n});
  const Tensor dh = g.narrow(0, rows * n, rows * n).reshape({rows, n});
  const Tensor dc = x.narrow(0, 3 * rows * n, rows * n).reshape({rows, n});
  auto f32 = [](const Tensor& t) { return t.defined() ? t.to(DType::F32) : t; };
  auto rounded = [](const Tensor& t) { return values(t.to(DType::BF16)); };
  for (const bool has_prev : {true, false}) {
    for (const bool with_add : {true, false}) {
      SCOPED_TRACE(std::string(has_prev ? "with" : "without") + " a previous state, " +
                   (with_add ? "with" : "without") + " the float adds");
      const Tensor prev = has_prev ? c_prev : Tensor();
      const Tensor za = with_add ? mul(gates, -0.5).to(DType::F32) : Tensor();
      const Tensor dha = with_add ? mul(dh, 0.25).to(DType::F32) : Tensor();
      Tensor acts = Tensor::empty({rows, 4 * n}, DType::BF16);
      Tensor c = Tensor::empty({rows, n}, DType::BF16), h = Tensor::empty({rows, n}, DType::BF16);
      Tensor dz = Tensor::empty({rows, 4 * n}, DType::BF16);
      Tensor dcp = Tensor::empty({rows, n}, DType::BF16);
      cpu.lstm_cell(gates, za, prev, acts, c, h);
      cpu.lstm_cell_backward(acts, c, prev, dh, dha, dc, dz, dcp);

      Tensor acts32 = Tensor::empty({rows, 4 * n}, DType::F32);
      Tensor c32 = Tensor::empty({rows, n}, DType::F32), h32 = Tensor::empty({rows, n}, DType::F32);
      cpu.lstm_cell(f32(gates), za, f32(prev), acts32, c32, h32);
      EXPECT_EQ(first_difference(values(acts), rounded(acts32)), "") << "activations";
      EXPECT_EQ(first_difference(values(c), rounded(c32)), "") << "c";
      EXPECT_EQ(first_difference(values(h), rounded(h32)), "") << "h";
      // Backward from the bf16 activations and state, widened.
      Tensor dz32 = Tensor::empty({rows, 4 * n}, DType::F32);
      Tensor dcp32 = Tensor::empty({rows, n}, DType::F32);
      cpu.lstm_cell_backward(f32(acts), f32(c), f32(prev), f32(dh), dha, f32(dc), dz32, dcp32);
      EXPECT_EQ(first_difference(values(dz), rounded(dz32)), "") << "d gates";
      EXPECT_EQ(first_difference(values(dcp), rounded(dcp32)), "") << "d c_prev";
    }
  }
}

// Contiguous bf16 operands are read and written inside the unary, derivative and binary kernels
// (not through the chunked path's convert() passes; the unary ones widen 512 elements at a time
// into L1): the results are the f32 kernels' on the same values, rounded once, and the chunked
// path's (a strided view takes it), bit for bit, for every op, with NaN, infinities and a
// subnormal among the inputs, and with the output written over an input. 5000 elements make
// several of the unary kernels' 512-element buffers and a ragged last one.
TEST(ElementwiseKernel, Bf16StorageIsTheF32KernelRoundedOnce) {
  Backend& cpu = cpu_backend();
  const int64_t n = 5000;  // more than two chunks, a ragged tail
  const Tensor x = probe(n, DType::BF16), g = probe(n, DType::BF16, true);
  // The same values as strided views of wider tensors: the chunked path.
  const Tensor xs = stack({x, g}, 1).select(1, 0), gs = stack({g, x}, 1).select(1, 0);
  ASSERT_FALSE(xs.is_contiguous());
  auto f32 = [](const Tensor& t) { return t.to(DType::F32); };
  auto rounded = [](const Tensor& t) { return values(t.to(DType::BF16)); };
  const Scalars s{2.5, 0.5};
  for (const UnaryOp u : kUnaryOps) {
    SCOPED_TRACE(unary_info(u).name);
    Tensor y = Tensor::empty({n}, DType::BF16), y_chunked = Tensor::empty({n}, DType::BF16);
    Tensor y32 = Tensor::empty({n}, DType::F32);
    cpu.unary(u, x, y, s);
    cpu.unary(u, xs, y_chunked, s);
    cpu.unary(u, f32(x), y32, s);
    EXPECT_EQ(first_difference(values(y), rounded(y32)), "") << "forward";
    EXPECT_EQ(first_difference(values(y), values(y_chunked)), "") << "forward, chunked";

    Tensor gx = Tensor::empty({n}, DType::BF16), gx_chunked = Tensor::empty({n}, DType::BF16);
    Tensor gx32 = Tensor::empty({n}, DType::F32);
    cpu.unary_backward(u, g, x, y, gx, s);
    cpu.unary_backward(u, gs, xs, y_chunked, gx_chunked, s);  // y_chunked: contiguous, y's bits
    cpu.unary_backward(u, f32(g), f32(x), f32(y), gx32, s);
    EXPECT_EQ(first_difference(values(gx), rounded(gx32)), "") << "backward";
    EXPECT_EQ(first_difference(values(gx), values(gx_chunked)), "") << "backward, chunked";
  }
  for (const BinaryOp b : kBinaryOps) {
    if (is_comparison(b)) continue;
    SCOPED_TRACE(binary_info(b).name);
    Tensor o = Tensor::empty({n}, DType::BF16), o_chunked = Tensor::empty({n}, DType::BF16);
    Tensor o32 = Tensor::empty({n}, DType::F32);
    cpu.binary(b, x, g, o);
    cpu.binary(b, xs, gs, o_chunked);
    cpu.binary(b, f32(x), f32(g), o32);
    EXPECT_EQ(first_difference(values(o), rounded(o32)), "");
    EXPECT_EQ(first_difference(values(o), values(o_chunked)), "") << "chunked";
    Tensor in_place = x.clone();
    cpu.binary(b, in_place, g, in_place);
    EXPECT_EQ(first_difference(values(in_place), values(o)), "") << "written over its input";
  }
}

// Layer norm on bf16 rows: the rows are widened a group at a time and the input gradient's rows
// rounded a group at a time; the results are the f32 kernel's on the widened values (the output
// and input gradient rounded once, the statistics and the weight and bias gradients equal), bit
// for bit. 2887 rows make blocks of 46 rows, loaded in groups of 32 (rows of 64) or 20 (rows of
// 100), the last group of each block ragged.
TEST(LayerNormKernel, Bf16IsTheF32KernelRoundedOnce) {
  Backend& cpu = cpu_backend();
  const int64_t rows = 2887;
  for (const int64_t n : {int64_t(64), int64_t(100)}) {
    SCOPED_TRACE("rows of " + std::to_string(n));
    const Tensor x = add(Tensor::normal({rows, n}, 0, 1, 31), 0.25).to(DType::BF16);
    const Tensor g = Tensor::uniform({rows, n}, -1, 1, 32).to(DType::BF16);
    const Tensor w = Tensor::uniform({n}, 0.5, 1.5, 33), b = Tensor::uniform({n}, -1, 1, 34);
    struct Out {
      Tensor y, mean, rstd, gx, gw, gb;
    };
    auto run = [&](DType dt) {
      Out o{Tensor::empty({rows, n}, dt),      Tensor::empty({rows}, DType::F32),
            Tensor::empty({rows}, DType::F32), Tensor::empty({rows, n}, dt),
            Tensor::empty({n}, DType::F32),    Tensor::empty({n}, DType::F32)};
      const Tensor xd = x.to(dt), gd = g.to(dt);
      cpu.layer_norm(xd, &w, &b, 1e-5, o.y, o.mean, o.rstd);
      cpu.layer_norm_backward(gd, xd, &w, o.mean, o.rstd, &o.gx, &o.gw, &o.gb);
      return o;
    };
    const Out h = run(DType::BF16), f = run(DType::F32);
    auto rounded = [](const Tensor& t) { return values(t.to(DType::BF16)); };
    EXPECT_EQ(first_difference(values(h.y), rounded(f.y)), "") << "output";
    EXPECT_EQ(first_difference(values(h.mean), values(f.mean)), "") << "mean";
    EXPECT_EQ(first_difference(values(h.rstd), values(f.rstd)), "") << "rstd";
    EXPECT_EQ(first_difference(values(h.gx), rounded(f.gx)), "") << "input gradient";
    EXPECT_EQ(first_difference(values(h.gw), values(f.gw)), "") << "weight gradient";
    EXPECT_EQ(first_difference(values(h.gb), values(f.gb)), "") << "bias gradient";
  }
}

// Batch norm on channels-last bf16 reads and writes the storage in its block loops, and f16
// blocks are converted first: in every build, the output, the input gradient, the weight and bias
// gradients and the running statistics are the f32 kernel's on the widened values (the output
// and input gradient rounded once), bit for bit, and the builds agree. 32 and 16 channels fill
// whole vectors, 20 do not; 504 pixels make several blocks.
TEST(BatchNormKernel, ChannelsLastHalfIsTheF32KernelRoundedOnceInEveryBuild) {
  std::vector<VectorIsa> isas{VectorIsa::Baseline};
  for (const VectorIsa isa : {VectorIsa::Avx2, VectorIsa::Avx512}) {
    if (vector_isa_supported(isa)) isas.push_back(isa);
  }
  // 504 pixels of 32 or 20 channels; 105 pixels of 16 (bf16's elementwise passes end on a run
  // of 16); 272 channels (more than those runs take).
  for (const Shape& shape :
       {Shape{8, 32, 9, 7}, Shape{8, 20, 9, 7}, Shape{3, 16, 5, 7}, Shape{2, 272, 3, 5}}) {
    const int64_t ch = shape[1];
    for (const DType dt : {DType::BF16, DType::F16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + ", " + std::to_string(ch) + " channels");
      const Tensor x0 =
          add(Tensor::normal(shape, 0, 1, 21), 0.5).to(dt).contiguous(MemoryFormat::ChannelsLast);
      const Tensor g0 =
          Tensor::uniform(shape, -1, 1, 22).to(dt).contiguous(MemoryFormat::ChannelsLast);
      const Tensor w0 = Tensor::uniform({ch}, 0.5, 1.5, 23), b0 = Tensor::uniform({ch}, -1, 1, 24);
      std::vector<std::vector<uint64_t>> first;
      for (const VectorIsa isa : isas) {
        SCOPED_TRACE(vector_isa_name(isa));
        ForcedIsa forced(isa);
        auto run = [&](DType as) {
          const Tensor x = x0.to(as).detach().set_requires_grad();
          const Tensor w = w0.detach().set_requires_grad(), b = b0.detach().set_requires_grad();
          Tensor rm = Tensor::zeros({ch}), rv = Tensor::ones({ch});
          const Tensor y = batch_norm(x, w, b, rm, rv, true);
          EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
          y.backward(g0.to(as));
          return std::vector<Tensor>{y.to(dt), x.grad().to(dt), w.grad(), b.grad(), rm, rv};
        };
        const std::vector<Tensor> half = run(dt), f32 = run(DType::F32);
        const char* names[] = {"output",        "input gradient", "weight gradient",
                               "bias gradient", "running mean",   "running variance"};
        std::vector<std::vector<uint64_t>> got;
        for (size_t i = 0; i < half.size(); ++i) {
          got.push_back(values(half[i]));
          EXPECT_EQ(first_difference(got.back(), values(f32[i])), "") << names[i];
        }
        if (first.empty()) {
          first = got;
        } else {
          for (size_t i = 0; i < got.size(); ++i)
            EXPECT_EQ(first_difference(got[i], first[i]), "")
                << names[i] << " against the baseline";
        }
      }
    }
  }
}

TEST(VectorIsa, ForcingAnUnsupportedIsaIsRefused) {
  force_vector_isa(VectorIsa::Baseline);
  EXPECT_EQ(vector_isa(), VectorIsa::Baseline);
  force_vector_isa(std::nullopt);
  bool refused_one = false;
  for (const VectorIsa isa : {VectorIsa::Avx2, VectorIsa::Avx512}) {
    if (!vector_isa_supported(isa)) {
      EXPECT_THROW(force_vector_isa(isa), Error) << vector_isa_name(isa);
      refused_one = true;
    }
  }
  if (!refused_one) GTEST_SKIP() << "this CPU runs every build";
}

}  // namespace
}  // namespace mantissa::backend::cpu
