// Generation: greedy against full forwards step by step, seeds, top-k, top-p,
// temperature, the stop token and the streaming callback, in fp32, under bf16
// autocast and for a bf16 model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mantissa/autocast/autocast.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/generate.h"
#include "nn/lm_test_util.h"

namespace mantissa::nn {
namespace {

using namespace testing_lm;

std::vector<float> row_of(const Tensor& logits, int64_t t) {
  return logits.select(0, 0).select(0, t).contiguous().to_vector<float>();
}

// Greedy generation picks, at every step, the argmax of a full forward over the
// prompt and the tokens so far. Where the full forward's two best logits are
// closer than the rounding between the paths, either is right.
// With a `window` (a GPT's context length), the full forward runs over the last `window` tokens.
void expect_greedy_is_argmax(Module& model, const std::vector<int64_t>& prompt,
                             const std::vector<int64_t>& generated, double tol,
                             int64_t window = 0) {
  std::vector<int64_t> seq = prompt;
  for (size_t i = 0; i < generated.size(); ++i) {
    const int64_t n = int64_t(seq.size());
    const int64_t start = window > 0 ? std::max<int64_t>(0, n - window) : 0;
    const std::vector<int64_t> seen(seq.begin() + start, seq.end());
    const Tensor logits = full_logits(model, Tensor::from_vector(seen, {1, n - start}));
    std::vector<float> row = row_of(logits, n - start - 1);
    const auto best = int64_t(std::max_element(row.begin(), row.end()) - row.begin());
    const float top = row[size_t(best)];
    row[size_t(best)] = -INFINITY;
    const float second = *std::max_element(row.begin(), row.end());
    if (top - second > tol) {
      EXPECT_EQ(generated[i], best) << "step " << i;
    } else if (generated[i] != best) {
      EXPECT_GE(row[size_t(generated[i])], top - tol) << "step " << i;
    }
    seq.push_back(generated[i]);
  }
}

TEST(Generate, GreedyIsTheArgmaxOfTheFullForwardStepByStep) {
  for (const char* name : {"gpt2_tiny", "lstm"}) {
    SCOPED_TRACE(name);
    auto model = tiny(name);
    const std::vector<int64_t> prompt = random_tokens(5, 11);
    const Generation g = generate(*model, prompt, {.max_new_tokens = 30, .temperature = 0});
    EXPECT_EQ(g.tokens.size(), 30u);
    EXPECT_EQ(g.reason, StopReason::MaxTokens);
    EXPECT_TRUE(model->is_training()) << "the caller's mode is restored";
    model->eval();
    expect_greedy_is_argmax(*model, prompt, g.tokens, 1e-5);
    // top_k = 1 keeps only the most likely token: greedy at any temperature.
    const Generation k1 =
        generate(*model, prompt, {.max_new_tokens = 30, .temperature = 1.5, .top_k = 1, .seed = 3});
    EXPECT_EQ(k1.tokens, g.tokens);
  }
}

// The tolerance of a near-tie is in the half formats' rounding of logits of ~0.2.
TEST(Generate, GreedyUnderAutocastAndForHalfModels) {
  const std::vector<int64_t> prompt = random_tokens(4, 12);
  const GenerateOptions greedy{.max_new_tokens = 12, .temperature = 0};
  {
    auto model = tiny("gpt2_tiny");
    model->eval();
    amp::Autocast ac(DeviceType::CPU, DType::BF16);
    expect_greedy_is_argmax(*model, prompt, generate(*model, prompt, greedy).tokens, 0.01);
  }
  for (const DType dt : {DType::BF16, DType::F16}) {  // O2/O3 weights
    SCOPED_TRACE(dtype_name(dt));
    for (const char* name : {"gpt2_tiny", "lstm"}) {
      auto model = tiny(name);
      model->to(dt);
      model->eval();
      const Generation g = generate(*model, prompt, greedy);
      EXPECT_EQ(g.tokens.size(), 12u);
      expect_greedy_is_argmax(*model, prompt, g.tokens, 0.01);
    }
  }
}

TEST(Generate, SameSeedSameTokensOnAnyThreadCount) {
  auto model = tiny("gpt2_tiny");
  const std::vector<int64_t> prompt = random_tokens(6, 13);
  const GenerateOptions options{.max_new_tokens = 40, .temperature = 1.0, .seed = 42};
  const int threads = get_num_threads();
  const Generation a = generate(*model, prompt, options);
  set_num_threads(1);
  const Generation b = generate(*model, prompt, options);
  set_num_threads(threads);
  EXPECT_EQ(a.tokens, b.tokens);
  GenerateOptions other = options;
  other.seed = 43;
  EXPECT_NE(generate(*model, prompt, other).tokens, a.tokens);
  // Without a seed the default generator decides: manual_seed makes it
  // reproducible.
  other.seed.reset();
  manual_seed(5);
  const Generation c = generate(*model, prompt, other);
  manual_seed(5);
  EXPECT_EQ(generate(*model, prompt, other).tokens, c.tokens);
}

TEST(Generate, StopTokenAndCallback) {
  auto model = tiny("lstm");
  const std::vector<int64_t> prompt = random_tokens(3, 14);
  const GenerateOptions sampled{.max_new_tokens = 40, .temperature = 1.0, .seed = 1};
  const Generation free = generate(*model, prompt, sampled);
  ASSERT_EQ(free.tokens.size(), 40u);
  // Stop at the first token that did not occur before it (after the first few).
  size_t at = 3;
  while (at < free.tokens.size() && std::find(free.tokens.begin(), free.tokens.begin() + long(at),
                                              free.tokens[at]) != free.tokens.begin() + long(at))
    ++at;
  ASSERT_LT(at, free.tokens.size());
  GenerateOptions stop = sampled;
  stop.stop_token = free.tokens[at];
  std::vector<int64_t> streamed;
  stop.on_token = [&](int64_t t) {
    streamed.push_back(t);
    return true;
  };
  const Generation g = generate(*model, prompt, stop);
  EXPECT_EQ(g.reason, StopReason::StopToken);
  EXPECT_EQ(g.tokens, std::vector<int64_t>(free.tokens.begin(), free.tokens.begin() + long(at)));
  EXPECT_EQ(streamed, g.tokens) << "every token streamed, the stop token not";
  // A callback that returns false stops after its token.
  GenerateOptions cb = sampled;
  cb.on_token = [](int64_t) { return false; };
  const Generation one = generate(*model, prompt, cb);
  EXPECT_EQ(one.reason, StopReason::Callback);
  EXPECT_EQ(one.tokens, std::vector<int64_t>{free.tokens[0]});
}

TEST(Generate, LstmCarriesItsStatePastTheTrainingWindow) {
  auto model = tiny("lstm");
  EXPECT_EQ(as_causal_lm(*model).context_length(), 0);
  const Generation g =
      generate(*model, random_tokens(3, 15), {.max_new_tokens = 2 * kContext, .temperature = 0});
  EXPECT_EQ(g.tokens.size(), size_t(2 * kContext));
}

// Past its context a GPT's window slides (nanoGPT's crop): each token is the argmax of a full
// forward over the last `context` tokens, for a prompt that fits and for one that does not.
TEST(Generate, AGptSlidesItsWindowPastTheContext) {
  auto gpt = tiny("gpt2_tiny");
  const int64_t context = as_causal_lm(*gpt).context_length();
  for (const int64_t p : {int64_t(5), context + 7}) {
    SCOPED_TRACE(p);
    const std::vector<int64_t> prompt = random_tokens(p, 16);
    const Generation g = generate(*gpt, prompt, {.max_new_tokens = 2 * context, .temperature = 0});
    ASSERT_EQ(g.tokens.size(), size_t(2 * context));
    gpt->eval();  // the full forwards without dropout, as generate runs
    expect_greedy_is_argmax(*gpt, prompt, g.tokens, 1e-5, context);
  }
}

TEST(Generate, RefusesWhatItCannotDo) {
  auto gpt = tiny("gpt2_tiny");
  EXPECT_THROW(generate(*gpt, {}, {}), Error);
  EXPECT_THROW(generate(*gpt, {kVocab}, {}), Error);
  EXPECT_THROW(generate(*gpt, {1}, {.temperature = -1}), Error);
  EXPECT_THROW(generate(*gpt, {1}, {.top_p = 0}), Error);
  EXPECT_THROW(generate(*gpt, {1}, {.stop_token = kVocab}), Error);
  auto cnn = make_model("cnn");
  try {
    generate(*cnn, {1}, {});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a causal language model"), std::string::npos);
  }
}

TEST(Sampling, TemperatureTopKAndTopPFilters) {
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  auto probs = [&](GenerateOptions o) { return next_token_probabilities(logits, o); };
  auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-7) << "token " << i;
  };
  near(probs({}), {0.5, 0.3, 0.15, 0.05});
  // Temperature 2: p_i proportional to sqrt(p_i).
  const double s = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.15) + std::sqrt(0.05);
  near(probs({.temperature = 2}),
       {std::sqrt(0.5) / s, std::sqrt(0.3) / s, std::sqrt(0.15) / s, std::sqrt(0.05) / s});
  near(probs({.temperature = 0}), {1, 0, 0, 0});
  near(probs({.top_k = 2}), {0.5 / 0.8, 0.3 / 0.8, 0, 0});
  near(probs({.top_p = 0.7}), {0.5 / 0.8, 0.3 / 0.8, 0, 0});  // 0.5 < 0.7: one more
  near(probs({.top_p = 0.5}), {1, 0, 0, 0});                  // 0.5 reaches 0.5
  near(probs({.top_p = 0.81}), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
  near(probs({.top_k = 3, .top_p = 0.9}), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
  // Ties with the k-th stay (nanoGPT's filter); -inf logits are never drawn.
  near(next_token_probabilities({1, 1, 0, -INFINITY}, {.top_k = 1}), {0.5, 0.5, 0, 0});
  EXPECT_THROW(next_token_probabilities({0, NAN}, {}), Error);
  EXPECT_EQ(sample_token({0.2, 0, 0.8}, 0.0), 0);
  EXPECT_EQ(sample_token({0.2, 0, 0.8}, 0.1999), 0);
  EXPECT_EQ(sample_token({0.2, 0, 0.8}, 0.2), 2);
  EXPECT_EQ(sample_token({0.2, 0.8, 0}, 0.9999999), 1);
}

// The draws follow the distribution: 40000 tokens from softmax(l / T) at T =
// 0.5 over four tokens; each frequency within 5 standard deviations of its
// probability (a false alarm has probability ~6e-7 per token), and the uniform
// numbers themselves are uniform.
TEST(Sampling, DrawsFollowTheTemperatureScaledDistribution) {
  const std::vector<float> logits = {0.0f, 0.4f, -0.3f, 0.9f};
  const GenerateOptions o{.temperature = 0.5};
  const std::vector<double> p = next_token_probabilities(logits, o);
  double z = 0;
  for (float l : logits)
    z += std::exp(double(l) / 0.5);
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(p[i], std::exp(double(logits[i]) / 0.5) / z, 1e-12);
  constexpr int kDraws = 40000;
  std::vector<int> counts(p.size(), 0);
  double mean_u = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = sampling_uniform(99, uint64_t(i));
    ASSERT_TRUE(u >= 0 && u < 1);
    mean_u += u / kDraws;
    ++counts[size_t(sample_token(p, u))];
  }
  for (size_t i = 0; i < p.size(); ++i) {
    const double sd = std::sqrt(p[i] * (1 - p[i]) / kDraws);
    EXPECT_NEAR(double(counts[i]) / kDraws, p[i], 5 * sd) << "token " << i;
  }
  EXPECT_NEAR(mean_u, 0.5, 5 * std::sqrt(1.0 / 12 / kDraws));
}

}  // namespace
}  // namespace mantissa::nn
