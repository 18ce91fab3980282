// The CUDA GEMM (cuBLASLt), convolution (cuDNN), pooling and indexing kernels against the CPU
// backend (the reference semantics), for f32 (strict and TF32), f16, bf16 and f64, on odd sizes,
// batched, broadcast, transposed and strided operands, with outputs pre-filled with NaN so that
// an unwritten element shows. Tolerances follow each dtype's epsilon and the length of the sums.
// The host-side layout and window arithmetic (blas.h, pool_windows.h) is tested everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/blas.h"
#include "backend/cuda/pool_windows.h"
#include "backend/cuda_test_util.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa {
namespace {

using backend::Backend;
using backend::Conv2dParams;
using backend::MatmulOptions;
using backend::Pool2dParams;
using backend::cuda::LtOperand;
using backend::cuda::PoolRange;

// ---- host code: runs everywhere ---------------------------------------------------------------

// Every element (r, c) of a row-major view is where lt_operand's column-major description says
// element (c, r) of the transposed matrix is.
TEST(CudaBlasLayout, OperandsAddressEveryElementAsTheView) {
  std::mt19937 rng(7);
  int plain = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t R = 1 + int64_t(rng() % 6), C = 1 + int64_t(rng() % 6);
    const int64_t pad = int64_t(rng() % 3);
    int64_t sr = 0, sc = 0;
    switch (rng() % 3) {
      case 0:  // row-major, maybe padded rows
        sc = 1;
        sr = C + pad;
        break;
      case 1:  // column-major (a transposed view)
        sr = 1;
        sc = R + pad;
        break;
      default:  // neither: a stepped slice
        sr = 2 * C + 1 + pad;
        sc = 2;
    }
    LtOperand o;
    const bool ok = backend::cuda::lt_operand(R, C, sr, sc, o);
    const bool expect_ok = sc == 1 || sr == 1 || R == 1 || C == 1;
    ASSERT_EQ(ok, expect_ok) << R << "x" << C << " strides " << sr << "," << sc;
    if (!ok) continue;
    ++plain;
    ASSERT_GE(o.ld, std::max<int64_t>(o.rows, 1));
    ASSERT_EQ(o.rows * o.cols, R * C);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < C; ++c) {
        // op(stored)(c, r): stored (c, r) as-is, stored (r, c) when transposed.
        const int64_t at = o.transpose ? r + c * o.ld : c + r * o.ld;
        ASSERT_EQ(at, r * sr + c * sc) << R << "x" << C << " strides " << sr << "," << sc;
      }
    }
    if (o.transpose) {
      EXPECT_EQ(o.rows, R);
    } else {
      EXPECT_EQ(o.rows, C);
    }
  }
  EXPECT_GT(plain, 1000);
}

TEST(CudaPoolWindows, CoveringOutputsAreExactlyTheWindowsContainingTheInput) {
  for (int64_t n = 1; n <= 9; ++n) {
    for (int64_t k = 1; k <= 4; ++k) {
      for (int64_t s = 1; s <= 3; ++s) {
        for (int64_t p = 0; p <= k / 2; ++p) {
          const int64_t n_out = (n + 2 * p - k) / s + 1;
          if (n_out <= 0) continue;
          for (int64_t i = 0; i < n; ++i) {
            const PoolRange r = backend::cuda::pool_covering(i, s, p, k, n_out);
            for (int64_t o = 0; o < n_out; ++o) {
              const PoolRange w = backend::cuda::pool_window(o, s, p, k, n);
              const bool covers = w.begin <= i && i < w.end;
              ASSERT_EQ(covers, r.begin <= o && o < r.end)
                  << "n=" << n << " k=" << k << " s=" << s << " p=" << p << " i=" << i
                  << " o=" << o;
            }
          }
        }
      }
    }
  }
}

TEST(CudaPoolWindows, AdaptiveCoveringMatchesBruteForce) {
  for (int64_t n = 1; n <= 12; ++n) {
    for (int64_t m = 1; m <= 12; ++m) {
      for (int64_t i = 0; i < n; ++i) {
        const PoolRange r = backend::cuda::adaptive_pool_covering(i, n, m);
        ASSERT_LT(r.begin, r.end);
        for (int64_t o = 0; o < m; ++o) {
          const PoolRange w = backend::cuda::adaptive_pool_window(o, n, m);
          ASSERT_EQ(w.begin <= i && i < w.end, r.begin <= o && o < r.end)
              << "n=" << n << " m=" << m << " i=" << i << " o=" << o;
        }
      }
    }
  }
}

