// The option table (config/train_config.h) turned into the struct's JSON, its values as text, and
// each value's check; validate() keeps the rules between options.
#include "mantissa/config/train_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "mantissa/core/device.h"
#include "mantissa/core/error.h"

namespace mantissa::config {
namespace {

using Json = nlohmann::ordered_json;

// What `range` asks of `v`, which it refused: "positive", "in [0, 1)", "at most 4096". A range
// whose top is far (a count's) names the side `v` fell off; a narrow one names both.
std::string range_phrase(const Range& r, double v) {
  const auto num = [](double x) {
    return x == std::floor(x) && std::fabs(x) < 1e15 ? std::to_string(int64_t(x)) : Json(x).dump();
  };
  if (r.hi < double(1 << 16)) {
    return "in " + std::string(r.lo_open ? "(" : "[") + num(r.lo) + ", " + num(r.hi) +
           (r.hi_open ? ")" : "]");
  }
  if (v > r.lo || (v == r.lo && !r.lo_open))
    return (r.hi_open ? "less than " : "at most ") + num(r.hi);
  if ((r.lo == 0 && r.lo_open) || (r.lo == 1 && !r.lo_open)) return "positive";
  if (r.lo == 0) return "0 or more";
  return (r.lo_open ? "more than " : "at least ") + num(r.lo);
}

bool in_range(double v, const Range& r) {
  return (r.lo_open ? v > r.lo : v >= r.lo) && (r.hi_open ? v < r.hi : v <= r.hi);
}

// How each type of option is stored as JSON and written as text. from_json and from_text return
// "" when the value was taken, else what is wrong with it (without the option's name).
template <typename T>
struct Traits;

template <>
struct Traits<bool> {
  static constexpr ValueKind kind = ValueKind::Bool;
  static Json to_json(bool v) { return v; }
  static std::string from_json(const Json& j, bool& out) {
    if (!j.is_boolean()) return "must be true or false, not " + j.dump();
    out = j.get<bool>();
    return "";
  }
  static std::string to_text(bool v) { return v ? "true" : "false"; }
  static std::string from_text(std::string_view t, bool& out) {
    if (t == "true") return out = true, "";
    if (t == "false") return out = false, "";
    return "must be true or false, not '" + std::string(t) + "'";
  }
};

template <typename T>
requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) struct Traits<T> {
  static constexpr ValueKind kind = std::is_signed_v<T> ? ValueKind::Integer : ValueKind::Unsigned;
  using Limits = std::numeric_limits<T>;
  static std::string limits() {
    return "[" + std::to_string(+Limits::min()) + ", " + std::to_string(+Limits::max()) + "]";
  }
  static Json to_json(T v) { return v; }
  // One integer of exactly T's range: nlohmann's get_to would turn 1e30 into an undefined
  // conversion (found by fuzz/config_fuzz.cpp) and 3.7 into 3.
  static std::string from_json(const Json& j, T& out) {
    bool fits = false;
    if (j.is_number_unsigned()) {
      fits = j.get<uint64_t>() <= uint64_t(Limits::max());
    } else if (j.is_number_integer()) {
      const int64_t x = j.get<int64_t>();
      fits = Limits::is_signed ? x >= int64_t(Limits::min()) && x <= int64_t(Limits::max())
                               : x >= 0 && uint64_t(x) <= uint64_t(Limits::max());
    }
    if (!fits) return "must be an integer in " + limits() + ", not " + j.dump();
    out = j.is_number_unsigned() ? T(j.get<uint64_t>()) : T(j.get<int64_t>());
    return "";
  }
  static std::string to_text(T v) { return std::to_string(+v); }
  static std::string from_text(std::string_view t, T& out) {
    T v{};
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec == std::errc() && end == t.data() + t.size() && !t.empty()) return out = v, "";
    return "must be an integer in " + limits() + ", not '" + std::string(t) + "'";
  }
};

template <>
struct Traits<double> {
  static constexpr ValueKind kind = ValueKind::Real;
  static Json to_json(double v) { return v; }
  static std::string from_json(const Json& j, double& out) {
    if (!j.is_number()) return "must be a number, not " + j.dump();
    out = j.get<double>();
    return "";
  }
  static std::string to_text(double v) { return Json(v).dump(); }
  static std::string from_text(std::string_view t, double& out) {
    const std::string s(t);
    char* end = nullptr;
    const double v = s.empty() ? 0 : std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size()) return "must be a number, not '" + s + "'";
    out = v;
    return "";
  }
};

