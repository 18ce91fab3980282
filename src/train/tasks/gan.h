// Internal: the DC-GAN task (--model dcgan, docs/training.md "GANs"): a generator (the main
// trainee) and a discriminator, each with its optimizer and precision, trained in alternating
// steps on Fashion-MNIST or the synthetic images; evaluated with the Fréchet distance of the cnn
// classifier's features and MS-SSIM (metrics/image_quality.h).
#pragma once

#include <array>
#include <memory>
#include <optional>

#include "mantissa/data/images.h"
#include "mantissa/metrics/image_quality.h"
#include "train/task.h"

namespace mantissa::train {

class FeatureNet;  // the Fréchet distance's feature network (gan.cpp)

class GanTask final : public Task {
 public:
  static constexpr std::string_view kModel = "dcgan";
  // The registry's models the GAN is made of (nn/models.h): no task trains them alone.
  static constexpr std::array<std::string_view, 2> kParts = {"dcgan_generator",
                                                             "dcgan_discriminator"};
  static constexpr std::string_view kName = "GAN";
  static constexpr config::DataInput kInput = config::DataInput::Images;
  static constexpr config::Features kFeatures =
      config::features_of(config::Feature::FeatureNetwork);
  // The DC-GAN paper's settings: Adam at 2e-4 with beta1 0.5, no weight decay, no schedule.
  static void defaults(TrainConfig& c);

  GanTask();
  ~GanTask() override;

  std::string_view name() const override { return kName; }
  config::Features features() const override { return kFeatures; }
  bool has_accuracy() const override { return false; }
  TaskData build(Run& run) override;
  StepOutput step(const data::Batch& batch, Run& run) override;
  EvalResult evaluate(Run& run) override;
  std::string describe(const EvalResult& e) const override;
  const char* eval_unit() const override { return "generated images"; }
  void describe_config(Json& record) const override;
  void summarize(const TrainResult& r, Json& summary) const override;
  std::string result_line(const TrainResult& r, const Run& run) const override;

 private:
  // Generated images in [-1, 1], `n` of them from the fixed evaluation noise, on the host.
  Tensor generate(Run& run, int64_t n, int64_t chunk);
  void fit_real(Run& run, int64_t chunk);

  data::ImageDataset train_, test_;
  int64_t eval_n_ = 0;
  std::unique_ptr<FeatureNet> features_;
  metrics::GaussianFit real_fit_;
  double real_floor_ = 0;
  int64_t fd_steps_ = 0;
  int64_t train_peak_ = 0;  // the training steps' peak memory, evaluations set aside
  Tensor ones_, zeros_;     // the discriminator's targets (B, 1)
  uint64_t z_seed_ = 0;
};

}  // namespace mantissa::train
