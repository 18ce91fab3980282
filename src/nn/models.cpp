// The model registry: names -> builders, and what each model takes as input.
#include "mantissa/nn/models.h"

#include <algorithm>
#include <functional>
#include <random>
#include <utility>

#include "mantissa/nn/layers.h"

namespace mantissa::nn {

namespace {

struct Entry {
  const char* name;
  ModelInput input;
  std::function<std::shared_ptr<Module>(const ModelConfig&)> build;
};

// The patch of the small-image ViT: 4 (more tokens, better accuracy) when it divides the image.
int64_t small_vit_patch(int64_t image_size) {
  if (image_size % 4 == 0) return 4;
  MT_CHECK(image_size % 7 == 0, "vit: image_size ", image_size,
           " is a multiple of neither 4 nor 7 (the patch sizes of the small ViT)");
  return 7;
}

const std::vector<Entry>& registry() {
  static const std::vector<Entry> entries = {
      {"mlp", ModelInput::Image, models::mlp},
      {"cnn", ModelInput::Image, models::cnn},
      {"resnet", ModelInput::Image,
       [](const ModelConfig& c) { return models::resnet_cifar(c, 3); }},
      {"resnet_small", ModelInput::Image,
       [](const ModelConfig& c) { return models::resnet_cifar(c, 1); }},
      {"resnet18", ModelInput::Image, models::resnet18},
      {"resnet50", ModelInput::Image, models::resnet50},
      {"vit", ModelInput::Image,
       [](const ModelConfig& c) {
         return models::vit(c, small_vit_patch(c.image_size), 64, 4, 4);
       }},
      {"vit_tiny", ModelInput::Image,
       [](const ModelConfig& c) { return models::vit(c, 16, 192, 12, 3); }},
      {"vit_small", ModelInput::Image,
       [](const ModelConfig& c) { return models::vit(c, 16, 384, 12, 6); }},
      {"vit_base", ModelInput::Image,
       [](const ModelConfig& c) { return models::vit(c, 16, 768, 12, 12); }},
      {"gpt2", ModelInput::Tokens,
       [](const ModelConfig& c) { return models::gpt(c, 50257, 1024, 12, 12, 768); }},
      {"gpt2_tiny", ModelInput::Tokens,
       [](const ModelConfig& c) { return models::gpt(c, c.vocab_size, c.max_seq_len, 4, 4, 128); }},
      {"lstm", ModelInput::Tokens,
       [](const ModelConfig& c) { return models::lstm_lm(c, 128, 256, 2); }},
      {"lstm_classifier", ModelInput::Image,
       [](const ModelConfig& c) { return models::lstm_classifier(c, 128); }},
      {"dcn", ModelInput::Clicks, [](const ModelConfig& c) { return models::dcn(c); }},
      {"dcgan_generator", ModelInput::Latent, models::dcgan_generator},
      {"dcgan_discriminator", ModelInput::Image, models::dcgan_discriminator},
  };
  return entries;
}

const Entry& find(const std::string& name) {
  std::string names;
  for (const Entry& e : registry()) {
    if (e.name == name) return e;
    names += (names.empty() ? "" : ", ") + std::string(e.name);
  }
  MT_CHECK(false, "unknown model \"", name, "\"; the models are: ", names);
  return registry().front();
}

}  // namespace

std::shared_ptr<Module> make_model(const std::string& name, const ModelConfig& config) {
  std::shared_ptr<Module> model = find(name).build(config);
  if (config.activation_checkpointing != ActivationCheckpointing::Off) {
    MT_CHECK(set_activation_checkpointing(*model, config.activation_checkpointing) > 0, "model \"",
             name, "\" has no transformer blocks or LSTM layers to checkpoint; activation ",
             "checkpointing is for gpt2, gpt2_tiny, vit*, lstm and lstm_classifier");
  }
  return model;
}

std::vector<std::string> model_names() {
  std::vector<std::string> out;
  for (const Entry& e : registry())
    out.emplace_back(e.name);
  return out;
}

ModelInput model_input(const std::string& name) {
  return find(name).input;
}

Tensor example_input(const std::string& name, const ModelConfig& config, int64_t batch,
                     int64_t seq_len, uint64_t seed) {
  MT_CHECK(batch > 0 && seq_len > 0, "example_input: batch and seq_len must be positive");
  MT_CHECK(model_input(name) != ModelInput::Clicks, "model \"", name,
           "\" takes {dense, categorical}: use example_inputs");
  if (model_input(name) == ModelInput::Image) {
    return Tensor::uniform({batch, config.in_channels, config.image_size, config.image_size}, -1.0,
                           1.0, seed);
  }
  if (model_input(name) == ModelInput::Latent)
    return Tensor::normal({batch, kDcganLatentDim}, 0.0, 1.0, seed);
  const bool gpt2 = name == "gpt2";
  const int64_t vocab = gpt2 ? 50257 : config.vocab_size;
  const int64_t t = std::min(seq_len, gpt2 ? int64_t(1024) : config.max_seq_len);
  std::mt19937_64 rng(seed);  // the same tokens on every platform (unlike distributions)
  std::vector<int64_t> tokens(size_t(batch * t));
  for (int64_t& v : tokens)
    v = int64_t(rng() % uint64_t(vocab));
  return Tensor::from_vector(tokens, {batch, t});
}

TensorList example_inputs(const std::string& name, const ModelConfig& config, int64_t batch,
                          int64_t seq_len, uint64_t seed) {
  if (model_input(name) != ModelInput::Clicks)
    return {example_input(name, config, batch, seq_len, seed)};
  MT_CHECK(batch > 0, "example_inputs: batch must be positive");
  std::vector<int64_t> tables = config.table_sizes;
  if (tables.empty()) tables.assign(26, 10000);
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(size_t(batch) * tables.size());
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int64_t(rng() % uint64_t(tables[i % tables.size()]));
  return {Tensor::uniform({batch, config.dense_features}, 0.0, 3.0, seed),
          Tensor::from_vector(ids, {batch, int64_t(tables.size())})};
}

}  // namespace mantissa::nn
