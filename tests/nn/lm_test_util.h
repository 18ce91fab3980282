// Small language models and token helpers shared by the KV-cache and generation tests.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/nn/models.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::nn::testing_lm {

inline constexpr int64_t kVocab = 64;
inline constexpr int64_t kContext = 48;

inline std::shared_ptr<Module> tiny(const std::string& name, double dropout = 0.1) {
  return make_model(name,
                    {.vocab_size = kVocab, .max_seq_len = kContext, .dropout = dropout, .seed = 7});
}

inline std::vector<int64_t> random_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t& v : t)
    v = int64_t(rng() % uint64_t(kVocab));
  return t;
}

// forward(tokens) (B, T, V) as f32, without a graph.
inline Tensor full_logits(Module& model, const Tensor& tokens) {
  NoGrad ng;
  return model.forward(tokens).to(DType::F32);
}

}  // namespace mantissa::nn::testing_lm
