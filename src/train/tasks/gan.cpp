// The DC-GAN task (gan.h): alternating discriminator and generator steps, each network with its
// own optimizer and Amp, evaluated with the Fréchet distance of cnn features and MS-SSIM.
#include "train/tasks/gan.h"

#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/clock.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/gan.h"
#include "mantissa/train/report.h"
#include "train/run.h"

namespace mantissa::train {

// How long the feature network trains: TrainConfig::fd_feature_steps (0: one epoch).
static std::string describe_training(int64_t steps) {
  return steps > 0 ? std::to_string(steps) + " steps" : "1 epoch";
}

// The feature network of the Fréchet distance: the `cnn` classifier trained in fp32 for one epoch
// (or fd_feature_steps steps) on the same data with seed 0, cached as a checkpoint beside the
// metrics file.
class FeatureNet {
 public:
  // `stop`: the run's stop flag, which also stops this training (then complete() is false and
  // nothing is cached).
  FeatureNet(const TrainConfig& gan, const Device& device, const std::atomic<int>* stop)
      : device_(device) {
    TrainConfig c = defaults_for("cnn");
    c.data = gan.data;
    c.data_dir = gan.data_dir;
    c.synthetic_size = gan.synthetic_size;
    // One epoch, or fd_feature_steps steps (over as many epochs as they take).
    c.max_steps = gan.fd_feature_steps;
    c.epochs = c.max_steps > 0 ? c.max_steps : 1;
    c.batch_size = 128;
    c.seed = 0;
    c.device = gan.device;
    c.threads = gan.threads;
    c.workers = gan.workers;
    c.progress = false;
    c.log_every = 1000000;
    std::string cache;
    if (!gan.metrics_path.empty()) {
      std::filesystem::path dir = std::filesystem::path(gan.metrics_path).parent_path();
      // Appended piece by piece: gcc 12 reports a false -Wrestrict for "_" + std::to_string().
      std::string name = "fd_cnn_";
      name += name_of(gan.data);
      if (gan.data == config::DataKind::Synthetic)
        name.append("_").append(std::to_string(gan.synthetic_size));
      if (gan.fd_feature_steps > 0)
        name.append("_steps").append(std::to_string(gan.fd_feature_steps));
      cache = (dir / (name + ".safetensors")).string();
    }
    nn::ModelConfig mc;
    mc.seed = 0;
    model_ = nn::make_model("cnn", mc);
    if (!cache.empty() && std::filesystem::exists(cache)) {
      const Checkpoint ckpt = load_checkpoint(cache);
      MT_CHECK(ckpt.config.model == "cnn" && ckpt.config.data == gan.data &&
                   ckpt.config.max_steps == c.max_steps,
               "'", cache, "' is not the feature network this run asks for: it is a ",
               ckpt.config.model, " trained on ", name_of(ckpt.config.data), " for ",
               describe_training(ckpt.config.max_steps), ", this run wants a cnn trained on ",
               name_of(gan.data), " for ", describe_training(c.max_steps),
               "; delete it and it is trained again");
      model_->load_state_dict(ckpt.model);
      complete_ = true;
      source_ = "loaded from " + cache;
    } else {
      // Written beside the cache and renamed when complete: an interrupted training leaves no
      // feature network behind (nor a stray mantissa-interrupted.safetensors).
      namespace fs = std::filesystem;
      const fs::path partial =
          cache.empty() ? fs::temp_directory_path() /
                              fmt::format("mantissa-fd-cnn-{}.safetensors.partial", ::getpid())
                        : fs::path(cache + ".partial");
      c.checkpoint_path = partial.string();
      Trainer t(c);
      t.set_quiet(!gan.progress);  // the GAN's own lines say what happens
      t.set_stop_flag(stop);
      const bool interrupted = t.fit().interrupted != 0;
      std::error_code ec;
      if (interrupted || cache.empty()) {
        fs::remove(partial, ec);
      } else {
        fs::rename(partial, cache, ec);
      }
      if (interrupted) return;
      complete_ = true;
      model_->load_state_dict(t.model().state_dict());
      source_ = cache.empty() ? "trained for this run" : "trained, saved to " + cache;
    }
    model_->to(device_);
    model_->eval();
    classifier_ = std::dynamic_pointer_cast<nn::Sequential>(model_->child("classifier"));
    features_ = model_->child("features");
    MT_ASSERT(classifier_ && features_ && classifier_->size() >= 3, "the cnn's layout changed");
  }
  bool complete() const { return complete_; }
  // images (N, 1, 28, 28) normalized as the classifier was trained -> (N, 128) F64 on the host.
  Tensor features(const Tensor& images, int64_t chunk) {
    NoGrad ng;
    std::vector<Tensor> parts;
    for (int64_t s = 0; s < images.size(0); s += chunk) {
      const int64_t n = std::min<int64_t>(chunk, images.size(0) - s);
      Tensor h = (*features_)(images.narrow(0, s, n).to(device_));
      for (size_t i = 0; i < 3; ++i)  // flatten, linear -> 128, relu
        h = (*(*classifier_)[i])(h);
      parts.push_back(h.to(Device::cpu()).to(DType::F32));
    }
    return cat(parts, 0).to(DType::F64);
  }
  const std::string& source() const { return source_; }

