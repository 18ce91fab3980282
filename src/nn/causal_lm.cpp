// Decoding caches and the CausalLM entry points (the checks every model shares).
#include "mantissa/nn/causal_lm.h"

#include <algorithm>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"

namespace mantissa::nn {

DecodeCache::DecodeCache(int64_t batch) : batch_(batch) {
  MT_CHECK(batch > 0, "a decoding cache needs a positive batch size, got ", batch);
}

void DecodeCache::advance(int64_t positions) {
  MT_ASSERT(positions >= 0, "advance(", positions, ")");
  length_ += positions;
}

KVCache::KVCache(int64_t layers, int64_t batch, int64_t heads, int64_t capacity, int64_t head_dim)
    : DecodeCache(batch),
      heads_(heads),
      capacity_(capacity),
      head_dim_(head_dim),
      k_(size_t(std::max<int64_t>(layers, 0))),
      v_(size_t(std::max<int64_t>(layers, 0))) {
  MT_CHECK(layers > 0 && heads > 0 && capacity > 0 && head_dim > 0,
           "KVCache: layers, heads, capacity and head_dim must be positive, got ", layers, ", ",
           heads, ", ", capacity, " and ", head_dim);
}

std::pair<Tensor, Tensor> KVCache::append(int64_t layer, const Tensor& k, const Tensor& v) {
  MT_CHECK(layer >= 0 && layer < layers(), "KVCache: layer ", layer, " of a cache of ", layers(),
           " layers");
  const Shape expected{batch(), heads_, k.dim() == 4 ? k.size(2) : 0, head_dim_};
  for (const Tensor* t : {&k, &v}) {
    MT_CHECK(t->dim() == 4 && t->shape() == expected,
             "KVCache: keys and values of a step are (B=", batch(), ", heads=", heads_,
             ", T_new, head_dim=", head_dim_, "), got a ", t->describe(),
             " (make the cache with the model's new_cache(batch))");
  }
  const int64_t past = length(), t_new = k.size(2);
  MT_CHECK(past + t_new <= capacity_, "KVCache: ", past, " cached positions and ", t_new,
           " new ones exceed the capacity ", capacity_,
           "; make a cache with a larger capacity (at most the model's context length)");
  Tensor& kb = k_[size_t(layer)];
  Tensor& vb = v_[size_t(layer)];
  if (!kb.defined()) {
    // The first write decides dtype and device: what the model's qkv projection produces.
    kb = Tensor::empty({batch(), heads_, capacity_, head_dim_}, k.dtype(), k.device());
    vb = Tensor::empty({batch(), heads_, capacity_, head_dim_}, v.dtype(), v.device());
  }
  MT_CHECK(k.device() == kb.device(), "KVCache: the cache is on ", kb.device().str(),
           ", the new keys on ", k.device().str());
  // copy_ converts: a step under another autocast setting than the first keeps the cache's dtype.
  kb.narrow(2, past, t_new).copy_(k);
  vb.narrow(2, past, t_new).copy_(v);
  return {kb.narrow(2, 0, past + t_new), vb.narrow(2, 0, past + t_new)};
}

const Tensor& KVCache::keys(int64_t layer) const {
  MT_CHECK(layer >= 0 && layer < layers(), "KVCache: layer ", layer, " of ", layers());
  return k_[size_t(layer)];
}

const Tensor& KVCache::values(int64_t layer) const {
  MT_CHECK(layer >= 0 && layer < layers(), "KVCache: layer ", layer, " of ", layers());
  return v_[size_t(layer)];
}

int64_t KVCache::nbytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < k_.size(); ++i) {
    if (k_[i].defined()) n += int64_t(k_[i].nbytes() + v_[i].nbytes());
  }
  return n;
}

void RecurrentCache::reset() {
  DecodeCache::reset();
  h = Tensor();
  c = Tensor();
}

std::unique_ptr<DecodeCache> CausalLM::new_cache(int64_t batch, int64_t capacity) const {
  MT_CHECK(batch > 0, name(), ": new_cache needs a positive batch size, got ", batch);
  const int64_t context = context_length();
  MT_CHECK(capacity >= 0 && (context == 0 || capacity <= context), name(), ": a cache capacity of ",
           capacity, " positions; it must be between 1 and the context length ", context,
           " (0: the context length)");
  return make_cache(batch, capacity == 0 ? context : capacity);
}

Tensor CausalLM::logits_with_cache(const Tensor& tokens, DecodeCache& cache, Logits which) {
  MT_CHECK(tokens.defined() && tokens.dim() == 2 && !tokens.is_floating_point() &&
               tokens.dtype() != DType::Bool,
           name(), ": logits_with_cache takes integer tokens (B, T_new), got a ",
           tokens.defined() ? tokens.describe() : std::string("undefined tensor"));
  MT_CHECK(tokens.size(0) == cache.batch(), name(), ": ", tokens.size(0),
           " sequences for a cache of batch ", cache.batch());
  MT_CHECK(tokens.size(1) > 0, name(), ": logits_with_cache needs at least one new token");
  NoGrad ng;
  return forward_cached(tokens, cache, which);
}

CausalLM& as_causal_lm(Module& model) {
  auto* lm = dynamic_cast<CausalLM*>(&model);
  MT_CHECK(lm != nullptr, "a ", model.name(),
           " is not a causal language model: generation needs one of gpt2, gpt2_tiny, lstm, or a "
           "model that implements nn::CausalLM (causal_lm.h)");
  return *lm;
}

}  // namespace mantissa::nn