template <>
struct Traits<std::string> {
  static constexpr ValueKind kind = ValueKind::Text;
  static Json to_json(const std::string& v) { return v; }
  static std::string from_json(const Json& j, std::string& out) {
    if (!j.is_string()) return "must be a string, not " + j.dump();
    out = j.get<std::string>();
    return "";
  }
  static std::string to_text(const std::string& v) { return v; }
  static std::string from_text(std::string_view t, std::string& out) {
    out = std::string(t);
    return "";
  }
};

template <>
struct Traits<LossScale> {
  static constexpr ValueKind kind = ValueKind::Text;
  static Json to_json(const LossScale& v) { return v.str(); }
  static std::string from_json(const Json& j, LossScale& out) {
    if (!j.is_string()) return "must be a string, not " + j.dump();
    return from_text(j.get<std::string>(), out);
  }
  static std::string to_text(const LossScale& v) { return v.str(); }
  static std::string from_text(std::string_view t, LossScale& out) {
    try {
      out = LossScale::parse(t);
    } catch (const Error& e) {
      return e.message();
    }
    return "";
  }
};

template <>
struct Traits<amp::Fp8Accumulation> {
  static constexpr ValueKind kind = ValueKind::Text;
  static Json to_json(const amp::Fp8Accumulation& v) { return v.str(); }
  static std::string from_json(const Json& j, amp::Fp8Accumulation& out) {
    if (!j.is_string()) return "must be a string, not " + j.dump();
    return from_text(j.get<std::string>(), out);
  }
  static std::string to_text(const amp::Fp8Accumulation& v) { return v.str(); }
  static std::string from_text(std::string_view t, amp::Fp8Accumulation& out) {
    try {
      out = amp::Fp8Accumulation::parse(t);
    } catch (const Error& e) {
      return e.message();
    }
    return "";
  }
};

// The words of a vocabulary option, with the option's name for messages ("unknown --schedule").
std::string word_error(std::string_view key, std::string_view given, std::span<const Word> words) {
  try {
    mantissa::detail::unknown_word("--" + std::string(key), given, words);
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

template <Vocabulary E>
struct Traits<E> {
  static constexpr ValueKind kind = ValueKind::Word;
  static Json to_json(E v) { return std::string(name_of(v)); }
  static std::string from_json(const Json& j, E& out, std::string_view key) {
    if (!j.is_string()) return "must be a string, not " + j.dump();
    return from_text(j.get<std::string>(), out, key);
  }
  static std::string to_text(E v) { return std::string(name_of(v)); }
  static std::string from_text(std::string_view t, E& out, std::string_view key) {
    if (const std::optional<E> e = find_word<E>(t)) return out = *e, "";
    return word_error(key, t, words_of<E>());
  }
};

// An optional word: "" stands for unset (the default that depends on other options).
template <Vocabulary E>
struct Traits<std::optional<E>> {
  static constexpr ValueKind kind = ValueKind::OptionalWord;
  static Json to_json(const std::optional<E>& v) { return v ? std::string(name_of(*v)) : ""; }
  static std::string from_json(const Json& j, std::optional<E>& out, std::string_view key) {
    if (!j.is_string()) return "must be a string, not " + j.dump();
    return from_text(j.get<std::string>(), out, key);
  }
  static std::string to_text(const std::optional<E>& v) {
    return v ? std::string(name_of(*v)) : "";
  }
  static std::string from_text(std::string_view t, std::optional<E>& out, std::string_view key) {
    if (t.empty()) return out.reset(), "";
    E e{};
    std::string wrong = Traits<E>::from_text(t, e, key);
    if (wrong.empty()) out = e;
    return wrong;
  }
};

template <typename T>
constexpr std::span<const Word> words_for() {
  if constexpr (Vocabulary<T>) {
    return words_of<T>();
  } else if constexpr (requires { typename T::value_type; } && !std::is_same_v<T, std::string>) {
    return words_of<typename T::value_type>();
  } else {
    return {};
  }
}

constexpr OptionInfo kOptions[] = {
#define MT_OPTION_INFO(type, field, key, def, resume, feature, group, range, help)              \
  OptionInfo{                                                                                   \
      Field::field,       #field, key,  Resume::resume,   Feature::feature, OptionGroup::group, \
      Traits<type>::kind, range,  help, words_for<type>()},
    MT_FORALL_TRAIN_OPTIONS(MT_OPTION_INFO)
#undef MT_OPTION_INFO
};
static_assert(std::size(kOptions) == kNumOptions);

// Calls fn(value, info) with the field's member of `c`.
template <typename C, typename Fn>
decltype(auto) visit(C& c, Field f, Fn&& fn) {
  switch (f) {
#define MT_OPTION_VISIT(type, field, ...) \
  case Field::field:                      \
    return fn(c.field, kOptions[size_t(Field::field)]);
    MT_FORALL_TRAIN_OPTIONS(MT_OPTION_VISIT)
#undef MT_OPTION_VISIT
  }
  MT_ASSERT(false, "no option ", int(f));
}

// A parsed number checked against the option's range (and, if real, to be finite).
template <typename T>
std::string check_range(const T& v, const OptionInfo& o) {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (std::is_floating_point_v<T> && !std::isfinite(double(v))) {
      return ::mantissa::detail::concat("must be a finite number, got ", double(v));
    }
    if (!in_range(double(v), o.range)) {
      return "must be " + range_phrase(o.range, double(v)) + ", got " + Json(v).dump();
    }
  }
  return "";
}

// Reads `value` into `out` by `read`, keeping `out` as it was when the value is refused.
template <typename T, typename Read>
std::string take(T& out, const OptionInfo& o, Read&& read) {
  T v = out;
  std::string wrong = read(v);
  if (wrong.empty()) wrong = check_range(v, o);
  if (!wrong.empty()) return wrong;
  out = std::move(v);
  return "";
}

template <typename T>
std::string read_json(const Json& j, T& v, const OptionInfo& o) {
  if constexpr (requires { Traits<T>::from_json(j, v, o.key); }) {
    return Traits<T>::from_json(j, v, o.key);
  } else {
    return Traits<T>::from_json(j, v);
  }
}

template <typename T>
std::string read_text(std::string_view t, T& v, const OptionInfo& o) {
  if constexpr (requires { Traits<T>::from_text(t, v, o.key); }) {
    return Traits<T>::from_text(t, v, o.key);
  } else {
    return Traits<T>::from_text(t, v);
  }
}

}  // namespace