TEST(CudaPoolWindows, AverageDivisorFollowsPyTorch) {
  // 5 inputs, kernel 3, stride 2, padding 1: windows [-1, 2), [1, 4), [3, 6) cut to 5 + 1.
  EXPECT_EQ(backend::cuda::pool_avg_divisor(0, 0, 5, 1, 3, 1, 2, 1, 1, 0, true), 3);
  EXPECT_EQ(backend::cuda::pool_avg_divisor(2, 0, 5, 1, 3, 1, 2, 1, 1, 0, true), 3);
  EXPECT_EQ(backend::cuda::pool_avg_divisor(0, 0, 5, 1, 3, 1, 2, 1, 1, 0, false), 2);
  EXPECT_EQ(backend::cuda::pool_avg_divisor(2, 0, 5, 1, 3, 1, 2, 1, 1, 0, false), 2);
  // 4 inputs, kernel 3, stride 2, padding 1: the last window [3, 6) is cut to [3, 5).
  EXPECT_EQ(backend::cuda::pool_avg_divisor(2, 0, 4, 1, 3, 1, 2, 1, 1, 0, true), 2);
}

// ---- GPU against CPU ----------------------------------------------------------------------------

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Backend& gpu() {
  return backend::backend_for(Device::cuda());
}
Backend& cpu() {
  return backend::cpu_backend();
}

double eps_of(DType dt) {
  switch (dt) {
    case DType::F64:
      return std::ldexp(1.0, -52);
    case DType::F32:
      return std::ldexp(1.0, -23);
    case DType::F16:
      return std::ldexp(1.0, -10);
    case DType::BF16:
      return std::ldexp(1.0, -7);
    default:
      return 1.0;
  }
}

std::string name_of(DType dt) {
  return std::string(dtype_name(dt));
}

constexpr double kTf32Eps = 0x1p-10;

Tensor rand_tensor(const Shape& shape, DType dt, uint64_t seed) {
  return Tensor::uniform(shape, -1.0, 1.0, seed, dt);
}

Tensor nan_filled(const Shape& shape, DType dt, Device device = Device::cuda()) {
  return Tensor::full(shape, kNaN, dt, device);
}

std::vector<double> values(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::F64).contiguous().to_vector<double>();
}

// |gpu - cpu| <= atol + rtol * |cpu| everywhere, NaN only where the CPU has NaN.
void expect_close(const Tensor& g, const Tensor& c, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(g.shape(), c.shape()) << what;
  const std::vector<double> gv = values(g), cv = values(c);
  int bad = 0;
  for (size_t i = 0; i < gv.size() && bad < 5; ++i) {
    const bool ok = std::isnan(cv[i]) ? std::isnan(gv[i])
                                      : std::abs(gv[i] - cv[i]) <= atol + rtol * std::abs(cv[i]);
    if (!ok) {
      ADD_FAILURE() << what << ": element " << i << " gpu " << gv[i] << " cpu " << cv[i]
                    << " (atol " << atol << ", rtol " << rtol << ")";
      ++bad;
    }
  }
}

void expect_equal(const Tensor& g, const Tensor& c, const std::string& what) {
  expect_close(g, c, 0.0, 0.0, what);
}

// ---- matmul

// A (B, R, C) operand in one of the layouts the GEMM must take, equal on both devices.
enum class Layout { Contiguous, Transposed, Stepped, Broadcast };

struct Operands {
  Tensor cpu, gpu;
};

Operands operand(int64_t B, int64_t R, int64_t C, Layout layout, DType dt, uint64_t seed) {
  Tensor base;
  switch (layout) {
    case Layout::Contiguous:
      base = rand_tensor({B, R, C}, dt, seed);
      return {base, base.to(Device::cuda())};
    case Layout::Transposed:
      base = rand_tensor({B, C, R}, dt, seed);
      return {base.transpose(1, 2), base.to(Device::cuda()).transpose(1, 2)};
    case Layout::Stepped:  // no unit stride: the GEMM copies first
      base = rand_tensor({B, R, 2 * C}, dt, seed);
      return {base.slice(2, 0, 2 * C, 2), base.to(Device::cuda()).slice(2, 0, 2 * C, 2)};
    case Layout::Broadcast:  // one matrix repeated over the batch with stride 0
      base = rand_tensor({1, R, C}, dt, seed);
      return {base.expand({B, R, C}), base.to(Device::cuda()).expand({B, R, C})};
  }
  return {};
}

