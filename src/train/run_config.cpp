// TOML run configs through toml++ (Debian's libtomlplusplus-dev), compiled into this file alone
// (header-only mode): the library's binary and its users need no TOML library.
#define TOML_HEADER_ONLY 1
#define TOML_ENABLE_FORMATTERS 0
#include "mantissa/train/run_config.h"

#include <toml++/toml.h>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "mantissa/core/error.h"

namespace mantissa::train {
namespace {

constexpr std::pair<const char*, const char*> kRenamed[] = {
    {"warmup_steps", "warmup"},  {"max_steps", "steps"},
    {"metrics_path", "metrics"}, {"checkpoint_path", "checkpoint"},
    {"resume_path", "resume"},   {"tensorboard_dir", "tensorboard"}};

// The defaults, as JSON: the type each key takes.
const nlohmann::ordered_json& default_json() {
  static const nlohmann::ordered_json j = nlohmann::ordered_json::parse(TrainConfig{}.to_json());
  return j;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest_key(std::string_view key) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& [field, value] : default_json().items()) {
    const std::string k = config_key_of_field(field);
    if (k == "resume") continue;
    const size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  // Close: a typo or two, or a prefix/suffix of the key ("batch" for "batch-size").
  const bool close =
      best_d <= std::max<size_t>(2, key.size() / 3) || best.find(key) != std::string::npos;
  return close && !key.empty() ? best : "";
}

std::string describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    default:
      return "a date or time";
  }
}

// A value as the JSON of its field's type, or an error message.
std::string to_json_value(const toml::node& n, const nlohmann::ordered_json& like,
                          nlohmann::ordered_json* out) {
  if (like.is_boolean()) {
    if (!n.is_boolean()) return "must be true or false, not " + describe(n);
    *out = n.as_boolean()->get();
  } else if (like.is_string()) {
    if (!n.is_string()) return "must be a string (in quotes), not " + describe(n);
    *out = n.as_string()->get();
  } else if (like.is_number_integer()) {  // (from_json checks the field's range)
    if (!n.is_integer()) return "must be an integer, not " + describe(n);
    *out = n.as_integer()->get();
  } else {  // a float field: integers are floats too (lr = 1)
    if (n.is_integer()) {
      *out = double(n.as_integer()->get());
    } else if (n.is_floating_point()) {
      *out = n.as_floating_point()->get();
    } else {
      return "must be a number, not " + describe(n);
    }
  }
  return "";
}

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string toml_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest exact
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // TOML floats need one
  return s;
}

// Whether a message of validate() or from_json is about `key` set to `value`: it names the
// option or the field, or quotes the value.
bool blames(const std::string& message, const std::string& key, const std::string& field,
            const nlohmann::ordered_json& v) {
  if (message.find("'" + field + "'") != std::string::npos) return true;  // from_json's
  const std::string opt = "--" + key;
  for (size_t at = message.find(opt); at != std::string::npos; at = message.find(opt, at + 1)) {
    const size_t end = at + opt.size();
    if (end == message.size() ||
        !(std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-'))
      return true;
  }
  return v.is_string() && !v.get<std::string>().empty() &&
         message.find("'" + v.get<std::string>() + "'") != std::string::npos;
}

}  // namespace

std::string config_key_of_field(std::string_view field) {
  for (const auto& [f, k] : kRenamed)
    if (field == f) return k;
  std::string k(field);
  std::replace(k.begin(), k.end(), '_', '-');
  return k;
}

std::string field_of_config_key(std::string_view key) {
  std::string k(key);
  std::replace(k.begin(), k.end(), '_', '-');
  for (const auto& [field, value] : default_json().items())
    if (config_key_of_field(field) == k) return field;
  return "";
}

std::string to_toml(const TrainConfig& c) {
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(c.to_json());
  std::string out;
  for (const auto& [field, v] : j.items()) {
    if (field == "resume_path") continue;
    out += config_key_of_field(field) + " = ";
    if (v.is_boolean()) {
      out += v.get<bool>() ? "true" : "false";
    } else if (v.is_string()) {
      out += toml_string(v.get<std::string>());
    } else if (v.is_number_unsigned()) {
      out += std::to_string(v.get<uint64_t>());
    } else if (v.is_number_integer()) {
      out += std::to_string(v.get<int64_t>());
    } else {
      out += toml_float(v.get<double>());
    }
    out += "\n";
  }
  return out;
}

TrainConfig resolve_run_config(const TrainConfig& base, std::string_view toml,
                               const std::string& origin, const TrainConfig& cli,
                               const std::set<std::string>& cli_fields) {
  toml::table table;
  try {
    table = toml::parse(toml, origin);
  } catch (const toml::parse_error& e) {
    MT_CHECK(false, origin, ":", e.source().begin.line, ":", e.source().begin.column, ": ",
             e.description(), " (the file is not valid TOML)");
  }
  nlohmann::ordered_json merged = nlohmann::ordered_json::parse(base.to_json());
  struct FromFile {
    std::string key;
    int64_t line;
  };
  std::map<std::string, FromFile> from_file;  // by field
  for (const auto& [k, node] : table) {
    const std::string key(k.str());
    const auto line = int64_t(k.source().begin.line);
    const std::string at = origin + ":" + std::to_string(line) + ": ";
    const std::string field = field_of_config_key(key);
    if (field.empty() || field == "resume_path") {
      const std::string near = nearest_key(key);
      MT_CHECK(!node.is_table() || !near.empty(), at, "'", key,
               "' is a table; a run config has its keys at the top level, without [sections]");
      MT_CHECK(field != "resume_path", at,
               "'resume' cannot be set in a run config: give --resume CHECKPOINT on the command "
               "line");
      MT_CHECK(false, at, "unknown key '", key, "'",
               near.empty() ? std::string() : "; did you mean '" + near + "'?",
               " (the keys are mantissa train's options without the dashes: --print-config "
               "lists them all)");
    }
    if (const auto seen = from_file.find(field); seen != from_file.end()) {
      MT_CHECK(false, at, "'", key, "' sets '", seen->second.key, "' again (line ",
               seen->second.line, ")");
    }
    from_file[field] = {config_key_of_field(field), line};
    nlohmann::ordered_json value;
    const std::string wrong = to_json_value(node, default_json()[field], &value);
    MT_CHECK(wrong.empty(), at, "'", key, "' ", wrong);
    if (!cli_fields.contains(field)) merged[field] = value;
  }
  const nlohmann::ordered_json given = nlohmann::ordered_json::parse(cli.to_json());
  for (const std::string& field : cli_fields) {
    MT_ASSERT(given.contains(field), "no configuration field '", field, "'");
    merged[field] = given[field];
  }
  TrainConfig c;
  try {
    c = TrainConfig::from_json(merged.dump());
    c.validate();
  } catch (const Error& e) {
    // Name the line of the key the message is about, when the file set it.
    for (const auto& [field, f] : from_file) {
      if (cli_fields.contains(field) || !blames(e.message(), f.key, field, merged[field])) continue;
      MT_CHECK(false, origin, ":", f.line, ": '", f.key, "': ", e.message());
    }
    throw;
  }
  return c;
}

}  // namespace mantissa::train
