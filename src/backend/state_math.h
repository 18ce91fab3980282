// Internal: the arithmetic of the block-scaled optimizer states (optim/state_format.h), one
// definition for every backend: a block's absmax, fp8 E4M3 codes under it, and bitsandbytes'
// dynamic 8-bit maps with their nearest-code search. Pure functions of plain values: nvcc
// compiles them for the device too.
//
// The dynamic maps ("8-Bit Approximations for Parallelism in Deep Learning", Dettmers 2015, as
// bitsandbytes' create_dynamic_map with 7 exponent bits and 8 bits in all): for i = 0..6 the
// interval [0.1, 1] is cut into n_i equal parts by n_i + 1 boundaries b_0..b_n (b_k = 0.1 +
// k * 0.9 / n_i), and each part's midpoint, times 10^(i - 6), is a code value. The signed map
// has n_i = 2^i (127 magnitudes, each with both signs), the unsigned map n_i = 2^(i + 1) (254
// magnitudes); both add 0 and 1.0 and are sorted: 256 values in [-1, 1] or [0, 1]. Each value
// here is its midpoint computed in double and rounded once to float; bitsandbytes computes the
// same midpoints with torch.linspace in float32, whose last bit depends on the CPU's vector
// width. tools/reference/optim_state_golden.py compares the two (docs/memory.md has the figure).
#pragma once

#include <bit>
#include <cstdint>

#include "backend/host_device.h"
#include "mantissa/numerics/round.h"

namespace mantissa::backend {

// A block's scale: max |x| over its n values; NaN when one is NaN (the block's state then reads
// back NaN, as an fp32 state would be). In float (a double state's is rounded once).
template <typename C>
MT_HOST_DEVICE constexpr float block_absmax(const C* x, int64_t n) {
  C m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const C a = x[i] < C(0) ? -x[i] : x[i];
    if (a > m || a != a) m = a;
    if (m != m) break;
  }
  return float(m);
}

// ---- fp8 ---------------------------------------------------------------------------------------

inline constexpr float kStateFp8Max = 448.0f;  // E4M3's largest finite value

// x's E4M3 code under a block of absmax `absmax` (> 0): e4m3(x * (448 / absmax)) to nearest
// even, saturating at +-448.
MT_HOST_DEVICE constexpr uint8_t state_fp8_encode(float x, float absmax) {
  constexpr FormatSpec e4m3 = format_spec(Format::FP8_E4M3);
  if (absmax == 0.0f) return 0;
  const float inv = kStateFp8Max / absmax;
  return uint8_t(detail::encode_bits<float>(std::bit_cast<uint32_t>(x * inv), e4m3,
                                            RoundingMode::NearestEven, Overflow::Saturate, 0u));
}

MT_HOST_DEVICE constexpr float state_fp8_decode(uint8_t code, float absmax) {
  constexpr FormatSpec e4m3 = format_spec(Format::FP8_E4M3);
  return detail::decode_bits(code, e4m3) * (absmax / kStateFp8Max);
}

// ---- the dynamic 8-bit maps --------------------------------------------------------------------

struct DynamicMap {
  float value[256];  // ascending
  float mid[255];    // mid[k] = (value[k] + value[k + 1]) / 2 in float: the decision points
  // Where the search for a q starts: the count of decision points below the lowest float whose
  // top 14 bits (sign, exponent, 5 mantissa bits) are q's. At most two points lie inside one
  // such bin, so the search ends within two steps of its start.
  uint8_t start[1 << 14];
};

inline constexpr int kDynamicMapBinShift = 18;  // a float's bits >> 18: its bin of start[]

namespace detail {

// 10^e for e in [-6, 0], exact in double as the quotient of two exact powers of ten.
constexpr double pow10_neg(int e) {
  double d = 1.0;
  for (int i = 0; i < -e; ++i)
    d *= 10.0;
  return 1.0 / d;
}

constexpr void sort_floats(float* v, int n) {
  for (int i = 1; i < n; ++i) {
    const float x = v[i];
    int j = i - 1;
    for (; j >= 0 && v[j] > x; --j)
      v[j + 1] = v[j];
    v[j + 1] = x;
  }
}

constexpr DynamicMap make_dynamic_map(bool is_signed) {
  DynamicMap m{};
  int n = 0;
  for (int i = 0; i < 7; ++i) {
    const int parts = is_signed ? 1 << i : 1 << (i + 1);
    const double scale = pow10_neg(i - 6);
    for (int k = 0; k < parts; ++k) {
      const double lo = 0.1 + k * (0.9 / parts), hi = 0.1 + (k + 1) * (0.9 / parts);
      const auto v = float(scale * ((lo + hi) / 2.0));
      m.value[n++] = v;
      if (is_signed) m.value[n++] = -v;
    }
  }
  m.value[n++] = 0.0f;
  m.value[n++] = 1.0f;
  sort_floats(m.value, n);
  for (int k = 0; k < 255; ++k)
    m.mid[k] = (m.value[k] + m.value[k + 1]) / 2.0f;
  for (uint32_t bin = 0; bin < (1u << 14); ++bin) {
    // The bin's lowest float: its smallest magnitude when positive, its largest when negative.
    const uint32_t low_bits = (bin & 0x2000u) != 0 ? (1u << kDynamicMapBinShift) - 1 : 0u;
    const float low = std::bit_cast<float>((bin << kDynamicMapBinShift) | low_bits);
    int count = 0;  // of the 255 = 2^8 - 1 sorted points below `low`: a binary search
    for (int step = 128; step >= 1; step >>= 1)
      count += m.mid[count + step - 1] < low ? step : 0;
    m.start[bin] = uint8_t(count);
  }
  return m;
}

}  // namespace detail

// Index 127 of the signed map is 0, index 0 of the unsigned map is 0.
inline constexpr DynamicMap kSignedDynamicMap = detail::make_dynamic_map(true);
inline constexpr DynamicMap kUnsignedDynamicMap = detail::make_dynamic_map(false);

// The map of a moment: signed for first moments (momentum, exp_avg), unsigned for second ones.
constexpr const DynamicMap& dynamic_map_of(bool first_moment) {
  return first_moment ? kSignedDynamicMap : kUnsignedDynamicMap;
}

// The code of x (|x| <= absmax) under a block of absmax `absmax`: the number of decision points
// below x / absmax, i.e. the nearest map value with ties to the lower index (bitsandbytes'
// reference quantizer: bucketize over the midpoints). An all-zero block codes its zeros as the
// map's 0.
MT_HOST_DEVICE constexpr uint8_t state_q8_encode(float x, float absmax, const DynamicMap& map) {
  const float q = absmax == 0.0f ? 0.0f : x / absmax;
  // From q's bin (start[]) up to the first decision point not below q: a step or two, where a
  // binary search over the 255 points was eight dependent loads.
  int idx = map.start[std::bit_cast<uint32_t>(q) >> kDynamicMapBinShift];
  while (idx < 255 && map.mid[idx] < q)
    ++idx;
  return uint8_t(idx);
}

MT_HOST_DEVICE constexpr float state_q8_decode(uint8_t code, float absmax, const DynamicMap& map) {
  return map.value[code] * absmax;
}

}  // namespace mantissa::backend
