// promote_types over every pair of dtypes, derived from the dtype list (kind and width): frozen
// here as the table it was when it was a pair of hand-written rank switches.
#include <gtest/gtest.h>

#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

TEST(PromoteTypes, EveryPair) {
  using enum DType;
  // want[a][b], rows and columns in the list's order.
  const DType want[kNumDTypes][kNumDTypes] = {
      {F64, F64, F64, F64, F64, F64, F64, F64, F64, F64},                            // f64
      {F64, F32, F32, F32, F32, F32, F32, F32, F32, F32},                            // f32
      {F64, F32, F16, F32, F16, F16, F16, F16, F16, F16},                            // f16
      {F64, F32, F32, BF16, BF16, BF16, BF16, BF16, BF16, BF16},                     // bf16
      {F64, F32, F16, BF16, FP8_E4M3, F16, FP8_E4M3, FP8_E4M3, FP8_E4M3, FP8_E4M3},  // e4m3
      {F64, F32, F16, BF16, F16, FP8_E5M2, FP8_E5M2, FP8_E5M2, FP8_E5M2, FP8_E5M2},  // e5m2
      {F64, F32, F16, BF16, FP8_E4M3, FP8_E5M2, I64, I64, I64, I64},                 // i64
      {F64, F32, F16, BF16, FP8_E4M3, FP8_E5M2, I64, I32, I32, I32},                 // i32
      {F64, F32, F16, BF16, FP8_E4M3, FP8_E5M2, I64, I32, U8, U8},                   // u8
      {F64, F32, F16, BF16, FP8_E4M3, FP8_E5M2, I64, I32, U8, Bool},                 // bool
  };
  for (int a = 0; a < kNumDTypes; ++a) {
    for (int b = 0; b < kNumDTypes; ++b) {
      EXPECT_EQ(promote_types(DType(a), DType(b)), want[a][b])
          << dtype_name(DType(a)) << " + " << dtype_name(DType(b));
    }
  }
}

}  // namespace
}  // namespace mantissa