struct MatmulCase {
  int64_t B, M, K, N;
  Layout la, lb;
  bool bias;
};

void check_matmul(const MatmulCase& mc, DType dt, Format rounding, uint64_t seed) {
  const Operands a = operand(mc.B, mc.M, mc.K, mc.la, dt, seed);
  const Operands b = operand(mc.B, mc.K, mc.N, mc.lb, dt, seed + 1);
  const Tensor bias = rand_tensor({mc.N}, dt, seed + 2);
  const Tensor bias_g = bias.to(Device::cuda());
  MatmulOptions opt;
  opt.input_rounding = rounding;
  Tensor out_c = Tensor::empty({mc.B, mc.M, mc.N}, dt);
  Tensor out_g = nan_filled({mc.B, mc.M, mc.N}, dt);
  cpu().matmul(a.cpu, b.cpu, mc.bias ? &bias : nullptr, out_c, opt);
  gpu().matmul(a.gpu, b.gpu, mc.bias ? &bias_g : nullptr, out_g, opt);
  // Sums of K products of values in [-1, 1]: the accumulation order differs, and the output is
  // rounded once into dt (TF32 rounds the inputs too).
  const double in_eps = (dt == DType::F32 && rounding == Format::TF32) ? kTf32Eps : eps_of(dt);
  const double sum_eps = dt == DType::F64 ? eps_of(dt) : eps_of(DType::F32);
  const double atol = 4 * std::sqrt(double(mc.K) + 1) * std::max(in_eps, 16 * sum_eps);
  const double rtol = 2 * eps_of(dt);
  expect_close(out_g, out_c, atol, rtol,
               std::string("matmul ") + name_of(dt) + (rounding == Format::TF32 ? " tf32" : "") +
                   " B=" + std::to_string(mc.B) + " M=" + std::to_string(mc.M) +
                   " K=" + std::to_string(mc.K) + " N=" + std::to_string(mc.N) + " layouts " +
                   std::to_string(int(mc.la)) + "," + std::to_string(int(mc.lb)) +
                   (mc.bias ? " +bias" : ""));
}

const std::vector<MatmulCase>& matmul_cases() {
  static const std::vector<MatmulCase> cases = {
      {1, 37, 64, 29, Layout::Contiguous, Layout::Contiguous, false},
      {1, 37, 64, 29, Layout::Contiguous, Layout::Contiguous, true},  // the bias epilogue
      {1, 64, 48, 32, Layout::Transposed, Layout::Transposed, true},
      {3, 17, 33, 9, Layout::Contiguous, Layout::Contiguous, false},  // strided batched
      {3, 17, 33, 9, Layout::Contiguous, Layout::Transposed, true},   // batched bias (beta = 1)
      {4, 13, 20, 11, Layout::Broadcast, Layout::Contiguous, false},  // broadcast batch of a
      {4, 13, 20, 11, Layout::Transposed, Layout::Broadcast, true},   // ... and of b
      {2, 9, 15, 7, Layout::Stepped, Layout::Contiguous, false},      // copied first
      {2, 9, 15, 7, Layout::Transposed, Layout::Stepped, true},
      {1, 1, 40, 1, Layout::Contiguous, Layout::Transposed, false},  // a dot product
      {2, 5, 1, 6, Layout::Contiguous, Layout::Contiguous, true},    // K = 1: outer products
      {1, 128, 256, 96, Layout::Contiguous, Layout::Transposed, true},
  };
  return cases;
}

TEST(CudaMatmul, MatchesTheCpuInEveryDtypeAndLayout) {
  MT_REQUIRE_CUDA();
  uint64_t seed = 100;
  for (const MatmulCase& mc : matmul_cases()) {
    for (const DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
      check_matmul(mc, dt, Format::FP32, seed += 3);
    }
    check_matmul(mc, DType::F32, Format::TF32, seed += 3);
  }
}

