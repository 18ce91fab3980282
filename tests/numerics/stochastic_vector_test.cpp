// The vectorized stochastic rounding kernels (fp32 -> bf16 / fp16, overflow to inf) are
// bit-identical to the definition: element i rounded by encode_bits() with
// random_bits(seed, offset, index + i), on every instruction set this machine has, for every
// length (head, groups and tails), alignment of `index`, and kind of value.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mantissa/numerics/convert.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"
#include "numerics/kernels.h"

namespace mantissa {
namespace {

using detail::Isa;

// The reference, element by element, from the public pieces (philox.h, round.h) only.
std::vector<uint16_t> reference(Format f, const std::vector<float>& src, uint64_t seed,
                                uint64_t offset, uint64_t index, Overflow overflow) {
  std::vector<uint16_t> out(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    const uint32_t r = random_bits(seed, offset, index + i);
    out[i] = uint16_t(detail::encode_bits<float>(std::bit_cast<uint32_t>(src[i]), format_spec(f),
                                                 RoundingMode::Stochastic, overflow, r));
  }
  return out;
}

// Random bit patterns, the boundary cases over-represented, both signs throughout.
std::vector<float> interesting_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t b = rng();
    const uint32_t sign = b & 0x80000000u;
    switch (rng() % 14) {
      case 0:
        b = sign;  // signed zero
        break;
      case 1:
        b &= 0x807fffffu;  // fp32 subnormal
        break;
      case 2:
        b = sign | 0x7f800000u;  // inf
        break;
      case 3:
        b = (b & 0x807fffffu) | 0x7f800001u;  // NaN, payload anywhere (never zero)
        break;
      case 4:
        b = (b & 0x807f0000u) | 0x7f800000u | (rng() & 1);  // NaN, payload above or in the low bits
        break;
      case 5:
        b = (b & 0x8000ffffu) | 0x7f7f0000u;  // bf16: max finite and above (rounds to inf)
        break;
      case 6:
        b = (b & 0x807fffffu) | 0x47000000u;  // fp16: 32768 .. 65536, max finite 65504
        break;
      case 7:
        b = (b & 0x801fffffu) | 0x477fe000u;  // fp16: right at max finite / inf
        break;
      case 8:
        b = (b & 0x83ffffffu) | 0x34000000u;  // fp16 subnormal range
        break;
      case 9:
        b = (b & 0x807fffffu) | ((96 + rng() % 24) << 23);  // fp16: below and at the min subnormal
        break;
      case 10:
        b = (b & 0x807fffffu) | ((110 + rng() % 6) << 23);  // fp16: the subnormal/normal boundary
        break;
      case 11:
        b &= 0xffff0000u;  // exact in bf16
        break;
      default:
        break;  // any pattern
    }
    v[i] = std::bit_cast<float>(b);
  }
  return v;
}

struct Stream {
  uint64_t seed, offset, index;
};

// Aligned and unaligned starts, block counters that carry into their high word, positions that
// wrap at 2^64, and the optimizer's (tensor_id << 40) + start.
const Stream kStreams[] = {
    {0, 0, 0},
    {42, 7, 1},
    {0x123456789abcdef0u, 0xfedcba9876543210u, 2},
    {1, 0, 3},
    {99, 1, 5},
    {7, 3, (uint64_t(0xffffffffu) << 2) - 9},  // block crosses 2^32
    {5, 0xffffffffu, ~uint64_t(0) - 37},       // position wraps to 0
    {11, 2, ~uint64_t(0) - 2},
    {0xdeadbeefu, 1000, (uint64_t(17) << 40) + 2048},
    {3, 4, (uint64_t(17) << 40) + 2048 + 1},
};