 private:
  Device device_;
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<nn::Sequential> classifier_;
  nn::ModulePtr features_;
  std::string source_;
  bool complete_ = false;
};

namespace {

// Generated images in [-1, 1] -> the classifier's input normalization.
Tensor classifier_input(const Tensor& images) {
  const double a = 0.5 / double(data::kFashionMnistStd);
  const double b = (0.5 - double(data::kFashionMnistMean)) / double(data::kFashionMnistStd);
  return add(mul(images, a), b);
}

// The first n indices.
std::vector<int64_t> first(int64_t n) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    idx[size_t(i)] = i;
  return idx;
}

}  // namespace

void GanTask::defaults(TrainConfig& c) {
  c.optimizer = config::OptimizerKind::AdamW;
  c.lr = 2e-4;
  c.beta1 = 0.5;
  c.weight_decay = 0;
  c.schedule = optim::ScheduleKind::Constant;
}

GanTask::GanTask() = default;
GanTask::~GanTask() = default;

TaskData GanTask::build(Run& run) {
  const TrainConfig& c = run.config;
  if (c.data == config::DataKind::FashionMnist) {
    train_ = data::load_fashion_mnist(c.data_dir, true);
    test_ = data::load_fashion_mnist(c.data_dir, false);
  } else {
    // The image classifier's split of one draw, with seed 0: the data of the feature network too.
    const int64_t n_train = c.synthetic_size, n_test = std::max<int64_t>(n_train / 5, 1);
    const data::ImageDataset all = data::synthetic_images(n_train + n_test, 1, 28, 10, 0);
    train_ = all.slice(0, n_train);
    test_ = all.slice(n_train, n_test);
  }
  eval_n_ = std::min<int64_t>(kGanEvalSamples, test_.size());
  MT_CHECK(eval_n_ >= 2, "the test set has too few images for the Fréchet distance");
  fd_steps_ = c.fd_feature_steps;
  nn::ModelConfig mc;
  mc.in_channels = train_.channels();
  mc.image_size = train_.height();
  // The generator is the main model (what `mantissa generate` and eval would use), the
  // discriminator's tensors are prefixed "discriminator." in checkpoints.
  for (const std::string_view half : kParts) {
    const bool gen = half == kParts[0];
    mc.seed = nn::init::derive_seed(c.seed, gen ? 1 : 2);
    std::shared_ptr<nn::Module> m = nn::make_model(std::string(half), mc);
    std::vector<optim::ParamGroup> groups =
        c.decay == config::Decay::Weights
            ? decay_groups(*m, c.weight_decay)
            : std::vector<optim::ParamGroup>{{.params = m->parameters()}};
    run.add_trainee(gen ? "" : "discriminator", std::move(m), std::move(groups));
  }
  ones_ = Tensor::ones({c.batch_size, 1}, DType::F32, run.device);
  zeros_ = Tensor::zeros({c.batch_size, 1}, DType::F32, run.device);
  z_seed_ = nn::init::derive_seed(c.seed, 3);
  MT_CHECK(train_.size() >= c.batch_size, "--batch-size ", c.batch_size, " exceeds the ",
           train_.size(), " training images");
  TaskData d;
  d.train = std::make_shared<const data::ImageDataset>(
      train_.with_options({.mean = 0.5f, .std = 0.5f, .dtype = DType::F32}));
  d.loader.batch_size = c.batch_size;
  d.loader.shuffle = true;
  d.loader.drop_last = true;
  d.loader.seed = c.seed;
  d.loader.num_workers = c.workers;
  for (const data::ImageDataset* s : {&train_, &test_})
    d.bytes += int64_t(s->images().nbytes() + s->labels().nbytes());
  return d;
}