TEST(CudaMatmul, StrictFp32IsMoreAccurateThanTf32) {
  MT_REQUIRE_CUDA();
  // Against an f64 product: strict fp32 must be far inside TF32's error, or the compute types
  // are swapped.
  const Tensor a = rand_tensor({1, 64, 512}, DType::F32, 1),
               b = rand_tensor({1, 512, 64}, DType::F32, 2);
  Tensor ref = Tensor::empty({1, 64, 64}, DType::F64);
  cpu().matmul(a.to(DType::F64), b.to(DType::F64), nullptr, ref, MatmulOptions{});
  auto max_err = [&](Format rounding) {
    Tensor out = nan_filled({1, 64, 64}, DType::F32);
    gpu().matmul(a.to(Device::cuda()), b.to(Device::cuda()), nullptr, out, MatmulOptions{rounding});
    const std::vector<double> g = values(out), r = values(ref);
    double e = 0;
    for (size_t i = 0; i < g.size(); ++i)
      e = std::max(e, std::abs(g[i] - r[i]));
    return e;
  };
  const double strict = max_err(Format::FP32), tf32 = max_err(Format::TF32);
  EXPECT_LT(strict, 1e-4);
  EXPECT_GT(tf32, 4 * strict);
}

TEST(CudaMatmul, EmptySumsAndFp8Inputs) {
  MT_REQUIRE_CUDA();
  // K = 0: the output is the bias (or zeros).
  const Tensor a = Tensor::empty({2, 3, 0}, DType::F32, Device::cuda());
  const Tensor b = Tensor::empty({2, 0, 4}, DType::F32, Device::cuda());
  const Tensor bias = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {4}).to(Device::cuda());
  Tensor out = nan_filled({2, 3, 4}, DType::F32);
  gpu().matmul(a, b, &bias, out, MatmulOptions{});
  const std::vector<double> v = values(out);
  for (size_t i = 0; i < v.size(); ++i)
    EXPECT_EQ(v[i], double(i % 4 + 1));
  gpu().matmul(a, b, nullptr, out, MatmulOptions{});
  for (double x : values(out))
    EXPECT_EQ(x, 0.0);
  // fp8 runs as rounded f32 copies, exactly as the CPU emulates it.
  const Tensor a8 = rand_tensor({1, 8, 16}, DType::FP8_E4M3, 5),
               b8 = rand_tensor({1, 16, 8}, DType::FP8_E4M3, 6);
  Tensor oc = Tensor::empty({1, 8, 8}, DType::FP8_E4M3),
         og = nan_filled({1, 8, 8}, DType::FP8_E4M3);
  cpu().matmul(a8, b8, nullptr, oc, MatmulOptions{});
  gpu().matmul(a8.to(Device::cuda()), b8.to(Device::cuda()), nullptr, og, MatmulOptions{});
  expect_close(og, oc, 0x1p-9, 0.125, "fp8 matmul");  // at most one fp8 rounding apart
}

#ifdef MANTISSA_HAS_CUDA
TEST(CudaMatmul, GeluEpilogueMatchesMatmulThenGeluTanh) {
  MT_REQUIRE_CUDA();
  for (const DType dt : {DType::F32, DType::F16, DType::BF16}) {
    const Tensor a = rand_tensor({1, 33, 40}, dt, 11), b = rand_tensor({1, 40, 24}, dt, 12);
    const Tensor bias = rand_tensor({24}, dt, 13);
    Tensor pre_c = Tensor::empty({1, 33, 24}, dt), ref = Tensor::empty({1, 33, 24}, dt);
    cpu().matmul(a, b, &bias, pre_c, MatmulOptions{});
    cpu().unary(backend::UnaryOp::GeluTanh, pre_c, ref, {});
    const Tensor ag = a.to(Device::cuda()), bg = b.to(Device::cuda()).transpose(1, 2).contiguous();
    Tensor out = nan_filled({1, 33, 24}, dt), pre = nan_filled({1, 33, 24}, dt);
    // b as a transposed view of a contiguous (N, K) weight, as Linear passes it.
    if (!backend::cuda::matmul_bias_gelu(ag, bg.transpose(1, 2), bias.to(Device::cuda()), out, &pre,
                                         MatmulOptions{})) {
      ADD_FAILURE() << "no GELU epilogue for " << name_of(dt);
      continue;
    }
    const double tol = 8 * std::sqrt(41.0) * std::max(eps_of(dt), 16 * eps_of(DType::F32));
    expect_close(pre, pre_c, tol, 2 * eps_of(dt), std::string("pre-gelu ") + name_of(dt));
    // cuBLASLt evaluates tanh with its own fast approximation: 1e-3 absolute on top.
    expect_close(out, ref, tol + 1e-3, 4 * eps_of(dt), std::string("gelu epilogue ") + name_of(dt));
  }
}
#endif

