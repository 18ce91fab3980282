// fp4_quantize and hadamard16 (backend_ops.h; the arithmetic in backend/fp4_math.h) against
// the reference algorithms of Transformer Engine's NVFP4 quantizer and the OCP MX spec, ported
// to tools/reference/fp4_golden.py, whose output is committed (tests/data/golden/
// fp4_golden.safetensors): NVFP4 1x16 and 16x16, the RHT before quantization, stochastic
// rounding with a fixed seed, MXFP4 with both scale rules — codes, block scales, amax and the
// tensor scale byte for byte (atol 0), on the CPU and, where there is one, on the GPU. Then the
// properties the recipe relies on: 16x16 blocks quantize a matrix and its transpose alike,
// stochastic rounding is unbiased and seeded, the transform keeps dot products, a given amax
// is used, and non-finite inputs show as NaN values. Last, the native FP4 GEMM's operands (the
// codes packed, the scales in cuBLASLt's swizzled layout) against the golden layout, and, on a GPU
// with FP4 tensor cores, its output against the emulation.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cpu/vector_isa.h"
#include "backend/cuda_test_util.h"
#include "backend/forced_isa.h"
#include "backend/fp4_math.h"
#include "harness/op_harness.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::backend {
namespace {

struct Quantized {
  Tensor codes, block_scales, scale_inv, amax, values;
};

Quantized quantize(const Tensor& x, const Fp4QuantizeParams& p) {
  const Device d = x.device();
  const int64_t R = x.size(0), C = x.size(1), br = p.block_rows, bc = fp4_block_cols(p.rule);
  Quantized q{Tensor::zeros({R, C}, DType::U8, d),
              Tensor::zeros({(R + br - 1) / br, (C + bc - 1) / bc}, DType::U8, d),
              Tensor::full({1}, NAN, DType::F32, d), Tensor::full({1}, NAN, DType::F32, d),
              Tensor::full({R, C}, NAN, DType::BF16, d)};
  backend_for(d).fp4_quantize(x, p, q.codes, q.block_scales, q.scale_inv, q.amax, &q.values);
  return q;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  std::vector<uint8_t> out(size_t(c.numel()) * dtype_size(c.dtype()));
  std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

std::vector<uint32_t> float_bits(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float v : t.to(Device::cpu()).to_vector<float>())
    out.push_back(std::bit_cast<uint32_t>(v));
  return out;
}

Fp4ScaleRule rule_named(const std::string& s) {
  return s == "nvfp4" ? Fp4ScaleRule::Nvfp4
                      : (s == "mx_ceil" ? Fp4ScaleRule::MxCeil : Fp4ScaleRule::MxFloor);
}

std::vector<Device> devices() {
  std::vector<Device> d{Device::cpu()};
  if (cuda::is_available()) d.push_back(Device::cuda(0));
  return d;
}

TEST(Fp4Golden, QuantizersMatchTheReferenceByteForByte) {
  const SafetensorsFile f =
      load_safetensors(std::string(MANTISSA_GOLDEN_DIR) + "/fp4_golden.safetensors");
  const nlohmann::json cases = nlohmann::json::parse(f.metadata.at("cases"));
  ASSERT_GE(cases.size(), 10u);
  for (const Device d : devices()) {
    for (const auto& [name, c] : cases.items()) {
      SCOPED_TRACE(name + " on " + d.str());
      const DType dt = c["dtype"] == "bf16" ? DType::BF16 : DType::F32;
      Tensor x = f.at(name + ".x").to(dt).to(d);
      if (c["rht"].get<bool>()) {
        // TE's columnwise path: the transform of x^T, in x's dtype.
        const Tensor xt = x.t().contiguous();
        Tensor h = Tensor::full(xt.shape(), NAN, dt, d);
        backend_for(d).hadamard16(xt, kTeWgradSigns, h);
        EXPECT_EQ(float_bits(h.to(DType::F32)), float_bits(f.at(name + ".x_t")));
        x = h;
      }
      Fp4QuantizeParams p;
      p.rule = rule_named(c["rule"]);
      p.block_rows = c["block_rows"];
      p.stochastic = c["stochastic"];
      p.seed = c["seed"];
      p.offset = c["offset"];
      const Quantized q = quantize(x, p);
      EXPECT_EQ(bytes_of(q.codes), bytes_of(f.at(name + ".codes")));
      EXPECT_EQ(bytes_of(q.block_scales), bytes_of(f.at(name + ".scales")));
      EXPECT_EQ(float_bits(q.amax), float_bits(f.at(name + ".amax")));
      EXPECT_EQ(float_bits(q.scale_inv), float_bits(f.at(name + ".scale_inv")));
      // Each value is its code's value times its block's scale, exactly.
      const std::vector<uint8_t> codes = bytes_of(q.codes), scales = bytes_of(q.block_scales);
      const std::vector<float> values = q.values.to(Device::cpu()).to_vector<float>();
      const int64_t C = x.size(1), nbc = q.block_scales.size(1), bc = fp4_block_cols(p.rule);
      int wrong = 0;
      for (size_t i = 0; i < codes.size(); ++i) {
        const int64_t r = int64_t(i) / C, col = int64_t(i) % C;
        const uint8_t s = scales[size_t((r / p.block_rows) * nbc + col / bc)];
        const float scale =
            p.rule == Fp4ScaleRule::Nvfp4 ? decode(Format::FP8_E4M3, s) : decode(Format::E8M0, s);
        wrong += values[i] != fp4_value(codes[i]) * scale;
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

// The branch-free rounding and decoding of fp4_math.h are round.h's definition: every code's
// value, and the nearest-even code of the floats around every midpoint (the ties and their
// neighbours), of a sweep over [-8, 8] and of the specials.
TEST(Fp4Math, NearestCodeAndValueAreTheFormatsDefinition) {
  for (uint32_t code = 0; code < 16; ++code)
    EXPECT_EQ(std::bit_cast<uint32_t>(fp4_value(code)),
              std::bit_cast<uint32_t>(decode(Format::FP4_E2M1, code)))
        << code;
  auto same = [](float x) {
    const float c = x > 6.0f ? 6.0f : (x < -6.0f ? -6.0f : x);
    return fp4_code(x, false, 0) == encode(Format::FP4_E2M1, c);
  };
  int wrong = 0;
  for (const float mid : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f}) {
    for (const float m : {mid, -mid}) {
      wrong += !same(m) + !same(std::nextafter(m, 0.0f)) + !same(std::nextafter(m, 10.0f * m));
    }
  }
  const uint32_t top = std::bit_cast<uint32_t>(8.0f);
  for (uint32_t b = 0; b <= top; b += 61) {
    const float x = std::bit_cast<float>(b);
    wrong += !same(x) + !same(-x);
  }
  for (const float x : {0.0f, -0.0f, 1e-45f, -1e-45f, 7.0f, -100.0f, INFINITY, -INFINITY})
    wrong += !same(x);
  EXPECT_EQ(wrong, 0);
}

// Weights are quantized in 16 x 16 blocks so that the forward GEMM (W) and the backward one
// (W^T) multiply the same values: quantizing W^T gives W's codes and scales, transposed.
TEST(Fp4Quantize, SixteenBySixteenBlocksQuantizeATransposeAlike) {
  for (const Device d : devices()) {
    const Tensor w = testing::random_f64({48, 80}, 11, -3, 3).to(DType::BF16).to(d);
    Fp4QuantizeParams p;
    p.block_rows = 16;
    const Quantized a = quantize(w, p), b = quantize(w.t().contiguous(), p);
    EXPECT_EQ(bytes_of(a.codes.t()), bytes_of(b.codes)) << d.str();
    EXPECT_EQ(bytes_of(a.block_scales.t()), bytes_of(b.block_scales)) << d.str();
    EXPECT_EQ(bytes_of(a.values.t()), bytes_of(b.values)) << d.str();
    EXPECT_EQ(float_bits(a.scale_inv), float_bits(b.scale_inv));
    // 1 x 16 blocks do not: the blocks run along the other dimension.
    p.block_rows = 1;
    EXPECT_NE(bytes_of(quantize(w, p).values.t()),
              bytes_of(quantize(w.t().contiguous(), p).values));
  }
}

// Stochastic rounding: the mean of many roundings of one value is the value; one seed and offset
// give the same codes on every device, another offset others.
TEST(Fp4Quantize, StochasticRoundingIsUnbiasedAndSeeded) {
  const int64_t n = 1 << 16;
  std::vector<float> v(size_t(n), 0.3f);
  for (int64_t i = 0; i < n; i += 32)
    v[size_t(i)] = 6.0f;  // each block's max: scale 1 in MX, so 0.3 lies between fp4's 0 and 0.5
  const Tensor x = Tensor::from_vector(v, {1, n});
  Fp4QuantizeParams p;
  p.rule = Fp4ScaleRule::MxFloor;
  p.stochastic = true;
  p.seed = 77;
  p.offset = 5;
  for (const Device d : devices()) {
    const Quantized q = quantize(x.to(d), p);
    const std::vector<float> got = q.values.to(DType::F32).to(Device::cpu()).to_vector<float>();
    double sum = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (i % 32 == 0) continue;  // the blocks' maxima
      ASSERT_TRUE(got[size_t(i)] == 0.0f || got[size_t(i)] == 0.5f) << got[size_t(i)];
      sum += got[size_t(i)];
      ++count;
    }
    const double mean = sum / double(count), sigma = std::sqrt(0.3 * 0.2 / double(count));
    EXPECT_NEAR(mean, 0.3, 5 * sigma) << d.str();
    EXPECT_EQ(bytes_of(q.codes), bytes_of(quantize(x, p).codes)) << "cpu and " << d.str();
    Fp4QuantizeParams other = p;
    other.offset = 6;
    EXPECT_NE(bytes_of(q.codes), bytes_of(quantize(x.to(d), other).codes));
  }
  // Round to nearest puts 0.3 on 0.5 every time.
  p.stochastic = false;
  const std::vector<float> nearest = quantize(x, p).values.to(DType::F32).to_vector<float>();
  EXPECT_EQ(nearest[1], 0.5f);
}

// The wgrad GEMM's inputs are transformed along its reduction dimension; the transform is
// orthogonal (diag(s) H / 4 times its transpose is I), so dot products along that dimension
// are kept: sum_k a_k b_k = sum_j T(a)_j T(b)_j, to fp32's rounding of the 16-term sums.
TEST(Hadamard16, KeepsDotProductsAlongTheTransformedDimension) {
  for (const Device d : devices()) {
    for (const uint32_t signs : {0u, kTeWgradSigns, hadamard16_signs(123)}) {
      const Tensor a = testing::random_f64({6, 64}, 21, -2, 2).to(DType::F32);
      const Tensor b = testing::random_f64({5, 64}, 22, -2, 2).to(DType::F32);
      Tensor ta = Tensor::full({6, 64}, NAN, DType::F32, d);
      Tensor tb = Tensor::full({5, 64}, NAN, DType::F32, d);
      backend_for(d).hadamard16(a.to(d), signs, ta);
      backend_for(d).hadamard16(b.to(d), signs, tb);
      const std::vector<double> want =
          matmul(a.to(DType::F64), b.to(DType::F64).t()).to_vector<double>();
      const std::vector<double> got =
          matmul(ta.to(Device::cpu()).to(DType::F64), tb.to(Device::cpu()).to(DType::F64).t())
              .to_vector<double>();
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-4) << "signs " << signs << " on " << d.str();
    }
    // Its coefficients: +-1/4, and the Sylvester matrix's first column all positive without signs.
    for (int i = 0; i < 16; ++i)
      EXPECT_EQ(hadamard16_coefficient(0, i, 0), 0.25f);
    EXPECT_EQ(hadamard16_coefficient(kTeWgradSigns, 3, 0), -0.25f);  // TE's sign 3 is -1
  }
}

// NVFP4's tensor scale from a given amax (e.g. reduced over ranks), and the MX rules' scales.
TEST(Fp4Quantize, UsesAGivenAmaxAndTheMxRules) {
  const Tensor x = Tensor::from_vector(std::vector<float>(32, 7.0f), {1, 32});
  Fp4QuantizeParams p;
  const Tensor given = Tensor::full({1}, 28.0, DType::F32);
  p.amax = &given;
  Quantized q = quantize(x, p);
  EXPECT_EQ(q.amax.item<float>(), 28.0f);
  EXPECT_EQ(q.scale_inv.item<float>(), 1.0f / (2688.0f / 28.0f));
  // MX: amax 7 -> floor rule 2^(2 - 2) = 1: 7 saturates to 6; ceil rule 2^ceil(log2(7/6)) = 2.
  p = {};
  p.rule = Fp4ScaleRule::MxFloor;
  q = quantize(x, p);
  EXPECT_EQ(bytes_of(q.block_scales)[0], 127);
  EXPECT_EQ(q.values.to(DType::F32).to_vector<float>()[0], 6.0f);
  p.rule = Fp4ScaleRule::MxCeil;
  q = quantize(x, p);
  EXPECT_EQ(bytes_of(q.block_scales)[0], 128);
  EXPECT_EQ(q.values.to(DType::F32).to_vector<float>()[0], 8.0f);
  // An all-zero block: NVFP4 scale code 0, MX 2^-127; its values zero.
  const Tensor zeros = Tensor::zeros({2, 32});
  for (const Fp4ScaleRule r : {Fp4ScaleRule::Nvfp4, Fp4ScaleRule::MxFloor}) {
    p = {};
    p.rule = r;
    q = quantize(zeros, p);
    EXPECT_EQ(bytes_of(q.block_scales)[0], 0);  // E4M3 0, or E8M0 2^-127
    for (float v : q.values.to(DType::F32).to_vector<float>())
      EXPECT_EQ(v, 0.0f);
  }
}

// An inf or NaN input: its value is NaN (so the GEMM's output and the step's gradients are not
// finite and the loss scaler skips the step), and the amax says so.
TEST(Fp4Quantize, NonFiniteInputsGiveNanValues) {
  for (const Fp4ScaleRule r : {Fp4ScaleRule::Nvfp4, Fp4ScaleRule::MxFloor, Fp4ScaleRule::MxCeil}) {
    for (const float bad : {INFINITY, NAN}) {
      std::vector<float> v(64, 1.5f);
      v[3] = bad;
      Fp4QuantizeParams p;
      p.rule = r;
      const Quantized q = quantize(Tensor::from_vector(v, {1, 64}), p);
      const std::vector<float> got = q.values.to(DType::F32).to_vector<float>();
      EXPECT_TRUE(std::isnan(got[3]));
      EXPECT_FALSE(std::isfinite(q.amax.item<float>()));
      if (r != Fp4ScaleRule::Nvfp4) {
        EXPECT_EQ(got[40], 1.5f);  // another block: untouched
      }
    }
  }
}

// Every CPU vector build quantizes as the scalar definition, bit for bit, where the block scales
// span everything NVFP4's E4M3 scale can be: a tensor whose blocks' amaxes run over 40 binades
// below its own (so the scales reach E4M3's subnormals and 0), with ties of the scale's rounding,
// all-zero blocks and a block holding inf or NaN -- 1x16 and 16x16 blocks, and MX's rules.
TEST(Fp4Quantize, EveryVectorBuildMatchesTheScalarDefinition) {
  const int64_t R = 32, C = 16 * 48;
  std::vector<float> v(size_t(R * C));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const int64_t block = c / 16;
      // Block amax 2^(-block + r % 5) times a mantissa that puts some scales on E4M3 ties.
      const float m = 1.0f + float((r * 7 + block) % 16) / 16.0f;
      const float x =
          std::ldexp(m * (c % 16 == 3 ? 1.0f : 0.5f * float(c % 16) / 16.0f), int(-block + r % 5));
      v[size_t(r * C + c)] = (c % 2 ? -x : x);
    }
    for (int64_t c = 0; c < 16; ++c)
      v[size_t(r * C + 40 * 16 + c)] = 0.0f;  // an all-zero block
  }
  v[size_t(5 * C + 44 * 16 + 2)] = INFINITY;
  v[size_t(9 * C + 45 * 16 + 7)] = NAN;
  v[0] = 448.0f * 6.0f;  // the tensor amax
  // Rows 16..31, blocks 0..39: block amaxes whose scaled value amax * multiplier lands exactly on
  // a tie of the E4M3 rounding (normal: halfway between 3-bit mantissas; subnormal: an odd
  // multiple of 2^-10), so nearest-even is what decides.
  const float mult = nvfp4_tensor_scales(448.0f * 6.0f).multiplier;
  int ties = 0;
  for (int64_t r = 16; r < R; ++r) {
    for (int64_t block = 0; block < 40; ++block) {
      const int64_t i = (r - 16) * 40 + block;
      const float tie = i % 4 == 3
                            ? std::ldexp(float(2 * (i % 7) + 1), -10)
                            : std::ldexp(1.0f + float(2 * (i % 8) + 1) / 16.0f, int(i % 13) - 6);
      float a = tie / mult;
      for (int step = 0; step < 64 && a * mult != tie; ++step)
        a = std::nextafter(a, a * mult < tie ? INFINITY : 0.0f);
      if (a * mult != tie) continue;
      ++ties;
      for (int64_t c = 0; c < 16; ++c)
        v[size_t(r * C + block * 16 + c)] = c == 5 ? -a : a * float(c) / 32.0f;
    }
  }
  ASSERT_GE(ties, 300);
  const Tensor x = Tensor::from_vector(v, {R, C});
  std::vector<cpu::VectorIsa> isas{cpu::VectorIsa::Baseline};
  for (const cpu::VectorIsa isa : {cpu::VectorIsa::Avx2, cpu::VectorIsa::Avx512})
    if (cpu::vector_isa_supported(isa)) isas.push_back(isa);
  for (const Fp4ScaleRule rule :
       {Fp4ScaleRule::Nvfp4, Fp4ScaleRule::MxFloor, Fp4ScaleRule::MxCeil}) {
    for (const int64_t br : {int64_t(1), int64_t(16)}) {
      if (br == 16 && rule != Fp4ScaleRule::Nvfp4) continue;
      Fp4QuantizeParams p;
      p.rule = rule;
      p.block_rows = br;
      Quantized want;
      {
        const cpu::ForcedIsa scalar(cpu::VectorIsa::Baseline);
        want = quantize(x, p);
      }
      std::set<uint8_t> distinct;
      for (uint8_t s : bytes_of(want.block_scales))
        distinct.insert(s);
      if (rule == Fp4ScaleRule::Nvfp4 && br == 1) {
        EXPECT_GE(distinct.size(), 60u);  // normal and subnormal scales, 0 among them
        EXPECT_TRUE(distinct.count(0) && distinct.count(1) && distinct.count(0x7e));
      }
      for (const cpu::VectorIsa isa : isas) {
        const cpu::ForcedIsa forced(isa);
        const Quantized got = quantize(x, p);
        SCOPED_TRACE(std::string(cpu::vector_isa_name(isa)) + " rule " + std::to_string(int(rule)) +
                     " block rows " + std::to_string(br));
        EXPECT_EQ(bytes_of(got.block_scales), bytes_of(want.block_scales));
        EXPECT_EQ(bytes_of(got.codes), bytes_of(want.codes));
        EXPECT_EQ(bytes_of(got.values), bytes_of(want.values));
        EXPECT_EQ(float_bits(got.scale_inv), float_bits(want.scale_inv));
      }
    }
  }
}

