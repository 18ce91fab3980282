// Sequence models: GPT-2 (nanoGPT's structure with timm-style block names) and LSTMs (a language
// model after PyTorch's word_language_model example, and a row-by-row image classifier).
#include <cmath>
#include <optional>

#include "mantissa/nn/layers.h"
#include "mantissa/nn/models.h"

namespace mantissa::nn {

namespace {

void check_tokens(const Tensor& tokens, int64_t context, const std::string& model) {
  MT_CHECK(tokens.dim() == 2 && !tokens.is_floating_point(), model,
           ": expected integer tokens (B, T), got a ", tokens.describe());
  MT_CHECK(tokens.size(1) >= 1 && tokens.size(1) <= context, model, ": the sequence length ",
           tokens.size(1), " must be between 1 and the context length ", context);
}

// wte, wpe, drop, blocks.i (pre-LN, causal, GELU tanh), ln_f, lm_head (tied to wte).
class GPT : public Module {
 public:
  GPT(const ModelConfig& c, int64_t vocab, int64_t context, int64_t layers, int64_t heads,
      int64_t dim)
      : Module("GPT"), context_(context) {
    MT_CHECK(vocab > 0 && context > 0 && layers > 0 && heads > 0 && dim > 0,
             "gpt: sizes must be positive, got vocab=", vocab, ", context=", context,
             ", layers=", layers, ", heads=", heads, ", dim=", dim);
    MT_CHECK(c.dropout >= 0 && c.dropout < 1, "gpt: dropout must be in [0, 1), got ", c.dropout);
    uint64_t k = 0;
    auto seed = [&] { return init::derive_seed(c.seed, k++); };
    std::optional<init::NoInit> skip(std::in_place);  // GPT-2's own init draws each value once
    wte = register_module("wte", std::make_shared<Embedding>(vocab, dim, seed()));
    wpe = register_module("wpe", std::make_shared<Embedding>(context, dim, seed()));
    drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
    blocks = register_module("blocks", std::make_shared<Sequential>());
    TransformerConfig tc;
    tc.dropout = c.dropout;
    tc.causal = true;
    tc.gelu = GeluApproximation::Tanh;
    for (int64_t i = 0; i < layers; ++i)
      blocks->push_back(std::make_shared<TransformerBlock>(dim, heads, seed(), tc));
    ln_f = register_module("ln_f", std::make_shared<LayerNorm>(dim));
    lm_head = register_module("lm_head", std::make_shared<Linear>(wte->weight()));
    skip.reset();

    // GPT-2: N(0, 0.02) everywhere, biases 0, residual projections scaled by 1/sqrt(2 layers).
    const double residual_std = 0.02 / std::sqrt(2.0 * double(layers));
    init::normal_(wte->weight(), 0.0, 0.02, seed());
    init::normal_(wpe->weight(), 0.0, 0.02, seed());
    for (size_t i = 0; i < blocks->size(); ++i) {
      auto& block = static_cast<TransformerBlock&>(*(*blocks)[i]);
      for (Linear* lin : {block.attn->qkv.get(), block.attn->proj.get(), block.mlp->fc1.get(),
                          block.mlp->fc2.get()}) {
        const bool residual = lin == block.attn->proj.get() || lin == block.mlp->fc2.get();
        init::normal_(lin->weight(), 0.0, residual ? residual_std : 0.02, seed());
        init::zeros_(lin->bias());
      }
    }
  }

  // tokens (B, T) -> logits (B, T, vocab)
  Tensor forward(const Tensor& tokens) override {
    check_tokens(tokens, context_, "gpt");
    const int64_t t = tokens.size(1);
    const Tensor positions = Tensor::arange(t, DType::I64, tokens.device());
    Tensor h = add((*wte)(tokens), (*wpe)(positions));  // (B, T, C)
    h = (*blocks)((*drop)(h));
    return (*lm_head)((*ln_f)(h));
  }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> blocks;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;

