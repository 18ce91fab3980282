// The one list of tensor element types (docs/design.md §7). Everything that enumerates dtypes —
// names, sizes, promotion, formats, dispatch on both backends, checkpoint tags, the library type
// maps (src/backend/dtype_map.h) — expands this list or reads the table made from it, so adding a
// dtype is one line here plus its conversion kernels (numerics/), and a library map that lacks
// the new row fails to compile, naming it.
// The order is part of the checkpoint format: append, never reorder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "mantissa/numerics/types.h"

// _(Enum, name, storage type, compute type, kind, format, safetensors dtype tag, aliases)
//   kind:    Float, Integer or Bool: which ops and dispatchers take it;
//   format:  the numerics Format whose grid the values lie on (None: f64 and the non-floats);
//   aliases: the other names parse_dtype accepts, separated by spaces.
// Type promotion follows the kind and the storage size (promote_types, tensor/ops.h).
// clang-format off
#define MT_FORALL_DTYPES(_)                                                                                     \
  _(F64,      "f64",      double,                  double,  Float,   None,     "F64",     "float64 double")     \
  _(F32,      "f32",      float,                   float,   Float,   FP32,     "F32",     "float32 float fp32") \
  _(F16,      "f16",      ::mantissa::half,        float,   Float,   FP16,     "F16",     "float16 half fp16")  \
  _(BF16,     "bf16",     ::mantissa::bfloat16,    float,   Float,   BF16,     "BF16",    "bfloat16")           \
  _(FP8_E4M3, "fp8_e4m3", ::mantissa::float8_e4m3, float,   Float,   FP8_E4M3, "F8_E4M3", "e4m3 float8_e4m3fn") \
  _(FP8_E5M2, "fp8_e5m2", ::mantissa::float8_e5m2, float,   Float,   FP8_E5M2, "F8_E5M2", "e5m2 float8_e5m2")   \
  _(I64,      "i64",      int64_t,                 int64_t, Integer, None,     "I64",     "int64")              \
  _(I32,      "i32",      int32_t,                 int32_t, Integer, None,     "I32",     "int32")              \
  _(U8,       "u8",       uint8_t,                 uint8_t, Integer, None,     "U8",      "uint8")              \
  _(Bool,     "bool",     bool,                    bool,    Bool,    None,     "BOOL",    "")
// clang-format on

namespace mantissa {

enum class DType : uint8_t {
#define MT_DTYPE_ENUM(e, ...) e,
  MT_FORALL_DTYPES(MT_DTYPE_ENUM)
#undef MT_DTYPE_ENUM
};

#define MT_DTYPE_COUNT(...) +1
inline constexpr int kNumDTypes = 0 MT_FORALL_DTYPES(MT_DTYPE_COUNT);
#undef MT_DTYPE_COUNT

// What a dtype holds, for dispatch: real numbers, integers, or truth values.
enum class DTypeKind : uint8_t { Float, Integer, Bool };

// The spellings of the list's format column: a Format enumerator, or None.
namespace dtype_column {
using enum Format;
inline constexpr std::nullopt_t None = std::nullopt;
}  // namespace dtype_column

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
  bool is_float;
  std::string_view safetensors;
  DTypeKind kind;
  std::optional<Format> format;
  std::string_view aliases;  // space-separated
};

inline constexpr DTypeInfo kDTypeTable[] = {
#define MT_DTYPE_INFO(e, name, T, C, kind, format, st, aliases) \
  {DType::e,                                                    \
   name,                                                        \
   sizeof(T),                                                   \
   DTypeKind::kind == DTypeKind::Float,                         \
   st,                                                          \
   DTypeKind::kind,                                             \
   dtype_column::format,                                        \
   aliases},
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
constexpr DTypeKind dtype_kind(DType d) {
  return dtype_info(d).kind;
}

// Accepts the list's names and their aliases ("float32", "half", "bfloat16", "int64", ...),
// in any case.
std::optional<DType> parse_dtype(std::string_view name);

// The numeric format of a floating dtype (f64 has none: it is not a training format).
constexpr std::optional<Format> dtype_format(DType d) {
  return dtype_info(d).format;
}

// The C++ type of each dtype, for templates: DTypeTraits<DType::BF16>::type == bfloat16.
template <DType D>
struct DTypeTraits;
#define MT_DTYPE_TRAITS(e, name, T, C, kind, ...)            \
  template <>                                                \
  struct DTypeTraits<DType::e> {                             \
    using type = T;                                          \
    using compute_type = C;                                  \
    static constexpr DTypeKind dtype_kind = DTypeKind::kind; \
  };
MT_FORALL_DTYPES(MT_DTYPE_TRAITS)
#undef MT_DTYPE_TRAITS

// The dtype whose storage type is T: DTypeOf<bfloat16>::value == DType::BF16. Storage types are
// unique (a second row with the same type is a redefinition error); a type of no dtype has no
// value (is_storage_type_v is false).
template <typename T>
struct DTypeOf;
#define MT_DTYPE_OF(e, name, T, ...)         \
  template <>                                \
  struct DTypeOf<T> {                        \
    static constexpr DType value = DType::e; \
  };
MT_FORALL_DTYPES(MT_DTYPE_OF)
#undef MT_DTYPE_OF

template <typename T>
inline constexpr bool is_storage_type_v = requires {
  DTypeOf<T>::value;
};
template <typename T>
inline constexpr DType dtype_of_v = DTypeOf<T>::value;

}  // namespace mantissa