StepOutput GanTask::step(const data::Batch& batch, Run& run) {
  Trainee& gen = *run.trainees[0];
  Trainee& disc = *run.trainees[1];
  const int64_t B = run.config.batch_size;
  const Tensor& real = batch.x();
  const Tensor z = Tensor::normal({B, nn::kDcganLatentDim}, 0.0, 1.0,
                                  nn::init::derive_seed(z_seed_, uint64_t(run.state.step)),
                                  DType::F32, run.device);
  // Discriminator: real -> 1, G(z) (detached) -> 0.
  const Tensor fake = gen.forward(z).to(DType::F32);
  const Tensor logits_real = disc.forward(real).to(DType::F32);
  const Tensor logits_fake = disc.forward(fake.detach()).to(DType::F32);
  const Tensor loss_d = add(binary_cross_entropy_with_logits(logits_real, ones_),
                            binary_cross_entropy_with_logits(logits_fake, zeros_));
  disc.backward(loss_d);
  disc.step(run);
  // Generator: D(G(z)) -> 1, through the updated discriminator.
  const Tensor logits_g = disc.forward(fake).to(DType::F32);
  const Tensor loss_g = binary_cross_entropy_with_logits(logits_g, ones_);
  gen.backward(loss_g);
  gen.step(run);
  NoGrad ng;
  StepOutput out;
  out.loss = add(loss_d.detach().to(DType::F64), loss_g.detach().to(DType::F64));
  out.targets = B;
  out.scalars = {{"loss_d", loss_d.detach()},
                 {"loss_g", loss_g.detach()},
                 {"d_real", mean(sigmoid(logits_real.detach()))},
                 {"d_fake", mean(sigmoid(logits_fake.detach()))}};
  return out;
}

Tensor GanTask::generate(Run& run, int64_t n, int64_t chunk) {
  Trainee& gen = run.main();
  NoGrad ng;
  gen.model().eval();
  std::vector<Tensor> parts;
  for (int64_t s = 0; s < n; s += chunk) {
    const int64_t m = std::min<int64_t>(chunk, n - s);
    const Tensor z = Tensor::normal({m, nn::kDcganLatentDim}, 0.0, 1.0,
                                    nn::init::derive_seed(run.config.seed ^ 0x5eed, uint64_t(s)),
                                    DType::F32, run.device);
    parts.push_back(gen.forward(z).to(DType::F32).to(Device::cpu()));
  }
  gen.model().train();
  return cat(parts, 0);
}

// The feature network (trained or loaded once), the real test images' fit, and the floor a
// perfect generator would reach: as many real training images against the same test images (the
// sampling noise of the two fits).
void GanTask::fit_real(Run& run, int64_t chunk) {
  features_ = std::make_unique<FeatureNet>(run.config, run.device, run.stop_flag);
  if (!features_->complete()) {  // stopped while it trained: the run stops, no evaluation
    features_.reset();
    return;
  }
  const Tensor real = test_.get_batch(first(eval_n_))[0];  // normalized as the cnn's training
  real_fit_ = metrics::gaussian_fit(features_->features(real, chunk));
  const int64_t n_floor = std::min<int64_t>(eval_n_, train_.size());
  if (n_floor >= 2) {
    real_floor_ = metrics::frechet_distance(
        metrics::gaussian_fit(features_->features(train_.get_batch(first(n_floor))[0], chunk)),
        real_fit_);
  }
}

