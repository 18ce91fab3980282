// `mantissa formats`: the bits of a number in every training format, and what rounding cost.
#include <fmt/core.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/inspect.h"

namespace mantissa::cli {
namespace {

struct FormatsOptions {
  std::vector<std::string> numbers;
  std::string rounding = "nearest";
  std::string overflow = "inf";
  std::vector<std::string> only;
  bool json = false;
  bool table = false;
};

// JSON has no inf/nan literals: those become the strings "inf", "-inf", "nan".
nlohmann::ordered_json number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

std::string human(double v, const char* spec) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format(fmt::runtime(spec), v);
}

std::vector<Format> selected_formats(const std::vector<std::string>& only) {
  std::vector<Format> out;
  if (only.empty()) {
    for (const auto& info : kFormatTable)
      out.push_back(info.format);
    return out;
  }
  for (const auto& name : only) {
    auto f = parse_format(name);
    MT_CHECK(f.has_value(), "unknown format '", name, "'; the formats are ", format_names());
    out.push_back(*f);
  }
  return out;
}

std::string class_text(const FormatReport& r) {
  std::string s(value_class_name(r.value_class));
  if (r.overflow) s += " (overflow)";
  if (r.underflow) s += " (underflow)";
  return s;
}

// e8m0 has no sign and no mantissa bits: a dash in their columns.
std::string field_or_dash(const std::string& bits) {
  return bits.empty() ? "-" : bits;
}

// The fields that exist, space separated ("0 1000 010"; e8m0: "01111111").
std::string bit_fields(const FormatReport& r) {
  std::string s;
  for (const std::string* f : {&r.sign_bits, &r.exponent_bits, &r.mantissa_bits}) {
    if (f->empty()) continue;
    if (!s.empty()) s += ' ';
    s += *f;
  }
  return s;
}

void print_human(const ParsedNumber& x, RoundingMode mode, const std::vector<FormatReport>& rows) {
  fmt::print("{} (rounding {})\n", x.text,
             mode == RoundingMode::NearestEven ? "to nearest, ties to even" : "toward zero");
  size_t wm = 8;
  for (const auto& r : rows)
    wm = std::max(wm, r.mantissa_bits.size());
  fmt::print("  {:<9} {:<4} {:<8} {:<{}} {:<10} {:<22} {:<10} {:<10} {}\n", "format", "sign",
             "exponent", "mantissa", wm, "hex", "value", "abs error", "rel error", "class");
  for (const auto& r : rows) {
    fmt::print("  {:<9} {:<4} {:<8} {:<{}} {:<10} {:<22} {:<10} {:<10} {}\n", format_name(r.format),
               field_or_dash(r.sign_bits), r.exponent_bits, field_or_dash(r.mantissa_bits), wm,
               r.hex, human(r.value, "{:.15g}"), human(r.abs_error, "{:.3g}"),
               human(r.rel_error, "{:.3g}"), class_text(r));
  }
}

nlohmann::ordered_json to_json(const ParsedNumber& x, RoundingMode mode,
                               const std::vector<FormatReport>& rows) {
  nlohmann::ordered_json formats = nlohmann::ordered_json::array();
  for (const auto& r : rows) {
    formats.push_back({{"name", format_name(r.format)},
                       {"bits", bit_fields(r)},
                       {"hex", r.hex},
                       {"value", number(r.value)},
                       {"abs_error", number(r.abs_error)},
                       {"rel_error", number(r.rel_error)},
                       {"class", value_class_name(r.value_class)},
                       {"overflow", r.overflow},
                       {"underflow", r.underflow}});
  }
  return {{"input", x.text}, {"rounding", rounding_name(mode)}, {"formats", formats}};
}

std::string encoding_hex(uint32_t bits, const FormatInfo& info) {
  const uint32_t container =
      info.format == Format::TF32 ? bits << (23 - info.spec.mantissa_bits) : bits;
  return fmt::format("0x{:0{}x}", container, info.storage_bytes * 2);
}

std::string nan_text(const FormatSpec& s, const FormatInfo& i) {
  switch (s.nan) {
    case NanEncoding::Ieee:
      return "exponent all ones, mantissa != 0; quiet " + encoding_hex(s.quiet_nan_bits(), i);
    case NanEncoding::AllOnes:
      if (!s.has_sign) return "only all ones: " + encoding_hex(s.quiet_nan_bits(), i);
      return "only S.1111.111: " + encoding_hex(s.quiet_nan_bits(), i) + " / " +
             encoding_hex(s.quiet_nan_bits() | s.sign_bit(), i);
    case NanEncoding::None:
      break;
  }
  return "none (NaN becomes a zero)";
}

int print_table(bool json, const std::vector<Format>& formats) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  if (!json) {
    fmt::print("{:<9} {:<8} {:>4}  {:<15} {:<15} {:<15} {:<13} {:>6}  {:<21} {}\n", "format",
               "s-e-m", "bias", "max finite", "min normal", "min subnormal", "epsilon", "digits",
               "+inf / -inf", "nan");
  }
  for (Format f : formats) {
    const FormatInfo& i = format_info(f);
    const FormatSpec& s = i.spec;
    const std::string layout =
        fmt::format("{}-{}-{}", int(s.has_sign), s.exponent_bits, s.mantissa_bits);
    const std::string inf = s.has_inf() ? encoding_hex(s.inf_bits(), i) + " / " +
                                              encoding_hex(s.inf_bits() | s.sign_bit(), i)
                                        : "none";
    const std::string nan = nan_text(s, i);
    if (json) {
      out.push_back(
          {{"name", i.name},
           {"exponent_bits", s.exponent_bits},
           {"mantissa_bits", s.mantissa_bits},
           {"bias", s.bias()},
           {"storage_bytes", i.storage_bytes},
           {"max_finite", i.max_finite},
           {"min_normal", i.min_normal},
           {"min_subnormal", i.min_subnormal},
           {"epsilon", i.epsilon},
           {"decimal_digits", i.decimal_digits},
           {"has_sign", s.has_sign},
           {"has_inf", s.has_inf()},
           {"has_nan", s.has_nan()},
           {"inf", s.has_inf() ? nlohmann::ordered_json(encoding_hex(s.inf_bits(), i)) : nullptr},
           {"nan",
            s.has_nan() ? nlohmann::ordered_json(encoding_hex(s.quiet_nan_bits(), i)) : nullptr}});
    } else {
      fmt::print("{:<9} {:<8} {:>4}  {:<15.9g} {:<15.9g} {:<15.9g} {:<13.7g} {:>6.2f}  {:<21} {}\n",
                 i.name, layout, s.bias(), i.max_finite, i.min_normal, i.min_subnormal, i.epsilon,
                 i.decimal_digits, inf, nan);
    }
  }
  if (json) fmt::print("{}\n", out.dump(2));
  return 0;
}