// A transposed quantization (p.columns: the wgrad GEMM's operands, quantized down x's columns
// without a transpose, the RHT fused) is bit for bit the quantization of x^T made contiguous
// with x's rows zero-padded to whole blocks, transformed first by hadamard16 where asked: codes,
// values, block scales, amax and the tensor scale, every scale rule, nearest and stochastic
// rounding, f32 and bf16 inputs, ragged shapes (rows not a whole block, columns not a whole
// vector), non-finite inputs, in every vector build and on the GPU. Values only leaves the codes
// unwritten and the rest the same.
TEST(Fp4Quantize, ColumnsQuantizeTheTransposeBitForBit) {
  const int64_t R = 70, C = 40;
  std::vector<float> v(size_t(R * C));
  for (int64_t i = 0; i < R * C; ++i)  // values over 30 binades, both signs, a few exact zeros
    v[size_t(i)] =
        i % 37 == 0 ? 0.0f
                    : std::ldexp(1.0f + float(i * 7919 % 1000) / 1000.0f, int(i * 31 % 30) - 15) *
                          (i % 3 ? 1.0f : -1.0f);
  std::vector<float> special = v;
  special[size_t(3 * C + 5)] = INFINITY;
  special[size_t(40 * C + 17)] = NAN;
  struct Case {
    Fp4ScaleRule rule;
    bool rht, stochastic, nonfinite;
  };
  std::vector<Case> cases;
  for (const Fp4ScaleRule rule : {Fp4ScaleRule::Nvfp4, Fp4ScaleRule::MxFloor, Fp4ScaleRule::MxCeil})
    for (const bool rht : {false, true})
      for (const bool stochastic : {false, true})
        cases.push_back({rule, rht, stochastic, false});
  cases.push_back({Fp4ScaleRule::Nvfp4, true, true, true});
  cases.push_back({Fp4ScaleRule::Nvfp4, false, false, true});
  std::vector<std::pair<Device, std::optional<cpu::VectorIsa>>> builds{
      {Device::cpu(), cpu::VectorIsa::Baseline}};
  for (const cpu::VectorIsa isa : {cpu::VectorIsa::Avx2, cpu::VectorIsa::Avx512})
    if (cpu::vector_isa_supported(isa)) builds.push_back({Device::cpu(), isa});
  if (cuda::is_available()) builds.push_back({Device::cuda(0), std::nullopt});
  int compared = 0;
  for (const Case& k : cases) {
    const int64_t bc = fp4_block_cols(k.rule), Rp = (R + bc - 1) / bc * bc;
    for (const DType dt : {DType::F32, DType::BF16}) {
      const Tensor x = Tensor::from_vector(k.nonfinite ? special : v, {R, C}).to(dt);
      Fp4QuantizeParams p;
      p.rule = k.rule;
      p.stochastic = k.stochastic;
      p.seed = 5;
      p.offset = 3;
      Quantized want;
      {  // The definition: x^T padded, transformed, quantized along its rows, by the scalar build.
        const cpu::ForcedIsa scalar(cpu::VectorIsa::Baseline);
        Tensor xt = Tensor::zeros({C, Rp}, dt);
        xt.narrow(1, 0, R).copy_(x.t());
        if (k.rht) {
          Tensor t = Tensor::empty({C, Rp}, dt);
          backend_for(Device::cpu()).hadamard16(xt, 0xb35cu, t);
          xt = t;
        }
        want = quantize(xt, p);
        for (const cpu::VectorIsa isa : {cpu::VectorIsa::Baseline, cpu::vector_isa()}) {
          const cpu::ForcedIsa build(isa);  // rows, values only: the same values, no codes
          Fp4QuantizeParams only = p;
          only.values_only = true;
          Tensor none = Tensor::empty({0}, DType::U8),
                 values = Tensor::full({C, Rp}, NAN, DType::BF16);
          Quantized q = quantize(xt, p);
          backend_for(Device::cpu())
              .fp4_quantize(xt, only, none, q.block_scales, q.scale_inv, q.amax, &values);
          EXPECT_EQ(bytes_of(values), bytes_of(want.values));
        }
      }
      p.columns = true;
      p.rht = k.rht;
      p.rht_signs = 0xb35cu;
      for (const auto& [d, isa] : builds) {
        std::optional<cpu::ForcedIsa> forced;
        if (isa) forced.emplace(*isa);
        SCOPED_TRACE(d.str() + (isa ? std::string(" ") + cpu::vector_isa_name(*isa) : "") +
                     " rule " + std::to_string(int(k.rule)) + (k.rht ? " rht" : "") +
                     (k.stochastic ? " sr" : "") + (k.nonfinite ? " non-finite" : "") + " " +
                     std::string(dtype_name(dt)));
        Quantized got{Tensor::full({Rp, C}, 0xee, DType::U8, d),
                      Tensor::zeros({Rp / bc, C}, DType::U8, d),
                      Tensor::full({1}, NAN, DType::F32, d), Tensor::full({1}, NAN, DType::F32, d),
                      Tensor::full({Rp, C}, NAN, DType::BF16, d)};
        backend_for(d).fp4_quantize(x.to(d), p, got.codes, got.block_scales, got.scale_inv,
                                    got.amax, &got.values);
        EXPECT_EQ(bytes_of(got.codes.t()), bytes_of(want.codes));
        EXPECT_EQ(bytes_of(got.values.t()), bytes_of(want.values));
        EXPECT_EQ(bytes_of(got.block_scales.t()), bytes_of(want.block_scales));
        EXPECT_EQ(float_bits(got.amax), float_bits(want.amax));
        EXPECT_EQ(float_bits(got.scale_inv), float_bits(want.scale_inv));
        ++compared;
        if (!d.is_cpu()) continue;
        Fp4QuantizeParams only = p;
        only.values_only = true;
        Tensor untouched = Tensor::full({Rp, C}, 0xee, DType::U8);
        Tensor values = Tensor::full({Rp, C}, NAN, DType::BF16);
        backend_for(d).fp4_quantize(x, only, untouched, got.block_scales, got.scale_inv, got.amax,
                                    &values);
        EXPECT_EQ(bytes_of(values), bytes_of(got.values));
        EXPECT_EQ(bytes_of(untouched), bytes_of(Tensor::full({Rp, C}, 0xee, DType::U8)));
      }
    }
  }
  EXPECT_GE(compared, 28);
}