// ---- conv2d

struct ConvCase {
  int64_t N, C, H, W, K, kh, kw;
  Conv2dParams p;
};

Conv2dParams conv_params(int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                         int64_t groups) {
  Conv2dParams p;
  p.stride[0] = sh;
  p.stride[1] = sw;
  p.padding[0] = ph;
  p.padding[1] = pw;
  p.dilation[0] = dh;
  p.dilation[1] = dw;
  p.groups = groups;
  return p;
}

void check_conv(const ConvCase& cc, DType dt, Format rounding, uint64_t seed) {
  const Conv2dParams& p = cc.p;
  const int64_t OH = (cc.H + 2 * p.padding[0] - p.dilation[0] * (cc.kh - 1) - 1) / p.stride[0] + 1;
  const int64_t OW = (cc.W + 2 * p.padding[1] - p.dilation[1] * (cc.kw - 1) - 1) / p.stride[1] + 1;
  const Tensor x = rand_tensor({cc.N, cc.C, cc.H, cc.W}, dt, seed);
  const Tensor w = rand_tensor({cc.K, cc.C / p.groups, cc.kh, cc.kw}, dt, seed + 1);
  const Tensor bias = rand_tensor({cc.K}, dt, seed + 2);
  const Tensor gy = rand_tensor({cc.N, cc.K, OH, OW}, dt, seed + 3);
  const MatmulOptions opt{rounding};
  const std::string what = std::string(name_of(dt)) + (rounding == Format::TF32 ? " tf32" : "") +
                           " x(" + std::to_string(cc.N) + "," + std::to_string(cc.C) + "," +
                           std::to_string(cc.H) + "," + std::to_string(cc.W) + ") groups " +
                           std::to_string(p.groups);
  const double in_eps = (dt == DType::F32 && rounding == Format::TF32) ? kTf32Eps : eps_of(dt);
  const double sum_eps = dt == DType::F64 ? eps_of(dt) : eps_of(DType::F32);
  auto tol = [&](int64_t terms) {
    return 4 * std::sqrt(double(terms) + 1) * std::max(in_eps, 16 * sum_eps);
  };
  const double rtol = 2 * eps_of(dt);

  Tensor yc = Tensor::empty({cc.N, cc.K, OH, OW}, dt), yg = nan_filled({cc.N, cc.K, OH, OW}, dt);
  const Tensor bias_g = bias.to(Device::cuda());
  cpu().conv2d(x, w, &bias, yc, p, opt);
  gpu().conv2d(x.to(Device::cuda()), w.to(Device::cuda()), &bias_g, yg, p, opt);
  expect_close(yg, yc, tol(cc.C / p.groups * cc.kh * cc.kw), rtol, "conv2d forward " + what);

  Tensor gxc = Tensor::empty(x.shape(), dt), gwc = Tensor::empty(w.shape(), dt);
  Tensor gbc = Tensor::empty({cc.K}, dt);
  Tensor gxg = nan_filled(x.shape(), dt), gwg = nan_filled(w.shape(), dt);
  Tensor gbg = nan_filled({cc.K}, dt);
  cpu().conv2d_backward(gy, x, w, &gxc, &gwc, &gbc, p, opt);
  // x as a non-contiguous view: the kernel makes its own contiguous copy.
  const Tensor xg = x.to(Device::cuda()).transpose(2, 3).contiguous().transpose(2, 3);
  gpu().conv2d_backward(gy.to(Device::cuda()), xg, w.to(Device::cuda()), &gxg, &gwg, &gbg, p, opt);
  expect_close(gxg, gxc, tol(cc.K / p.groups * cc.kh * cc.kw), rtol, "conv2d grad_x " + what);
  expect_close(gwg, gwc, tol(cc.N * OH * OW), rtol, "conv2d grad_w " + what);
  expect_close(gbg, gbc, tol(cc.N * OH * OW), rtol, "conv2d grad_bias " + what);

  // Each gradient alone, with a broadcast stand-in for the operand it does not read (as the op
  // layer passes it).
  Tensor gx_only = nan_filled(x.shape(), dt);
  const Tensor stand_in = Tensor::zeros({}, dt, Device::cuda()).expand(x.shape());
  gpu().conv2d_backward(gy.to(Device::cuda()), stand_in, w.to(Device::cuda()), &gx_only, nullptr,
                        nullptr, p, opt);
  expect_close(gx_only, gxc, tol(cc.K / p.groups * cc.kh * cc.kw), rtol, "grad_x alone " + what);
}

