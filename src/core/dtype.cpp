#include "mantissa/core/dtype.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <utility>

namespace mantissa {

std::optional<DType> parse_dtype(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& info : kDTypeTable) {
    if (s == info.name) return info.dtype;
  }
  static constexpr std::array<std::pair<std::string_view, DType>, 16> kAliases = {{
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
  }};
  for (const auto& [alias, d] : kAliases) {
    if (s == alias) return d;
  }
  return std::nullopt;
}

std::optional<Format> dtype_format(DType d) {
  switch (d) {
    case DType::F32:
      return Format::FP32;
    case DType::F16:
      return Format::FP16;
    case DType::BF16:
      return Format::BF16;
    case DType::FP8_E4M3:
      return Format::FP8_E4M3;
    case DType::FP8_E5M2:
      return Format::FP8_E5M2;
    default:
      return std::nullopt;
  }
}

}  // namespace mantissa
