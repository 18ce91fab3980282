// Internal: what differs between training tasks. The Trainer's loop (loop.cpp) is the same for
// every task: it builds the run, takes batches, applies the schedule, resets gradients, reads
// values back once per window, writes records, checkpoints, evaluates, stops on a signal and
// watches for divergence. A task says which options it honours (its features), loads its data,
// builds its networks as Trainees, and defines a step and an evaluation.
//
// Adding a task: a class here (src/train/tasks/), a row of MT_FORALL_TASKS (task.cpp) and the
// rule that picks it for a model (task_kind).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mantissa/config/train_config.h"
#include "mantissa/data/dataset.h"
#include "mantissa/data/loader.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {

using Json = nlohmann::ordered_json;

// What a step hands the loop: values on the device, read back once per window.
struct StepOutput {
  Tensor loss;          // F32 scalar: the step's loss
  Tensor correct;       // I64 scalar: correct predictions, or undefined (the task has none)
  int64_t targets = 0;  // what the throughput and accuracy count: examples or tokens
  // More scalars for the train record (the GAN's loss_d, loss_g, d_real, d_fake).
  std::vector<std::pair<std::string, Tensor>> scalars;
};

// The training data of a task and how the loop's loader reads it (a loader batch is one
// optimizer step).
struct TaskData {
  std::shared_ptr<const data::Dataset> train;
  data::LoaderOptions loader;
  int64_t bytes = 0;  // the data held as tensors (train and evaluation sets)
};

class Task {
 public:
  virtual ~Task() = default;

  // "image classification", "language model", ...
  virtual std::string_view name() const = 0;
  // The options the task honours beyond every task's (config::Feature).
  virtual config::Features features() const = 0;
  // What samples_per_s counts ("samples", "tokens") and whether steps have an accuracy.
  virtual const char* unit() const { return "samples"; }
  virtual bool has_accuracy() const { return true; }

  // Loads the data (it may complete the configuration: a language model's vocabulary and
  // tokenizer) and builds the networks as trainees of `run` (run.add_trainee; the first is the
  // main model). Returns the training data.
  virtual TaskData build(Run& run) = 0;
  // One optimizer step on a loader batch: forward, backward and step() of its trainees.
  virtual StepOutput step(const data::Batch& batch, Run& run) = 0;
  // The evaluation, in eval mode without a graph; its metrics are the eval record's.
  virtual EvalResult evaluate(Run& run) = 0;
  // A short line of an evaluation ("test loss 0.4211 acc 85.10%"), and what its samples are.
  virtual std::string describe(const EvalResult& e) const = 0;
  virtual const char* eval_unit() const = 0;

  // What the run's first ("config") record says of the task beyond the configuration.
  virtual void describe_config(Json& /*record*/) const {}
  // State beyond the trainees' for checkpoints (the recommender's lazily updated tables).
  virtual NamedTensors state_dict() const { return {}; }
  virtual void load_state_dict(const NamedTensors& /*state*/) {}
  // Numbers of the summary record beyond every task's (the recommender's Bayes log loss).
  virtual void summarize(const TrainResult& /*r*/, Json& /*summary*/) const {}
  // The one line `mantissa train` prints at the end.
  virtual std::string result_line(const TrainResult& r, const Run& run) const = 0;
};

// The task that trains config.model.
std::unique_ptr<Task> make_task(const TrainConfig& config);

}  // namespace mantissa::train
