// What the backends derive from the dtype list (MT_FORALL_DTYPES): exact widenings
// (backend/rounded_copy.h), frozen here as explicit expectations.
#include <gtest/gtest.h>

#include "backend/rounded_copy.h"

namespace mantissa::backend {
namespace {

// The exact float widenings, every pair: f32 into f64, half into f32/f64, fp8 into everything
// wider; never between formats of one width.
TEST(DTypeTables, WidensExactly) {
  const DType floats[] = {DType::F64,  DType::F32,      DType::F16,
                          DType::BF16, DType::FP8_E4M3, DType::FP8_E5M2};
  for (const DTypeInfo& from : kDTypeTable) {
    for (const DTypeInfo& to : kDTypeTable) {
      bool want = from.dtype == to.dtype;
      for (DType f : floats)
        for (DType t : floats)
          want = want || (from.dtype == f && to.dtype == t && dtype_size(f) < dtype_size(t));
      EXPECT_EQ(widens_exactly(from.dtype, to.dtype), want) << from.name << " -> " << to.name;
    }
  }
  EXPECT_TRUE(widens_exactly(DType::FP8_E5M2, DType::BF16));
  EXPECT_FALSE(widens_exactly(DType::F16, DType::BF16));
  EXPECT_FALSE(widens_exactly(DType::I32, DType::F64));
}

}  // namespace
}  // namespace mantissa::backend
