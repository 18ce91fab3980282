// Reference models, built by name. Parameter names follow the PyTorch originals where there is
// one (torchvision ResNets, timm ViTs, nanoGPT-style GPT-2, torch.nn.LSTM), so checkpoints map
// key for key, and parameter counts equal the published ones:
//   resnet18 11,689,512 · resnet50 25,557,032 (in_channels 3, 1000 classes)
//   vit_base 86,567,656 (224x224, in_channels 3, 1000 classes) · gpt2 124,439,808 (tied)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mantissa/nn/module.h"

namespace mantissa::nn {

struct ModelConfig {
  int64_t num_classes = 10;  // image models
  int64_t in_channels = 1;
  int64_t image_size = 28;    // square images
  int64_t vocab_size = 256;   // token models (gpt2 itself: 50257)
  int64_t max_seq_len = 256;  // token models (gpt2 itself: 1024)
  // Recommenders (dcn): dense features, the rows of each categorical field's embedding table
  // (empty: Criteo's 26 fields hashed into 10,000 rows each) and the embedding width.
  int64_t dense_features = 13;
  std::vector<int64_t> table_sizes = {};
  int64_t embedding_dim = 16;
  double dropout = 0.0;
  uint64_t seed = 0;  // every initial value derives from it
  // PerBlock: every transformer block (gpt2*, vit*) or LSTM layer (lstm, lstm_classifier)
  // recomputes its activations in backward (nn::set_activation_checkpointing). Other models have
  // no blocks and refuse it.
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::Off;
  // resnet* on the CPU: the layout of its activations. Channels-last (the input converted once;
  // every op of the network keeps the layout) lets oneDNN's convolutions read and write them
  // without reordering. Other models, and every model on a GPU, run row-major (the cnn measured
  // no faster channels-last: 92-95 against 88 ms a step, fp32, one thread).
  MemoryFormat memory_format = MemoryFormat::ChannelsLast;
};

// What a model takes as input.
enum class ModelInput {
  Image,   // f32 (B, in_channels, image_size, image_size) -> logits (B, num_classes)
  Tokens,  // i64 (B, T), T <= max_seq_len -> logits (B, T, vocab)
  // forward_list({dense f32 (B, dense_features), categorical i64 (B, fields)}) -> {logits (B)}
  Clicks,
  Latent,  // f32 (B, kDcganLatentDim) noise -> images (B, in_channels, image_size, image_size)
};

// The latent size of dcgan_generator.
inline constexpr int64_t kDcganLatentDim = 64;

// The models, by name:
//   mlp            flatten -> in*size^2 -> 256 -> 128 -> classes, ReLU (and dropout)
//   cnn            features: [conv 5x5 32, BN, ReLU, maxpool 2] x2 (32, 64 channels);
//                  classifier: flatten, linear -> 128, ReLU, dropout, linear -> classes
//   resnet         CIFAR-style ResNet-20 (3x3 stem 16, stages 16/32/64 of 3 BasicBlocks)
//   resnet_small   the same with 1 block per stage (ResNet-8)
//   resnet18/50    torchvision layouts (7x7 stride-2 stem + maxpool, 4 stages)
//   vit            ViT for small images: patch 4 (or 7), dim 64, 4 layers, 4 heads
//   vit_tiny/small/base   patch 16 (image_size divisible by 16, e.g. 224): dims 192/384/768,
//                  12 layers, 3/6/12 heads
//   gpt2           124M: 12 layers, 12 heads, 768 dim, vocab 50257, context 1024, tied
//                  embeddings, GELU tanh (ignores vocab_size / max_seq_len)
//   gpt2_tiny      4 layers, 4 heads, 128 dim, vocab_size, context max_seq_len
//   lstm           language model: embedding 128 -> 2-layer LSTM 256 -> linear to vocab (Tokens)
//   lstm_classifier  image rows as a sequence: (B, C, H, W) or (B, H, W) -> LSTM 128 -> classes
//   dcn            Deep & Cross Network (Wang et al. 2017) for click logs (ModelInput::Clicks):
//                  one embedding of embedding_dim (16) per categorical field, concatenated after
//                  the dense features into x0 (13 + 26*16 = 429 wide by default); 3 cross layers
//                  (CrossLayer) beside a deep MLP x0 -> 256 -> 128 (ReLU); their outputs
//                  concatenated -> Linear -> 1 logit. Parameters: embeddings.<f>.weight,
//                  cross.<l>.{weight,bias}, deep.{0,2}.{weight,bias}, head.{weight,bias}
//                  (4,306,108 with the defaults, 4,160,000 of them in the tables).
//   dcgan_generator  z (B, 64) -> linear to 128 x s x s (s = image_size / 4), BN, ReLU ->
//                  conv-transpose 4x4/2 to 64, BN, ReLU -> conv-transpose 4x4/2 to in_channels,
//                  tanh (Latent input; image_size a multiple of 4, e.g. 28)
//   dcgan_discriminator  images -> conv 4x4/2 64, LeakyReLU 0.2 -> conv 4x4/2 128, BN,
//                  LeakyReLU 0.2 -> flatten, linear -> 1 logit (B, 1); num_classes ignored
//                  (both DC-GAN models: DCGAN-paper init N(0, 0.02); trained by train::train_gan)
// An unknown name throws listing these. The token models (gpt2, gpt2_tiny, lstm) are
// nn::CausalLM's (causal_lm.h): they generate with a cache (generate.h).
std::shared_ptr<Module> make_model(const std::string& name, const ModelConfig& config = {});
std::vector<std::string> model_names();
ModelInput model_input(const std::string& name);
// A random input batch the model accepts: images U(-1, 1), latent vectors N(0, 1), or tokens of
// length min(max_seq_len, seq_len) drawn from the vocabulary. (A Clicks model takes two tensors:
// example_inputs.)
Tensor example_input(const std::string& name, const ModelConfig& config, int64_t batch,
                     int64_t seq_len = 64, uint64_t seed = 0);
// Every input of a batch: {example_input(...)} for image and token models; for Clicks models
// {dense U(0, 3) (B, dense_features), categorical (B, fields) uniform over each table}.
TensorList example_inputs(const std::string& name, const ModelConfig& config, int64_t batch,
                          int64_t seq_len = 64, uint64_t seed = 0);

// The building blocks, for models that mix them (registered by make_model).
namespace models {
std::shared_ptr<Module> mlp(const ModelConfig& c);
std::shared_ptr<Module> cnn(const ModelConfig& c);
std::shared_ptr<Module> resnet_cifar(const ModelConfig& c, int64_t blocks_per_stage);
std::shared_ptr<Module> resnet18(const ModelConfig& c);
std::shared_ptr<Module> resnet50(const ModelConfig& c);
std::shared_ptr<Module> vit(const ModelConfig& c, int64_t patch, int64_t dim, int64_t depth,
                            int64_t heads);
std::shared_ptr<Module> gpt(const ModelConfig& c, int64_t vocab, int64_t context, int64_t layers,
                            int64_t heads, int64_t dim);
std::shared_ptr<Module> lstm_lm(const ModelConfig& c, int64_t embed, int64_t hidden,
                                int64_t layers);
std::shared_ptr<Module> lstm_classifier(const ModelConfig& c, int64_t hidden);
// DCN v1: `cross_layers` CrossLayers beside an MLP of `deep` widths (ReLU), over ModelConfig's
// dense_features, table_sizes and embedding_dim.
std::shared_ptr<Module> dcn(const ModelConfig& c, int64_t cross_layers = 3,
                            const std::vector<int64_t>& deep = {256, 128});
std::shared_ptr<Module> dcgan_generator(const ModelConfig& c);
std::shared_ptr<Module> dcgan_discriminator(const ModelConfig& c);
}  // namespace models

}  // namespace mantissa::nn
