// DC-GAN (Radford et al. 2016) for small single-channel images such as Fashion-MNIST's 28x28:
// a generator from a latent vector and a discriminator giving one logit. Trained by
// train::train_gan (train/gan.h), not by the Trainer.
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"

namespace mantissa::nn {

namespace {

struct Seeds {
  uint64_t base;
  uint64_t next = 0;
  uint64_t operator()() { return init::derive_seed(base, next++); }
};

void check_gan_config(const ModelConfig& c, const char* model) {
  MT_CHECK(c.in_channels > 0 && c.image_size >= 4 && c.image_size % 4 == 0, model,
           ": in_channels must be positive and image_size a multiple of 4 (two stride-2 "
           "layers), got ",
           c.in_channels, " and ", c.image_size);
}

// The DC-GAN paper's initialization, as PyTorch's DC-GAN example applies it: convolution and
// linear weights N(0, 0.02), batch-norm weights N(1, 0.02), biases 0.
void dcgan_init(Module& model, uint64_t seed) {
  Seeds s{init::derive_seed(seed, 1000)};
  NoGrad ng;
  model.apply([&](Module& m) {
    if (auto* c = dynamic_cast<Conv2d*>(&m)) {
      init::normal_(c->weight(), 0.0, 0.02, s());
      if (c->bias().defined()) init::zeros_(c->bias());
    } else if (auto* t = dynamic_cast<ConvTranspose2d*>(&m)) {
      init::normal_(t->weight(), 0.0, 0.02, s());
      if (t->bias().defined()) init::zeros_(t->bias());
    } else if (auto* l = dynamic_cast<Linear*>(&m)) {
      init::normal_(l->weight(), 0.0, 0.02, s());
      if (l->bias().defined()) init::zeros_(l->bias());
    } else if (auto* b = dynamic_cast<BatchNorm*>(&m)) {
      init::normal_(b->weight(), 1.0, 0.02, s());
      init::zeros_(b->bias());
    }
  });
}

// z (B, latent) -> Linear -> 128 x s x s (s = image_size / 4) -> BN -> ReLU -> ConvTranspose
// 128->64 k4 s2 p1 (2s) -> BN -> ReLU -> ConvTranspose 64->C k4 s2 p1 (4s) -> Tanh. The layers
// followed by batch norm have no bias (the norm's shift replaces it).
class DcganGenerator : public Module {
 public:
  explicit DcganGenerator(const ModelConfig& c) : Module("DcganGenerator"), config_(c) {
    check_gan_config(c, "dcgan_generator");
    side_ = c.image_size / 4;
    Seeds seed{c.seed};
    fc = register_module(
        "fc", std::make_shared<Linear>(kDcganLatentDim, 128 * side_ * side_, seed(), Bias::No));
    bn0 = register_module("bn0", std::make_shared<BatchNorm1d>(128 * side_ * side_));
    deconv1 = register_module(
        "deconv1", std::make_shared<ConvTranspose2d>(
                       128, 64, 4,
                       ConvTranspose2dConfig{.stride = 2, .padding = 1, .bias = Bias::No}, seed()));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(64));
    deconv2 = register_module(
        "deconv2",
        std::make_shared<ConvTranspose2d>(
            64, c.in_channels, 4, ConvTranspose2dConfig{.stride = 2, .padding = 1}, seed()));
    dcgan_init(*this, c.seed);
  }
  Tensor forward(const Tensor& z) override {
    MT_CHECK(z.dim() == 2 && z.size(1) == kDcganLatentDim,
             "dcgan_generator: expected a latent batch (B, ", kDcganLatentDim, "), got a ",
             z.describe());
    Tensor h = relu((*bn0)((*fc)(z)));              // (B, 128 s s)
    h = h.reshape({z.size(0), 128, side_, side_});  // (B, 128, s, s)
    h = relu((*bn1)((*deconv1)(h)));                // (B, 64, 2s, 2s)
    return tanh((*deconv2)(h));                     // (B, C, 4s, 4s) in (-1, 1)
  }

  std::shared_ptr<Linear> fc;
  std::shared_ptr<BatchNorm1d> bn0;
  std::shared_ptr<ConvTranspose2d> deconv1, deconv2;
  std::shared_ptr<BatchNorm2d> bn1;

 private:
  ModelConfig config_;
  int64_t side_ = 7;
};

// x (B, C, 4s, 4s) -> Conv 64 k4 s2 p1 -> LeakyReLU 0.2 -> Conv 128 k4 s2 p1 -> BN ->
// LeakyReLU 0.2 -> flatten -> Linear -> 1 logit (B, 1).
class DcganDiscriminator : public Sequential {
 public:
  explicit DcganDiscriminator(const ModelConfig& c) : Sequential("DcganDiscriminator") {
    check_gan_config(c, "dcgan_discriminator");
    Seeds seed{c.seed};
    const int64_t side = c.image_size / 4;
    push_back(std::make_shared<Conv2d>(c.in_channels, 64, 4,
                                       Conv2dConfig{.stride = 2, .padding = 1}, seed()));
    push_back(std::make_shared<LeakyReLU>(0.2));
    push_back(std::make_shared<Conv2d>(
        64, 128, 4, Conv2dConfig{.stride = 2, .padding = 1, .bias = Bias::No}, seed()));
    push_back(std::make_shared<BatchNorm2d>(128));
    push_back(std::make_shared<LeakyReLU>(0.2));
    push_back(std::make_shared<Flatten>());
    push_back(std::make_shared<Linear>(128 * side * side, 1, seed()));
    dcgan_init(*this, c.seed);
  }
};

}  // namespace

namespace models {
std::shared_ptr<Module> dcgan_generator(const ModelConfig& c) {
  return std::make_shared<DcganGenerator>(c);
}
std::shared_ptr<Module> dcgan_discriminator(const ModelConfig& c) {
  return std::make_shared<DcganDiscriminator>(c);
}
}  // namespace models

}  // namespace mantissa::nn