std::span<const OptionInfo> options() {
  return kOptions;
}

const OptionInfo& option(Field f) {
  return kOptions[size_t(f)];
}

std::optional<Field> find_option(std::string_view key) {
  std::string k(key);
  std::replace(k.begin(), k.end(), '_', '-');
  for (const OptionInfo& o : kOptions) {
    std::string name(o.name);
    std::replace(name.begin(), name.end(), '_', '-');
    if (o.key == k || name == k) return o.field;
  }
  return std::nullopt;
}

std::string value_json(const TrainConfig& c, Field f) {
  return visit(c, f, [](const auto& v, const OptionInfo&) {
    return Traits<std::decay_t<decltype(v)>>::to_json(v).dump();
  });
}

std::string set_value_json(TrainConfig& c, Field f, std::string_view json) {
  const Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return "is not a valid value: " + std::string(json);
  return visit(c, f, [&](auto& v, const OptionInfo& o) {
    return take(v, o, [&](auto& into) { return read_json(j, into, o); });
  });
}

std::string value_text(const TrainConfig& c, Field f) {
  return visit(c, f, [](const auto& v, const OptionInfo&) {
    return Traits<std::decay_t<decltype(v)>>::to_text(v);
  });
}

std::string set_value_text(TrainConfig& c, Field f, std::string_view text) {
  return visit(c, f, [&](auto& v, const OptionInfo& o) {
    return take(v, o, [&](auto& into) { return read_text(text, into, o); });
  });
}

std::string value_error(const TrainConfig& c, Field f) {
  return visit(c, f, [](const auto& v, const OptionInfo& o) { return check_range(v, o); });
}

bool same_value(const TrainConfig& a, const TrainConfig& b, Field f) {
  return value_json(a, f) == value_json(b, f);
}

std::string TrainConfig::to_json() const {
  Json j;
  for (const OptionInfo& o : kOptions) {
    visit(*this, o.field, [&](const auto& v, const OptionInfo&) {
      j[std::string(o.name)] = Traits<std::decay_t<decltype(v)>>::to_json(v);
      return 0;
    });
  }
  return j.dump();
}

TrainConfig TrainConfig::from_json(const std::string& text) {
  const Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  MT_CHECK(!j.is_discarded(), "the training configuration is not valid JSON");
  MT_CHECK(j.is_object(), "the training configuration must be a JSON object");
  TrainConfig c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const OptionInfo* o = nullptr;
    for (const OptionInfo& x : kOptions)
      if (x.name == it.key()) o = &x;
    MT_CHECK(o != nullptr, "training configuration: unknown key '", it.key(), "'");
    const std::string wrong = visit(c, o->field, [&](auto& v, const OptionInfo& info) {
      return take(v, info, [&](auto& into) { return read_json(it.value(), into, info); });
    });
    MT_CHECK(wrong.empty(), "training configuration: '", it.key(), "' ", wrong);
  }
  return c;
}

