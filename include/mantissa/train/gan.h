// Training a DC-GAN (nn::make_model("dcgan_generator") / ("dcgan_discriminator")) on
// Fashion-MNIST (or the synthetic images) in any precision recipe the Trainer supports, with
// quality metrics (metrics/image_quality.h). docs/training.md, "GANs".
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mantissa/metrics/image_quality.h"
#include "mantissa/train/config.h"

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
  double loss_scale = 1;      // the discriminator's scale at the end (the generator's in the log)
  int64_t peak_memory_bytes = 0;              // of the training steps (evaluations excluded)
  double final_loss_d = 0, final_loss_g = 0;  // of the last step
};

// Evaluation sizes: generated and real test images per Fréchet distance (fewer when the test
// set is smaller), and generated pairs per mean MS-SSIM.
inline constexpr int64_t kGanEvalSamples = 2000;
inline constexpr int64_t kGanMsSsimPairs = 100;

// Trains a DC-GAN with `config`:
// - data: fashion-mnist (data_dir) or synthetic (synthetic_size training images and a fifth as
//   many test images, drawn with seed 0 like the feature network's); pixels scaled to
//   [-1, 1] (the generator ends in tanh). Batches of batch_size, the last short one dropped.
// - Adam for both networks (config.optimizer is not read). Where config keeps TrainConfig's
//   defaults the DC-GAN paper's settings are used: lr 2e-4 (default 0.05), beta1 0.5 (default
//   0.9), weight decay 0 (default 5e-4); values the caller changed are used as given. The
//   config record shows the values that ran. No schedule, no clipping.
// - precision, opt_level, loss_scale, init_scale, rounding: train::initialize_precision once for
//   each network and its optimizer, so each has its own Amp (and, for fp16, its own dynamic
//   GradScaler); every recipe the Trainer supports except fp8.
// - Each iteration: a discriminator step on a real batch and a generated one (BCE with logits,
//   real 1, fake 0), then a generator step (BCE with logits of D(G(z)) against 1), both with
//   the same G(z). z ~ N(0, I) from Philox, seeded by config.seed and the step.
// - seed (models, data order, z), epochs or max_steps (> 0: stop after that many iterations,
//   across epochs), log_every, eval_every (> 0: every that many iterations; 0: at each epoch's
//   end; always at the end), metrics_path, tensorboard_dir, threads, workers, device. zero_grad
//   zeros and input_pipeline other than prefetch are refused.
// - Records (the Trainer's conventions, to the metrics file, TensorBoard and on_record alike):
//   config; train every log_every iterations {step, epoch, loss_d, loss_g, loss = loss_d +
//   loss_g, d_real, d_fake (mean sigmoid outputs), loss_scale (D's), loss_scale_g,
//   skipped_steps, samples_per_s, peak_memory_bytes}; eval {step, frechet_distance,
//   frechet_distance_real (real training images against the same test images: the floor of
//   the sampling noise), ms_ssim, eval_seconds}; summary.
// - The feature network of the Fréchet distance: the `cnn` classifier trained in fp32 for one
//   epoch on the same data (seed 0, SGD lr 0.05, batch 128: the same network for every run on
//   that data), its 128-d penultimate activations (after the ReLU). With a metrics_path it is
//   cached as a checkpoint beside the metrics file (fd_cnn_<data>.safetensors), reused by later
//   runs; without one it is trained afresh each run.
// Refused with a clear message: precision fp8, distributed, grad_accum > 1, checkpoints/resume.
GanResult train_gan(const TrainConfig& config,
                    std::function<void(const std::string& json)> on_record = {});

}  // namespace mantissa::train
