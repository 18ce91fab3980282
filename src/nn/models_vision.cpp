// Image models: MLP, the classic Fashion-MNIST CNN, ResNets (CIFAR-style and torchvision's) and
// Vision Transformers (timm's layout and names).
#include <cmath>
#include <optional>

#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"

namespace mantissa::nn {

namespace {

// The seed of a model's k-th layer.
struct Seeds {
  uint64_t base;
  uint64_t next = 0;
  uint64_t operator()() { return init::derive_seed(base, next++); }
};

void check_image_config(const ModelConfig& c, const char* model) {
  MT_CHECK(c.in_channels > 0 && c.image_size > 0 && c.num_classes > 0, model,
           ": in_channels, image_size and num_classes must be positive, got ", c.in_channels, ", ",
           c.image_size, ", ", c.num_classes);
  MT_CHECK(c.dropout >= 0 && c.dropout < 1, model, ": dropout must be in [0, 1), got ", c.dropout);
}

void check_image_input(const Tensor& x, const ModelConfig& c, const std::string& model) {
  MT_CHECK(x.dim() == 4 && x.size(1) == c.in_channels, model, ": expected images (B, ",
           c.in_channels, ", H, W), got a ", x.describe());
}

// ---- MLP, CNN ----------------------------------------------------------------------------------

class MLP : public Sequential {
 public:
  explicit MLP(const ModelConfig& c) : Sequential("MLP") {
    check_image_config(c, "mlp");
    Seeds seed{c.seed};
    push_back(std::make_shared<Flatten>());
    push_back(std::make_shared<Linear>(c.in_channels * c.image_size * c.image_size, 256, seed()));
    push_back(std::make_shared<ReLU>());
    push_back(std::make_shared<Dropout>(c.dropout));
    push_back(std::make_shared<Linear>(256, 128, seed()));
    push_back(std::make_shared<ReLU>());
    push_back(std::make_shared<Dropout>(c.dropout));
    push_back(std::make_shared<Linear>(128, c.num_classes, seed()));
  }
};

class CNN : public Module {
 public:
  explicit CNN(const ModelConfig& c) : Module("CNN"), config_(c) {
    check_image_config(c, "cnn");
    MT_CHECK(c.image_size >= 4, "cnn: image_size must be at least 4, got ", c.image_size);
    Seeds seed{c.seed};
    features = register_module("features", std::make_shared<Sequential>());
    int64_t channels = c.in_channels;
    for (int64_t width : {32, 64}) {
      features->push_back(
          std::make_shared<Conv2d>(channels, width, 5, Conv2dConfig{.padding = 2}, seed()));
      features->push_back(std::make_shared<BatchNorm2d>(width));
      features->push_back(std::make_shared<ReLU>());
      features->push_back(std::make_shared<MaxPool2d>(2));
      channels = width;
    }
    const int64_t side = c.image_size / 2 / 2;
    classifier = register_module("classifier", std::make_shared<Sequential>());
    classifier->push_back(std::make_shared<Flatten>());
    classifier->push_back(std::make_shared<Linear>(channels * side * side, 128, seed()));
    classifier->push_back(std::make_shared<ReLU>());
    classifier->push_back(std::make_shared<Dropout>(c.dropout));
    classifier->push_back(std::make_shared<Linear>(128, c.num_classes, seed()));
  }
  Tensor forward(const Tensor& x) override {
    check_image_input(x, config_, "cnn");
    return (*classifier)((*features)(x));
  }

  std::shared_ptr<Sequential> features, classifier;

 private:
  ModelConfig config_;
};

// ---- ResNets -----------------------------------------------------------------------------------

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  return std::make_shared<Conv2d>(in, out, k,
                                  Conv2dConfig{.stride = stride, .padding = pad, .bias = Bias::No});
}

// 1x1 conv + BN on the shortcut when the shape changes (torchvision's downsample).
std::shared_ptr<Sequential> downsample(int64_t in, int64_t out, int64_t stride) {
  return std::make_shared<Sequential>(std::initializer_list<ModulePtr>{
      conv(in, out, 1, stride, 0), std::make_shared<BatchNorm2d>(out)});
}

class BasicBlock : public Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t in, int64_t planes, int64_t stride) : Module("BasicBlock") {
    conv1 = register_module("conv1", conv(in, planes, 3, stride, 1));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
    conv2 = register_module("conv2", conv(planes, planes, 3, 1, 1));
    bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
    if (stride != 1 || in != planes) {
      shortcut = register_module("downsample", downsample(in, planes, stride));
    }
  }
  Tensor forward(const Tensor& x) override {
    const Tensor out = (*bn2)((*conv2)(relu((*bn1)((*conv1)(x)))));
    return relu(add(out, shortcut ? (*shortcut)(x) : x));
  }

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<Sequential> shortcut;
};