int run(const FormatsOptions& o) {
  const std::vector<Format> formats = selected_formats(o.only);
  if (o.table) return print_table(o.json, formats);
  MT_CHECK(!o.numbers.empty(),
           "give at least one NUMBER (e.g. 'mantissa formats 12.31'), or --table");
  const RoundingMode mode =
      o.rounding == "truncate" ? RoundingMode::TowardZero : RoundingMode::NearestEven;
  const Overflow overflow = o.overflow == "saturate" ? Overflow::Saturate : Overflow::Infinity;

  // Parse everything first: a bad number is reported before anything is printed.
  std::vector<ParsedNumber> inputs;
  for (const auto& text : o.numbers) {
    auto x = parse_number(text);
    MT_CHECK(
        x.has_value(), "'", text,
        "' is not a number (use decimal, scientific like 1e-5, hex like 0x1.8p-3, inf or nan)");
    inputs.push_back(*x);
  }

  nlohmann::ordered_json docs = nlohmann::ordered_json::array();
  for (size_t k = 0; k < inputs.size(); ++k) {
    std::vector<FormatReport> rows;
    for (Format f : formats)
      rows.push_back(inspect(f, inputs[k], mode, overflow));
    if (o.json) {
      docs.push_back(to_json(inputs[k], mode, rows));
    } else {
      if (k) fmt::print("\n");
      print_human(inputs[k], mode, rows);
    }
  }
  if (o.json) fmt::print("{}\n", json_line(docs.size() == 1 ? docs[0] : docs));
  return 0;
}

}  // namespace

Command add_formats_command(CLI::App& app) {
  auto opts = std::make_shared<FormatsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "formats", "Show a number's bits, stored value and rounding error in every format");
  cmd->add_option("NUMBER", opts->numbers,
                  "Decimal (12.31), scientific (1e-5), hex float (0x1.8p-3), inf, -inf or nan");
  cmd->add_option("--rounding", opts->rounding, "Rounding mode")
      ->check(CLI::IsMember({"nearest", "truncate"}))
      ->capture_default_str();
  cmd->add_option("--overflow", opts->overflow,
                  "Beyond the largest finite value: the format's inf/NaN, or saturate to max")
      ->check(CLI::IsMember({"inf", "saturate"}))
      ->capture_default_str();
  cmd->add_option("--format", opts->only, "Only these formats (comma separated)")->delimiter(',');
  cmd->add_flag("--json", opts->json, "Print JSON instead of a table");
  cmd->add_flag("--table", opts->table, "Print the table of format facts instead");
  return [opts] { return run(*opts); };
}

}  // namespace mantissa::cli
