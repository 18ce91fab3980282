// The precision table (amp/precision.h): what each row means, read by the configuration's
// validation (which the fuzz targets build without tensors) and by amp::initialize (amp.cpp).
#include "mantissa/amp/precision.h"

#include "mantissa/core/cpu.h"
#include "mantissa/core/error.h"

namespace mantissa::amp {

const PrecisionInfo& precision_info(Precision p) {
  static constexpr PrecisionInfo kInfo[] = {
#define MT_PRECISION_INFO(e, name, help, dtype, level, levels, gemm) {dtype, level, levels, gemm},
      MT_FORALL_PRECISIONS(MT_PRECISION_INFO)
#undef MT_PRECISION_INFO
  };
  return kInfo[size_t(p)];
}

Precision resolve(Precision p) {
  if (p != Precision::Auto) return p;
  return cpu_features().avx512_bf16 ? Precision::BF16 : Precision::FP16;
}

bool accepts_level(Precision p, OptLevel level) {
  return (precision_info(p).levels >> int(level)) & 1;
}

OptLevel level_of(const Recipe& r) {
  return r.level.value_or(precision_info(resolve(r.precision)).level);
}

}  // namespace mantissa::amp