// torchvision's ResNet v1.5: the stride sits on the 3x3 conv.
class Bottleneck : public Module {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t in, int64_t planes, int64_t stride) : Module("Bottleneck") {
    const int64_t out = planes * kExpansion;
    conv1 = register_module("conv1", conv(in, planes, 1, 1, 0));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
    conv2 = register_module("conv2", conv(planes, planes, 3, stride, 1));
    bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
    conv3 = register_module("conv3", conv(planes, out, 1, 1, 0));
    bn3 = register_module("bn3", std::make_shared<BatchNorm2d>(out));
    if (stride != 1 || in != out) {
      shortcut = register_module("downsample", downsample(in, out, stride));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor out = relu((*bn1)((*conv1)(x)));
    out = relu((*bn2)((*conv2)(out)));
    out = (*bn3)((*conv3)(out));
    return relu(add(out, shortcut ? (*shortcut)(x) : x));
  }

  std::shared_ptr<Conv2d> conv1, conv2, conv3;
  std::shared_ptr<BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<Sequential> shortcut;
};

enum class Stem { Cifar, ImageNet };

// conv1, bn1, (maxpool), layer1..N, avgpool, fc — torchvision's names.
class ResNet : public Module {
 public:
  template <typename Block>
  static std::shared_ptr<ResNet> make(const ModelConfig& c, Stem stem,
                                      const std::vector<int64_t>& blocks,
                                      const std::vector<int64_t>& widths) {
    auto net = std::shared_ptr<ResNet>(new ResNet(c));
    const int64_t stem_width = widths[0];
    std::optional<init::NoInit> skip(std::in_place);  // initialise() draws every value once
    if (stem == Stem::ImageNet) {
      net->conv1 = net->register_module("conv1", conv(c.in_channels, stem_width, 7, 2, 3));
    } else {
      net->conv1 = net->register_module("conv1", conv(c.in_channels, stem_width, 3, 1, 1));
    }
    net->bn1 = net->register_module("bn1", std::make_shared<BatchNorm2d>(stem_width));
    if (stem == Stem::ImageNet) {
      net->maxpool = net->register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1));
    }
    int64_t in = stem_width;
    for (size_t s = 0; s < blocks.size(); ++s) {
      auto layer = std::make_shared<Sequential>();
      for (int64_t b = 0; b < blocks[s]; ++b) {
        const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
        layer->push_back(std::make_shared<Block>(in, widths[s], stride));
        in = widths[s] * Block::kExpansion;
      }
      net->layers.push_back(net->register_module("layer" + std::to_string(s + 1), layer));
    }
    net->avgpool = net->register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
    net->fc = net->register_module("fc", std::make_shared<Linear>(in, c.num_classes));
    skip.reset();
    net->initialise(c.seed);
    return net;
  }

  Tensor forward(const Tensor& x) override {
    check_image_input(x, config_, name());
    const bool channels_last =
        config_.memory_format == MemoryFormat::ChannelsLast && x.device().is_cpu() && x.dim() == 4;
    Tensor h = relu((*bn1)((*conv1)(channels_last ? x.contiguous(MemoryFormat::ChannelsLast) : x)));
    if (maxpool) h = (*maxpool)(h);  // keeps the layout
    for (const auto& layer : layers)
      h = (*layer)(h);
    return (*fc)((*avgpool)(h).flatten(1));
  }

  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<MaxPool2d> maxpool;  // ImageNet stem only
  std::vector<std::shared_ptr<Sequential>> layers;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;

 private:
  explicit ResNet(const ModelConfig& c) : Module("ResNet"), config_(c) {
    check_image_config(c, "resnet");
  }

  // torchvision: convs kaiming_normal_(fan_out, relu), BN 1/0, fc Linear's default.
  void initialise(uint64_t seed) {
    Seeds seeds{seed};
    for (auto& [path, m] : named_modules()) {
      if (auto* cv = dynamic_cast<Conv2d*>(m)) {
        init::kaiming_normal_(cv->weight(), seeds(), 0.0, init::FanMode::FanOut,
                              init::Nonlinearity::ReLU);
      } else if (auto* lin = dynamic_cast<Linear*>(m)) {
        const uint64_t s = seeds();
        const double bound = 1.0 / std::sqrt(double(lin->in_features()));
        init::kaiming_uniform_(lin->weight(), init::derive_seed(s, 0), std::sqrt(5.0));
        init::uniform_(lin->bias(), -bound, bound, init::derive_seed(s, 1));
      }
    }
  }

  ModelConfig config_;
};

// ---- Vision Transformer ------------------------------------------------------------------------

class PatchEmbed : public Module {
 public:
  PatchEmbed(int64_t in_channels, int64_t dim, int64_t patch, uint64_t seed)
      : Module("PatchEmbed") {
    proj = register_module("proj", std::make_shared<Conv2d>(in_channels, dim, patch,
                                                            Conv2dConfig{.stride = patch}, seed));
  }
  // (B, C, H, W) -> (B, N, D)
  Tensor forward(const Tensor& x) override { return (*proj)(x).flatten(2).transpose(1, 2); }

