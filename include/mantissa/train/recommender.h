// Training a recommender (a ModelInput::Clicks model: dcn) on a click log, in any precision
// recipe the Trainer has (docs/training.md, "Recommenders").
//
//   mantissa::train::TrainConfig c = mantissa::train::defaults_for("dcn");  // AdamW at 1e-3, ...
//   c.data = mantissa::config::DataKind::SyntheticClicks;   // or Clicks with c.data_path
//   c.max_steps = 1000;
//   c.precision = mantissa::amp::Precision::BF16;
//   auto r = mantissa::train::train_recommender(c);   // r.log_loss vs r.bayes_log_loss
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mantissa/train/trainer.h"

namespace mantissa::train {

struct RecommenderResult {
  double log_loss = 0;        // held-out mean binary cross-entropy (nats) at the end
  double auc = 0;             // held-out ROC AUC at the end
  double bayes_log_loss = 0;  // synthetic-clicks: the planted model's; NaN for a real log
  double seconds = 0;         // training time (evaluations excluded)
  int64_t steps = 0;
  int64_t skipped_steps = 0;  // fp16 / static scale: steps skipped for inf/NaN gradients
  double loss_scale = 1;      // the loss scale at the end (1 without one)
  int64_t peak_memory_bytes = 0;
  // Beyond those: the held-out split's constant-predictor log loss (its base rate's entropy),
  // and, on the CPU, where the optimizer time went (seconds summed over all steps): the
  // embedding tables' update (the lazy update, or the tables' dense optimizer step) and the
  // other parameters' optimizer step. The rest of `seconds` is the batch, forward and backward.
  double constant_log_loss = 0;
  int64_t held_out_examples = 0;
  double table_update_seconds = 0;
  double optimizer_seconds_rest = 0;
  std::string embedding_update;  // "lazy" or "dense": what ran
  std::string precision;         // amp's description
};

// Trains config.model (a Clicks model) with the Trainer: on config.data, synthetic-clicks
// (synthetic_size examples of data::synthetic_clicks with config.seed, its last 10% held out) or
// clicks (the log at data_path, its last 10% held out, or val_path as the held-out log). The
// tables update lazily (embedding_update) or with their own optimizer; every option of every
// task (precision, schedule, clipping, checkpoints and resume, divergence, ...) is honoured as
// by the Trainer, and those of other tasks (fp8, grad_accum, distributed, ...) are refused.
//
// Records (the metrics file, TensorBoard and `on_record` get the same JSON): "config" first;
// "train" every log_every steps; "eval" every eval_every steps and at each epoch's end (step,
// loss: the held-out log loss, auc, bayes_log_loss for synthetic data, constant_log_loss,
// examples, eval_seconds); "summary" at the end.
RecommenderResult train_recommender(const TrainConfig& config,
                                    std::function<void(const std::string& json)> on_record = {});

}  // namespace mantissa::train
