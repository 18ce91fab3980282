// What the backends derive from the dtype list (MT_FORALL_DTYPES): exact widenings
// (backend/rounded_copy.h) and the library type maps (backend/dtype_map.h), frozen here as
// explicit expectations.
#include <gtest/gtest.h>

#include "backend/dtype_map.h"
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

// The GEMM/convolution libraries take a dtype as it is under fp32/tf32 rounding or its own
// format; f64 under any.
TEST(DTypeTables, TakesRounding) {
  EXPECT_TRUE(takes_rounding(DType::F64, Format::FP16));
  EXPECT_TRUE(takes_rounding(DType::F32, Format::TF32));
  EXPECT_FALSE(takes_rounding(DType::F32, Format::BF16));
  EXPECT_TRUE(takes_rounding(DType::BF16, Format::BF16));
  EXPECT_TRUE(takes_rounding(DType::F16, Format::TF32));
  EXPECT_FALSE(takes_rounding(DType::BF16, Format::FP16));
  EXPECT_FALSE(takes_rounding(DType::F16, Format::FP8_E4M3));
}

constexpr DTypeMapRow<int> kExample[] = {
    {DType::F64, 64},           {DType::F32, 32},
    {DType::F16, kUnsupported}, {DType::BF16, 16},
    {DType::FP8_E4M3, 8},       {DType::FP8_E5M2, kUnsupported},
    {DType::I64, kUnsupported}, {DType::I32, kUnsupported},
    {DType::U8, kUnsupported},  {DType::Bool, kUnsupported},
};
static_assert(dtype_map_complete<kExample>());
static_assert(dtype_map_lookup(kExample, DType::BF16) == 16);
static_assert(!dtype_map_lookup(kExample, DType::F16).has_value());

}  // namespace
}  // namespace mantissa::backend
