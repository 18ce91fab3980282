// train_gan (gan.h): a DC-GAN's alternating discriminator and generator steps, each network with
// its own optimizer and Amp, evaluated with the Fréchet distance of cnn features and MS-SSIM.
#include "mantissa/train/gan.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "mantissa/amp/amp.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/error.h"
#include "mantissa/data/images.h"
#include "mantissa/data/loader.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"
#include "mantissa/train/checkpoint.h"
#include "mantissa/train/trainer.h"
#include "train/run_log.h"

namespace mantissa::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The run's data: train and test images, pixels as the generator makes them ([-1, 1]).
struct GanData {
  data::ImageDataset train, test;
};

GanData load_data(const TrainConfig& c) {
  MT_CHECK(c.data == "fashion-mnist" || c.data == "synthetic",
           "the GAN trains on images: use --data fashion-mnist or synthetic, not '", c.data, "'");
  GanData d;
  if (c.data == "fashion-mnist") {
    d.train = data::load_fashion_mnist(c.data_dir, true);
    d.test = data::load_fashion_mnist(c.data_dir, false);
  } else {
    // The Trainer's split of one draw, with seed 0: the data of the feature network too.
    const int64_t n_train = c.synthetic_size, n_test = std::max<int64_t>(n_train / 5, 1);
    const data::ImageDataset all = data::synthetic_images(n_train + n_test, 1, 28, 10, 0);
    d.train = all.slice(0, n_train);
    d.test = all.slice(n_train, n_test);
  }
  return d;
}

// ---- the feature network of the Fréchet distance ----------------------------------------------

// How long the feature network trains: TrainConfig::fd_feature_steps (0: one epoch).
std::string describe_training(int64_t steps) {
  return steps > 0 ? std::to_string(steps) + " steps" : "1 epoch";
}

class FeatureNet {
 public:
  FeatureNet(const TrainConfig& gan, const Device& device) : device_(device) {
    TrainConfig c;
    c.model = "cnn";
    c.data = gan.data;
    c.data_dir = gan.data_dir;
    c.synthetic_size = gan.synthetic_size;
    // One epoch, or fd_feature_steps steps (over as many epochs as they take).
    c.max_steps = gan.fd_feature_steps;
    c.epochs = c.max_steps > 0 ? c.max_steps : 1;
    c.batch_size = 128;
    c.seed = 0;
    c.precision = "fp32";
    c.device = gan.device;
    c.threads = gan.threads;
    c.workers = gan.workers;
    c.progress = false;
    c.log_every = 1000000;
    std::string cache;
    if (!gan.metrics_path.empty()) {
      std::filesystem::path dir = std::filesystem::path(gan.metrics_path).parent_path();
      std::string name = "fd_cnn_" + gan.data;
      if (gan.data == "synthetic") name += "_" + std::to_string(gan.synthetic_size);
      if (gan.fd_feature_steps > 0) name += "_steps" + std::to_string(gan.fd_feature_steps);
      cache = (dir / (name + ".safetensors")).string();
    }
    nn::ModelConfig mc;
    mc.seed = 0;
    if (!cache.empty() && std::filesystem::exists(cache)) {
      const Checkpoint ckpt = load_checkpoint(cache);
      MT_CHECK(ckpt.config.model == "cnn" && ckpt.config.data == gan.data &&
                   ckpt.config.max_steps == c.max_steps,
               "'", cache, "' is not the feature network this run asks for: it is a ",
               ckpt.config.model, " trained on ", ckpt.config.data, " for ",
               describe_training(ckpt.config.max_steps), ", this run wants a cnn trained on ",
               gan.data, " for ", describe_training(c.max_steps),
               "; delete it and it is trained again");
      model_ = nn::make_model("cnn", mc);
      model_->load_state_dict(ckpt.model);
      model_->to(device_);
      source_ = "loaded from " + cache;
    } else {
      c.checkpoint_path = cache;
      Trainer t(c);
      t.set_quiet(!gan.progress);  // the GAN's own lines say what happens
      t.fit();
      model_ = nn::make_model("cnn", mc);
      model_->load_state_dict(t.model().state_dict());
      model_->to(device_);
      source_ = cache.empty() ? "trained for this run" : "trained, saved to " + cache;
    }
    model_->eval();
    classifier_ = std::dynamic_pointer_cast<nn::Sequential>(model_->child("classifier"));
    features_ = model_->child("features");
    MT_ASSERT(classifier_ && features_ && classifier_->size() >= 3, "the cnn's layout changed");
  }
  // images (N, 1, 28, 28) normalized as the classifier was trained -> (N, 128) F32 on the host.
  Tensor features(const Tensor& images) {
    NoGrad ng;
    std::vector<Tensor> parts;
    for (int64_t s = 0; s < images.size(0); s += 500) {
      const int64_t n = std::min<int64_t>(500, images.size(0) - s);
      Tensor h = (*features_)(images.narrow(0, s, n).to(device_));
      for (size_t i = 0; i < 3; ++i)  // flatten, linear -> 128, relu
        h = (*(*classifier_)[i])(h);
      parts.push_back(h.to(Device::cpu()).to(DType::F32));
    }
    return cat(parts, 0);
  }
  const std::string& source() const { return source_; }