TrainConfig& TrainConfig::set(std::string_view key, std::string_view text) {
  const std::optional<Field> f = find_option(key);
  MT_CHECK(f.has_value(), "no option '", key, "' (the options: mantissa train --help)");
  const std::string wrong = set_value_text(*this, *f, text);
  MT_CHECK(wrong.empty(),
           wrong.starts_with("unknown ") ? "" : "--" + std::string(option(*f).key) + " ", wrong);
  return *this;
}

LossScale LossScale::parse(std::string_view text) {
  if (text == "dynamic") return {};
  const std::string s(text);
  char* end = nullptr;
  const double v = s.empty() ? 0 : std::strtod(s.c_str(), &end);
  MT_CHECK(!s.empty() && end == s.c_str() + s.size() && v > 0 && std::isfinite(v) &&
               std::isfinite(float(v)) && float(v) > 0,
           "--loss-scale takes 'dynamic' or a positive number finite in fp32, got '", s, "'");
  return {v};
}

std::string LossScale::str() const {
  if (!value) return "dynamic";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, *value);
  return std::string(buf, r.ptr);
}

DataInput data_input(DataKind d) {
  constexpr DataInput kInputs[] = {
#define MT_DATA_INPUT(e, name, help, input, features) input,
      MT_FORALL_DATA_KINDS(MT_DATA_INPUT)
#undef MT_DATA_INPUT
  };
  return kInputs[size_t(d)];
}

Features data_features(DataKind d) {
  constexpr Features kFeatures[] = {
#define MT_DATA_FEATURES(e, name, help, input, features) features,
      MT_FORALL_DATA_KINDS(MT_DATA_FEATURES)
#undef MT_DATA_FEATURES
  };
  return kFeatures[size_t(d)];
}

RoundingMode rounding_mode(StoreRounding r) {
  constexpr RoundingMode kModes[] = {
#define MT_STORE_ROUNDING(e, name, help, mode) mode,
      MT_FORALL_STORE_ROUNDINGS(MT_STORE_ROUNDING)
#undef MT_STORE_ROUNDING
  };
  return kModes[size_t(r)];
}

DType grad_comm_dtype(GradComm g) {
  constexpr DType kDTypes[] = {
#define MT_GRAD_COMM(e, name, help, dtype) dtype,
      MT_FORALL_GRAD_COMMS(MT_GRAD_COMM)
#undef MT_GRAD_COMM
  };
  return kDTypes[size_t(g)];
}

optim::StateFormat exp_avg_format_of(const TrainConfig& c) {
  return c.exp_avg_state.value_or(c.optim_state);
}

optim::StateFormat exp_avg_sq_format_of(const TrainConfig& c) {
  return c.exp_avg_sq_state.value_or(c.optim_state);
}

bool narrow_optimizer_state(const TrainConfig& c) {
  constexpr auto f32 = optim::StateFormat::F32;
  if (c.optimizer != OptimizerKind::AdamW) return c.optim_state != f32;
  return exp_avg_format_of(c) != f32 || exp_avg_sq_format_of(c) != f32;
}

amp::Recipe recipe_of(const TrainConfig& c) {
  amp::Recipe r;
  r.precision = c.precision;
  r.level = c.opt_level;
  if (c.rounding) r.rounding = rounding_mode(*c.rounding);
  r.compensation = c.compensation;
  r.loss_scale = c.loss_scale.value;
  r.init_scale = c.init_scale;
  r.seed = c.seed;
  r.fp8.recipe = c.fp8_recipe;
  r.fp8.format = c.fp8_format;
  if (c.fp8_pow2_scales) r.fp8.pow2_scales = is_on(*c.fp8_pow2_scales);
  r.fp8.accumulate = c.fp8_accumulate;
  r.fp8.amax_history_len = c.fp8_amax_history;
  r.fp8.margin = c.fp8_margin;
  r.fp8_layers = c.fp8_layers;
  r.fp4 = {.recipe = c.fp4_recipe,
           .rht = is_on(c.fp4_rht),
           .two_d = is_on(c.fp4_2d),
           .sr = is_on(c.fp4_sr),
           .mx_scale = c.fp4_mx_scale,
           .seed = c.seed};
  r.fp4_layers = c.fp4_layers;
  r.fp4_high_precision_layers = c.fp4_high_precision_layers;
  return r;
}

}  // namespace mantissa::config