TEST(CudaConv2d, MatchesTheCpuForwardAndBackward) {
  MT_REQUIRE_CUDA();
  const std::vector<ConvCase> cases = {
      {2, 3, 9, 11, 5, 3, 3, conv_params(1, 1, 1, 1, 1, 1, 1)},
      {2, 4, 9, 11, 6, 3, 2, conv_params(2, 1, 1, 0, 1, 2, 2)},   // stride, padding, dilation
      {1, 8, 12, 10, 8, 3, 3, conv_params(1, 2, 2, 1, 2, 1, 8)},  // depthwise
      {3, 6, 7, 7, 4, 1, 1, conv_params(1, 1, 0, 0, 1, 1, 2)},    // 1x1, grouped
  };
  uint64_t seed = 500;
  for (const ConvCase& cc : cases) {
    for (const DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
      check_conv(cc, dt, Format::FP32, seed += 5);
    }
    check_conv(cc, DType::F32, Format::TF32, seed += 5);
  }
}

// ---- pooling

Pool2dParams pool_params(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                         bool count_include_pad) {
  Pool2dParams p;
  p.kernel[0] = kh;
  p.kernel[1] = kw;
  p.stride[0] = sh;
  p.stride[1] = sw;
  p.padding[0] = ph;
  p.padding[1] = pw;
  p.count_include_pad = count_include_pad;
  return p;
}

int64_t pool_out(int64_t n, int64_t k, int64_t s, int64_t p) {
  return (n + 2 * p - k) / s + 1;
}

TEST(CudaPool, MaxAndAveragePoolingMatchTheCpu) {
  MT_REQUIRE_CUDA();
  const std::vector<Pool2dParams> params = {
      pool_params(2, 2, 2, 2, 0, 0, true),  // the common non-overlapping case
      pool_params(3, 3, 2, 2, 1, 1, true),  // overlapping, padded
      pool_params(3, 2, 1, 2, 1, 0, false),
      pool_params(2, 3, 3, 1, 0, 1, false),
  };
  uint64_t seed = 900;
  for (const DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (const Pool2dParams& p : params) {
      const std::string what = std::string(name_of(dt)) + " kernel " + std::to_string(p.kernel[0]) +
                               "x" + std::to_string(p.kernel[1]);
      const int64_t H = 9, W = 10;
      const Shape ys = {2, 3, pool_out(H, p.kernel[0], p.stride[0], p.padding[0]),
                        pool_out(W, p.kernel[1], p.stride[1], p.padding[1])};
      // A strided input: the kernels copy it first.
      const Tensor base = rand_tensor({2, 3, W, H}, dt, seed += 2);
      const Tensor x = base.transpose(2, 3);
      const Tensor xg = base.to(Device::cuda()).transpose(2, 3);
      const Tensor gy = rand_tensor(ys, dt, seed += 2);

      Tensor yc = Tensor::empty(ys, dt), ic = Tensor::empty(ys, DType::I64);
      Tensor yg = nan_filled(ys, dt), ig = Tensor::full(ys, -7, DType::I64, Device::cuda());
      cpu().max_pool2d(x, yc, ic, p);
      gpu().max_pool2d(xg, yg, ig, p);
      expect_equal(yg, yc, "max_pool2d " + what);
      expect_equal(ig, ic, "max_pool2d indices " + what);

      Tensor gxc = Tensor::empty(x.shape(), dt), gxg = nan_filled(x.shape(), dt);
      cpu().max_pool2d_backward(gy, ic, gxc);
      gpu().max_pool2d_backward(gy.to(Device::cuda()), ig, gxg);
      // Overlapping windows add up to 4 values; the atomics' order may differ.
      expect_close(gxg, gxc, 4 * eps_of(dt == DType::F64 ? dt : DType::F32), eps_of(dt),
                   "max_pool2d_backward " + what);

      Tensor ac = Tensor::empty(ys, dt), ag = nan_filled(ys, dt);
      cpu().avg_pool2d(x, ac, p);
      gpu().avg_pool2d(xg, ag, p);
      expect_close(ag, ac, 0, eps_of(dt), "avg_pool2d " + what);  // the same order of sums

      Tensor gac = Tensor::empty(x.shape(), dt), gag = nan_filled(x.shape(), dt);
      cpu().avg_pool2d_backward(gy, gac, p);
      gpu().avg_pool2d_backward(gy.to(Device::cuda()), gag, p);
      expect_close(gag, gac, 0, eps_of(dt), "avg_pool2d_backward " + what);
    }
  }
}

