#include "mantissa/numerics/convert.h"

#include <algorithm>
#include <array>
#include <bit>
#include <type_traits>

#include "kernels.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/numerics/round.h"

namespace mantissa {
namespace {

// Whether the vector kernels implement these options (they cover the common case: RNE or
// truncation with the format's own overflow).
bool vectorizable(const RoundingOptions& o) {
  return o.mode != RoundingMode::Stochastic && o.overflow == Overflow::Infinity;
}

// Whether the stochastic vector kernels implement these options: they round with overflow to inf.
bool stochastic_vectorizable(const RoundingOptions& o) {
  return o.mode == RoundingMode::Stochastic && o.overflow == Overflow::Infinity;
}

// The scalar definition for any format and options; element i draws
// random_bits(seed, offset, index + i).
template <Format F, typename Out>
void encode_generic(const float* src, Out* dst, size_t n, const RoundingOptions& o) {
  constexpr FormatSpec spec = format_spec(F);
  auto put = [&](size_t i, uint32_t rnd) {
    const uint32_t bits =
        detail::encode_bits<float>(std::bit_cast<uint32_t>(src[i]), spec, o.mode, o.overflow, rnd);
    if constexpr (std::is_same_v<Out, float>) {
      dst[i] = detail::decode_bits(bits, spec);
    } else {
      dst[i] = Out::from_bits(static_cast<typename Out::bits_type>(bits));
    }
  };
  if (o.mode != RoundingMode::Stochastic) {
    for (size_t i = 0; i < n; ++i)
      put(i, 0);
    return;
  }
  const std::array<uint32_t, 2> key = {uint32_t(o.seed), uint32_t(o.seed >> 32)};
  // Element i uses word (index + i) % 4 of Philox block (index + i) / 4.
  size_t i = 0;
  while (i < n) {
    const uint64_t pos = o.index + i;
    const uint64_t block = pos >> 2;
    const PhiloxBlock r = philox4x32_10(
        {uint32_t(block), uint32_t(block >> 32), uint32_t(o.offset), uint32_t(o.offset >> 32)},
        key);
    for (size_t w = size_t(pos & 3); w < 4 && i < n; ++w, ++i)
      put(i, r[w]);
  }
}

template <typename T>
uint16_t* bits_of(T* p) {
  return reinterpret_cast<uint16_t*>(p);
}
template <typename T>
const uint16_t* bits_of(const T* p) {
  return reinterpret_cast<const uint16_t*>(p);
}

template <Format F>
constexpr std::array<float, 256> make_decode_table() {
  std::array<float, 256> t{};
  for (uint32_t b = 0; b < 256; ++b)
    t[b] = decode(F, b);
  return t;
}

// Any one-byte format through its 256-entry table (fp6/fp4 use the low 64/16 entries).
template <Format F, typename T>
void decode_byte(const T* src, float* dst, size_t n) {
  static constexpr std::array<float, 256> kTable = make_decode_table<F>();
  for (size_t i = 0; i < n; ++i)
    dst[i] = kTable[src[i].bits];
}

// Round to nearest even with saturation into an fp8 format (fp8 training's quantization); the
// element function (round.h) is branch-free, so the loop vectorizes.
template <Format F, typename Out>
void encode_fp8_saturating(const float* src, Out* dst, size_t n) {
  uint8_t* out = reinterpret_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i)
    out[i] = uint8_t(detail::encode_fp8_saturating<F>(std::bit_cast<uint32_t>(src[i])));
}

}  // namespace

void convert(const float* src, bfloat16* dst, size_t n, const RoundingOptions& o) {
  if (vectorizable(o)) return detail::f32_to_bf16(src, bits_of(dst), n, o.mode, detail::best_isa());
  if (stochastic_vectorizable(o)) {
    return detail::f32_to_bf16_stochastic(src, bits_of(dst), n, o.seed, o.offset, o.index,
                                          detail::best_isa());
  }
  encode_generic<Format::BF16>(src, dst, n, o);
}

void convert(const float* src, half* dst, size_t n, const RoundingOptions& o) {
  if (vectorizable(o)) return detail::f32_to_f16(src, bits_of(dst), n, o.mode, detail::best_isa());
  if (stochastic_vectorizable(o)) {
    return detail::f32_to_f16_stochastic(src, bits_of(dst), n, o.seed, o.offset, o.index,
                                         detail::best_isa());
  }
  encode_generic<Format::FP16>(src, dst, n, o);
}