EvalResult GanTask::evaluate(Run& run) {
  const auto t0 = Clock::now();
  // The peak of the training steps alone: an evaluation's (the feature network, its batches) is
  // set aside and the counter restarted after it.
  train_peak_ = std::max(train_peak_, memory_stats(run.device).peak_bytes);
  const int64_t chunk = run.config.eval_batch_size > 0 ? run.config.eval_batch_size : 500;
  if (!features_) fit_real(run, chunk);
  if (!features_) return EvalResult{};  // stopped (Loop discards an interrupted evaluation)
  const Tensor images = generate(run, eval_n_, chunk);
  const std::vector<float> px = images.to_vector<float>();
  MT_CHECK(std::all_of(px.begin(), px.end(), [](float v) { return std::isfinite(v); }),
           "the generator made non-finite pixels at step ", run.state.step, "; the run diverged");
  EvalResult r;
  const double fd = metrics::frechet_distance(
      metrics::gaussian_fit(features_->features(classifier_input(images), chunk)), real_fit_);
  const double ms_ssim = metrics::mean_pairwise_ms_ssim(
      images.narrow(0, 0, std::min<int64_t>(2 * kGanMsSsimPairs, eval_n_)));
  r.loss = fd;
  r.samples = eval_n_;
  r.seconds = seconds_since(t0);
  r.metrics = {
      {"frechet_distance", fd}, {"frechet_distance_real", real_floor_}, {"ms_ssim", ms_ssim}};
  reset_peak_memory(run.device);
  return r;
}

std::string GanTask::describe(const EvalResult& e) const {
  return fmt::format("frechet distance (cnn features) {:.3f}, ms-ssim {:.4f}",
                     e.metric("frechet_distance"), e.metric("ms_ssim"));
}

void GanTask::describe_config(Json& j) const {
  j["latent_dim"] = nn::kDcganLatentDim;
  j["eval_samples"] = eval_n_;
  j["ms_ssim_pairs"] = std::min<int64_t>(kGanMsSsimPairs, eval_n_ / 2);
  j["feature_network"] = "cnn (fp32, " + describe_training(fd_steps_) +
                         ", seed 0), 128-d penultimate layer: not Inception";
}

void GanTask::summarize(const TrainResult& r, Json& j) const {
  j["peak_memory_bytes"] = std::max(train_peak_, r.peak_memory_bytes);
  j["seconds"] = r.train_seconds;
  j["ms_per_step"] = r.steps ? 1000 * r.train_seconds / double(r.steps) : 0.0;
  if (features_) j["feature_network"] = features_->source();
}

std::string GanTask::result_line(const TrainResult& r, const Run& run) const {
  double loss_d = 0, loss_g = 0;
  for (const auto& [n, v] : r.last_step) {
    if (n == "loss_d") loss_d = v;
    if (n == "loss_g") loss_g = v;
  }
  return fmt::format(
      "dcgan on {} ({}): frechet distance {:.3f} (cnn features, not FID), ms-ssim {:.4f}, {} "
      "steps, {:.1f} s training ({:.1f} ms/step), final loss_d {:.4f} loss_g {:.4f}, peak memory "
      "{}, loss scale {:g}, {} skipped steps",
      name_of(run.config.data), run.main().amp().describe(), r.test.metric("frechet_distance"),
      r.test.metric("ms_ssim"), r.steps, r.train_seconds,
      r.steps ? 1000 * r.train_seconds / double(r.steps) : 0.0, loss_d, loss_g,
      format_bytes(std::max(train_peak_, r.peak_memory_bytes)), r.loss_scale, r.skipped_steps);
}

}  // namespace mantissa::train
