// A run's configuration from where a user gives it: a TOML file (`mantissa train --config
// run.toml`), the configuration a finished run stored (`--config-from`), the command line or a
// Python dict — and what `--resume` makes of a checkpoint's configuration and this command's
// options. One rule for each, whatever the source (docs/training.md, "Run configs").
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "mantissa/config/train_config.h"

namespace mantissa::config {

// Options as text, by field, with where each came from for messages ("--lr", "run.toml:3").
struct GivenOption {
  std::string text;    // as a command line spells it (value_text); a TOML value in its JSON form
  std::string origin;  // for messages: "--lr", "run.toml:3: 'lr'"
  bool json = false;   // text is the JSON of the value (TOML) rather than command-line text
};
using GivenOptions = std::map<Field, GivenOption>;

// The options a TOML run config sets. Keys are the options' keys (underscores may stand for
// dashes); errors name `origin` (the file), the line and the key: TOML syntax, unknown keys (with
// the nearest one: "did you mean 'batch-size'?"), tables, values of the wrong type, and `resume`,
// which a file cannot set.
GivenOptions read_toml(std::string_view toml, const std::string& origin);

// The options of a JSON object of keys (the Python package's dict): the same keys, checks and
// messages as a TOML file's, without lines.
GivenOptions read_json_options(std::string_view json_object, const std::string& origin);

// Every option of `c` but `resume`, in the table's order, as a TOML file that read_toml reads
// back to the same configuration (floats in their shortest exact form).
std::string to_toml(const TrainConfig& c);

// The defaults of a run that trains `model` (train::defaults_for: a task's own, e.g. the GAN's
// learning rate): the base of a configuration that is not --config-from.
using DefaultsFor = std::function<TrainConfig(const std::string& model)>;

// Where a configuration comes from, the later winning: `stored` (--config-from) or the model's
// defaults, the file's options, then the command line's (or a Python dict's).
struct ConfigSources {
  std::optional<TrainConfig> stored{};
  GivenOptions file{};
  GivenOptions command_line{};
};

// The configuration of those sources, validated. One rule on top: --steps given (by the file or
// the command line) without --epochs runs that many steps over as many epochs as they take
// (epochs = 0). Errors name the option and where it was given.
TrainConfig resolve(const ConfigSources& sources, const DefaultsFor& defaults_for);

// A resumed run: the checkpoint's configuration `stored` with this command's options `given`, by
// each option's Resume policy: a Fixed one given with another value is refused naming it and
// both values; Tunable and Output ones given are applied; Launch ones are always this command's
// (or their defaults). The checkpoint a resumed run writes, unless --checkpoint is given, is the
// file it resumed from (`resume_path`): never a path this command did not name. Validated.
TrainConfig merge_resume(const TrainConfig& stored, const GivenOptions& given,
                         const std::string& resume_path);

// Refuses to continue the run stored in `checkpoint` with `config` when a Fixed option differs,
// naming the first such option and both values.
void check_same_run(const TrainConfig& stored, const TrainConfig& config,
                    const std::string& checkpoint);

// The fields set in `options`.
FieldSet fields_of(const GivenOptions& options);

}  // namespace mantissa::config
