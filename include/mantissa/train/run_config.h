// A training run's configuration as a TOML file (`mantissa train --config run.toml`): its keys
// are `mantissa train`'s option names (batch-size = 64, precision = "bf16"), and also the
// TrainConfig fields that have no option (beta1, beta2, eps, step-size, gamma). Underscores
// may stand for dashes (batch_size). docs/training.md, "Run configs".
#pragma once

#include <set>
#include <string>
#include <string_view>

#include "mantissa/train/config.h"

namespace mantissa::train {

// The config-file key (the option's name without "--") of a TrainConfig field, and back ("" if
// there is none). Most are the field with dashes; the others: warmup_steps <-> warmup,
// max_steps <-> steps, metrics_path <-> metrics, checkpoint_path <-> checkpoint, resume_path
// <-> resume, tensorboard_dir <-> tensorboard. `progress` is the key of --no-progress (false).
std::string config_key_of_field(std::string_view field);
std::string field_of_config_key(std::string_view key);

// Every key of `c`, in TrainConfig's order, as a TOML file that resolve_run_config reads back to
// the same configuration (floats in their shortest exact form). `resume` is left out: the file
// describes a run, not how one launch of it began.
std::string to_toml(const TrainConfig& c);

// The configuration of a run launched as `--config FILE` (with `--config-from` a stored run as
// `base`, else the defaults) plus the command line: every key of the TOML text `toml` replaces
// base's, then every field named in `cli_fields` takes its value from `cli` (the command line
// wins). The result is validated. Errors name `origin` (the file), the line and the key:
// TOML syntax, unknown keys (with the nearest known one when it is close: "did you mean
// 'batch-size'?"), tables, wrong types, integers out of range, and what validate() refuses of
// a value the file set.
TrainConfig resolve_run_config(const TrainConfig& base, std::string_view toml,
                               const std::string& origin, const TrainConfig& cli = {},
                               const std::set<std::string>& cli_fields = {});

// The configuration a run stored in its outputs: a checkpoint's (metadata), or the "config"
// record at the head of a metrics file (--metrics). The run starts again and writes its own
// outputs: resume, metrics, checkpoint, checkpoint-every and tensorboard are cleared.
TrainConfig stored_run_config(const std::string& path);

}  // namespace mantissa::train
