// The one list of tensor element types (DESIGN.md §7). Everything that enumerates dtypes —
// names, sizes, dispatch, checkpoint tags — expands this list, so adding a dtype is one line.
// The order is part of the checkpoint format: append, never reorder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "mantissa/numerics/types.h"

// _(Enum, name, storage type, compute type, is_float, safetensors dtype tag)
#define MT_FORALL_DTYPES(_)                                                \
  _(F64, "f64", double, double, true, "F64")                               \
  _(F32, "f32", float, float, true, "F32")                                 \
  _(F16, "f16", ::mantissa::half, float, true, "F16")                      \
  _(BF16, "bf16", ::mantissa::bfloat16, float, true, "BF16")               \
  _(FP8_E4M3, "fp8_e4m3", ::mantissa::float8_e4m3, float, true, "F8_E4M3") \
  _(FP8_E5M2, "fp8_e5m2", ::mantissa::float8_e5m2, float, true, "F8_E5M2") \
  _(I64, "i64", int64_t, int64_t, false, "I64")                            \
  _(I32, "i32", int32_t, int32_t, false, "I32")                            \
  _(U8, "u8", uint8_t, uint8_t, false, "U8")                               \
  _(Bool, "bool", bool, bool, false, "BOOL")

namespace mantissa {

enum class DType : uint8_t {
#define MT_DTYPE_ENUM(e, ...) e,
  MT_FORALL_DTYPES(MT_DTYPE_ENUM)
#undef MT_DTYPE_ENUM
};

#define MT_DTYPE_COUNT(...) +1
inline constexpr int kNumDTypes = 0 MT_FORALL_DTYPES(MT_DTYPE_COUNT);
#undef MT_DTYPE_COUNT

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
  bool is_float;
  std::string_view safetensors;
};

inline constexpr DTypeInfo kDTypeTable[] = {
#define MT_DTYPE_INFO(e, name, T, C, is_float, st) {DType::e, name, sizeof(T), is_float, st},
    MT_FORALL_DTYPES(MT_DTYPE_INFO)
#undef MT_DTYPE_INFO
};

constexpr const DTypeInfo& dtype_info(DType d) {
  return kDTypeTable[static_cast<int>(d)];
}
constexpr std::string_view dtype_name(DType d) {
  return dtype_info(d).name;
}
constexpr size_t dtype_size(DType d) {
  return dtype_info(d).size;
}
constexpr bool is_floating(DType d) {
  return dtype_info(d).is_float;
}

// Accepts the list's names and the usual aliases ("float32", "half", "bfloat16", "int64", ...).
std::optional<DType> parse_dtype(std::string_view name);

// The numeric format of a floating dtype (f64 has none: it is not a training format).
std::optional<Format> dtype_format(DType d);

// The C++ type of each dtype, for templates: DTypeTraits<DType::BF16>::type == bfloat16.
template <DType D>
struct DTypeTraits;
#define MT_DTYPE_TRAITS(e, name, T, C, ...) \
  template <>                               \
  struct DTypeTraits<DType::e> {            \
    using type = T;                         \
    using compute_type = C;                 \
  };
MT_FORALL_DTYPES(MT_DTYPE_TRAITS)
#undef MT_DTYPE_TRAITS

}  // namespace mantissa
