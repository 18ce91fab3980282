// Training a recommender (a ModelInput::Clicks model: dcn) on a click log, in any precision
// recipe the Trainer has (docs/training.md, "Recommenders").
//
//   mantissa::train::TrainConfig c;
//   c.model = "dcn";
//   c.data = "synthetic-clicks";   // or "clicks" with c.data_path = "day_0.tsv"
//   c.optimizer = "adamw";
//   c.lr = 1e-3;
//   c.max_steps = 1000;
//   c.precision = "bf16";
//   auto r = mantissa::train::train_recommender(c);   // r.log_loss vs r.bayes_log_loss
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mantissa/train/config.h"

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

// Trains config.model (a Clicks model) on config.data: synthetic-clicks (synthetic_size
// examples of data::synthetic_clicks with config.seed, its last 10% held out) or clicks (the
// log at data_path, its last 10% held out, or val_path as the held-out log). Honours precision,
// opt_level, loss_scale, init_scale, rounding (train::initialize_precision), seed, batch_size,
// epochs / max_steps, optimizer (sgd | adamw), lr, momentum, weight_decay (weights of two or
// more dims; not biases, cross layers or tables), betas, eps, schedule, warmup_steps,
// eval_every, eval_batch_size, log_every, metrics_path, tensorboard_dir, threads, workers,
// device, hash_buckets, embedding_update and progress. Options it does not take (checkpoints,
// resume, distributed, grad_accum, fp8, underflow_every, anomaly detection, clipping with lazy
// tables, on_divergence other than stop, zero_grad zeros, input_pipeline other than prefetch)
// are refused with a mantissa::Error.
//
// Records (the metrics file, TensorBoard and `on_record` get the same JSON): "config" first;
// "train" every log_every steps (step, epoch, loss, lr, samples_per_s, loss_scale, skipped,
// skipped_steps, peak_memory_bytes); "eval" every eval_every steps and at the end (step, loss:
// the held-out log loss, auc, bayes_log_loss for synthetic data, constant_log_loss, examples,
// eval_seconds); "summary" at the end (the result's fields, the model, its parameters, the
// precision, the device). A step whose loss is not finite and was not skipped stops the run
// with a mantissa::Error naming the step.
RecommenderResult train_recommender(const TrainConfig& config,
                                    std::function<void(const std::string& json)> on_record = {});

}  // namespace mantissa::train
