// Sampling a continuation through a CausalLM's cache. The distribution and the draw are computed
// on the host in double: a vocabulary row is small (50257 values for GPT-2), the ops have no
// top-k or multinomial, and host arithmetic makes the draw independent of threads and devices.
#include "mantissa/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/numerics/philox.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::nn {

namespace {

void check_options(const GenerateOptions& o) {
  MT_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got ", o.max_new_tokens);
  MT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "generate: the temperature must be ",
           ">= 0 (0: greedy), got ", o.temperature);
  MT_CHECK(o.top_k >= 0, "generate: top_k must be >= 0 (0: all tokens), got ", o.top_k);
  MT_CHECK(o.top_p > 0 && o.top_p <= 1, "generate: top_p must be in (0, 1] (1: all tokens), got ",
           o.top_p);
}

// Eval mode while generating (dropout off), the caller's mode afterwards, also on an error.
class EvalScope {
 public:
  explicit EvalScope(Module& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalScope() {
    if (was_training_) m_.train();
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Module& m_;
  bool was_training_;
};

// Where the model's parameters live: the prompt goes there.
Device model_device(const Module& model) {
  const std::vector<Tensor> params = model.parameters();
  return params.empty() ? Device::cpu() : params.front().device();
}

}  // namespace

double sampling_uniform(uint64_t seed, uint64_t index) {
  // Two 32-bit draws of stream (seed, index) make one double with a full 53-bit mantissa, so
  // tokens of probability far below 2^-32 keep their chance.
  const uint64_t hi = random_bits(seed, index, 0), lo = random_bits(seed, index, 1);
  return double(((hi << 32) | lo) >> 11) * 0x1p-53;
}

std::vector<double> next_token_probabilities(const std::vector<float>& logits,
                                             const GenerateOptions& options) {
  check_options(options);
  const size_t v = logits.size();
  MT_CHECK(v > 0, "generate: empty logits");
  for (size_t i = 0; i < v; ++i) {
    MT_CHECK(!std::isnan(logits[i]) && logits[i] != std::numeric_limits<float>::infinity(),
             "generate: the logit of token ", i, " is ", logits[i],
             " (the model's output is not finite: a diverged or badly converted checkpoint?)");
  }
  std::vector<double> p(v, 0.0);
  const auto best = size_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (options.temperature == 0 || logits[best] == -std::numeric_limits<float>::infinity()) {
    p[best] = 1.0;  // greedy: the first maximum, as argmax
    return p;
  }
  std::vector<double> z(v);
  for (size_t i = 0; i < v; ++i)
    z[i] = double(logits[i]) / options.temperature;

  // top-k: everything below the k-th largest scaled logit goes (ties with it stay).
  double floor = -std::numeric_limits<double>::infinity();
  if (options.top_k > 0 && size_t(options.top_k) < v) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(),
                     std::greater<>());
    floor = sorted[size_t(options.top_k - 1)];
  }
  const double zmax = z[best];
  double total = 0;
  for (size_t i = 0; i < v; ++i) {
    if (z[i] >= floor) {
      p[i] = std::exp(z[i] - zmax);
      total += p[i];
    }
  }
  for (double& x : p)
    x /= total;

  // top-p: the most likely tokens, in order, while the mass before each is below top_p.
  if (options.top_p < 1) {
    std::vector<size_t> order;
    for (size_t i = 0; i < v; ++i) {
      if (p[i] > 0) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    double before = 0, kept = 0;
    size_t n = 0;
    while (n < order.size() && (n == 0 || before < options.top_p)) {
      before += p[order[n]];
      ++n;
    }
    for (size_t i = n; i < order.size(); ++i)
      p[order[i]] = 0;
    for (size_t i = 0; i < n; ++i)
      kept += p[order[i]];
    for (double& x : p)
      x /= kept;
  }
  return p;
}

