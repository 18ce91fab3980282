// FP8 training's op layer (src/autocast/fp8.cpp): the scaled GEMM against float64 from the same
// rounded inputs, delayed scaling's history against Transformer Engine's formulas written down
// by hand, fp8_linear's gradients against the bf16 Linear and float64, zero and non-finite
// amaxes, the state's checkpoint form, prepare_fp8 and the region.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "harness/errors.h"
#include "mantissa/amp/amp.h"
#include "mantissa/amp/grad_scaler.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autocast/fp8.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::amp {
namespace {

Tensor randn(const Shape& shape, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(size_t(shape.numel()));
  for (double& x : v)
    x = d(g);
  return Tensor::from_vector(v, shape).to(DType::F32);
}

std::vector<double> as_f64(const Tensor& t) {
  return t.to(DType::F64).contiguous().to_vector<double>();
}

// a (M, K) @ b (N, K)^T in float64 from the values the Fp8Tensors stand for, block by block, and
// for each output the sum of |terms| (the error bound's scale).
void reference_gemm(const Fp8Tensor& a, const Fp8Tensor& b, std::vector<double>& out,
                    std::vector<double>& mag) {
  const int64_t M = a.codes.size(0), K = a.codes.size(1), N = b.codes.size(0);
  const std::vector<double> ca = as_f64(a.codes), cb = as_f64(b.codes);
  const std::vector<double> sa = as_f64(a.scale_inv), sb = as_f64(b.scale_inv);
  const int64_t nca = a.scale_inv.size(1), ncb = b.scale_inv.size(1);
  out.assign(size_t(M * N), 0.0);
  mag.assign(size_t(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, g = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double va =
            ca[size_t(m * K + k)] * sa[size_t((m / a.block_rows) * nca + k / a.block_cols)];
        const double vb =
            cb[size_t(n * K + k)] * sb[size_t((n / b.block_rows) * ncb + k / b.block_cols)];
        s += va * vb;
        g += std::fabs(va * vb);
      }
      out[size_t(m * N + n)] = s;
      mag[size_t(m * N + n)] = g;
    }
  }
}

struct GemmCase {
  const char* name;
  Fp8Scaling sa, sb;
};

TEST(Fp8Gemm, EqualsFloat64FromTheSameRoundedInputsToFp32Rounding) {
  const int64_t M = 37, K = 300, N = 45;  // ragged against 32 and 128
  const Tensor a = randn({M, K}, 1, 3.0), b = randn({N, K}, 2, 0.05);
  const GemmCase cases[] = {
      {"per tensor, given",
       {0, 0, Fp8ScaleRule::Given, 20.0f},
       {0, 0, Fp8ScaleRule::Given, 3000.0f}},
      {"per tensor, current", {0, 0, Fp8ScaleRule::Amax, 1}, {0, 0, Fp8ScaleRule::Amax, 1}},
      {"mxfp8", {1, 32, Fp8ScaleRule::AmaxPow2, 1}, {1, 32, Fp8ScaleRule::AmaxPow2, 1}},
      {"blockwise", {1, 128, Fp8ScaleRule::Amax, 1}, {128, 128, Fp8ScaleRule::Amax, 1}},
  };
  for (const GemmCase& c : cases) {
    for (DType bdt : {DType::FP8_E4M3, DType::FP8_E5M2}) {
      const Fp8Tensor qa = fp8_quantize(a, DType::FP8_E4M3, c.sa);
      const Fp8Tensor qb = fp8_quantize(b, bdt, c.sb);
      const std::vector<double> got = as_f64(fp8_gemm(qa, qb, Tensor(), DType::F32));
      std::vector<double> want, mag;
      reference_gemm(qa, qb, want, mag);
      // fp32 accumulation of K products, the slices' scaling and sum: gamma_(K+4) * sum |terms|.
      const double eps = std::ldexp(1.0, -24);
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double bound = (double(K) + 4) * eps * mag[i] + 1e-30;
        ASSERT_LE(std::fabs(got[i] - want[i]), bound)
            << c.name << " " << dtype_name(bdt) << " element " << i;
        worst = std::max(worst, std::fabs(got[i] - want[i]) / (mag[i] + 1e-30));
      }
      EXPECT_GT(worst, 0.0) << c.name << ": the comparison must see fp32 rounding, not nothing";
    }
  }
}

// In every recipe's GEMM (each fuses its epilogue differently on the CPU).
TEST(Fp8Gemm, BiasIsAddedInFp32AndTheOutputRoundedOnce) {
  const Tensor a = randn({40, 300}, 3), b = randn({136, 300}, 4), bias = randn({136}, 5);
  const GemmCase cases[] = {
      {"per tensor", {0, 0, Fp8ScaleRule::Amax, 1}, {0, 0, Fp8ScaleRule::Amax, 1}},
      {"mxfp8", {1, 32, Fp8ScaleRule::AmaxPow2, 1}, {1, 32, Fp8ScaleRule::AmaxPow2, 1}},
      {"blockwise", {1, 128, Fp8ScaleRule::Amax, 1}, {128, 128, Fp8ScaleRule::Amax, 1}},
  };
  for (const GemmCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Fp8Tensor qa = fp8_quantize(a, DType::FP8_E4M3, c.sa),
                    qb = fp8_quantize(b, DType::FP8_E4M3, c.sb);
    const Tensor f32 = fp8_gemm(qa, qb, bias, DType::F32);
    const Tensor bf = fp8_gemm(qa, qb, bias, DType::BF16);
    EXPECT_EQ(bf.dtype(), DType::BF16);
    EXPECT_EQ(as_f64(bf), as_f64(f32.to(DType::BF16)));  // one rounding from the fp32 result
    const Tensor nobias = fp8_gemm(qa, qb, Tensor(), DType::F32);
    EXPECT_EQ(as_f64(f32), as_f64(add(nobias, bias)));
  }
}