 private:
  Device device_;
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<nn::Sequential> classifier_;
  nn::ModulePtr features_;
  std::string source_;
};

// Generated images in [-1, 1] -> the classifier's input normalization.
Tensor classifier_input(const Tensor& images) {
  const double a = 0.5 / double(data::kFashionMnistStd);
  const double b = (0.5 - double(data::kFashionMnistMean)) / double(data::kFashionMnistStd);
  return add(mul(images, a), b);
}

}  // namespace

GanResult train_gan(const TrainConfig& config_in,
                    std::function<void(const std::string& json)> on_record) {
  TrainConfig c = config_in;
  c.precision = resolve_precision(c.precision);
  // The DC-GAN defaults where the caller kept TrainConfig's (gan.h).
  const TrainConfig defaults;
  if (c.lr == defaults.lr) c.lr = 2e-4;
  if (c.beta1 == defaults.beta1) c.beta1 = 0.5;
  if (c.weight_decay == defaults.weight_decay) c.weight_decay = 0;
  c.optimizer = "adamw";
  c.model = "dcgan";
  c.validate();
  MT_CHECK(c.precision != "fp8",
           "the GAN does not run fp8 (its Linear layers are not the GEMMs that matter); use "
           "fp32, tf32, bf16, bf16-pure or fp16");
  MT_CHECK(!c.distributed, "the GAN trains on one process; drop --distributed");
  MT_CHECK(c.grad_accum == 1, "the GAN takes no --grad-accum (got ", c.grad_accum, ")");
  MT_CHECK(c.checkpoint_path.empty() && c.resume_path.empty() && c.checkpoint_every == 0,
           "the GAN writes no checkpoints yet; drop --checkpoint/--resume");
  MT_CHECK(c.clip_grad_norm == 0, "the GAN takes no --clip-grad-norm");
  MT_CHECK(c.zero_grad == "none" && c.input_pipeline == "prefetch",
           "the GAN takes neither --zero-grad zeros nor --input-pipeline pinned/pageable (the "
           "Trainer's, for the study's time/memory ladder); drop them");
  const Device device = require_device(c.device);
  set_num_threads(c.threads > 0 ? c.threads
                                : int(std::max(1u, std::thread::hardware_concurrency())));

  RunLog log(c.metrics_path, c.tensorboard_dir);
  if (on_record) log.set_callback(std::move(on_record));

  const GanData data = load_data(c);
  MT_CHECK(data.train.size() >= c.batch_size, "--batch-size ", c.batch_size, " exceeds the ",
           data.train.size(), " training images");
  nn::ModelConfig mc;
  mc.in_channels = data.train.channels();
  mc.image_size = data.train.height();
  mc.seed = nn::init::derive_seed(c.seed, 1);
  std::shared_ptr<nn::Module> gen = nn::make_model("dcgan_generator", mc);
  mc.seed = nn::init::derive_seed(c.seed, 2);
  std::shared_ptr<nn::Module> disc = nn::make_model("dcgan_discriminator", mc);
  gen->to(device);
  disc->to(device);
  optim::AdamWOptions ao{
      .lr = c.lr, .beta1 = c.beta1, .beta2 = c.beta2, .eps = c.eps, .weight_decay = c.weight_decay};
  optim::AdamW opt_g(gen->parameters(), ao), opt_d(disc->parameters(), ao);
  amp::Amp amp_g = initialize_precision(*gen, opt_g, c);
  amp::Amp amp_d = initialize_precision(*disc, opt_d, c);

  // Evaluation: real features once, a fixed z for the generated images.
  std::optional<FeatureNet> fnet;
  metrics::GaussianFit real_fit;
  double real_floor = 0;
  const int64_t eval_n = std::min<int64_t>(kGanEvalSamples, data.test.size());
  MT_CHECK(eval_n >= 2, "the test set has too few images for the Fréchet distance");
  // The peak of the training steps alone: an evaluation's (the feature network, 500-image
  // batches) is set aside and the counter restarted after it.
  int64_t train_peak = 0;
  auto training_peak = [&] { return std::max(train_peak, memory_stats(device).peak_bytes); };
  auto evaluate = [&](int64_t step, GanResult& r) {
    const auto t0 = Clock::now();
    train_peak = training_peak();
    if (!fnet) {
      fnet.emplace(c, device);
      std::vector<int64_t> idx(static_cast<size_t>(eval_n));
      for (int64_t i = 0; i < eval_n; ++i)
        idx[size_t(i)] = i;
      const Tensor real = data.test.get_batch(idx)[0];  // normalized as the cnn's training
      real_fit = metrics::gaussian_fit(fnet->features(real).to(DType::F64));
      // The floor a perfect generator would reach: as many real training images against the
      // same test images (the sampling noise of the two fits).
      const int64_t n_floor = std::min<int64_t>(eval_n, data.train.size());
      std::vector<int64_t> tidx(static_cast<size_t>(n_floor));
      for (int64_t i = 0; i < n_floor; ++i)
        tidx[size_t(i)] = i;
      if (n_floor >= 2) {
        real_floor = metrics::frechet_distance(
            metrics::gaussian_fit(fnet->features(data.train.get_batch(tidx)[0]).to(DType::F64)),
            real_fit);
      }
    }
    gen->eval();
    Tensor images;
    {
      NoGrad ng;
      std::vector<Tensor> parts;
      for (int64_t s = 0; s < eval_n; s += 500) {
        const int64_t n = std::min<int64_t>(500, eval_n - s);
        const Tensor z =
            Tensor::normal({n, nn::kDcganLatentDim}, 0.0, 1.0,
                           nn::init::derive_seed(c.seed ^ 0x5eed, uint64_t(s)), DType::F32, device);
        parts.push_back(amp_g.forward(*gen, z).to(DType::F32).to(Device::cpu()));
      }
      images = cat(parts, 0);
    }
    gen->train();
    const std::vector<float> px = images.to_vector<float>();
    MT_CHECK(std::all_of(px.begin(), px.end(), [](float v) { return std::isfinite(v); }),
             "the generator made non-finite pixels at step ", step, "; the run diverged");
    r.frechet_distance = metrics::frechet_distance(
        metrics::gaussian_fit(fnet->features(classifier_input(images)).to(DType::F64)), real_fit);
    r.ms_ssim = metrics::mean_pairwise_ms_ssim(
        images.narrow(0, 0, std::min<int64_t>(2 * kGanMsSsimPairs, eval_n)));
    auto j = record("eval");
    j["step"] = step;
    j["frechet_distance"] = r.frechet_distance;
    j["frechet_distance_real"] = real_floor;
    j["ms_ssim"] = r.ms_ssim;
    j["eval_seconds"] = seconds_since(t0);
    log.write(j);
    reset_peak_memory(device);
  };

  {
    auto j = record("config");
    j["step"] = 0;
    j["config"] = nlohmann::ordered_json::parse(c.to_json());
    j["precision"] = amp_g.describe();
    j["latent_dim"] = nn::kDcganLatentDim;
    j["eval_samples"] = eval_n;
    j["ms_ssim_pairs"] = std::min<int64_t>(kGanMsSsimPairs, eval_n / 2);
    j["feature_network"] = "cnn (fp32, " + describe_training(c.fd_feature_steps) +
                           ", seed 0), 128-d penultimate layer: not Inception";
    log.write(j);
  }

  data::LoaderOptions lo;
  lo.batch_size = c.batch_size;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.seed = c.seed;
  lo.num_workers = c.workers;
  data::DataLoader loader(data.train.with_options({.mean = 0.5f, .std = 0.5f, .dtype = DType::F32}),
                          lo);

  reset_peak_memory(device);
  const int64_t B = c.batch_size;
  const Tensor ones = Tensor::ones({B, 1}, DType::F32, device);
  const Tensor zeros = Tensor::zeros({B, 1}, DType::F32, device);
  const uint64_t z_seed = nn::init::derive_seed(c.seed, 3);
  GanResult result;
  Tensor loss_d, loss_g, d_real, d_fake;
  double train_seconds = 0;
  auto window_start = Clock::now();
  int64_t window_steps = 0;
  bool done = false;
  for (int64_t epoch = 0; !done && (c.max_steps > 0 || epoch < c.epochs); ++epoch) {
    loader.set_epoch(epoch);
    auto t0 = Clock::now();
    for (std::optional<data::Batch> batch = loader.next(); batch; batch = loader.next()) {
      const Tensor real = batch->x().to(device);
      const Tensor z =
          Tensor::normal({B, nn::kDcganLatentDim}, 0.0, 1.0,
                         nn::init::derive_seed(z_seed, uint64_t(result.steps)), DType::F32, device);
      // Discriminator: real -> 1, G(z) (detached) -> 0.
      opt_d.zero_grad();
      const Tensor fake = amp_g.forward(*gen, z).to(DType::F32);
      const Tensor logits_real = amp_d.forward(*disc, real).to(DType::F32);
      const Tensor logits_fake = amp_d.forward(*disc, fake.detach()).to(DType::F32);
      loss_d = add(binary_cross_entropy_with_logits(logits_real, ones),
                   binary_cross_entropy_with_logits(logits_fake, zeros));
      amp_d.scaler().scale(loss_d).backward();
      amp_d.scaler().step(opt_d);
      amp_d.scaler().update();
      // Generator: D(G(z)) -> 1, through the updated discriminator.
      opt_g.zero_grad();
      const Tensor logits_g = amp_d.forward(*disc, fake).to(DType::F32);
      loss_g = binary_cross_entropy_with_logits(logits_g, ones);
      amp_g.scaler().scale(loss_g).backward();
      amp_g.scaler().step(opt_g);
      amp_g.scaler().update();
      ++result.steps;
      ++window_steps;
      const bool last = c.max_steps > 0 && result.steps >= c.max_steps;
      if (result.steps % c.log_every == 0 || last) {
        // The one host read of the interval (docs/design.md §5).
        const double ld = loss_d.item(), lg = loss_g.item();
        train_seconds += seconds_since(t0);
        const double window = seconds_since(window_start);
        auto j = record("train");
        j["step"] = result.steps;
        j["epoch"] = epoch + 1;
        j["loss_d"] = ld;
        j["loss_g"] = lg;
        j["loss"] = ld + lg;
        j["d_real"] = mean(sigmoid(logits_real.detach())).item();
        j["d_fake"] = mean(sigmoid(logits_fake.detach())).item();
        j["loss_scale"] = amp_d.scaler().get_scale();
        j["loss_scale_g"] = amp_g.scaler().get_scale();
        j["skipped_steps"] = amp_d.scaler().skipped_steps() + amp_g.scaler().skipped_steps();
        j["samples_per_s"] = window > 0 ? double(window_steps * B) / window : 0.0;
        j["peak_memory_bytes"] = training_peak();
        log.write(j);
        window_start = Clock::now();
        window_steps = 0;
        t0 = Clock::now();
      }
      if (c.eval_every > 0 && result.steps % c.eval_every == 0 && !last) {
        train_seconds += seconds_since(t0);
        evaluate(result.steps, result);
        t0 = window_start = Clock::now();
        window_steps = 0;
      }
      if (last) {
        done = true;
        break;
      }
    }
    train_seconds += seconds_since(t0);
    // --eval-every 0: at each epoch's end (the run's last evaluation comes after the loop).
    if (!done && c.eval_every == 0 && (c.max_steps > 0 || epoch + 1 < c.epochs)) {
      evaluate(result.steps, result);
      window_start = Clock::now();
      window_steps = 0;
    }
  }
  MT_CHECK(result.steps > 0, "the GAN ran no steps (epochs ", c.epochs, ", --steps ", c.max_steps,
           ")");
  result.seconds = train_seconds;
  result.final_loss_d = loss_d.item();
  result.final_loss_g = loss_g.item();
  result.skipped_steps = amp_d.scaler().skipped_steps() + amp_g.scaler().skipped_steps();
  result.loss_scale = amp_d.scaler().get_scale();
  result.peak_memory_bytes = training_peak();
  evaluate(result.steps, result);
  {
    auto j = record("summary");
    j["steps"] = result.steps;
    j["seconds"] = result.seconds;
    j["ms_per_step"] = 1000 * result.seconds / double(result.steps);
    j["frechet_distance"] = result.frechet_distance;
    j["ms_ssim"] = result.ms_ssim;
    j["final_loss_d"] = result.final_loss_d;
    j["final_loss_g"] = result.final_loss_g;
    j["skipped_steps"] = result.skipped_steps;
    j["loss_scale"] = result.loss_scale;
    j["loss_scale_g"] = amp_g.scaler().get_scale();
    j["peak_memory_bytes"] = result.peak_memory_bytes;
    j["precision"] = amp_g.describe();
    j["feature_network"] = fnet->source();
    log.write(j);
  }
  return result;
}

}  // namespace mantissa::train
