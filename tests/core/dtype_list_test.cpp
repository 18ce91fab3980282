// What the rest of the engine derives from the one dtype list (MT_FORALL_DTYPES): kinds,
// formats, aliases, and the type maps both ways. The list's first columns are checked in
// dtype_test.cpp.
#include <gtest/gtest.h>

#include <type_traits>

#include "mantissa/core/dtype.h"

namespace mantissa {
namespace {

// Storage type -> dtype is the list read backwards, and storage types are unique.
static_assert(dtype_of_v<double> == DType::F64);
static_assert(dtype_of_v<bfloat16> == DType::BF16);
static_assert(dtype_of_v<float8_e5m2> == DType::FP8_E5M2);
static_assert(dtype_of_v<bool> == DType::Bool);
static_assert(!is_storage_type_v<char> && !is_storage_type_v<uint16_t>);
static_assert(DTypeTraits<DType::I32>::dtype_kind == DTypeKind::Integer);

// The numerics layer's storage floats: converted through round.h, never by a cast.
static_assert(is_small_float_v<half> && is_small_float_v<float8_e4m3>);
static_assert(!is_small_float_v<float> && !is_small_float_v<double> && !is_small_float_v<bool>);

constexpr bool every_row_round_trips() {
  for (const DTypeInfo& info : kDTypeTable) {
    if (info.is_float != (info.kind == DTypeKind::Float)) return false;
    // A format exactly for the floats, except f64 (not a training format).
    if (info.format.has_value() != (info.is_float && info.dtype != DType::F64)) return false;
  }
  return true;
}
static_assert(every_row_round_trips());

TEST(DTypeList, KindsAndFormats) {
  EXPECT_EQ(dtype_kind(DType::F16), DTypeKind::Float);
  EXPECT_EQ(dtype_kind(DType::U8), DTypeKind::Integer);
  EXPECT_EQ(dtype_kind(DType::Bool), DTypeKind::Bool);
  EXPECT_EQ(dtype_format(DType::F32), Format::FP32);
  EXPECT_EQ(dtype_format(DType::F16), Format::FP16);
  EXPECT_EQ(dtype_format(DType::FP8_E4M3), Format::FP8_E4M3);
  EXPECT_EQ(dtype_format(DType::FP8_E5M2), Format::FP8_E5M2);
  EXPECT_FALSE(dtype_format(DType::Bool).has_value());
}

TEST(DTypeList, EveryAliasParses) {
  const std::pair<const char*, DType> aliases[] = {
      {"float64", DType::F64},
      {"double", DType::F64},
      {"float32", DType::F32},
      {"float", DType::F32},
      {"fp32", DType::F32},
      {"float16", DType::F16},
      {"half", DType::F16},
      {"fp16", DType::F16},
      {"bfloat16", DType::BF16},
      {"e4m3", DType::FP8_E4M3},
      {"float8_e4m3fn", DType::FP8_E4M3},
      {"e5m2", DType::FP8_E5M2},
      {"float8_e5m2", DType::FP8_E5M2},
      {"int64", DType::I64},
      {"int32", DType::I32},
      {"uint8", DType::U8},
      {"FLOAT8_E5M2", DType::FP8_E5M2},
  };
  for (const auto& [alias, d] : aliases)
    EXPECT_EQ(parse_dtype(alias), d) << alias;
  // Not the aliases' separators or pieces of them.
  for (const char* bad : {"", " ", "float16 half", "float8", "fp8", "e4", "int", "f8_e4m3"})
    EXPECT_FALSE(parse_dtype(bad).has_value()) << '"' << bad << '"';
}

}  // namespace
}  // namespace mantissa