// Values of magnitude in [1, 2) with random signs: quantized with amax scaling, every product
// of two codes is a multiple of 2^8 below 2^18, so a slice's sum of 128 is exact in fp32 in any
// order, and the fp32 sums of a slice equal float64's.
Tensor unit_magnitudes(const Shape& shape, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> mag(1.0, 2.0);
  std::vector<double> v(size_t(shape.numel()));
  for (double& x : v)
    x = (g() & 1 ? -1.0 : 1.0) * mag(g);
  return Tensor::from_vector(v, shape).to(DType::F32);
}

// The block-scaled GEMM's arithmetic, element by element in fp32 from exact slice sums: acc =
// part_0 * (sa * sb), then acc + part_s * (sa * sb) slice by slice, then + bias.
std::vector<float> block_scaled_reference(const Fp8Tensor& a, const Fp8Tensor& b,
                                          const std::vector<float>& bias) {
  const int64_t M = a.codes.size(0), K = a.codes.size(1), N = b.codes.size(0);
  const int64_t bk = a.block_cols, slices = (K + bk - 1) / bk;
  const std::vector<double> ca = as_f64(a.codes), cb = as_f64(b.codes);
  const Tensor sat = a.scale_inv.contiguous(), sbt = b.scale_inv.contiguous();
  const std::vector<float> sa = sat.to_vector<float>(), sb = sbt.to_vector<float>();
  std::vector<float> out(size_t(M * N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0;
      for (int64_t s = 0; s < slices; ++s) {
        double part = 0;
        for (int64_t k = s * bk; k < std::min(K, (s + 1) * bk); ++k)
          part += ca[size_t(m * K + k)] * cb[size_t(n * K + k)];
        const float f = sa[size_t((m / a.block_rows) * slices + s)] *
                        sb[size_t((n / b.block_rows) * slices + s)];
        const float term = float(part) * f;
        acc = s == 0 ? term : acc + term;
      }
      out[size_t(m * N + n)] = bias.empty() ? acc : acc + bias[size_t(n)];
    }
  }
  return out;
}

