// The CPU backend's fp8_quantize (cpu/fp8.cpp, its row loops in cpu/fp8_rows.inc) against the
// scalar definition written out here from the numerics layer's generic encode/decode: each
// block's amax, its scale (fp8_math.h's rule), every code, every bf16 value, in every vector
// build this CPU runs, for f32, bf16 and f16 inputs, both fp8 formats and every scaling the
// recipes use. The inputs hold what the loops must get right: signed zeros, values that round
// into fp8's subnormals or to zero, values that saturate, infinities and a NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vector_isa.h"
#include "backend/forced_isa.h"
#include "backend/fp8_math.h"
#include "mantissa/numerics/format.h"
#include "mantissa/numerics/round.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend::cpu {
namespace {

// The matrix's shape: rows and columns ragged against blocks of 32 and 128, or columns that
// blocks of 32 and 128 tile (whole rows of blocks: the kernel quantizes groups of rows as one).
struct Dims {
  int64_t R, C;
};
constexpr Dims kShapes[] = {{131, 200}, {131, 256}};

// Values over many binades with both signs, and the edge cases; the non-finite ones only in the
// rows from `special_from` on, so that most blocks stay finite.
std::vector<float> inputs(uint64_t seed, Dims d) {
  const int64_t R = d.R, C = d.C;
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exp(-30, 12);
  std::vector<float> v(size_t(R * C));
  for (float& x : v)
    x = std::ldexp(mant(g), exp(g));
  const float specials[] = {0.0f,   -0.0f,     1e-30f,  -1e-30f, 1e-42f /* f32 subnormal */,
                            6.0e4f, -3.0e38f,  1.5e-6f, 448.0f,  57344.0f,
                            460.0f, -61440.0f, 2e-3f,   1.0f,    -1.0f};
  size_t k = 0;
  for (float s : specials)
    v[(k += 977) % v.size()] = s;
  // Blocks whose amax is zero or an f32 subnormal (MXFP8's scales take the slow path there):
  // a row's first 64 values, 32 rows of one column; a row's second 32 values subnormal.
  for (int64_t c = 0; c < 64; ++c)
    v[size_t(3 * C + c)] = 0.0f;
  for (int64_t r = 64; r < 96; ++r)
    v[size_t(r * C + 7)] = r % 2 ? 0.0f : -0.0f;
  for (int64_t c = 32; c < 64; ++c)
    v[size_t(5 * C + c)] = float(c) * 1e-42f;
  // And for the 128-wide blocks, where fp8_max / amax overflows: a row's values from column 128
  // on, 128 rows of one column.
  for (int64_t c = 128; c < C; ++c)
    v[size_t(6 * C + c)] = float(c) * 1e-43f;
  for (int64_t r = 0; r < std::min<int64_t>(R, 128); ++r)
    v[size_t(r * C + 11)] = float(r + 1) * 1e-41f;
  // Non-finite values in the last rows only.
  v[size_t((R - 2) * C + 5)] = std::numeric_limits<float>::infinity();
  v[size_t((R - 2) * C + 170)] = -std::numeric_limits<float>::infinity();
  v[size_t((R - 1) * C + 40)] = std::numeric_limits<float>::quiet_NaN();
  return v;
}

struct Expected {
  std::vector<uint8_t> codes;
  std::vector<uint16_t> values;
  std::vector<float> amax, scale_inv;
};

// The definition, element by element, in scalar code.
Expected reference(const std::vector<float>& x, Format f, const Fp8QuantizeParams& p, Dims d) {
  const int64_t R = d.R, C = d.C;
  const float fp8_max = float(format_info(f).max_finite);
  const int64_t br = p.block_rows ? p.block_rows : R, bc = p.block_cols ? p.block_cols : C;
  const int64_t nbr = (R + br - 1) / br, nbc = (C + bc - 1) / bc;
  Expected e;
  std::vector<float> scale(size_t(nbr * nbc));
  for (int64_t b = 0; b < nbr * nbc; ++b) {
    const int64_t rb = b / nbc, cb = b % nbc;
    float m = 0;
    bool nan = false;
    for (int64_t r = rb * br; r < std::min(R, (rb + 1) * br); ++r) {
      for (int64_t c = cb * bc; c < std::min(C, (cb + 1) * bc); ++c) {
        const float a = std::fabs(x[size_t(r * C + c)]);
        nan = nan || std::isnan(a);
        m = std::max(m, a);
      }
    }
    e.amax.push_back(nan ? std::numeric_limits<float>::quiet_NaN() : m);
    const float given = p.given ? *static_cast<const float*>(p.given->data_ptr()) : 1.0f;
    scale[size_t(b)] = fp8_block_scale(e.amax.back(), fp8_max, p.rule, given);
    e.scale_inv.push_back(1.0f / scale[size_t(b)]);
  }
  if (p.rule == Fp8ScaleRule::Given) e.amax.assign(1, e.amax[0]);
  const uint32_t nan_code = encode(f, std::numeric_limits<float>::quiet_NaN(),
                                   RoundingMode::NearestEven, Overflow::Saturate);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const size_t b = size_t((r / br) * nbc + c / bc);
      const float v = x[size_t(r * C + c)];
      const uint32_t code =
          std::isfinite(v) ? encode(f, v * scale[b], RoundingMode::NearestEven, Overflow::Saturate)
                           : nan_code;
      e.codes.push_back(uint8_t(code));
      float value = decode(f, code);
      if (p.rule == Fp8ScaleRule::AmaxPow2) value *= e.scale_inv[b];
      e.values.push_back(uint16_t(encode(Format::BF16, value)));
    }
  }
  return e;
}

