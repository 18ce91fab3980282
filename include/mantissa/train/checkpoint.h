// Training checkpoints: one safetensors file. The model's tensors keep their PyTorch state_dict
// names, so Python's safetensors / PyTorch load the weights directly; the optimizer's tensors
// are under "optimizer."; the step, epoch, random-generator state and the whole TrainConfig are
// JSON strings in the metadata. Written atomically (temp file + rename).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mantissa/config/train_config.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::train {

using config::TrainConfig;

inline constexpr const char* kOptimizerPrefix = "optimizer.";
inline constexpr const char* kScalerPrefix = "scaler.";

struct TrainState {
  int64_t step = 0;            // optimizer steps taken
  int64_t epoch = 0;           // the epoch to continue in (0-based)
  int64_t batch = 0;           // batches of that epoch already done
  GeneratorState generator{};  // the default generator (dropout) to continue with
  double train_seconds = 0;    // training time so far (excluding evaluation)
  // The factor on the schedule's learning rate: 1, halved by each rollback after a divergence
  // (TrainConfig::on_divergence), and kept from then on.
  double lr_scale = 1;
  // The tokenizer of the token data the run trained on (data::BpeTokenizer::fingerprint()), so
  // that an evaluation on other data can tell it was encoded otherwise; 0: none or unknown.
  uint64_t tokenizer_fingerprint = 0;
};

struct Checkpoint {
  TrainConfig config;
  TrainState state;
  NamedTensors model;
  NamedTensors optimizer;  // names without the prefix
  NamedTensors scaler;     // the loss scaler's state (fp16 runs), names without the prefix
  std::map<std::string, std::string> metadata;
};

void save_checkpoint(const std::string& path, const TrainConfig& config, const TrainState& state,
                     const NamedTensors& model, const NamedTensors& optimizer,
                     const NamedTensors& scaler = {});

// The configuration a run stored in its outputs: a checkpoint's (metadata), or the "config"
// record at the head of a metrics file (--metrics): `--config-from`. The run starts again and
// writes its own outputs: every Output option (config::Resume) is cleared, and resume.
TrainConfig stored_run_config(const std::string& path);

// Refuses files that are missing, corrupted or not Mantissa checkpoints, naming the file.
Checkpoint load_checkpoint(const std::string& path);

}  // namespace mantissa::train