// The CPU computes the slices' sums a chunk of rows at a time (a batched GEMM where the operands
// are transposed views) and adds each row's slices in one pass, rounding the output in it: the
// order of the scaling and the sums is the tensor ops' (the GPU path's), bit for bit.
TEST(Fp8Gemm, BlockScaledSlicesAreScaledAndSummedInOrder) {
  const Fp8Scaling rows{1, 128, Fp8ScaleRule::Amax, 1}, blocks{128, 128, Fp8ScaleRule::Amax, 1};
  struct Case {
    const char* name;
    int64_t M, K, N;
    bool transposed;
  };
  // The last: 9 slices of 1024 columns, 28 rows of sums at a time (the CPU holds 1 MiB of them),
  // the last chunk short.
  const Case cases[] = {{"row-major, ragged K", 37, 300, 45, false},
                        {"transposed views, ragged K", 70, 600, 136, true},
                        {"transposed views, chunks of rows", 300, 1152, 1024, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor x = unit_magnitudes({c.M, c.K}, 11), w = unit_magnitudes({c.N, c.K}, 12);
    const Tensor bias = unit_magnitudes({c.N}, 13);
    const Fp8Tensor qa = c.transposed
                             ? fp8_quantize_transposed(x.t().contiguous(), DType::FP8_E4M3, rows)
                             : fp8_quantize(x, DType::FP8_E4M3, rows);
    const Fp8Tensor qb = c.transposed
                             ? fp8_quantize_transposed(w.t().contiguous(), DType::FP8_E5M2, blocks)
                             : fp8_quantize(w, DType::FP8_E5M2, blocks);
    ASSERT_EQ(qa.codes.stride(0) == 1, c.transposed);
    const std::vector<float> want = block_scaled_reference(qa, qb, bias.to_vector<float>());
    const Tensor f32 = fp8_gemm(qa, qb, bias, DType::F32);
    EXPECT_EQ(f32.to_vector<float>(), want);
    const Tensor bf = fp8_gemm(qa, qb, bias, DType::BF16);
    EXPECT_EQ(as_f64(bf), as_f64(Tensor::from_vector(want, {c.M, c.N}).to(DType::BF16)));
  }
}

TEST(Fp8Gemm, RefusesBlocksThatDoNotMeetAlongK) {
  const Tensor a = randn({4, 64}, 6), b = randn({4, 64}, 7);
  const Fp8Tensor qa = fp8_quantize(a, DType::FP8_E4M3, {1, 32, Fp8ScaleRule::AmaxPow2, 1});
  const Fp8Tensor qb = fp8_quantize(b, DType::FP8_E4M3, {0, 0, Fp8ScaleRule::Amax, 1});
  EXPECT_THROW(fp8_gemm(qa, qb, Tensor(), DType::F32), Error);
}

TEST(Fp8Quantize, ZeroTensorsNeedNoDivisionByZero) {
  const Tensor z = Tensor::zeros({4, 40});
  for (Fp8ScaleRule r : {Fp8ScaleRule::Amax, Fp8ScaleRule::AmaxPow2}) {
    const Fp8Tensor q = fp8_quantize(z, DType::FP8_E4M3, {1, 32, r, 1});
    for (float s : q.scale_inv.to_vector<float>())
      EXPECT_EQ(s, 1.0f);
    for (double v : as_f64(fp8_dequantize(q)))
      EXPECT_EQ(v, 0.0);
  }
}

// What the emulated GEMM multiplies: the codes' values (exact in bf16) and, for power-of-two
// scales, the dequantized values (exact too), written by the quantize kernel in the same pass.
TEST(Fp8Quantize, ValuesAreTheCodesOrTheirExactDequantization) {
  const Tensor x = randn({9, 70}, 13, 5.0);
  for (const Fp8Scaling& s :
       {Fp8Scaling{0, 0, Fp8ScaleRule::Given, 30.0f}, Fp8Scaling{1, 128, Fp8ScaleRule::Amax, 1},
        Fp8Scaling{1, 32, Fp8ScaleRule::AmaxPow2, 1}}) {
    const Fp8Tensor q = fp8_quantize(x, DType::FP8_E5M2, s);
    ASSERT_TRUE(q.values.defined());
    EXPECT_EQ(q.values.dtype(), DType::BF16);
    const Tensor want =
        s.rule == Fp8ScaleRule::AmaxPow2 ? fp8_dequantize(q) : q.codes.to(DType::F32);
    EXPECT_EQ(as_f64(q.values), as_f64(want)) << int(s.rule);
    EXPECT_EQ(as_f64(want.to(DType::BF16)), as_f64(want)) << "exact in bf16";
  }
}

// Backward's quantization of a transposed operand (block scales along the other dimension)
// without the transposed copy: the same codes, values, scales and amaxes as quantizing the copy.
TEST(Fp8Quantize, TransposedIsTheQuantizationOfTheTranspose) {
  Tensor x = randn({150, 70}, 21, 4.0);  // ragged against 32 and 128 both ways
  x = x * exp(Tensor::arange(70, DType::F64).to(DType::F32) * 0.2 - 3.0);  // columns' ranges
  for (const DType input : {DType::F32, DType::BF16}) {
    const Tensor xi = x.to(input);
    for (const Fp8Scaling& s :
         {Fp8Scaling{0, 0, Fp8ScaleRule::Given, 12.0f}, Fp8Scaling{0, 0, Fp8ScaleRule::Amax, 1},
          Fp8Scaling{1, 32, Fp8ScaleRule::AmaxPow2, 1}, Fp8Scaling{1, 128, Fp8ScaleRule::Amax, 1},
          Fp8Scaling{128, 128, Fp8ScaleRule::Amax, 1}}) {
      for (const DType dt : {DType::FP8_E4M3, DType::FP8_E5M2}) {
        SCOPED_TRACE(std::to_string(s.block_rows) + "x" + std::to_string(s.block_cols) + " " +
                     std::string(dtype_name(dt)) + " from " + std::string(dtype_name(input)));
        const Fp8Tensor got = fp8_quantize_transposed(xi, dt, s);
        const Fp8Tensor want = fp8_quantize(xi.t().contiguous(), dt, s);
        ASSERT_EQ(got.codes.shape(), want.codes.shape());
        EXPECT_EQ(got.block_rows, want.block_rows);
        EXPECT_EQ(got.block_cols, want.block_cols);
        EXPECT_EQ(got.power_of_two_scales, want.power_of_two_scales);
        EXPECT_EQ(as_f64(got.codes.to(DType::F32)), as_f64(want.codes.to(DType::F32)));
        EXPECT_EQ(as_f64(got.values), as_f64(want.values));
        EXPECT_EQ(as_f64(got.scale_inv), as_f64(want.scale_inv));
        EXPECT_EQ(as_f64(got.amax), as_f64(want.amax));
      }
    }
  }
}

TEST(Fp8Quantize, RefusesWhatItCannotDo) {
  EXPECT_THROW(fp8_quantize(randn({4}, 1), DType::FP8_E4M3, {}), Error);
  EXPECT_THROW(fp8_quantize(randn({4, 4}, 1), DType::BF16, {}), Error);
  EXPECT_THROW(fp8_quantize(randn({4, 4}, 1), DType::FP8_E4M3, {1, 2, Fp8ScaleRule::Given, 2}),
               Error);
  EXPECT_THROW(fp8_quantize(randn({4, 4}, 1), DType::FP8_E4M3, {0, 0, Fp8ScaleRule::Given, 0}),
               Error);
}

// ---- delayed scaling -------------------------------------------------------------------------

// Transformer Engine's DelayedScaling, written down by hand for a history of 3, margin 1, E4M3
// (fp8_max 448) inputs: each step's amax goes to slot 0; update() takes the max over the history,
// scale = (448 / amax) / 2^1, then rolls the history left and zeroes slot 0. So step t's scale
// comes from the amaxes of steps t-3 .. t-1 and never from step t itself.
TEST(Fp8Delayed, HistoryRollMaxMarginAndUpdateOrder) {
  Fp8Options o;
  o.recipe = Fp8Recipe::Delayed;
  o.amax_history_len = 3;
  o.margin = 1;
  Fp8Context ctx(o);
  auto st = ctx.add_layer("l");
  Fp8TensorMeta& in = (*st)[Fp8Role::Input];
  const float amaxes[] = {2.0f, 8.0f, 1.0f, 0.5f, 0.25f};
  // The scale each step quantizes with (before that step's update), by hand:
  //   step 0: 1 (initial)
  //   after 0: history {2, 0, 0} -> max 2 -> 448/2/2 = 112;  rolled {0, 0, 2}
  //   after 1: {8, 0, 2} -> 8 -> 28;                         rolled {0, 2, 8}
  //   after 2: {1, 2, 8} -> 8 -> 28;                         rolled {2, 8, 1} -> slot 0 = 0: {0, 8,
  //   1} after 3: {0.5, 8, 1} -> 8 -> 28;                       rolled {8, 1, 0.5} -> {0, 1, 0.5}
  //   after 4: {0.25, 1, 0.5} -> 1 -> 224
  const float want_scale_used[] = {1.0f, 112.0f, 28.0f, 28.0f, 28.0f};
  const float want_after[] = {112.0f, 28.0f, 28.0f, 28.0f, 224.0f};
  for (int step = 0; step < 5; ++step) {
    EXPECT_EQ(in.scale_value(), want_scale_used[step]) << "step " << step;
    // One training forward of a tensor whose amax is amaxes[step].
    Tensor x = Tensor::full({2, 4}, 0.0f);
    Tensor xv = x.clone();
    xv.narrow(0, 0, 1).narrow(1, 0, 1).fill_(double(amaxes[step]));
    Tensor w = randn({3, 4}, 9).set_requires_grad(true);
    fp8_linear(xv, w, Tensor(), *st, o);
    EXPECT_EQ(in.history()[0], amaxes[step]);
    ctx.update();
    EXPECT_EQ(in.scale_value(), want_after[step]) << "after step " << step;
    EXPECT_EQ(in.history()[0], 0.0f);
  }
}

// The data-parallel hook: update() hands this step's amaxes (layer by layer, input, weight,
// grad_output) to `reduce` first, and scales and history follow what it returns.
TEST(Fp8Delayed, UpdateTakesTheReducedAmaxes) {
  Fp8Options o;
  o.recipe = Fp8Recipe::Delayed;
  o.amax_history_len = 2;
  Fp8Context ctx(o);
  auto a = ctx.add_layer("a"), b = ctx.add_layer("b");
  const float mine[] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  int i = 0;
  for (auto* st : {a.get(), b.get()})
    for (Fp8TensorMeta& m : st->meta) {
      std::vector<float> h = m.history();
      h[0] = mine[i++];
      m.set_history(h);
    }
  std::vector<float> seen;
  ctx.update([&](Tensor& amaxes) {
    seen = amaxes.to_vector<float>();
    amaxes.mul_(4.0);  // another rank's larger amaxes, say
  });
  EXPECT_EQ(seen, std::vector<float>(std::begin(mine), std::end(mine)));
  i = 0;
  for (auto* st : {a.get(), b.get()}) {
    for (int r = 0; r < kNumFp8Roles; ++r) {
      const Fp8TensorMeta& m = st->meta[size_t(r)];
      const float fp8_max = r == int(Fp8Role::GradOutput) ? 57344.0f : 448.0f;
      EXPECT_EQ(m.scale_value(), fp8_max / (4 * mine[i])) << st->name << " role " << r;
      EXPECT_EQ(m.history()[1], 4 * mine[i]);  // rolled: the reduced value is kept
      ++i;
    }
  }
}

TEST(Fp8Delayed, MostRecentAndZeroAmaxKeepTheScale) {
  Fp8Options o;
  o.recipe = Fp8Recipe::Delayed;
  o.amax_history_len = 4;
  o.amax_compute = AmaxCompute::MostRecent;
  Fp8Context ctx(o);
  auto st = ctx.add_layer("l");
  Fp8TensorMeta& w = (*st)[Fp8Role::Weight];
  w.set_history({4.0f, 100.0f, 100.0f, 100.0f});
  ctx.update();
  EXPECT_EQ(w.scale_value(), 112.0f);  // 448 / 4: only the most recent
  ctx.update();                        // slot 0 is 0 now: the scale stays
  EXPECT_EQ(w.scale_value(), 112.0f);
}

TEST(Fp8Delayed, EvaluationDoesNotMoveTheScales) {
  Fp8Context ctx({.recipe = Fp8Recipe::Delayed});
  auto st = ctx.add_layer("l");
  const Tensor x = randn({5, 8}, 11), w = randn({4, 8}, 12);  // nothing requires grad
  fp8_linear(x, w, Tensor(), *st, ctx.options());
  EXPECT_EQ((*st)[Fp8Role::Input].history()[0], 0.0f);
  EXPECT_GT((*st)[Fp8Role::Input].last_amax(), 0.0f);  // the metrics still see it
}

TEST(Fp8Delayed, StateDictRoundTripsAndRefusesAMismatch) {
  Fp8Options o;
  o.recipe = Fp8Recipe::Delayed;
  o.amax_history_len = 5;
  Fp8Context a(o);
  auto la = a.add_layer("h.0.fc");
  (*la)[Fp8Role::GradOutput].set_history({1, 2, 3, 4, 5});
  (*la)[Fp8Role::GradOutput].set_scale(7.5f);
  const auto sd = a.state_dict();
  EXPECT_EQ(sd.size(), 6u);
  Fp8Context b(o);
  auto lb = b.add_layer("h.0.fc");
  b.load_state_dict(sd);
  EXPECT_EQ((*lb)[Fp8Role::GradOutput].history(), (*la)[Fp8Role::GradOutput].history());
  EXPECT_EQ((*lb)[Fp8Role::GradOutput].scale_value(), 7.5f);
  o.amax_history_len = 6;
  Fp8Context c(o);
  c.add_layer("h.0.fc");
  EXPECT_THROW(c.load_state_dict(sd), Error);
  Fp8Context d(o);
  d.add_layer("other");
  EXPECT_THROW(d.load_state_dict(sd), Error);
}

// ---- fp8_linear ------------------------------------------------------------------------------

double rel_err(const Tensor& got, const Tensor& want) {
  const std::vector<double> g = as_f64(got), w = as_f64(want);
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    num += (g[i] - w[i]) * (g[i] - w[i]);
    den += w[i] * w[i];
  }
  return std::sqrt(num / den);
}