// fp4_math.h's layout of a native FP4 GEMM's operands is the one tools/reference/fp4_golden.py
// derives from cuBLAS's docs (torchao's to_blocked): every scale of a 200 x 9 matrix lands where
// the golden says, nothing else is written (the rest is padding), and codes pack two to a byte
// with the first in the low nibble.
TEST(Fp4Golden, NativeGemmOperandsTakeCublasLtsLayout) {
  const SafetensorsFile f =
      load_safetensors(std::string(MANTISSA_GOLDEN_DIR) + "/fp4_golden.safetensors");
  const std::vector<int32_t> index = f.at("gemm_layout.scale_index").to_vector<int32_t>();
  const int64_t rows = 200, cols = 9;
  ASSERT_EQ(int64_t(index.size()), fp4_swizzled_rows(rows) * fp4_swizzled_cols(cols));
  std::vector<int32_t> placed(index.size(), -1);
  for (int64_t r = 0; r < fp4_swizzled_rows(rows); ++r) {
    for (int64_t c = 0; c < fp4_swizzled_cols(cols); ++c) {
      const int64_t at = fp4_swizzled_scale_offset(r, c, cols);
      ASSERT_TRUE(at >= 0 && at < int64_t(placed.size())) << r << ", " << c;
      EXPECT_EQ(placed[size_t(at)], -1) << "two scales at " << at;
      placed[size_t(at)] = r < rows && c < cols ? int32_t(r * cols + c) : -2;
    }
  }
  for (int32_t& v : placed)
    v = v == -2 ? -1 : v;  // the padding, as the golden writes it
  EXPECT_EQ(placed, index);

  const std::vector<uint8_t> codes = bytes_of(f.at("nvfp4_1d_ragged.codes")),
                             packed = bytes_of(f.at("gemm_layout.packed"));
  ASSERT_EQ(codes.size(), 2 * packed.size());
  std::vector<uint8_t> mine(packed.size());
  for (size_t i = 0; i < mine.size(); ++i)
    mine[i] = fp4_pack_pair(codes[2 * i], codes[2 * i + 1]);
  EXPECT_EQ(mine, packed);
}