TEST(CudaPool, MaxPoolingKeepsTheFirstMaximumAndTheFirstNaN) {
  MT_REQUIRE_CUDA();
  // One 2x4 plane, 2x2 windows: ties and NaNs decide the index.
  const Tensor x =
      Tensor::from_vector(std::vector<double>{1, 1, kNaN, 2, 1, 0, 5, kNaN}, {1, 1, 2, 4});
  const Pool2dParams p = pool_params(2, 2, 2, 2, 0, 0, true);
  Tensor yc = Tensor::empty({1, 1, 1, 2}), ic = Tensor::empty({1, 1, 1, 2}, DType::I64);
  Tensor yg = nan_filled({1, 1, 1, 2}, DType::F32);
  Tensor ig = Tensor::full({1, 1, 1, 2}, -1, DType::I64, Device::cuda());
  cpu().max_pool2d(x, yc, ic, p);
  gpu().max_pool2d(x.to(Device::cuda()), yg, ig, p);
  EXPECT_EQ(values(ic), (std::vector<double>{0, 2}));
  expect_equal(ig, ic, "max_pool2d tie/NaN indices");
  expect_equal(yg, yc, "max_pool2d tie/NaN values");
}

TEST(CudaPool, AdaptiveAveragePoolingMatchesTheCpu) {
  MT_REQUIRE_CUDA();
  uint64_t seed = 1300;
  for (const DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (const auto& [in_hw, out_hw] : std::vector<std::pair<Shape, Shape>>{
             {{7, 9}, {3, 4}}, {{3, 4}, {5, 7}}, {{8, 8}, {1, 1}}, {{6, 5}, {6, 5}}}) {
      const Shape xs = {2, 3, in_hw[0], in_hw[1]}, ys = {2, 3, out_hw[0], out_hw[1]};
      const Tensor x = rand_tensor(xs, dt, seed += 2), gy = rand_tensor(ys, dt, seed += 2);
      Tensor yc = Tensor::empty(ys, dt), yg = nan_filled(ys, dt);
      cpu().adaptive_avg_pool2d(x, yc);
      gpu().adaptive_avg_pool2d(x.to(Device::cuda()), yg);
      const std::string what = std::string(name_of(dt)) + " " + xs.str() + " -> " + ys.str();
      expect_close(yg, yc, 0, eps_of(dt), "adaptive_avg_pool2d " + what);
      Tensor gc = Tensor::empty(xs, dt), gg = nan_filled(xs, dt);
      cpu().adaptive_avg_pool2d_backward(gy, gc);
      gpu().adaptive_avg_pool2d_backward(gy.to(Device::cuda()), gg);
      expect_close(gg, gc, 0, eps_of(dt), "adaptive_avg_pool2d_backward " + what);
    }
  }
}

// ---- indexing

