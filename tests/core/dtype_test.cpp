#include <gtest/gtest.h>

#include <set>

#include "mantissa/core/dtype.h"

namespace mantissa {
namespace {

TEST(DType, TableIsConsistentWithTheList) {
  EXPECT_EQ(kNumDTypes, 10);
  std::set<std::string_view> names;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DTypeInfo& info = kDTypeTable[i];
    EXPECT_EQ(static_cast<int>(info.dtype), i) << "the table follows the enum's order";
    EXPECT_TRUE(names.insert(info.name).second) << "duplicate name " << info.name;
    EXPECT_EQ(parse_dtype(info.name), info.dtype);
  }
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::FP8_E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::Bool), 1u);
  EXPECT_TRUE(is_floating(DType::F16));
  EXPECT_FALSE(is_floating(DType::I32));
  EXPECT_EQ(dtype_info(DType::FP8_E4M3).safetensors, "F8_E4M3");
}

TEST(DType, OrderIsFrozenForCheckpoints) {
  // Checkpoints store these numbers: changing one breaks every saved file.
  EXPECT_EQ(static_cast<int>(DType::F64), 0);
  EXPECT_EQ(static_cast<int>(DType::F32), 1);
  EXPECT_EQ(static_cast<int>(DType::F16), 2);
  EXPECT_EQ(static_cast<int>(DType::BF16), 3);
  EXPECT_EQ(static_cast<int>(DType::FP8_E4M3), 4);
  EXPECT_EQ(static_cast<int>(DType::FP8_E5M2), 5);
  EXPECT_EQ(static_cast<int>(DType::I64), 6);
  EXPECT_EQ(static_cast<int>(DType::I32), 7);
  EXPECT_EQ(static_cast<int>(DType::U8), 8);
  EXPECT_EQ(static_cast<int>(DType::Bool), 9);
}

TEST(DType, AliasesAndFormats) {
  EXPECT_EQ(parse_dtype("float32"), DType::F32);
  EXPECT_EQ(parse_dtype("BFloat16"), DType::BF16);
  EXPECT_EQ(parse_dtype("half"), DType::F16);
  EXPECT_FALSE(parse_dtype("complex64").has_value());
  EXPECT_EQ(dtype_format(DType::BF16), Format::BF16);
  EXPECT_FALSE(dtype_format(DType::I64).has_value());
  EXPECT_FALSE(dtype_format(DType::F64).has_value());
  static_assert(std::is_same_v<DTypeTraits<DType::BF16>::type, bfloat16>);
  static_assert(std::is_same_v<DTypeTraits<DType::F16>::compute_type, float>);
}

}  // namespace
}  // namespace mantissa
