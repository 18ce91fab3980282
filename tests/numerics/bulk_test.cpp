// The vectorized bulk paths are bit-identical to the scalar definition, on every instruction set
// this machine has, for every length (tails included) and every kind of value.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "mantissa/numerics/convert.h"
#include "mantissa/numerics/round.h"
#include "numerics/kernels.h"

namespace mantissa {
namespace {

using detail::Isa;

// Random bit patterns, with the interesting ones over-represented: subnormals, NaNs with
// payloads only in the dropped bits, values near every format's overflow and ties.
std::vector<float> interesting_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t b = rng();
    switch (i % 8) {
      case 0:
        b &= 0x807fffffu;
        break;  // fp32 subnormal or zero
      case 1:
        b = (b & 0x807fffffu) | 0x7f800000u;
        break;  // inf / NaN with any payload
      case 2:
        b = (b & 0x8000ffffu) | 0x47000000u;
        break;  // near 65504 .. 131072
      case 3:
        b = (b & 0xffff0000u) | 0x8000u;
        break;  // bf16 ties
      case 4:
        b = (b & 0xffffe000u) | 0x1000u;
        break;  // fp16 / tf32 ties
      case 5:
        b = (b & 0x83ffffffu) | 0x30000000u;
        break;  // fp16 subnormal range
      default:
        break;
    }
    v[i] = std::bit_cast<float>(b);
  }
  return v;
}

class BulkIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!detail::isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU has no " << detail::isa_name(GetParam());
    }
  }
};

TEST_P(BulkIsa, F32ToBf16AndF16MatchScalar) {
  const Isa isa = GetParam();
  for (size_t n : {0, 1, 7, 15, 16, 17, 31, 32, 33, 100, 4099}) {
    const std::vector<float> src = interesting_floats(n, uint32_t(n));
    for (RoundingMode m : {RoundingMode::NearestEven, RoundingMode::TowardZero}) {
      std::vector<uint16_t> b(n + 1, 0xdead), h(n + 1, 0xdead);
      detail::f32_to_bf16(src.data(), b.data(), n, m, isa);
      detail::f32_to_f16(src.data(), h.data(), n, m, isa);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(b[i], encode(Format::BF16, src[i], m))
            << std::hex << std::bit_cast<uint32_t>(src[i]) << " n=" << std::dec << n;
        ASSERT_EQ(h[i], encode(Format::FP16, src[i], m))
            << std::hex << std::bit_cast<uint32_t>(src[i]) << " n=" << std::dec << n;
      }
      EXPECT_EQ(b[n], 0xdead) << "wrote past the end";
      EXPECT_EQ(h[n], 0xdead) << "wrote past the end";
    }
  }
}

TEST_P(BulkIsa, AllHalfPatternsWidenLikeScalar) {
  const Isa isa = GetParam();
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = uint16_t(i);
  std::vector<float> b(all.size()), h(all.size());
  detail::bf16_to_f32(all.data(), b.data(), all.size(), isa);
  detail::f16_to_f32(all.data(), h.data(), all.size(), isa);
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(b[i]), std::bit_cast<uint32_t>(decode(Format::BF16, all[i])))
        << std::hex << all[i];
    ASSERT_EQ(std::bit_cast<uint32_t>(h[i]), std::bit_cast<uint32_t>(decode(Format::FP16, all[i])))
        << std::hex << all[i];
  }
}

