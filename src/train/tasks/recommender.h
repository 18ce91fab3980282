// Internal: the recommender task (a ModelInput::Clicks model: dcn; docs/training.md
// "Recommenders"): a click log (synthetic with a planted model, or a TSV/CSV file), the model's
// embedding tables updated by their own optimizer (dense) or lazily, only the rows a batch
// touched; evaluated by held-out log loss and AUC.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mantissa/optim/sparse_adamw.h"
#include "train/task.h"

namespace mantissa::train {

class RecommenderTask final : public Task {
 public:
  static constexpr std::string_view kName = "recommender";
  static constexpr config::DataInput kInput = config::DataInput::Clicks;
  static constexpr config::Features kFeatures =
      config::features_of(config::Feature::Tables, config::Feature::EvalBatches);
  // AdamW at 1e-3 without weight decay, batches of 512, one epoch of 100,000 synthetic examples.
  static void defaults(TrainConfig& c);

  std::string_view name() const override { return kName; }
  config::Features features() const override { return kFeatures; }
  bool has_accuracy() const override { return false; }
  TaskData build(Run& run) override;
  StepOutput step(const data::Batch& batch, Run& run) override;
  EvalResult evaluate(Run& run) override;
  std::string describe(const EvalResult& e) const override;
  const char* eval_unit() const override { return "examples"; }
  NamedTensors state_dict() const override;
  void load_state_dict(const NamedTensors& state) override;
  void summarize(const TrainResult& r, Json& summary) const override;
  std::string result_line(const TrainResult& r, const Run& run) const override;

 private:
  std::shared_ptr<const data::Dataset> held_out_;
  double bayes_log_loss_ = 0, constant_log_loss_ = 0;
  std::vector<std::string> table_names_;
  std::unique_ptr<optim::SparseAdamW> lazy_;
  // On the CPU, where the optimizer time goes (seconds summed over all steps): the embedding
  // tables' update (the lazy update, or the tables' dense optimizer) and the other parameters'.
  double table_seconds_ = 0, rest_seconds_ = 0;
};

}  // namespace mantissa::train
