// Causal language models as a generator sees them: a model that turns tokens into next-token
// logits and carries what it has seen in a cache, so that each new token costs one step instead
// of a forward over the whole sequence (Hugging Face's past_key_values, llm.c's KV cache).
//
//   nn::CausalLM& lm = nn::as_causal_lm(*model);          // gpt2, gpt2_tiny, lstm
//   std::unique_ptr<nn::DecodeCache> cache = lm.new_cache(1);
//   Tensor logits = lm.logits_with_cache(prompt, *cache);  // (1, P, vocab), as forward(prompt)
//   logits = lm.logits_with_cache(next_token, *cache);     // (1, 1, vocab): row P of forward
//
// GPT's cache holds every layer's keys and values (KVCache); the LSTM's holds its hidden and cell
// states (RecurrentCache). generate.h samples continuations with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mantissa/nn/module.h"

namespace mantissa::nn {

// What a causal model carries from one decoding call to the next. length() counts the positions
// it has seen.
class DecodeCache {
 public:
  virtual ~DecodeCache() = default;
  int64_t batch() const { return batch_; }
  int64_t length() const { return length_; }
  // Starts a new sequence (keeping the memory).
  virtual void reset() { length_ = 0; }
  // Called by the model once all its layers have taken `positions` new positions.
  void advance(int64_t positions);

 protected:
  explicit DecodeCache(int64_t batch);

 private:
  int64_t batch_;
  int64_t length_ = 0;
};

// Per layer, the keys and values (B, heads, capacity, head_dim) of the positions seen so far,
// preallocated to the capacity (a GPT's context length) so that a step writes only its new
// positions: no reallocation, no concatenation. The buffers are allocated at the first write, in
// the dtype and on the device of the keys written (bf16 under autocast or for a bf16 model).
class KVCache final : public DecodeCache {
 public:
  KVCache(int64_t layers, int64_t batch, int64_t heads, int64_t capacity, int64_t head_dim);

  // Writes k and v (B, heads, T_new, head_dim) of `layer` at positions [length, length + T_new)
  // and returns views of positions [0, length + T_new) of both.
  std::pair<Tensor, Tensor> append(int64_t layer, const Tensor& k, const Tensor& v);
  // A layer's whole buffers (undefined before its first append).
  const Tensor& keys(int64_t layer) const;
  const Tensor& values(int64_t layer) const;

  int64_t layers() const { return int64_t(k_.size()); }
  int64_t heads() const { return heads_; }
  int64_t capacity() const { return capacity_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t nbytes() const;  // of the buffers allocated so far

 private:
  int64_t heads_, capacity_, head_dim_;
  std::vector<Tensor> k_, v_;
};

// A stacked LSTM's state after the last position: h and c (layers, B, hidden), undefined before
// the first call (the LSTM then starts from zeros, as in training).
class RecurrentCache final : public DecodeCache {
 public:
  explicit RecurrentCache(int64_t batch) : DecodeCache(batch) {}
  void reset() override;

  Tensor h, c;
};

// Which positions' logits logits_with_cache computes: All (B, T, vocab), as forward; Last
// (B, 1, vocab), what sampling needs (the vocabulary projection of a long prompt is skipped).
enum class Logits { All, Last };

// A Module that is a causal language model: tokens (B, T) -> logits (B, T, vocab) through
// forward, and the same incrementally through a cache. gpt2, gpt2_tiny and lstm implement it; a
// model of one's own does by overriding the four protected functions.
class CausalLM : public Module {
 public:
  using Module::Module;

  virtual int64_t vocab_size() const = 0;
  // The most positions one sequence may have (a GPT's learned positions); 0: no limit (an RNN
  // carries its state).
  virtual int64_t context_length() const = 0;

  // An empty cache for `batch` sequences holding up to `capacity` positions (0: the context
  // length; for models without one, ignored).
  std::unique_ptr<DecodeCache> new_cache(int64_t batch, int64_t capacity = 0) const;
  // tokens (B, T_new) integer, the positions after cache.length(); advances the cache by T_new.
  // The logits equal those rows of forward() over the whole sequence (to rounding: the GEMMs
  // have other shapes). Inference: it records no graph (NoGrad inside), and dropout follows the
  // module's mode as in forward (generate() switches to eval).
  Tensor logits_with_cache(const Tensor& tokens, DecodeCache& cache, Logits which = Logits::All);

 protected:
  virtual std::unique_ptr<DecodeCache> make_cache(int64_t batch, int64_t capacity) const = 0;
  // Called after the common checks (tokens (B, T_new) integer, B == cache.batch()), under
  // NoGrad; must advance the cache.
  virtual Tensor forward_cached(const Tensor& tokens, DecodeCache& cache, Logits which) = 0;
};

// The model as a CausalLM, or an error naming its type (generation needs gpt2, gpt2_tiny, lstm
// or a model of one's own that implements CausalLM).
CausalLM& as_causal_lm(Module& model);

}  // namespace mantissa::nn