TEST_P(BulkIsa, RoundInPlaceMatchesScalar) {
  const Isa isa = GetParam();
  for (size_t n : {1, 15, 16, 17, 1000}) {
    const std::vector<float> src = interesting_floats(n, 77 + uint32_t(n));
    for (Format f : {Format::TF32, Format::BF16, Format::FP16}) {
      for (RoundingMode m : {RoundingMode::NearestEven, RoundingMode::TowardZero}) {
        std::vector<float> v = src;
        detail::round_in_place_fast(f, v.data(), n, m, isa);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(std::bit_cast<uint32_t>(v[i]), std::bit_cast<uint32_t>(round_to(f, src[i], m)))
              << format_name(f) << " " << std::hex << std::bit_cast<uint32_t>(src[i]);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, BulkIsa, ::testing::ValuesIn(detail::kAllIsas), [](const auto& p) {
  std::string s(detail::isa_name(p.param));
  for (auto& c : s)
    c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
});

TEST(BulkPublic, RoundTripsAndOptions) {
  const std::vector<float> src = interesting_floats(5000, 5);
  std::vector<bfloat16> b(src.size());
  std::vector<half> h(src.size());
  std::vector<float8_e4m3> e4(src.size());
  std::vector<float8_e5m2> e5(src.size());
  for (Overflow o : {Overflow::Infinity, Overflow::Saturate}) {
    const RoundingOptions opt{.mode = RoundingMode::NearestEven, .overflow = o};
    convert(src.data(), b.data(), src.size(), opt);
    convert(src.data(), h.data(), src.size(), opt);
    convert(src.data(), e4.data(), src.size(), opt);
    convert(src.data(), e5.data(), src.size(), opt);
    std::vector<float> back(src.size()), grid(src.size());
    for (Format f : {Format::BF16, Format::FP16, Format::FP8_E4M3, Format::FP8_E5M2}) {
      switch (f) {
        case Format::BF16:
          convert(b.data(), back.data(), src.size());
          break;
        case Format::FP16:
          convert(h.data(), back.data(), src.size());
          break;
        case Format::FP8_E4M3:
          convert(e4.data(), back.data(), src.size());
          break;
        default:
          convert(e5.data(), back.data(), src.size());
          break;
      }
      grid = src;
      round_in_place(f, grid.data(), grid.size(), opt);
      for (size_t i = 0; i < src.size(); ++i) {
        const float want = round_to(f, src[i], opt.mode, o);
        ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(want))
            << format_name(f) << std::hex << " " << std::bit_cast<uint32_t>(src[i]);
        ASSERT_EQ(std::bit_cast<uint32_t>(grid[i]), std::bit_cast<uint32_t>(want));
      }
    }
  }
  std::vector<float> same = src;
  round_in_place(Format::FP32, same.data(), same.size());
  EXPECT_EQ(std::memcmp(same.data(), src.data(), src.size() * sizeof(float)), 0);
}

// The saturating fp8 encoder (fp8 training's quantization) is its own branch-free loop: the same
// bits as the scalar definition over a sweep of all floats (every 257th pattern of 2^32, which
// visits every exponent and sign with many mantissas) and the values near each rounding edge.
TEST(BulkPublic, SaturatingFp8MatchesScalarEncodeOverASweep) {
  std::vector<float> src;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 257)
    src.push_back(std::bit_cast<float>(uint32_t(b)));
  for (Format f : {Format::FP8_E4M3, Format::FP8_E5M2}) {
    for (uint32_t code = 0; code < 256; ++code) {  // every fp8 value and its neighbours
      const float v = decode(f, code);
      const uint32_t vb = std::bit_cast<uint32_t>(v);
      for (int d = -3; d <= 3; ++d)
        src.push_back(std::bit_cast<float>(vb + uint32_t(d)));
      src.push_back(v * 1.0000001f);
    }
  }
  std::vector<float8_e4m3> e4(src.size());
  std::vector<float8_e5m2> e5(src.size());
  const RoundingOptions sat{.mode = RoundingMode::NearestEven, .overflow = Overflow::Saturate};
  convert(src.data(), e4.data(), src.size(), sat);
  convert(src.data(), e5.data(), src.size(), sat);
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(e4[i].bits,
              encode(Format::FP8_E4M3, src[i], RoundingMode::NearestEven, Overflow::Saturate))
        << "e4m3 " << std::hex << std::bit_cast<uint32_t>(src[i]);
    ASSERT_EQ(e5[i].bits,
              encode(Format::FP8_E5M2, src[i], RoundingMode::NearestEven, Overflow::Saturate))
        << "e5m2 " << std::hex << std::bit_cast<uint32_t>(src[i]);
  }
}

// The branch-free fp8 decoder the CPU's quantization loops use (round.h) against the generic
// decode, on every code: zeros, subnormals, normals, the largest, inf and the NaNs.
TEST(BulkPublic, Fp8DecoderIsTheGenericDecodeOnEveryCode) {
  for (uint32_t code = 0; code < 256; ++code) {
    ASSERT_EQ(std::bit_cast<uint32_t>(detail::decode_fp8<Format::FP8_E4M3>(code)),
              std::bit_cast<uint32_t>(decode(Format::FP8_E4M3, code)))
        << "e4m3 code " << code;
    ASSERT_EQ(std::bit_cast<uint32_t>(detail::decode_fp8<Format::FP8_E5M2>(code)),
              std::bit_cast<uint32_t>(decode(Format::FP8_E5M2, code)))
        << "e5m2 code " << code;
  }
}

}  // namespace
}  // namespace mantissa