// The native FP4 GEMM (cuBLASLt, compute capability 10.0+) against the emulation on the same
// quantized operands: NVFP4 1x16 activations against 16x16 weights (and the weights transposed,
// as dgrad reads them), and MXFP4; fp32 sums in either order, so within a few fp32 roundings of
// sum |terms|. Skips where the GPU has no FP4 tensor cores (Hopper: fp4_gemm says false, the
// recipe emulates there, as on the CPU).
TEST(CudaFp4Gemm, NativeMatchesTheEmulation) {
  MT_REQUIRE_CUDA();
  Backend& gpu = backend_for(Device::cuda());
  const Device d = Device::cuda();
  const int64_t M = 64, N = 96, K = 256;
  const Tensor x = Tensor::uniform({M, K}, -3, 3, 61).to(d),
               w = Tensor::uniform({N, K}, -1, 1, 62).to(d);
  bool ran = false;
  for (const Fp4ScaleRule rule : {Fp4ScaleRule::Nvfp4, Fp4ScaleRule::MxCeil}) {
    for (const bool transposed_weight : {false, true}) {
      if (transposed_weight && rule != Fp4ScaleRule::Nvfp4) continue;
      Fp4QuantizeParams pa, pb;
      pa.rule = pb.rule = rule;
      pb.block_rows = rule == Fp4ScaleRule::Nvfp4 ? 16 : 1;
      // The weight as dgrad sees it: (K, N) quantized in 16 x 16 blocks, read transposed.
      const Tensor wq = transposed_weight ? Tensor::uniform({K, N}, -1, 1, 63).to(d) : w;
      const Quantized qa = quantize(x, pa), qb = quantize(wq, pb);
      const Tensor bc = transposed_weight ? qb.codes.t() : qb.codes,
                   bs = transposed_weight ? qb.block_scales.t() : qb.block_scales,
                   bv = transposed_weight ? qb.values.t() : qb.values;
      const Tensor alpha = mul(qa.scale_inv, qb.scale_inv);
      Tensor native = Tensor::full({M, N}, NAN, DType::F32, d);
      if (!gpu.fp4_gemm(qa.codes, qa.block_scales, 1, qa.scale_inv, qa.amax, bc, bs, pb.block_rows,
                        qb.scale_inv, qb.amax, rule, native))
        continue;
      ran = true;
      Tensor emulated = Tensor::full({M, N}, NAN, DType::F32, d);
      gpu.block_scaled_gemm(qa.values, qa.scale_inv.view({1, 1}), M, bv, qb.scale_inv.view({1, 1}),
                            N, K, nullptr, emulated);
      const Tensor mag = matmul(abs(qa.values.to(DType::F32)), abs(bv.to(DType::F32)).t());
      const std::vector<float> g = native.to(Device::cpu()).to_vector<float>(),
                               e = emulated.to(Device::cpu()).to_vector<float>();
      const std::vector<float> m = mul(mag, alpha).to(Device::cpu()).to_vector<float>();
      int wrong = 0;
      for (size_t i = 0; i < g.size(); ++i)
        wrong += !(std::fabs(g[i] - e[i]) <= std::ldexp(1.0f, -20) * m[i] + 1e-30f);
      EXPECT_EQ(wrong, 0) << (rule == Fp4ScaleRule::Nvfp4 ? "nvfp4" : "mxfp4")
                          << (transposed_weight ? ", the weight transposed" : "");
    }
  }
  if (!ran) GTEST_SKIP() << "this GPU has no FP4 tensor cores (compute capability 10.0+)";
}

}  // namespace
}  // namespace mantissa::backend