 private:
  int64_t context_;
};

// encoder (Embedding), drop, rnn (LSTM), decoder (Linear): tokens (B, T) -> logits (B, T, vocab).
class LSTMLanguageModel : public Module {
 public:
  LSTMLanguageModel(const ModelConfig& c, int64_t embed, int64_t hidden, int64_t layers)
      : Module("LSTMLanguageModel"), context_(c.max_seq_len) {
    MT_CHECK(c.vocab_size > 0 && c.max_seq_len > 0, "lstm: vocab_size and max_seq_len must be ",
             "positive, got ", c.vocab_size, " and ", c.max_seq_len);
    std::optional<init::NoInit> skip(std::in_place);  // drawn by init_weights below
    encoder = register_module(
        "encoder", std::make_shared<Embedding>(c.vocab_size, embed, init::derive_seed(c.seed, 0)));
    skip.reset();
    drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
    rnn = register_module("rnn", std::make_shared<LSTM>(embed, hidden, layers,
                                                        init::derive_seed(c.seed, 1), c.dropout));
    skip.emplace();
    decoder = register_module(
        "decoder", std::make_shared<Linear>(hidden, c.vocab_size, init::derive_seed(c.seed, 2)));
    skip.reset();
    // The example's init_weights: U(-0.1, 0.1) for the embedding and decoder, decoder bias 0.
    init::uniform_(encoder->weight(), -0.1, 0.1, init::derive_seed(c.seed, 3));
    init::uniform_(decoder->weight(), -0.1, 0.1, init::derive_seed(c.seed, 4));
    init::zeros_(decoder->bias());
  }

  Tensor forward(const Tensor& tokens) override {
    check_tokens(tokens, context_, "lstm");
    const Tensor h = (*rnn)((*drop)((*encoder)(tokens)));
    return (*decoder)((*drop)(h));
  }

  std::shared_ptr<Embedding> encoder;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<LSTM> rnn;
  std::shared_ptr<Linear> decoder;

 private:
  int64_t context_;
};

// Each image row is a time step: (B, C, H, W) -> (B, H, C*W) -> LSTM -> last step -> fc.
class LSTMClassifier : public Module {
 public:
  LSTMClassifier(const ModelConfig& c, int64_t hidden) : Module("LSTMClassifier"), config_(c) {
    MT_CHECK(c.in_channels > 0 && c.image_size > 0 && c.num_classes > 0,
             "lstm_classifier: in_channels, image_size and num_classes must be positive");
    rnn = register_module("rnn", std::make_shared<LSTM>(c.in_channels * c.image_size, hidden, 1,
                                                        init::derive_seed(c.seed, 0)));
    fc = register_module(
        "fc", std::make_shared<Linear>(hidden, c.num_classes, init::derive_seed(c.seed, 1)));
  }

  Tensor forward(const Tensor& x) override {
    Tensor rows;
    if (x.dim() == 3 && config_.in_channels == 1) {
      rows = x;  // (B, H, W)
    } else {
      MT_CHECK(x.dim() == 4 && x.size(1) == config_.in_channels,
               "lstm_classifier: expected images (B, ", config_.in_channels, ", H, W)",
               config_.in_channels == 1 ? " or (B, H, W)" : "", ", got a ", x.describe());
      rows = x.permute({0, 2, 1, 3}).reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
    }
    const Tensor out = (*rnn)(rows);  // (B, H, hidden)
    return (*fc)(out.select(1, out.size(1) - 1));
  }

  std::shared_ptr<LSTM> rnn;
  std::shared_ptr<Linear> fc;

 private:
  ModelConfig config_;
};

}  // namespace

namespace models {

std::shared_ptr<Module> gpt(const ModelConfig& c, int64_t vocab, int64_t context, int64_t layers,
                            int64_t heads, int64_t dim) {
  return std::make_shared<GPT>(c, vocab, context, layers, heads, dim);
}

std::shared_ptr<Module> lstm_lm(const ModelConfig& c, int64_t embed, int64_t hidden,
                                int64_t layers) {
  return std::make_shared<LSTMLanguageModel>(c, embed, hidden, layers);
}

std::shared_ptr<Module> lstm_classifier(const ModelConfig& c, int64_t hidden) {
  return std::make_shared<LSTMClassifier>(c, hidden);
}

}  // namespace models

}  // namespace mantissa::nn