TEST(Fp8Linear, GradientsMatchTheBf16LinearWithinFp8Tolerance) {
  const Tensor x0 = randn({3, 40, 96}, 21), w0 = randn({72, 96}, 22, 0.1), b0 = randn({72}, 23);
  const Tensor gy = randn({3, 40, 72}, 24, 1e-3);
  // float64 reference
  Tensor xr = x0.to(DType::F64).set_requires_grad(true),
         wr = w0.to(DType::F64).set_requires_grad(true);
  Tensor br = b0.to(DType::F64).set_requires_grad(true);
  Tensor yr = linear(xr, wr, br);
  yr.backward(gy.to(DType::F64));
  for (Fp8Recipe r : all_words<Fp8Recipe>()) {
    for (Fp8Format f : {Fp8Format::Hybrid, Fp8Format::E4M3}) {
      Fp8Options o;
      o.recipe = r;
      o.format = f;
      Fp8Context ctx(o);
      auto st = ctx.add_layer("l");
      if (r == Fp8Recipe::Delayed) {  // scales as a warmed-up history would give them
        (*st)[Fp8Role::Input].set_scale(448.0f / 4.5f);
        (*st)[Fp8Role::Weight].set_scale(448.0f / 0.45f);
        (*st)[Fp8Role::GradOutput].set_scale(
            float(format_info(f == Fp8Format::Hybrid ? Format::FP8_E5M2 : Format::FP8_E4M3)
                      .max_finite) /
            4.5e-3f);
      }
      Tensor x = x0.to(DType::BF16).set_requires_grad(true);
      Tensor w = w0.clone().set_requires_grad(true);
      Tensor b = b0.clone().set_requires_grad(true);
      Tensor y;
      {
        Autocast ac(Device::cpu(), DType::BF16);
        y = fp8_linear(x, w, b, *st, o);
      }
      EXPECT_EQ(y.dtype(), DType::BF16);
      y.backward(gy.to(DType::BF16));
      EXPECT_EQ(x.grad().dtype(), DType::BF16);
      EXPECT_EQ(w.grad().dtype(), DType::F32);
      // E4M3 carries 3 mantissa bits (relative step 2^-3, error up to 2^-4 per value), E5M2 2;
      // errors of many products average down. The bf16 Linear's error, for scale, is ~2^-8.
      const std::string what = std::string(name_of(r)) + "/" + std::string(name_of(f));
      EXPECT_LT(rel_err(y, yr), 0.06) << what;
      EXPECT_LT(rel_err(x.grad(), xr.grad()), f == Fp8Format::Hybrid ? 0.12 : 0.06) << what;
      EXPECT_LT(rel_err(w.grad(), wr.grad()), f == Fp8Format::Hybrid ? 0.12 : 0.06) << what;
      // From the unquantized gradient: only its rounding to bf16 (the backward's dtype) is seen.
      EXPECT_LT(rel_err(b.grad(), br.grad()), 4e-3) << what;
      // ... and fp8 is really used: worse than bf16 by a clear margin.
      EXPECT_GT(rel_err(y, yr), 1e-3) << what;
      EXPECT_EQ((*st)[Fp8Role::GradOutput].quantizations, 1);
    }
  }
}

