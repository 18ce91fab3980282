// Sampling text from a causal language model, token by token through its cache (causal_lm.h):
// the prompt runs once, then each new token is one step (nanoGPT's and Hugging Face's generate
// with a KV cache; an LSTM carries its state).
//
//   auto model = nn::make_model("gpt2_tiny", {.vocab_size = 4096});
//   ... load a checkpoint ...
//   nn::Generation g = nn::generate(*model, prompt_ids,
//                                   {.max_new_tokens = 200, .temperature = 0.8, .top_k = 40,
//                                    .seed = 1, .stop_token = 50256,
//                                    .on_token = [&](int64_t t) { print(t); return true; }});
//
// Deterministic: token i is drawn with the uniform number Philox(seed, i) from a distribution
// computed on the host in double, so a seed gives the same text on every thread count (given
// the same logits). Runs under NoGrad, in eval mode (restored afterwards), in the model's dtype
// (a bf16/fp16 model, Apex O2/O3) and under an enclosing amp::Autocast region.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "mantissa/nn/causal_lm.h"

namespace mantissa::nn {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  // Logits are divided by it before the softmax; 0 takes the most likely token (greedy argmax,
  // the first on ties) and ignores the other sampling options.
  double temperature = 1.0;
  // Keep only the k most likely tokens (ties with the k-th kept, as nanoGPT's and PyTorch's
  // top-k filter); 0: all.
  int64_t top_k = 0;
  // Nucleus sampling: keep the most likely tokens until their probability reaches top_p (at least
  // one), after top_k; 1: all.
  double top_p = 1.0;
  // The seed of the token draws; none: one drawn from the default generator (manual_seed).
  std::optional<uint64_t> seed = std::nullopt;
  // Stops when this token is drawn (e.g. GPT-2's <|endoftext|>, 50256); it is not part of the
  // result and not passed to on_token.
  std::optional<int64_t> stop_token = std::nullopt;
  // Called with each new token as soon as it is chosen (streaming); returning false stops after
  // it.
  std::function<bool(int64_t token)> on_token = nullptr;
};

enum class StopReason { MaxTokens, StopToken, Callback };

struct Generation {
  std::vector<int64_t> tokens;  // the continuation, without the prompt and the stop token
  StopReason reason = StopReason::MaxTokens;
};

// Continues `prompt` (at least one token id; for unconditional text, e.g. GPT-2's
// <|endoftext|>). A GPT sees at most its context length of tokens (the positions it learned):
// a longer prompt is cropped to its last `context` tokens, and once prompt and continuation fill
// the context the window slides by one token per new token, recomputed over the last `context`
// tokens (nanoGPT's crop; until then each token is one cached step).
Generation generate(CausalLM& model, const std::vector<int64_t>& prompt,
                    const GenerateOptions& options = {});
// The same for a Module that is a CausalLM (as_causal_lm's error otherwise).
Generation generate(Module& model, const std::vector<int64_t>& prompt,
                    const GenerateOptions& options = {});

// ---- the sampling step, for tests and custom loops ---------------------------------------------

// The distribution the next token is drawn from: softmax(logits / temperature) restricted to the
// top_k, then the top_p, tokens and renormalised; one-hot at the argmax for temperature 0.
// Logits may be -inf (never drawn), not NaN or +inf.
std::vector<double> next_token_probabilities(const std::vector<float>& logits,
                                             const GenerateOptions& options);
// The token whose cumulative probability (in token order) first exceeds u in [0, 1).
int64_t sample_token(const std::vector<double>& probabilities, double u);
// The uniform number in [0, 1) (53 bits) that draws token `index` of a generation with `seed`.
double sampling_uniform(uint64_t seed, uint64_t index);

}  // namespace mantissa::nn