TEST(CudaIndex, SelectAndGatherMatchTheCpu) {
  MT_REQUIRE_CUDA();
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{3, 0, 3, 4, 1}, {5});
  for (const DType dt : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64}) {
    const Tensor x = dt == DType::I64 ? Tensor::arange(5 * 6 * 7).reshape({5, 6, 7})
                                      : rand_tensor({5, 6, 7}, dt, 77);
    for (int dim : {0, 2}) {
      Shape os = x.shape();
      os[dim] = 5;
      Tensor oc = Tensor::empty(os, dt), og = Tensor::full(os, -1, dt, Device::cuda());
      cpu().index_select(x, dim, idx, oc);
      gpu().index_select(x.to(Device::cuda()), dim, idx.to(Device::cuda()), og);
      expect_equal(og, oc,
                   std::string("index_select ") + name_of(dt) + " dim " + std::to_string(dim));
    }
    // gather along dim 1 with an index of another length there.
    std::vector<int64_t> gi(5 * 4 * 7);
    for (size_t i = 0; i < gi.size(); ++i)
      gi[i] = int64_t((i * 7 + 3) % 6);
    const Tensor gidx = Tensor::from_vector(gi, {5, 4, 7});
    Tensor oc = Tensor::empty({5, 4, 7}, dt), og = Tensor::full({5, 4, 7}, -1, dt, Device::cuda());
    cpu().gather(x, 1, gidx, oc);
    gpu().gather(x.to(Device::cuda()), 1, gidx.to(Device::cuda()), og);
    expect_equal(og, oc, std::string("gather ") + name_of(dt));
  }
}

TEST(CudaIndex, AddsMatchTheCpuWithRepeatedIndices) {
  MT_REQUIRE_CUDA();
  // Index 2 repeats 6 times: the atomics' order differs from the CPU's index order.
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{2, 0, 2, 2, 5, 2, 2, 1, 2}, {9});
  for (const DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    // Repeated adds round once on the GPU (fp32 accumulator) but at every add on the CPU for
    // half dtypes: up to one rounding per repeat apart.
    const double atol = 8 * eps_of(dt == DType::F64 ? dt : DType::F32) + 7 * eps_of(dt) * 4;
    for (int dim : {0, 1}) {
      Shape xs = {6, 6, 5};
      Shape gs = xs;
      gs[dim] = 9;
      const Tensor x0 = rand_tensor(xs, dt, 31), go = rand_tensor(gs, dt, 32);
      Tensor xc = x0.clone(), xg = x0.to(Device::cuda());
      cpu().index_add(xc, dim, idx, go);
      gpu().index_add(xg, dim, idx.to(Device::cuda()), go.to(Device::cuda()));
      expect_close(xg, xc, atol, 2 * eps_of(dt),
                   std::string("index_add ") + name_of(dt) + " dim " + std::to_string(dim));
    }
    // scatter_add along dim 1: every source element goes to its own index.
    std::vector<int64_t> si(6 * 8 * 5);
    for (size_t i = 0; i < si.size(); ++i)
      si[i] = int64_t((i * 5 + i / 7) % 6);
    const Tensor sidx = Tensor::from_vector(si, {6, 8, 5});
    const Tensor x0 = rand_tensor({6, 6, 5}, dt, 41), src = rand_tensor({6, 8, 5}, dt, 42);
    Tensor xc = x0.clone(), xg = x0.to(Device::cuda());
    cpu().scatter_add(xc, 1, sidx, src);
    gpu().scatter_add(xg, 1, sidx.to(Device::cuda()), src.to(Device::cuda()));
    expect_close(xg, xc, atol, 2 * eps_of(dt), std::string("scatter_add ") + name_of(dt));
  }
}

TEST(CudaIndex, OutOfRangeIndicesNeverTouchMemoryOutsideTheTensors) {
  MT_REQUIRE_CUDA();
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3}, {3}).to(Device::cuda());
  const Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 7, -1, 2}, {4}).to(Device::cuda());
  Tensor out = nan_filled({4}, DType::F32);
  gpu().index_select(x, 0, idx, out);
  EXPECT_EQ(values(out), (std::vector<double>{2, 0, 0, 3}));
  Tensor acc = Tensor::zeros({3}, DType::F32, Device::cuda());
  gpu().index_add(acc, 0, idx, Tensor::ones({4}, DType::F32, Device::cuda()));
  EXPECT_EQ(values(acc), (std::vector<double>{0, 1, 1}));
}

}  // namespace
}  // namespace mantissa