TEST(Fp8Linear, NonFiniteInputsPoisonTheOutputAndAreNotRecorded) {
  Fp8Context ctx({.recipe = Fp8Recipe::Delayed});
  auto st = ctx.add_layer("blk.fc");
  Tensor x = randn({4, 16}, 31);
  x.narrow(0, 1, 1).narrow(1, 2, 1).fill_(std::numeric_limits<double>::infinity());
  Tensor w = randn({8, 16}, 32).set_requires_grad(true);
  const Tensor y = fp8_linear(x, w, Tensor(), *st, ctx.options());
  bool any_nan = false;
  for (double v : as_f64(y))
    any_nan = any_nan || std::isnan(v);
  EXPECT_TRUE(any_nan) << "an inf input must not saturate silently to a finite output";
  // Counted where the state lives (the trainer's fp8 records read it and warn).
  EXPECT_EQ((*st)[Fp8Role::Input].nonfinite(), 1);
  EXPECT_EQ((*st)[Fp8Role::Input].history()[0], 0.0f);
  ctx.update();
  EXPECT_EQ((*st)[Fp8Role::Input].scale_value(), 1.0f);  // unchanged
}

// The recipe's answer to a non-finite amax: the step is skipped by the loss scaler (a static
// scale of 1, as --precision fp8 sets it), the weights and the history stay as they were.
TEST(Fp8Linear, ANonFiniteStepIsSkippedByTheStaticScaler) {
  auto model = nn::make_model("mlp", {.seed = 3});
  Fp8Context ctx;
  prepare_fp8(*model, ctx, Fp8Layers::All);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  GradScaler scaler({.init_scale = 1.0, .mode = ScaleMode::Static});
  const std::vector<double> before = as_f64((*model->named_parameters().begin()).second);
  Tensor x = randn({4, 1, 28, 28}, 51);
  x.narrow(0, 2, 1).fill_(std::numeric_limits<double>::infinity());
  const Tensor y = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {4});
  Tensor loss;
  {
    Fp8Autocast f8(ctx);
    loss = cross_entropy((*model)(x), y);
  }
  scaler.scale(loss).backward();
  EXPECT_TRUE(scaler.step(opt).skipped());
  scaler.update();
  ctx.update();
  EXPECT_EQ(as_f64((*model->named_parameters().begin()).second), before);
  EXPECT_EQ((*ctx.layers()[0])[Fp8Role::Input].nonfinite(), 1);
  EXPECT_EQ((*ctx.layers()[0])[Fp8Role::Input].scale_value(), 1.0f);
}