int64_t sample_token(const std::vector<double>& probabilities, double u) {
  MT_CHECK(u >= 0 && u < 1, "sample_token: u must be in [0, 1), got ", u);
  const double total = std::accumulate(probabilities.begin(), probabilities.end(), 0.0);
  MT_CHECK(total > 0, "sample_token: the probabilities sum to ", total);
  const double target = u * total;
  double cum = 0;
  int64_t last = -1;
  for (size_t i = 0; i < probabilities.size(); ++i) {
    if (probabilities[i] <= 0) continue;
    cum += probabilities[i];
    last = int64_t(i);
    if (target < cum) return last;
  }
  return last;  // u * total rounded up to the total: the last possible token
}

Generation generate(CausalLM& model, const std::vector<int64_t>& prompt,
                    const GenerateOptions& options) {
  check_options(options);
  const int64_t vocab = model.vocab_size(), context = model.context_length();
  const auto p = int64_t(prompt.size());
  MT_CHECK(p > 0, "generate: the prompt is empty; give at least one token (for unconditional ",
           "text, the end-of-text token the model was trained with, e.g. GPT-2's 50256)");
  for (size_t i = 0; i < prompt.size(); ++i) {
    MT_CHECK(prompt[i] >= 0 && prompt[i] < vocab, "generate: prompt token ", i, " is ", prompt[i],
             ", outside the model's vocabulary [0, ", vocab, ")");
  }
  MT_CHECK(!options.stop_token || (*options.stop_token >= 0 && *options.stop_token < vocab),
           "generate: the stop token ", options.stop_token.value_or(0),
           " is outside the vocabulary [0, ", vocab, ")");

  Generation out;
  if (options.max_new_tokens == 0) return out;
  const uint64_t seed = options.seed ? *options.seed : draw_seed();
  EvalScope eval(model);
  NoGrad ng;
  const Device device = model_device(model);
  // The sequence so far; a GPT sees at most its last `context` tokens (the positions it learned).
  std::vector<int64_t> seq = prompt;
  seq.reserve(prompt.size() + size_t(options.max_new_tokens));
  auto window = [&] {
    const auto n = int64_t(seq.size());
    const int64_t start = context == 0 ? 0 : std::max<int64_t>(0, n - context);
    return Tensor::from_vector(std::vector<int64_t>(seq.begin() + start, seq.end()), {1, n - start})
        .to(device);
  };
  // Room for the positions fed until the window first fills (the last token is never fed back).
  const int64_t fed = p + options.max_new_tokens - 1;
  std::unique_ptr<DecodeCache> cache =
      model.new_cache(1, context == 0 ? 0 : std::min(context, fed));
  Tensor input = window();
  int64_t cached = 0;  // positions in the cache
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const Tensor logits = model.logits_with_cache(input, *cache, Logits::Last);  // (1, 1, V)
    cached += input.size(1);
    const std::vector<float> row = logits.reshape({-1}).to(DType::F32).to_vector<float>();
    const int64_t token =
        sample_token(next_token_probabilities(row, options), sampling_uniform(seed, uint64_t(i)));
    if (options.stop_token && token == *options.stop_token) {
      out.reason = StopReason::StopToken;
      return out;
    }
    out.tokens.push_back(token);
    seq.push_back(token);
    if (options.on_token && !options.on_token(token)) {
      out.reason = StopReason::Callback;
      return out;
    }
    if (i + 1 == options.max_new_tokens) break;
    if (context == 0 || cached < context) {
      input = Tensor::from_vector(std::vector<int64_t>{token}, {1, 1}).to(device);
    } else {
      // The window is full: it slides by one token, recomputed from a fresh cache over the last
      // `context` tokens (nanoGPT's crop; the learned positions cannot be shifted in a cache).
      cache = model.new_cache(1, context);
      cached = 0;
      input = window();
    }
  }
  return out;
}

Generation generate(Module& model, const std::vector<int64_t>& prompt,
                    const GenerateOptions& options) {
  return generate(as_causal_lm(model), prompt, options);
}

}  // namespace mantissa::nn