void convert(const float* src, float8_e4m3* dst, size_t n, const RoundingOptions& o) {
  if (o.mode == RoundingMode::NearestEven && o.overflow == Overflow::Saturate) {
    return encode_fp8_saturating<Format::FP8_E4M3>(src, dst, n);
  }
  encode_generic<Format::FP8_E4M3>(src, dst, n, o);
}

void convert(const float* src, float8_e5m2* dst, size_t n, const RoundingOptions& o) {
  if (o.mode == RoundingMode::NearestEven && o.overflow == Overflow::Saturate) {
    return encode_fp8_saturating<Format::FP8_E5M2>(src, dst, n);
  }
  encode_generic<Format::FP8_E5M2>(src, dst, n, o);
}

// The microscaling formats through the scalar definition (their vectorized quantization lives
// with the block-scaled recipes that use it).
void convert(const float* src, float6_e2m3* dst, size_t n, const RoundingOptions& o) {
  encode_generic<Format::FP6_E2M3>(src, dst, n, o);
}
void convert(const float* src, float6_e3m2* dst, size_t n, const RoundingOptions& o) {
  encode_generic<Format::FP6_E3M2>(src, dst, n, o);
}
void convert(const float* src, float4_e2m1* dst, size_t n, const RoundingOptions& o) {
  encode_generic<Format::FP4_E2M1>(src, dst, n, o);
}
void convert(const float* src, float8_e8m0* dst, size_t n, const RoundingOptions& o) {
  encode_generic<Format::E8M0>(src, dst, n, o);
}

void convert(const bfloat16* src, float* dst, size_t n) {
  detail::bf16_to_f32(bits_of(src), dst, n, detail::best_isa());
}

void convert(const half* src, float* dst, size_t n) {
  detail::f16_to_f32(bits_of(src), dst, n, detail::best_isa());
}

void convert(const float8_e4m3* src, float* dst, size_t n) {
  decode_byte<Format::FP8_E4M3>(src, dst, n);
}

void convert(const float8_e5m2* src, float* dst, size_t n) {
  decode_byte<Format::FP8_E5M2>(src, dst, n);
}

void convert(const float6_e2m3* src, float* dst, size_t n) {
  decode_byte<Format::FP6_E2M3>(src, dst, n);
}

void convert(const float6_e3m2* src, float* dst, size_t n) {
  decode_byte<Format::FP6_E3M2>(src, dst, n);
}

void convert(const float4_e2m1* src, float* dst, size_t n) {
  decode_byte<Format::FP4_E2M1>(src, dst, n);
}

void convert(const float8_e8m0* src, float* dst, size_t n) {
  decode_byte<Format::E8M0>(src, dst, n);
}

void round_in_place(Format f, float* data, size_t n, const RoundingOptions& o) {
  const bool has_kernel = f == Format::TF32 || f == Format::BF16 || f == Format::FP16;
  if (has_kernel && vectorizable(o)) {
    return detail::round_in_place_fast(f, data, n, o.mode, detail::best_isa());
  }
  if ((f == Format::BF16 || f == Format::FP16) && stochastic_vectorizable(o)) {
    // The vector stochastic conversion into a chunk of 16-bit values, widened back exactly: the
    // same bits as the scalar definition (element i draws at index + i; measured 20x faster).
    constexpr size_t kChunk = 4096;
    alignas(64) uint16_t bits[kChunk];
    for (size_t start = 0; start < n; start += kChunk) {
      const size_t len = std::min(kChunk, n - start);
      RoundingOptions c = o;
      c.index = o.index + start;
      if (f == Format::BF16) {
        auto* b = reinterpret_cast<bfloat16*>(bits);
        convert(data + start, b, len, c);
        convert(b, data + start, len);
      } else {
        auto* h = reinterpret_cast<half*>(bits);
        convert(data + start, h, len, c);
        convert(h, data + start, len);
      }
    }
    return;
  }
  with_format(f, [&](auto format) {
    constexpr Format F = decltype(format)::value;
    if constexpr (F != Format::FP32) encode_generic<F>(data, data, n, o);
  });
}

}  // namespace mantissa