TEST(Fp8Linear, LargeFiniteValuesSaturateInsteadOfOverflowing) {
  Fp8Context ctx({.recipe = Fp8Recipe::Delayed});
  auto st = ctx.add_layer("l");
  (*st)[Fp8Role::Input].set_scale(1000.0f);  // a late scale: x * scale > 448
  const Tensor x = Tensor::full({2, 4}, 1.0f);
  const Tensor w = Tensor::full({1, 4}, 1.0f);
  const Tensor y = fp8_linear(x, w, Tensor(), *st, ctx.options());
  // x quantizes to 448 (saturated), times 1/1000: 4 * 0.448
  for (double v : as_f64(y))
    EXPECT_NEAR(v, 4 * 0.448, 1e-6);
}

// ---- the rowwise recipes, power-of-two scales, the fast accumulator ---------------------------

// The float64 sum over k < n of a[a0 + k * as] * b[b0 + k * bs], and the sum of |terms| (the
// error bound's scale).
struct Dot {
  double sum = 0, mag = 0;
};
Dot dot(const std::vector<double>& a, int64_t a0, int64_t as, const std::vector<double>& b,
        int64_t b0, int64_t bs, int64_t n) {
  Dot d;
  for (int64_t k = 0; k < n; ++k) {
    const double t = a[size_t(a0 + k * as)] * b[size_t(b0 + k * bs)];
    d.sum += t;
    d.mag += std::fabs(t);
  }
  return d;
}

// dst (rows, K) in float64: each row of t quantized on its own, per tensor, by `rule`, and
// dequantized: what a scale per row along K must give.
std::vector<double> per_row_values(const Tensor& t, DType dtype, Fp8ScaleRule rule) {
  std::vector<double> out;
  for (int64_t r = 0; r < t.size(0); ++r) {
    const Fp8Tensor q = fp8_quantize(t.narrow(0, r, 1), dtype, {0, 0, rule, 1});
    for (double v : as_f64(fp8_dequantize(q)))
      out.push_back(v);
  }
  return out;
}