class StochasticVector : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!detail::isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU has no " << detail::isa_name(GetParam());
    }
  }

  // Runs the kernel for `f` and compares every element (and that nothing past n is written).
  static void check(Format f, const std::vector<float>& src, const Stream& s, Isa isa) {
    const size_t n = src.size();
    std::vector<uint16_t> out(n + 1, 0xdead);
    if (f == Format::BF16) {
      detail::f32_to_bf16_stochastic(src.data(), out.data(), n, s.seed, s.offset, s.index, isa);
    } else {
      detail::f32_to_f16_stochastic(src.data(), out.data(), n, s.seed, s.offset, s.index, isa);
    }
    const std::vector<uint16_t> want =
        reference(f, src, s.seed, s.offset, s.index, Overflow::Infinity);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], want[i]) << format_name(f) << " x=0x" << std::hex
                                 << std::bit_cast<uint32_t>(src[i]) << std::dec << " i=" << i
                                 << " n=" << n << " seed=" << s.seed << " offset=" << s.offset
                                 << " index=" << s.index;
    }
    ASSERT_EQ(out[n], 0xdead) << "wrote past the end, n=" << n;
  }
};

TEST_P(StochasticVector, EveryLengthAndStreamMatchesDefinition) {
  uint32_t input_seed = 1;
  for (Format f : {Format::BF16, Format::FP16}) {
    for (const Stream& s : kStreams) {
      for (size_t n = 0; n <= 70; ++n) {
        check(f, interesting_floats(n, input_seed++), s, GetParam());
      }
      for (size_t n : {127, 128, 129, 255, 1000, 2048, 4099}) {
        check(f, interesting_floats(n, input_seed++), s, GetParam());
      }
    }
  }
}

TEST_P(StochasticVector, RandomStreamsMatchDefinition) {
  std::mt19937_64 rng(2024);
  for (int trial = 0; trial < 200; ++trial) {
    const Stream s{rng(), rng(), rng() >> (rng() % 64)};
    const size_t n = rng() % 600;
    const std::vector<float> src = interesting_floats(n, uint32_t(trial) + 1000);
    check(Format::BF16, src, s, GetParam());
    check(Format::FP16, src, s, GetParam());
  }
}

// Every exponent field, both signs, with random mantissas: each branch of the fp16 arithmetic
// (normal, subnormal, far below the subnormals, overflow) and bf16's, many times.
TEST_P(StochasticVector, EveryExponentMatchesDefinition) {
  std::mt19937 rng(5);
  std::vector<float> src;
  for (uint32_t e = 0; e < 256; ++e) {
    for (int k = 0; k < 64; ++k) {
      src.push_back(std::bit_cast<float>((uint32_t(k & 1) << 31) | (e << 23) |
                                         (uint32_t(rng()) & 0x7fffffu)));
    }
  }
  for (const Stream& s : kStreams) {
    check(Format::BF16, src, s, GetParam());
    check(Format::FP16, src, s, GetParam());
  }
}

// The stream position of element 0 is `index`: converting from index k gives the tail, from
// element k, of the conversion from index 0.
TEST_P(StochasticVector, IndexShiftsTheStream) {
  const size_t n = 300;
  const std::vector<float> src = interesting_floats(n, 9);
  for (Format f : {Format::BF16, Format::FP16}) {
    std::vector<uint16_t> whole(n);
    auto run = [&](const float* in, uint16_t* out, size_t len, uint64_t index) {
      if (f == Format::BF16) {
        detail::f32_to_bf16_stochastic(in, out, len, 77, 5, index, GetParam());
      } else {
        detail::f32_to_f16_stochastic(in, out, len, 77, 5, index, GetParam());
      }
    };
    run(src.data(), whole.data(), n, 0);
    for (size_t k = 0; k < 70; ++k) {
      std::vector<uint16_t> tail(n - k);
      run(src.data() + k, tail.data(), n - k, k);
      for (size_t i = 0; i < n - k; ++i)
        ASSERT_EQ(tail[i], whole[k + i]) << format_name(f) << " k=" << k << " i=" << i;
    }
  }
}

