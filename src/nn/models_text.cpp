// Sequence models: GPT-2 (nanoGPT's structure with timm-style block names) and LSTMs (a language
// model after PyTorch's word_language_model example, and a row-by-row image classifier).
#include <cmath>
#include <optional>

#include "mantissa/nn/causal_lm.h"
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

// The last position of each sequence when only it is wanted: (B, T, C) -> (B, 1, C).
Tensor keep_positions(const Tensor& h, Logits which) {
  return which == Logits::Last ? h.narrow(1, h.size(1) - 1, 1) : h;
}

// wte, wpe, drop, blocks.i (pre-LN, causal, GELU tanh), ln_f, lm_head (tied to wte).
class GPT : public CausalLM {
 public:
  GPT(const ModelConfig& c, int64_t vocab, int64_t context, int64_t layers, int64_t heads,
      int64_t dim)
      : CausalLM("GPT"), vocab_(vocab), context_(context), heads_(heads), dim_(dim) {
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

  int64_t vocab_size() const override { return vocab_; }
  int64_t context_length() const override { return context_; }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<Sequential> blocks;
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Linear> lm_head;

 protected:
  std::unique_ptr<DecodeCache> make_cache(int64_t batch, int64_t capacity) const override {
    return std::make_unique<KVCache>(int64_t(blocks->size()), batch, heads_, capacity,
                                     dim_ / heads_);
  }

  // forward's computation over the positions after the cache's; each block attends to its
  // cached keys and values.
  Tensor forward_cached(const Tensor& tokens, DecodeCache& cache, Logits which) override {
    auto* kv = dynamic_cast<KVCache*>(&cache);
    MT_CHECK(kv != nullptr && kv->layers() == int64_t(blocks->size()),
             "gpt: this cache was not made by this model; make one with new_cache(batch)");
    const int64_t past = kv->length(), t = tokens.size(1);
    // GPT-2's positions are learned up to the context length and mean nothing past it; nanoGPT
    // crops the sequence to its last context_length tokens instead (recomputing all of them).
    MT_CHECK(past + t <= context_, "gpt: ", past, " cached positions and ", t,
             " new tokens pass the context length ", context_,
             "; generate fewer tokens, or start a new cache from the last tokens");
    MT_CHECK(past + t <= kv->capacity(), "gpt: ", past, " cached positions and ", t,
             " new tokens pass the cache's capacity ", kv->capacity(),
             "; make it with new_cache(batch, capacity) large enough (at most ", context_, ")");
    const Tensor positions =
        Tensor::arange(past + t, DType::I64, tokens.device()).narrow(0, past, t);
    Tensor h = add((*wte)(tokens), (*wpe)(positions));  // (B, T_new, C)
    h = (*drop)(h);
    for (size_t i = 0; i < blocks->size(); ++i) {
      h = static_cast<TransformerBlock&>(*(*blocks)[i]).forward_cached(h, *kv, int64_t(i));
    }
    kv->advance(t);
    return (*lm_head)((*ln_f)(keep_positions(h, which)));
  }

 private:
  int64_t vocab_, context_, heads_, dim_;
};

// encoder (Embedding), drop, rnn (LSTM), decoder (Linear): tokens (B, T) -> logits (B, T, vocab).
// Generation carries the LSTM's state instead of a context window.
class LSTMLanguageModel : public CausalLM {
 public:
  LSTMLanguageModel(const ModelConfig& c, int64_t embed, int64_t hidden, int64_t layers)
      : CausalLM("LSTMLanguageModel"), vocab_(c.vocab_size), context_(c.max_seq_len) {
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

  int64_t vocab_size() const override { return vocab_; }
  // max_seq_len bounds the training windows only: the state carries any length.
  int64_t context_length() const override { return 0; }

  std::shared_ptr<Embedding> encoder;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<LSTM> rnn;
  std::shared_ptr<Linear> decoder;

 protected:
  std::unique_ptr<DecodeCache> make_cache(int64_t batch, int64_t /*capacity*/) const override {
    return std::make_unique<RecurrentCache>(batch);
  }

  Tensor forward_cached(const Tensor& tokens, DecodeCache& cache, Logits which) override {
    auto* state = dynamic_cast<RecurrentCache*>(&cache);
    MT_CHECK(state != nullptr,
             "lstm: this cache was not made by this model; make one with new_cache(batch)");
    const Tensor x = (*drop)((*encoder)(tokens));
    const TensorList out =
        state->h.defined() ? (*rnn)({x, state->h, state->c}) : (*rnn)(TensorList{x});
    state->h = out[1];
    state->c = out[2];
    state->advance(tokens.size(1));
    return (*decoder)((*drop)(keep_positions(out[0], which)));
  }

 private:
  int64_t vocab_, context_;
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