std::vector<uint32_t> float_bits(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float v : t.to_vector<float>())
    out.push_back(std::isnan(v) ? 0x7fc00000u : std::bit_cast<uint32_t>(v));
  return out;
}

std::vector<uint32_t> float_bits(const std::vector<float>& t) {
  std::vector<uint32_t> out;
  for (float v : t)
    out.push_back(std::isnan(v) ? 0x7fc00000u : std::bit_cast<uint32_t>(v));
  return out;
}

// The first index where a and b differ, or -1.
template <typename T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

// MXFP8's power-of-two scale against its definition, searched in float64: 2^-e with e the
// smallest integer in [-127, 127] with amax <= fp8_max * 2^e, over a sweep of positive floats
// (normal and subnormal amaxes, and the ones next to each power-of-two boundary).
TEST(Fp8ScaleRule, PowerOfTwoScaleIsTheSmallestThatFits) {
  std::vector<float> amaxes;
  for (uint64_t b = 1; b < 0x7f800000u; b += 0x1003)
    amaxes.push_back(std::bit_cast<float>(uint32_t(b)));
  for (const float fp8_max : {448.0f, 57344.0f}) {
    for (int e = -150; e <= 128; ++e) {
      const float edge = std::ldexp(fp8_max, e);
      if (edge > 0 && std::isfinite(edge)) {
        amaxes.push_back(edge);
        amaxes.push_back(std::nextafter(edge, 0.0f));
        amaxes.push_back(std::nextafter(edge, INFINITY));
      }
    }
  }
  for (const float fp8_max : {448.0f, 57344.0f}) {
    for (const float amax : amaxes) {
      // From below the answer (log2(amax / fp8_max) > ilogb(amax) - ilogb(fp8_max) - 1) up.
      int e = std::max(-127, std::ilogb(amax) - std::ilogb(fp8_max) - 2);
      while (e < 127 && double(amax) > std::ldexp(double(fp8_max), e))
        ++e;
      ASSERT_EQ(fp8_block_scale(amax, fp8_max, Fp8ScaleRule::AmaxPow2, 1), std::ldexp(1.0f, -e))
          << "amax " << amax << " (bits " << std::bit_cast<uint32_t>(amax) << "), fp8_max "
          << fp8_max;
    }
  }
}