// random_bits_runs16 (FP4's stochastic rounding down columns): row i, column c is element
// index + c * stride + i of the stream, for run counts around the 16-run groups, aligned and
// unaligned starts and strides, and streams near the position's wrap; nothing past 16 n written.
TEST_P(StochasticVector, RunsOfSixteenAreTheStreamTransposed) {
  std::vector<Stream> streams(std::begin(kStreams), std::end(kStreams));
  streams.push_back({5, 9, ~uint64_t(0) - 63});  // aligned, the runs wrapping to 0
  for (const Stream& s : streams) {
    for (const uint64_t stride : {uint64_t(16), uint64_t(4096), uint64_t(36), uint64_t(7)}) {
      for (const size_t n : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(40)}) {
        std::vector<uint32_t> got(16 * n + 1, 0xdeadbeefu);
        detail::random_bits_runs16(got.data(), n, s.seed, s.offset, s.index, stride, GetParam());
        for (size_t i = 0; i < 16; ++i) {
          for (size_t c = 0; c < n; ++c) {
            ASSERT_EQ(got[i * n + c], random_bits(s.seed, s.offset, s.index + c * stride + i))
                << "i=" << i << " c=" << c << " n=" << n << " stride=" << stride
                << " index=" << s.index;
          }
        }
        ASSERT_EQ(got[16 * n], 0xdeadbeefu) << "wrote past the end, n=" << n;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, StochasticVector, ::testing::ValuesIn(detail::kAllIsas),
                         [](const auto& p) {
                           std::string s(detail::isa_name(p.param));
                           for (auto& c : s)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

// The public entry point (best instruction set, or the scalar path for Overflow::Saturate) agrees
// with the definition, and chunked calls at index = chunk start equal one call.
TEST(StochasticConvert, MatchesDefinitionAndChunksCompose) {
  const size_t n = 5000;
  const std::vector<float> src = interesting_floats(n, 31);
  for (Overflow ov : {Overflow::Infinity, Overflow::Saturate}) {
    for (const Stream& s : kStreams) {
      const RoundingOptions o{.mode = RoundingMode::Stochastic,
                              .overflow = ov,
                              .seed = s.seed,
                              .offset = s.offset,
                              .index = s.index};
      std::vector<bfloat16> b(n);
      std::vector<half> h(n);
      convert(src.data(), b.data(), n, o);
      convert(src.data(), h.data(), n, o);
      const std::vector<uint16_t> want_b =
          reference(Format::BF16, src, s.seed, s.offset, s.index, ov);
      const std::vector<uint16_t> want_h =
          reference(Format::FP16, src, s.seed, s.offset, s.index, ov);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(b[i].bits, want_b[i]) << i;
        ASSERT_EQ(h[i].bits, want_h[i]) << i;
      }
      // The optimizer's pattern: chunks of 2048 (and an odd size), each at its own index.
      for (size_t chunk : {2048, 333}) {
        std::vector<bfloat16> cb(n);
        for (size_t i = 0; i < n; i += chunk) {
          RoundingOptions c = o;
          c.index = s.index + i;
          convert(src.data() + i, cb.data() + i, std::min(chunk, n - i), c);
        }
        for (size_t i = 0; i < n; ++i)
          ASSERT_EQ(cb[i].bits, want_b[i]) << "chunk " << chunk << " i=" << i;
      }
    }
  }
}

// round_in_place's stochastic rounding (bf16 and fp16 through the vector conversion, in chunks)
// gives the definition's values: each element the widened reference bits at index + i.
TEST(StochasticRoundInPlace, MatchesDefinition) {
  const size_t n = 10000;  // more than one 4096-element chunk, and a ragged end
  const std::vector<float> src = interesting_floats(n, 7);
  for (Overflow ov : {Overflow::Infinity, Overflow::Saturate}) {
    for (const Stream& s : kStreams) {
      for (Format f : {Format::BF16, Format::FP16}) {
        std::vector<float> v = src;
        round_in_place(f, v.data(), n,
                       {.mode = RoundingMode::Stochastic,
                        .overflow = ov,
                        .seed = s.seed,
                        .offset = s.offset,
                        .index = s.index});
        const std::vector<uint16_t> want = reference(f, src, s.seed, s.offset, s.index, ov);
        for (size_t i = 0; i < n; ++i) {
          const float w = decode(f, want[i]);
          ASSERT_EQ(std::bit_cast<uint32_t>(v[i]), std::bit_cast<uint32_t>(w))
              << format_name(f) << " i=" << i << " x=" << src[i];
        }
      }
    }
  }
}

}  // namespace
}  // namespace mantissa