// rowwise: y = x W^T from x and W quantized a row at a time with power-of-two scales (E4M3
// both), each row on its own against fp8_quantize per tensor; the sum to fp32's rounding.
TEST(Fp8Rowwise, TheForwardQuantizesEachRowOfBothOperandsOnItsOwn) {
  const int64_t M = 9, K = 200, N = 7;
  const Tensor x = randn({M, K}, 61, 2.0), w = randn({N, K}, 62, 0.05);
  // Rows a thousand times apart: one scale per tensor would flush the small rows' values.
  x.narrow(0, 3, 1).mul_(1e-3);
  Fp8Options o{.recipe = Fp8Recipe::Rowwise};
  EXPECT_EQ(o.resolved_format(), Fp8Format::E4M3);
  EXPECT_TRUE(o.resolved_pow2_scales());
  Fp8Context ctx(o);
  auto st = ctx.add_layer("l");
  const std::vector<double> y = as_f64(fp8_linear(x, w, Tensor(), *st, o));
  const std::vector<double> xv = per_row_values(x, DType::FP8_E4M3, Fp8ScaleRule::AmaxPow2);
  const std::vector<double> wv = per_row_values(w, DType::FP8_E4M3, Fp8ScaleRule::AmaxPow2);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const Dot want = dot(xv, m * K, 1, wv, n * K, 1, K);
      EXPECT_NEAR(y[size_t(m * N + n)], want.sum, want.mag * K * 0x1p-24) << m << ", " << n;
    }
  }
  // The scale of the last quantization is a power of two.
  const float s = (*st)[Fp8Role::Weight].last_scale();
  EXPECT_EQ(std::exp2(std::round(std::log2(s))), s);
}

// rowwise_with_gw_hp: dW is the bf16 GEMM of dy^T and x with fp32 sums (no fp8), dx is dy
// quantized per row against W quantized per tensor, both E4M3 with fp32 scales.
TEST(Fp8Rowwise, WithGwHpTheWeightGradientIsBf16AndTheInputGradientUsesATensorScale) {
  const int64_t M = 24, K = 40, N = 9;
  const Tensor x0 = randn({M, K}, 63), w0 = randn({N, K}, 64, 0.1), gy0 = randn({M, N}, 65, 1e-2);
  Fp8Options o{.recipe = Fp8Recipe::RowwiseGwHp};
  EXPECT_FALSE(o.resolved_pow2_scales());
  Fp8Context ctx(o);
  auto st = ctx.add_layer("l");
  Tensor x = x0.to(DType::BF16).set_requires_grad(true);
  Tensor w = w0.clone().set_requires_grad(true);
  Tensor y;
  {
    Autocast ac(Device::cpu(), DType::BF16);
    y = fp8_linear(x, w, Tensor(), *st, o);
  }
  const Tensor gy = gy0.to(DType::BF16);
  y.backward(gy);
  // dW (N, K) = sum over m of bf16(dy)[m, n] * x[m, k], in float64, against the fp32 result.
  const std::vector<double> gv = as_f64(gy), xv = as_f64(x.detach());
  const std::vector<double> dw = as_f64(w.grad());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const Dot want = dot(gv, n, N, xv, k, K, M);
      ASSERT_NEAR(dw[size_t(n * K + k)], want.sum, want.mag * M * 0x1p-24) << n << ", " << k;
    }
  }
  // dx (M, K) = sum over n of q(dy)[m, n] * q(W)[n, k]: dy per row, W per tensor.
  const std::vector<double> qg = per_row_values(gy, DType::FP8_E4M3, Fp8ScaleRule::Amax);
  const std::vector<double> qw =
      as_f64(fp8_dequantize(fp8_quantize(w0, DType::FP8_E4M3, {0, 0, Fp8ScaleRule::Amax, 1})));
  const std::vector<double> dx = as_f64(x.grad());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      const double want = dot(qg, m * N, 1, qw, k, K, N).sum;
      // One bf16 rounding of the fp32 sum.
      ASSERT_NEAR(dx[size_t(m * K + k)], want, std::fabs(want) * 0x1p-8 + 1e-12) << m << ", " << k;
    }
  }
}

TEST(Fp8Options, PowerOfTwoScalesWhereTheRecipeHasThem) {
  EXPECT_FALSE(Fp8Options{.recipe = Fp8Recipe::Current}.resolved_pow2_scales());
  EXPECT_TRUE(Fp8Options{.recipe = Fp8Recipe::MXFP8}.resolved_pow2_scales());
  EXPECT_EQ(Fp8Options{.recipe = Fp8Recipe::Current}.resolved_format(), Fp8Format::Hybrid);
  EXPECT_EQ(
      (Fp8Options{.recipe = Fp8Recipe::Rowwise, .format = Fp8Format::Hybrid}.resolved_format()),
      Fp8Format::Hybrid);
  // Current with power-of-two scales: the scale it used is one.
  Fp8Options o{.recipe = Fp8Recipe::Current, .pow2_scales = true};
  Fp8Context ctx(o);
  auto st = ctx.add_layer("l");
  fp8_linear(randn({4, 16}, 66, 3.0), randn({5, 16}, 67), Tensor(), *st, o);
  const float s = (*st)[Fp8Role::Input].last_scale();
  EXPECT_EQ(std::exp2(std::round(std::log2(s))), s);
  EXPECT_LE((*st)[Fp8Role::Input].last_amax() * s, 448.0f);
  // Delayed scaling has no power-of-two rule; MXFP8's E8M0 scales have no other.
  EXPECT_HAS(
      testing::error_of([] { Fp8Context({.recipe = Fp8Recipe::Delayed, .pow2_scales = true}); }),
      "delayed scaling takes its scales from the amax history");
  EXPECT_HAS(
      testing::error_of([] { Fp8Context({.recipe = Fp8Recipe::MXFP8, .pow2_scales = false}); }),
      "powers of two by definition");
}

