// The fp8 options' rules (mantissa/autocast/fp8.h): each recipe's traits, what an unset option
// resolves to, and the spelling of --fp8-accumulate. Apart from fp8.cpp because the config layer
// (and the fuzz targets' parsers, which link no tensors) needs them.
#include "mantissa/autocast/fp8.h"

#include <charconv>
#include <string>

#include "mantissa/core/error.h"

namespace mantissa::amp {

namespace {

struct RecipeTraits {
  bool per_tensor;
  Fp8Format format;
  bool pow2;
};
constexpr RecipeTraits kRecipeTraits[] = {
#define MT_FP8_RECIPE_TRAITS(e, name, help, per_tensor, format, pow2) {per_tensor, format, pow2},
    MT_FORALL_FP8_RECIPES(MT_FP8_RECIPE_TRAITS)
#undef MT_FP8_RECIPE_TRAITS
};
const RecipeTraits& traits(Fp8Recipe r) {
  return kRecipeTraits[size_t(r)];
}

}  // namespace

Fp8Format Fp8Options::resolved_format() const {
  return format.value_or(traits(recipe).format);
}

bool Fp8Options::resolved_pow2_scales() const {
  return pow2_scales.value_or(traits(recipe).pow2);
}

bool Fp8Options::per_tensor() const {
  return traits(recipe).per_tensor;
}

Fp8Accumulation Fp8Accumulation::parse(std::string_view text) {
  if (text == "fp32") return {};
  if (text == "fast") return {.fast = true};
  if (text == "native") return {.fast = true, .native = true};
  const std::string_view prefix = "fast:";
  int64_t n = 0;
  if (text.starts_with(prefix)) {
    const std::string_view digits = text.substr(prefix.size());
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (ec == std::errc() && end == digits.data() + digits.size() && !digits.empty() && n >= 1)
      return {.fast = true, .promote_every = n};
  }
  MT_CHECK(false,
           "--fp8-accumulate takes fp32, fast (the tensor cores' narrow accumulator for the whole "
           "sum), fast:N (promoted to fp32 every N products, N >= 1; DeepSeek-V3 uses 128) or "
           "native (the GPU's own: cuBLASLt's FAST_ACCUM), got '",
           std::string(text), "'");
  return {};
}

std::string Fp8Accumulation::str() const {
  if (!fast) return "fp32";
  if (native) return "native";
  return promote_every > 0 ? "fast:" + std::to_string(promote_every) : "fast";
}

}  // namespace mantissa::amp
