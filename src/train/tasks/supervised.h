// Internal: the supervised tasks — a model's cross-entropy against labels: image classification
// (Fashion-MNIST or synthetic images) and language modelling (next-token prediction on token
// shards or a synthetic stream). They share the step (with gradient accumulation and the fp16
// underflow measurement) and the evaluation; the data differ.
#pragma once

#include <memory>
#include <vector>

#include "mantissa/nn/models.h"
#include "train/task.h"
#include "train/underflow.h"

namespace mantissa::train {

class SupervisedTask : public Task {
 public:
  TaskData build(Run& run) override;
  StepOutput step(const data::Batch& batch, Run& run) override;
  EvalResult evaluate(Run& run) override;

 protected:
  // Loads the training and evaluation data (completing the configuration where the data decide)
  // and sets the model's input sizes in `mc`.
  virtual void load_data(Run& run, nn::ModelConfig& mc) = 0;
  virtual bool tokens() const = 0;

  std::shared_ptr<const data::Dataset> train_data_, eval_data_;
  int64_t data_bytes_ = 0;

 private:
  // The fp32 gradients of the batch's loss with the same weights, batch, batch-norm statistics
  // and dropout masks; with `activations`, every layer's output gradient also goes into it.
  std::vector<Tensor> reference_gradients(Run& run, const data::Batch& batch,
                                          ActivationGradients* activations);
  // A step of one batch, measuring fp16 underflow when it is time to.
  Tensor step_whole(const data::Batch& batch, Run& run, Tensor* correct);
  // A step of grad_accum micro-batches.
  Tensor step_accumulated(const data::Batch& batch, Run& run, Tensor* correct);
};

class ImageClassifierTask final : public SupervisedTask {
 public:
  static constexpr std::string_view kName = "image classification";
  static constexpr config::DataInput kInput = config::DataInput::Images;
  static constexpr config::Features kFeatures =
      config::features_of(config::Feature::GradAccum, config::Feature::EvalBatches,
                          config::Feature::ActivationCheckpointing, config::Feature::Underflow,
                          config::Feature::Fp8, config::Feature::Fp4, config::Feature::Distributed);
  static void defaults(TrainConfig&) {}

  std::string_view name() const override { return kName; }
  config::Features features() const override { return kFeatures; }
  std::string describe(const EvalResult& e) const override;
  const char* eval_unit() const override { return "images"; }
  std::string result_line(const TrainResult& r, const Run& run) const override;

 protected:
  void load_data(Run& run, nn::ModelConfig& mc) override;
  bool tokens() const override { return false; }
};

class LanguageModelTask final : public SupervisedTask {
 public:
  static constexpr std::string_view kName = "language model";
  static constexpr config::DataInput kInput = config::DataInput::Tokens;
  static constexpr config::Features kFeatures = ImageClassifierTask::kFeatures;
  // Token shards by default: `--model gpt2_tiny` alone asks for --data-path.
  static void defaults(TrainConfig& c) { c.data = config::DataKind::Text; }

  std::string_view name() const override { return kName; }
  config::Features features() const override { return kFeatures; }
  const char* unit() const override { return "tokens"; }
  std::string describe(const EvalResult& e) const override;
  const char* eval_unit() const override { return "tokens"; }
  std::string result_line(const TrainResult& r, const Run& run) const override;

 protected:
  void load_data(Run& run, nn::ModelConfig& mc) override;
  bool tokens() const override { return true; }
};

}  // namespace mantissa::train
