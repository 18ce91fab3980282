// The option parser's errors in the words of the command line: which option or word was wrong,
// what it takes, the nearest spelling, and the subcommand's --help (CLI11's own messages list
// unexpected words in reverse, name no subcommand, and send every mistake to the top-level help).
#include "parse_errors.h"

#include <fmt/format.h>

#include <cctype>
#include <cstring>
#include <string_view>
#include <vector>

#include "mantissa/core/vocabulary.h"

namespace mantissa::cli {
namespace {

const CLI::App* subcommand_named(const CLI::App& app, std::string_view name) {
  for (const CLI::App* sub : app.get_subcommands({}))
    if (sub->get_name() == name) return sub;
  return nullptr;
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({}))
    names.push_back(sub->get_name());
  return names;
}

std::string commands_of(const CLI::App& app) {
  return fmt::format("{}", fmt::join(command_names(app), ", "));
}

std::string nearest_of(std::string_view given, const std::vector<std::string>& names) {
  std::vector<std::string_view> views(names.begin(), names.end());
  return nearest_name(given, views);
}

// The long option names of `sub` ("batch-size"), --help's too.
std::vector<std::string> long_names(const CLI::App& sub) {
  std::vector<std::string> names{"help"};
  for (const CLI::Option* o : sub.get_options())
    for (const std::string& n : o->get_lnames())
      names.push_back(n);
  return names;
}

const CLI::Option* option_named(const CLI::App& sub, std::string_view dashed) {
  for (const CLI::Option* o : sub.get_options()) {
    for (const std::string& n : o->get_lnames())
      if (dashed == "--" + n) return o;
    for (const std::string& n : o->get_snames())
      if (dashed == "-" + n) return o;
  }
  return nullptr;
}

// "a number", "an integer" for an option's value, from CLI11's type name.
std::string value_kind(const CLI::Option& o) {
  const std::string t = o.get_type_name();
  if (t == "INT") return "an integer";
  if (t == "UINT") return "an integer >= 0";
  if (t == "FLOAT") return "a number";
  return "a " + (t.empty() ? std::string("value") : t);
}

// ": a checkpoint written by mantissa train" (a short description only; --help has the rest).
std::string described(const CLI::Option& o) {
  std::string d = o.get_description();
  if (d.empty() || d.size() > 80) return "";
  if (d.size() > 1 && std::isupper(static_cast<unsigned char>(d[0])) &&
      !std::isupper(static_cast<unsigned char>(d[1])))
    d[0] = char(std::tolower(static_cast<unsigned char>(d[0])));
  return ": " + d;
}

bool takes_positionals(const CLI::App& sub) {
  for (const CLI::Option* o : sub.get_options())
    if (!o->nonpositional()) return true;
  return false;
}

// The first word after the subcommand that is neither one of its options nor an option's value:
// an unknown option ("--bach-size", named with the nearest spelling) or a stray word.
std::string first_unexpected(const CLI::App& sub, const std::vector<std::string>& args,
                             size_t after) {
  for (size_t i = after + 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.size() > 1 && a[0] == '-' && !(a[1] >= '0' && a[1] <= '9') && a[1] != '.' &&
        a[1] != ' ') {
      const std::string name = a.substr(0, a.find('='));
      const CLI::Option* o = option_named(sub, name);
      if (o == nullptr) {
        if (name == "--help" || name == "-h") continue;
        const std::string bare = name.substr(name.find_first_not_of('-'));
        const std::string near = nearest_of(bare, long_names(sub));
        return fmt::format("unknown option {}{}", name,
                           near.empty() ? std::string() : "; did you mean --" + near + "?");
      }
      // An option with a value takes the next word, unless it came with '='.
      if (o->get_expected_max() > 0 && a.find('=') == std::string::npos) ++i;
      continue;
    }
    if (takes_positionals(sub)) continue;  // (its own words: CLI11's message says more)
    return fmt::format(
        "unexpected argument '{}': `mantissa {}` takes options only (--name VALUE); a value "
        "belongs right after its option",
        a, sub.get_name());
  }
  return "";
}

std::string option_before_colon(const std::string& what) {
  return what.substr(0, what.find(':'));
}

}  // namespace

ParseErrorText explain_parse_error(const CLI::App& app, const std::vector<std::string>& args,
                                   const CLI::ParseError& e) {
  // The subcommand: the first word that does not start with '-'.
  size_t at = 1;
  while (at < args.size() && !args[at].empty() && args[at][0] == '-')
    ++at;
  if (at == args.size()) {
    const std::string opt = args.size() > 1 ? args[1] : "";
    return {"mantissa",
            fmt::format("{}give a command: {} (e.g. `mantissa train`)\nRun 'mantissa --help' "
                        "for what each does.",
                        opt.empty() ? "" : "unknown option " + opt + " before a command; ",
                        commands_of(app))};
  }
  const CLI::App* sub = subcommand_named(app, args[at]);
  if (sub == nullptr) {
    const std::string near = nearest_of(args[at], command_names(app));
    return {"mantissa",
            fmt::format("unknown command '{}'{}; the commands: {}\nRun 'mantissa --help' for "
                        "what each does.",
                        args[at], near.empty() ? "" : " (did you mean '" + near + "'?)",
                        commands_of(app))};
  }
  const std::string name = sub->get_name();
  std::string message = first_unexpected(*sub, args, at);
  const std::string what = e.what();
  if (!message.empty()) {
    // (An unknown option or a stray word explains the other errors it causes.)
  } else if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr &&
             what.starts_with("Could not convert: ")) {
    // "Could not convert: --steps = 1.5"
    const std::string rest = what.substr(std::strlen("Could not convert: "));
    const size_t eq = rest.find(" = ");
    const std::string opt = rest.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : rest.substr(eq + 3);
    const CLI::Option* o = option_named(*sub, opt);
    message =
        fmt::format("{} must be {}, not '{}'", opt, o ? value_kind(*o) : "another value", value);
  } else if (what.find("At Most 1 required but received") != std::string::npos) {
    message = fmt::format("{} is given more than once; give it once (the value to use)",
                          option_before_colon(what));
  } else if (what.find("required") != std::string::npos &&
             what.find("missing") != std::string::npos) {
    const std::string opt = option_before_colon(what);
    const CLI::Option* o = option_named(*sub, opt);
    message = fmt::format("{} needs a value{}", opt, o ? described(*o) : "");
  } else if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr &&
             what.ends_with(" is required")) {
    const std::string opt = what.substr(0, what.size() - std::strlen(" is required"));
    const CLI::Option* o = option_named(*sub, opt);
    message = fmt::format("{} is required{}", opt, o ? described(*o) : "");
  } else {
    message = what;
  }
  return {"mantissa " + name,
          fmt::format("{}\nRun 'mantissa {} --help' for its options.", message, name)};
}

}  // namespace mantissa::cli
