#include "mantissa/numerics/format.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <utility>

namespace mantissa {
namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return std::tolower(c); });
  return r;
}

}  // namespace

std::optional<Format> parse_format(std::string_view name) {
  const std::string s = lower(name);
  for (const auto& info : kFormatTable) {
    if (s == info.name) return info.format;
  }
  // ml_dtypes' names of each format too, so a NumPy dtype's name is accepted as it prints.
  static constexpr std::array<std::pair<std::string_view, Format>, 21> kAliases = {{
      {"f32", Format::FP32},
      {"float32", Format::FP32},
      {"float", Format::FP32},
      {"f16", Format::FP16},
      {"float16", Format::FP16},
      {"half", Format::FP16},
      {"bfloat16", Format::BF16},
      {"e4m3", Format::FP8_E4M3},
      {"float8_e4m3fn", Format::FP8_E4M3},
      {"e5m2", Format::FP8_E5M2},
      {"float8_e5m2", Format::FP8_E5M2},
      {"tensorfloat32", Format::TF32},
      {"e2m3", Format::FP6_E2M3},
      {"float6_e2m3fn", Format::FP6_E2M3},
      {"e3m2", Format::FP6_E3M2},
      {"float6_e3m2fn", Format::FP6_E3M2},
      {"fp4", Format::FP4_E2M1},
      {"e2m1", Format::FP4_E2M1},
      {"float4_e2m1fn", Format::FP4_E2M1},
      {"float8_e8m0fnu", Format::E8M0},
      {"e8m0fnu", Format::E8M0},
  }};
  for (const auto& [alias, f] : kAliases) {
    if (s == alias) return f;
  }
  return std::nullopt;
}

std::string format_names() {
  std::string names;
  for (const auto& info : kFormatTable) {
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

std::string_view rounding_name(RoundingMode mode) {
  switch (mode) {
    case RoundingMode::NearestEven:
      return "nearest";
    case RoundingMode::TowardZero:
      return "truncate";
    case RoundingMode::Stochastic:
      return "stochastic";
  }
  return "?";
}

std::optional<RoundingMode> parse_rounding(std::string_view name) {
  const std::string s = lower(name);
  if (s == "nearest" || s == "nearest-even" || s == "rne") return RoundingMode::NearestEven;
  if (s == "truncate" || s == "toward-zero" || s == "rtz") return RoundingMode::TowardZero;
  if (s == "stochastic" || s == "sr") return RoundingMode::Stochastic;
  return std::nullopt;
}

}  // namespace mantissa
