// `mantissa train`'s options from the option table (train_options.h).
#include "train_options.h"

#include <fmt/format.h>

#include "mantissa/train/trainer.h"

namespace mantissa::cli {

std::string option_help(const config::OptionInfo& o) {
  std::string help(o.help);
  if (o.field == config::Field::model) {
    std::vector<std::string> models;
    for (const auto& [m, task] : train::trainable_models())
      models.push_back(fmt::format("{} ({})", m, task));
    help += ": " + fmt::format("{}", fmt::join(models, ", "));
  }
  if (!o.words.empty()) {
    help += ": " + word_list(o.words, /*with_help=*/true);
  }
  const std::string def = config::value_text(config::TrainConfig{}, o.field);
  if (o.kind != config::ValueKind::Bool && !def.empty()) help += " [default: " + def + "]";
  if (o.resume == config::Resume::Fixed) help += " (fixed on --resume)";
  return help;
}

TrainOptions::TrainOptions(CLI::App& cmd) : cmd_(cmd) {
  for (const config::OptionInfo& o : config::options()) {
    auto text = std::make_unique<std::string>();
    const std::string group(name_of(o.group));
    CLI::Option* opt = nullptr;
    if (o.kind == config::ValueKind::Bool) {
      // A bool whose default is true is turned off by --no-KEY.
      const bool on_by_default = config::value_text(config::TrainConfig{}, o.field) == "true";
      const std::string flag = (on_by_default ? "--no-" : "--") + std::string(o.key);
      opt = cmd.add_flag_callback(
          flag, [t = text.get(), on_by_default] { *t = on_by_default ? "false" : "true"; },
          option_help(o) + (on_by_default ? fmt::format(" (config key: {})", o.key) : ""));
    } else {
      opt = cmd.add_option("--" + std::string(o.key), *text, option_help(o));
      opt->type_name(o.words.empty() ? "VALUE" : "WORD");
    }
    opt->group(group);
    options_[o.field] = {opt, std::move(text)};
  }
}

config::GivenOptions TrainOptions::given() const {
  config::GivenOptions out;
  for (const auto& [field, entry] : options_) {
    if (entry.first->count() == 0) continue;
    out[field] = {*entry.second, "--" + std::string(config::option(field).key), false};
  }
  return out;
}

}  // namespace mantissa::cli