TEST(Fp8Options, AccumulationParsesAndPrintsBack) {
  for (const char* text : {"fp32", "fast", "fast:1", "fast:128", "native"})
    EXPECT_EQ(Fp8Accumulation::parse(text).str(), text);
  EXPECT_EQ(Fp8Accumulation::parse("fast:128"), (Fp8Accumulation{true, 128}));
  EXPECT_EQ(Fp8Accumulation::parse("native"), (Fp8Accumulation{true, 0, true}));
  for (const char* bad :
       {"fast:0", "fast:", "fast:12x", "fast:-3", "slow", "FP32", "", "native:128"})
    EXPECT_HAS(testing::error_of([bad] { Fp8Accumulation::parse(bad); }),
               "--fp8-accumulate takes fp32, fast")
        << bad;
  // The GPU's own accumulation has no promotion interval to set.
  EXPECT_HAS(testing::error_of([] {
               Fp8Context({.accumulate = Fp8Accumulation{true, 128, true}});
             }),
             "native accumulation is the GPU's own");
}

// The fast accumulator in a Linear: K = 20000 equal products of 448 * 448 (ones scaled to E4M3's
// max) swamp the 13-bit accumulator about halfway (its last place passes twice the product near
// 2^31), so the output falls short by about half; promoted every 128 products the partial sums
// are exact and the output is fp32's (20000, to the rounding of the scales).
TEST(Fp8Accumulate, FastSwampsALongSumAndPromotionRestoresIt) {
  const Tensor x = Tensor::full({2, 20000}, 1.0), w = Tensor::full({3, 20000}, 1.0);
  auto run = [&](const char* accumulate) {
    Fp8Options o{.recipe = Fp8Recipe::Current, .accumulate = Fp8Accumulation::parse(accumulate)};
    Fp8Context ctx(o);
    auto st = ctx.add_layer("l");
    return as_f64(fp8_linear(x, w, Tensor(), *st, o));
  };
  for (double v : run("fp32"))
    EXPECT_NEAR(v, 20000, 20000 * 1e-6);
  for (double v : run("fast:128"))
    EXPECT_NEAR(v, 20000, 20000 * 1e-6);
  const std::vector<double> fast = run("fast");
  for (double v : fast) {
    EXPECT_LT(v, 0.6 * 20000);
    EXPECT_GT(v, 0.4 * 20000);
  }
  // The CPU has no fp8 tensor cores: native is the model, and says so once.
  reset_warnings();
  EXPECT_EQ(run("native"), fast);
  EXPECT_EQ(warning_count("fp8:native-accumulate:modelled"), 1);  // the one GEMM, forward
}

// ---- prepare_fp8 and the region
// ------------------------------------------------------------------

TEST(Fp8Prepare, InnerKeepsTheFirstAndLastLinearAndTheRegionSwitchesFp8On) {
  auto model = nn::make_model("mlp", {.seed = 1});
  Fp8Context ctx;
  const std::vector<std::string> names = prepare_fp8(*model, ctx, Fp8Layers::Inner);
  int linears = 0;
  for (auto& [path, m] : model->named_modules())
    linears += dynamic_cast<nn::Linear*>(m) != nullptr;
  ASSERT_GE(linears, 3);
  EXPECT_EQ(int(names.size()), linears - 2);
  const Tensor x = randn({4, 1, 28, 28}, 41);
  const Tensor plain = (*model)(x);
  Tensor in_region;
  {
    Fp8Autocast f8(ctx);
    EXPECT_EQ(fp8_context(), &ctx);
    in_region = (*model)(x);
    {
      Fp8Autocast off(ctx, false);
      EXPECT_EQ(fp8_context(), nullptr);
    }
  }
  EXPECT_EQ(fp8_context(), nullptr);
  EXPECT_GT(rel_err(in_region, plain), 1e-4);  // the inner layers ran in fp8
  EXPECT_GT((*ctx.layers()[0])[Fp8Role::Input].quantizations, 0);
  Fp8Context all;
  auto m2 = nn::make_model("mlp", {.seed = 1});
  EXPECT_EQ(int(prepare_fp8(*m2, all, Fp8Layers::All).size()), linears);
  nn::Linear single(4, 4, 1);  // one Linear: Inner would keep it in bf16 and have nothing to do
  Fp8Context c3;
  EXPECT_THROW(prepare_fp8(single, c3, Fp8Layers::Inner), Error);
  EXPECT_EQ(prepare_fp8(single, c3, Fp8Layers::All).size(), 1u);
}

TEST(Fp8Options, NamesParseBack) {
  for (Fp8Recipe r : all_words<Fp8Recipe>())
    EXPECT_EQ(find_word<Fp8Recipe>(name_of(r)), r);
  EXPECT_FALSE(find_word<Fp8Recipe>("tensorwise").has_value());
  EXPECT_EQ(find_word<Fp8Format>("e4m3"), Fp8Format::E4M3);
  EXPECT_EQ(fp8_dtype(Fp8Format::Hybrid, Fp8Role::GradOutput), DType::FP8_E5M2);
  EXPECT_EQ(fp8_dtype(Fp8Format::E4M3, Fp8Role::GradOutput), DType::FP8_E4M3);
  EXPECT_THROW(Fp8Context({.amax_history_len = 0}), Error);
}

}  // namespace
}  // namespace mantissa::amp
