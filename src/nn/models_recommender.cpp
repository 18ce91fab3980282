// Recommenders: DCN's cross layer and the Deep & Cross Network (Wang et al. 2017, "Deep & Cross
// Network for Ad Click Predictions", v1 cross layers).
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::nn {

CrossLayer::CrossLayer(int64_t dim, std::optional<uint64_t> seed_arg)
    : Module("CrossLayer"), dim_(dim) {
  MT_CHECK(dim > 0, "CrossLayer: dim must be positive, got ", dim);
  const uint64_t seed = init::seed_or_draw(seed_arg);
  weight_ = &register_parameter("weight", Tensor::empty({dim}, DType::F32));
  bias_ = &register_parameter("bias", Tensor::zeros({dim}, DType::F32));
  const double bound = 1.0 / std::sqrt(double(dim));
  init::uniform_(*weight_, -bound, bound, init::derive_seed(seed, 0));
}

TensorList CrossLayer::forward_list(const TensorList& inputs) {
  MT_CHECK(inputs.size() == 2, "CrossLayer takes {x0, xl}, got ", inputs.size(), " tensor(s)");
  const Tensor& x0 = inputs[0];
  const Tensor& xl = inputs[1];
  MT_CHECK(x0.dim() == 2 && x0.size(1) == dim_ && xl.shape() == x0.shape(), "CrossLayer(", dim_,
           "): x0 and xl must both be (B, ", dim_, "), got ", x0.describe(), " and ",
           xl.describe());
  // xl . w as a GEMM (autocast runs it in the low precision), then the fp32 elementwise part.
  const Tensor s = matmul(xl, weight_->reshape({dim_, 1}));  // (B, 1)
  return {add(add(mul(x0, s), *bias_), xl)};
}

std::string CrossLayer::extra_repr() const {
  return "dim=" + std::to_string(dim_);
}

namespace {

class Dcn : public Module {
 public:
  Dcn(const ModelConfig& c, int64_t cross_layers, const std::vector<int64_t>& deep)
      : Module("DCN"), dense_(c.dense_features) {
    std::vector<int64_t> tables = c.table_sizes;
    if (tables.empty()) tables.assign(26, 10000);
    MT_CHECK(c.dense_features >= 0 && c.embedding_dim > 0 && cross_layers >= 0,
             "dcn: needs dense_features >= 0, embedding_dim > 0 and cross_layers >= 0, got ",
             c.dense_features, ", ", c.embedding_dim, ", ", cross_layers);
    fields_ = int64_t(tables.size());
    uint64_t next = 0;
    auto seed = [&] { return init::derive_seed(c.seed, next++); };
    embeddings_ = register_module("embeddings", std::make_shared<Sequential>());
    for (const int64_t rows : tables) {
      auto e = embeddings_->push_back(std::make_shared<Embedding>(rows, c.embedding_dim, seed()));
      // N(0, 0.05^2): the tables start small beside the log-transformed dense features, as
      // Keras's uniform(+-0.05) of the DCN paper's code.
      NoGrad ng;
      Tensor(e->weight()).copy_(mul(e->weight(), 0.05));
    }
    width_ = dense_ + fields_ * c.embedding_dim;
    MT_CHECK(width_ > 0, "dcn: no input features (dense_features 0 and no tables)");
    cross_ = register_module("cross", std::make_shared<Sequential>());
    for (int64_t l = 0; l < cross_layers; ++l)
      cross_->push_back(std::make_shared<CrossLayer>(width_, seed()));
    deep_ = register_module("deep", std::make_shared<Sequential>());
    int64_t in = width_;
    for (const int64_t w : deep) {
      deep_->push_back(std::make_shared<Linear>(in, w, seed()));
      deep_->push_back(std::make_shared<ReLU>());
      in = w;
    }
    head_ = register_module("head", std::make_shared<Linear>(width_ + in, 1, seed()));
  }

  TensorList forward_list(const TensorList& inputs) override {
    MT_CHECK(inputs.size() == 2, "dcn takes {dense (B, ", dense_, "), categorical (B, ", fields_,
             ")}, got ", inputs.size(), " tensor(s)");
    const Tensor& dense = inputs[0];
    const Tensor& cat = inputs[1];
    MT_CHECK(dense.dim() == 2 && dense.size(1) == dense_ && dense.is_floating_point(),
             "dcn: dense features must be floating (B, ", dense_, "), got ", dense.describe());
    MT_CHECK(cat.dim() == 2 && cat.size(1) == fields_ && !cat.is_floating_point() &&
                 cat.size(0) == dense.size(0),
             "dcn: categorical ids must be integer (", dense.size(0), ", ", fields_, "), got ",
             cat.describe());
    std::vector<Tensor> parts{dense};
    for (int64_t f = 0; f < fields_; ++f)
      parts.push_back((*(*embeddings_)[size_t(f)])(cat.select(1, f)));  // (B, e)
    const Tensor x0 = cat_(parts);                                      // (B, width)
    Tensor xl = x0;
    for (size_t l = 0; l < cross_->size(); ++l)
      xl = (*(*cross_)[l])({x0, xl})[0];
    const Tensor d = (*deep_)(x0);                              // (B, last deep width)
    const Tensor logits = (*head_)(mantissa::cat({xl, d}, 1));  // (B, 1)
    return {logits.reshape({logits.size(0)})};
  }

  std::string extra_repr() const override {
    return "dense=" + std::to_string(dense_) + ", fields=" + std::to_string(fields_) +
           ", x0=" + std::to_string(width_);
  }

 private:
  static Tensor cat_(const std::vector<Tensor>& parts) { return mantissa::cat(parts, 1); }

  int64_t dense_ = 0, fields_ = 0, width_ = 0;
  std::shared_ptr<Sequential> embeddings_, cross_, deep_;
  std::shared_ptr<Linear> head_;
};

}  // namespace

namespace models {

std::shared_ptr<Module> dcn(const ModelConfig& c, int64_t cross_layers,
                            const std::vector<int64_t>& deep) {
  return std::make_shared<Dcn>(c, cross_layers, deep);
}

}  // namespace models

}  // namespace mantissa::nn
