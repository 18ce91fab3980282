// Training a DC-GAN (nn::make_model("dcgan_generator") / ("dcgan_discriminator")) on
// Fashion-MNIST (or the synthetic images) in any precision recipe the Trainer supports, with
// quality metrics (metrics/image_quality.h). docs/training.md, "GANs".
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mantissa/metrics/image_quality.h"
#include "mantissa/train/trainer.h"

namespace mantissa::train {

struct GanResult {
  // Of the last evaluation (at the end of the run): the Fréchet distance between the feature
  // statistics of generated and real test images, features from Mantissa's own `cnn` classifier
  // (NOT Inception: not comparable with published FIDs), and the mean MS-SSIM of pairs of
  // generated images (lower: more diverse).
  double frechet_distance = 0;
  double ms_ssim = 0;
  double seconds = 0;         // the training steps' wall time (evaluations and setup excluded)
  int64_t steps = 0;          // iterations (one discriminator and one generator step each)
  int64_t skipped_steps = 0;  // optimizer steps skipped for inf/NaN gradients, both networks
  double loss_scale = 1;      // the generator's scale at the end (the discriminator's in the log)
  int64_t peak_memory_bytes = 0;              // of the training steps (evaluations excluded)
  double final_loss_d = 0, final_loss_g = 0;  // of the last step
};

// Evaluation sizes: generated and real test images per Fréchet distance (fewer when the test
// set is smaller), and generated pairs per mean MS-SSIM.
inline constexpr int64_t kGanEvalSamples = 2000;
inline constexpr int64_t kGanMsSsimPairs = 100;

// Trains a DC-GAN (Trainer with --model dcgan; start from defaults_for("dcgan")):
// - data: fashion-mnist (data_dir) or synthetic (synthetic_size training images and a fifth as
//   many test images, drawn with seed 0 like the feature network's); pixels scaled to
//   [-1, 1] (the generator ends in tanh). Batches of batch_size, the last short one dropped.
// - Each network has the run's optimizer (defaults_for: Adam at 2e-4 with beta1 0.5, no weight
//   decay, a constant schedule), schedule, clipping and precision recipe (its own Amp: for fp16
//   its own dynamic GradScaler); fp8, grad_accum and data parallelism are refused.
// - Each iteration: a discriminator step on a real batch and a generated one (BCE with logits,
//   real 1, fake 0), then a generator step (BCE with logits of D(G(z)) against 1), both with
//   the same G(z). z ~ N(0, I) from Philox, seeded by config.seed and the step.
// - Records (the Trainer's, to the metrics file, TensorBoard and on_record alike): config (with
//   the feature network's description); train every log_every iterations {step, epoch, loss =
//   loss_d + loss_g, loss_d, loss_g, d_real, d_fake (mean sigmoid outputs), lr, loss_scale
//   (G's), loss_scale_discriminator, skipped_steps, samples_per_s, peak_memory_bytes}; eval
//   {step, frechet_distance, frechet_distance_real (real training images against the same test
//   images: the floor of the sampling noise), ms_ssim, eval_seconds} every eval_every iterations
//   and at each epoch's end; summary.
// - Checkpoints hold both networks (the discriminator's tensors prefixed "discriminator.") and
//   resume exactly, as every task's.
// - The feature network of the Fréchet distance: the `cnn` classifier trained in fp32 for one
//   epoch (or fd_feature_steps steps) on the same data (seed 0, SGD lr 0.05, batch 128: the
//   same network for every run on that data), its 128-d penultimate activations (after the
//   ReLU). With a metrics_path it is cached as a checkpoint beside the metrics file
//   (fd_cnn_<data>.safetensors), reused by later runs; without one it is trained afresh.
GanResult train_gan(const TrainConfig& config,
                    std::function<void(const std::string& json)> on_record = {});

}  // namespace mantissa::train
