// CPU copy with a rounding mode: stochastic or truncating casts into the narrow float formats.
// Float sources go through the vectorized bulk conversions of numerics/convert.h; f64 and
// integer sources are rounded once, straight from double, by round.h's scalar encode().
#include <bit>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/loops.h"
#include "backend/rounded_copy.h"
#include "mantissa/numerics/round.h"

namespace mantissa::backend::cpu {
namespace {

template <typename O>
O from_format_bits(uint32_t bits) {
  if constexpr (std::is_same_v<O, float>) {
    return std::bit_cast<float>(bits);
  } else {
    return O::from_bits(static_cast<typename O::bits_type>(bits));
  }
}

}  // namespace

void CpuBackend::copy_rounded(const Tensor& src, Tensor& dst, const RoundingOptions& rounding) {
  MT_ASSERT(src.shape() == dst.shape(), "copy_rounded: ", src.describe(), " into ", dst.describe());
  if (rounded_copy_is_plain(src.dtype(), dst.dtype(), rounding)) {
    copy(src, dst);
    return;
  }
  if (!dst.is_contiguous()) {
    Tensor tmp = Tensor::empty(dst.shape(), dst.dtype(), dst.device());
    copy_rounded(src, tmp, rounding);
    copy(tmp, dst);
    return;
  }
  const Shape shape = src.shape();
  const Operand in = operand_for(src, shape);
  const Format format = *dtype_format(dst.dtype());
  const bool stochastic = rounding.mode == RoundingMode::Stochastic;
  dispatch_dtype(src.dtype(), [&]<typename T>() {
    dispatch_float(dst.dtype(), "copy_rounded", [&]<typename O>() {
      O* d = static_cast<O*>(dst.data_ptr());
      // Chunk [start, start + n) draws stream positions rounding.index + start + i, so the
      // result does not depend on the chunking or the thread count.
      parallel_chunks(src.numel(), [&](int64_t start, int64_t n) {
        constexpr bool kFloatSource = std::is_same_v<T, float> || is_small_float_v<T>;
        if constexpr (kFloatSource && is_small_float_v<O>) {
          alignas(64) float buf[kChunk];
          const float* p = buf;
          if constexpr (std::is_same_v<T, float>) {
            if (in.contiguous) p = reinterpret_cast<const float*>(in.base) + start;
          }
          if (p == buf) gather_chunk<T, float>(in, shape, start, n, buf);
          RoundingOptions chunk = rounding;
          chunk.index = rounding.index + uint64_t(start);
          convert(p, d + start, size_t(n), chunk);
        } else if constexpr (!kFloatSource && !std::is_same_v<O, double>) {
          alignas(64) double buf[kChunk];
          gather_chunk<T, double>(in, shape, start, n, buf);
          PhiloxStream rng(rounding.seed, rounding.offset);
          for (int64_t i = 0; i < n; ++i) {
            const uint32_t bits =
                stochastic ? rng(rounding.index + uint64_t(start + i)) : uint32_t(0);
            d[start + i] =
                from_format_bits<O>(encode(format, buf[i], rounding.mode, rounding.overflow, bits));
          }
        } else {
          // Float into f32/f64 widens exactly and f64 holds no format: rounded_copy_is_plain.
          MT_ASSERT(false, "copy_rounded: ", dtype_name(src.dtype()), " into ",
                    dtype_name(dst.dtype()), " is a plain copy");
        }
      });
    });
  });
}

}  // namespace mantissa::backend::cpu