  std::shared_ptr<Conv2d> proj;
};

// timm's VisionTransformer: cls_token, pos_embed, patch_embed.proj, blocks.i, norm, head.
class VisionTransformer : public Module {
 public:
  VisionTransformer(const ModelConfig& c, int64_t patch, int64_t dim, int64_t depth, int64_t heads)
      : Module("VisionTransformer"), config_(c), dim_(dim) {
    check_image_config(c, "vit");
    MT_CHECK(patch > 0 && c.image_size % patch == 0, "vit: image_size ", c.image_size,
             " must be a multiple of the patch size ", patch,
             " (the patch-16 ViTs take e.g. image_size = 224)");
    Seeds seed{c.seed};
    const int64_t side = c.image_size / patch, tokens = side * side + 1;
    patch_embed = register_module("patch_embed",
                                  std::make_shared<PatchEmbed>(c.in_channels, dim, patch, seed()));
    cls_token_ = &register_parameter("cls_token", Tensor::empty({1, 1, dim}));
    pos_embed_ = &register_parameter("pos_embed", Tensor::empty({1, tokens, dim}));
    init::normal_(*cls_token_, 0.0, 1e-6, seed());
    init::normal_(*pos_embed_, 0.0, 0.02, seed());
    std::optional<init::NoInit> skip(std::in_place);  // the Linears are drawn below
    pos_drop = register_module("pos_drop", std::make_shared<Dropout>(c.dropout));
    blocks = register_module("blocks", std::make_shared<Sequential>());
    TransformerConfig tc;
    tc.dropout = c.dropout;
    tc.eps = 1e-6;
    for (int64_t i = 0; i < depth; ++i)
      blocks->push_back(std::make_shared<TransformerBlock>(dim, heads, seed(), tc));
    norm = register_module("norm", std::make_shared<LayerNorm>(dim, 1e-6));
    head = register_module("head", std::make_shared<Linear>(dim, c.num_classes));
    skip.reset();
    // timm: Linear weights N(0, 0.02) (truncated there), biases 0.
    for (auto& [path, m] : named_modules()) {
      if (auto* lin = dynamic_cast<Linear*>(m)) {
        init::normal_(lin->weight(), 0.0, 0.02, seed());
        if (lin->bias().defined()) init::zeros_(lin->bias());
      }
    }
  }

  Tensor forward(const Tensor& x) override {
    check_image_input(x, config_, "vit");
    MT_CHECK(x.size(2) == config_.image_size && x.size(3) == config_.image_size, "vit: built for ",
             config_.image_size, "x", config_.image_size,
             " images (its position embedding), got a ", x.describe());
    const int64_t b = x.size(0);
    const Tensor patches = (*patch_embed)(x);  // (B, N, D)
    Tensor cls = cls_token_->expand({b, 1, dim_});
    if (cls.dtype() != patches.dtype()) cls = cast(cls, patches.dtype());
    Tensor h = cat({cls, patches}, 1);
    h = (*pos_drop)(add(h, *pos_embed_));  // (B, N + 1, D)
    h = (*norm)((*blocks)(h));
    return (*head)(h.select(1, 0));  // the class token
  }

  std::shared_ptr<PatchEmbed> patch_embed;
  std::shared_ptr<Dropout> pos_drop;
  std::shared_ptr<Sequential> blocks;
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> head;

 private:
  ModelConfig config_;
  int64_t dim_;
  Tensor* cls_token_;  // (1, 1, D)
  Tensor* pos_embed_;  // (1, N + 1, D)
};

}  // namespace

namespace models {

std::shared_ptr<Module> mlp(const ModelConfig& c) {
  return std::make_shared<MLP>(c);
}

std::shared_ptr<Module> cnn(const ModelConfig& c) {
  return std::make_shared<CNN>(c);
}

std::shared_ptr<Module> resnet_cifar(const ModelConfig& c, int64_t blocks_per_stage) {
  MT_CHECK(blocks_per_stage > 0, "resnet: blocks_per_stage must be positive");
  const int64_t n = blocks_per_stage;
  return ResNet::make<BasicBlock>(c, Stem::Cifar, {n, n, n}, {16, 32, 64});
}

std::shared_ptr<Module> resnet18(const ModelConfig& c) {
  return ResNet::make<BasicBlock>(c, Stem::ImageNet, {2, 2, 2, 2}, {64, 128, 256, 512});
}

std::shared_ptr<Module> resnet50(const ModelConfig& c) {
  return ResNet::make<Bottleneck>(c, Stem::ImageNet, {3, 4, 6, 3}, {64, 128, 256, 512});
}

std::shared_ptr<Module> vit(const ModelConfig& c, int64_t patch, int64_t dim, int64_t depth,
                            int64_t heads) {
  return std::make_shared<VisionTransformer>(c, patch, dim, depth, heads);
}

}  // namespace models

}  // namespace mantissa::nn