TEST(Fp8QuantizeKernel, EveryBuildMatchesTheScalarDefinition) {
  std::vector<VectorIsa> isas{VectorIsa::Baseline};
  for (const VectorIsa isa : {VectorIsa::Avx2, VectorIsa::Avx512})
    if (vector_isa_supported(isa)) isas.push_back(isa);
  struct Case {
    const char* name;
    Fp8QuantizeParams p;
  };
  const Tensor given = Tensor::full({1}, 37.5, DType::F32);
  const Case cases[] = {
      {"per tensor, given scale", {0, 0, Fp8ScaleRule::Given, &given}},
      {"per tensor, current", {0, 0, Fp8ScaleRule::Amax, nullptr}},
      {"mxfp8 1x32", {1, 32, Fp8ScaleRule::AmaxPow2, nullptr}},
      {"blockwise 1x128", {1, 128, Fp8ScaleRule::Amax, nullptr}},
      {"blockwise 128x128", {128, 128, Fp8ScaleRule::Amax, nullptr}},
      // Rows (the rowwise recipes) and blocks whose width is no multiple of 16: a vector
      // straddles two blocks (this caught the AVX-512 loop skipping a block's first values).
      {"rowwise 1xC, power-of-two", {1, 0, Fp8ScaleRule::AmaxPow2, nullptr}},
      {"rowwise 1xC", {1, 0, Fp8ScaleRule::Amax, nullptr}},
      {"1x72 blocks", {1, 72, Fp8ScaleRule::Amax, nullptr}},
      // A transposed operand's blocks (fp8_quantize_transposed): a column wide, rows tall.
      {"mxfp8 32x1", {32, 1, Fp8ScaleRule::AmaxPow2, nullptr}},
      {"blockwise 128x1", {128, 1, Fp8ScaleRule::Amax, nullptr}},
  };
  Backend& cpu = cpu_backend();
  for (const Dims d : kShapes)
    for (const DType in : {DType::F32, DType::BF16, DType::F16}) {
      const int64_t R = d.R, C = d.C;
      // The inputs as the dtype holds them: the reference quantizes those values.
      const Tensor x = Tensor::from_vector(inputs(7, d), {R, C}).to(in);
      const std::vector<float> xv = x.to(DType::F32).to_vector<float>();
      for (const DType out : {DType::FP8_E4M3, DType::FP8_E5M2}) {
        const Format f = *dtype_format(out);
        for (const Case& c : cases) {
          const Expected want = reference(xv, f, c.p, d);
          for (const VectorIsa isa : isas) {
            SCOPED_TRACE(std::string(c.name) + ", " + std::to_string(R) + " x " +
                         std::to_string(C) + ", " + std::string(dtype_name(in)) + " -> " +
                         std::string(dtype_name(out)) + ", " + vector_isa_name(isa));
            ForcedIsa forced(isa);
            const int64_t nblocks = int64_t(want.scale_inv.size());
            const int64_t nbc = c.p.block_cols ? (C + c.p.block_cols - 1) / c.p.block_cols : 1;
            Tensor codes = Tensor::empty({R, C}, out), values = Tensor::empty({R, C}, DType::BF16);
            Tensor scale_inv = Tensor::empty({nblocks / nbc, nbc}, DType::F32);
            Tensor amax = Tensor::empty({nblocks / nbc, nbc}, DType::F32);
            cpu.fp8_quantize(x, c.p, codes, scale_inv, amax, &values);
            std::vector<uint8_t> got_codes(size_t(R * C));
            std::memcpy(got_codes.data(), codes.data_ptr(), got_codes.size());
            std::vector<uint16_t> got_values(size_t(R * C));
            std::memcpy(got_values.data(), values.data_ptr(), got_values.size() * 2);
            const int64_t dc = first_difference(got_codes, want.codes);
            EXPECT_EQ(dc, -1) << "code of element " << dc << " (x = " << xv[size_t(dc)] << "): got "
                              << int(got_codes[size_t(dc)]) << ", want "
                              << int(want.codes[size_t(dc)]);
            const int64_t dv = first_difference(got_values, want.values);
            EXPECT_EQ(dv, -1) << "value of element " << dv;
            EXPECT_EQ(first_difference(float_bits(scale_inv), float_bits(want.scale_inv)), -1);
            EXPECT_EQ(first_difference(float_bits(amax), float_bits(want.amax)), -1);
            // Without values, the same codes.
            Tensor codes_only = Tensor::empty({R, C}, out);
            cpu.fp8_quantize(x, c.p, codes_only, scale_inv, amax, nullptr);
            EXPECT_EQ(std::memcmp(codes_only.data_ptr(), codes.data_ptr(), size_t(R * C)), 0);
            // Values only (codes names the dtype, no storage to write): the same values.
            Fp8QuantizeParams values_only = c.p;
            values_only.values_only = true;
            Tensor dtype_only = Tensor::empty({0}, out);
            Tensor values_alone = Tensor::empty({R, C}, DType::BF16);
            cpu.fp8_quantize(x, values_only, dtype_only, scale_inv, amax, &values_alone);
            EXPECT_EQ(std::memcmp(values_alone.data_ptr(), values.data_ptr(), size_t(R * C) * 2),
                      0);
            EXPECT_EQ(first_difference(float_bits(scale_inv), float_bits(want.scale_inv)), -1);
          }
        }
      }
    }
}

}  // namespace
}  // namespace mantissa::backend::cpu
