// The KV cache (GPT) and the carried state (LSTM) of nn::CausalLM: cached logits against full
// forwards in fp32, under bf16 autocast and for a bf16 model; the buffers; the work of one step.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/op_harness.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/core/allocator.h"
#include "mantissa/core/error.h"
#include "mantissa/nn/causal_lm.h"
#include "mantissa/nn/layers.h"
#include "nn/lm_test_util.h"

namespace mantissa::nn {
namespace {

using namespace testing_lm;

// Feeds `tokens` (B, T) through the cache in chunks of the given sizes and returns the logits
// of every position, concatenated (B, T, V) as f32.
Tensor cached_logits(CausalLM& lm, const Tensor& tokens, const std::vector<int64_t>& chunks) {
  auto cache = lm.new_cache(tokens.size(0));
  std::vector<Tensor> parts;
  int64_t at = 0;
  for (int64_t n : chunks) {
    parts.push_back(lm.logits_with_cache(tokens.narrow(1, at, n), *cache).to(DType::F32));
    at += n;
    EXPECT_EQ(cache->length(), at);
  }
  EXPECT_EQ(at, tokens.size(1));
  return cat(parts, 1);
}

// A prompt in one call (causal within it), single tokens, a chunk after a past (the
// bottom-right-aligned mask), single tokens again.
const std::vector<int64_t> kChunks = {7, 1, 1, 1, 4, 1, 1, 1, 3};

// The cached path computes the same expressions as forward with GEMMs of other shapes (one row
// instead of T, keys read from the cache's buffer), so the logits agree to rounding: fp32
// accumulation of up to 512 terms per GEMM through 4 blocks. The tolerance is 64 eps (2^-23)
// times (|logit| + the logits' mean magnitude); measured: gpt2_tiny's worst element is 11 such
// units off (2.7e-7 on logits of ~0.2), the LSTM's logits are bit-identical.
TEST(KVCache, CachedLogitsEqualFullForwardFp32) {
  for (const char* name : {"gpt2_tiny", "lstm"}) {
    SCOPED_TRACE(name);
    auto model = tiny(name);
    model->eval();
    CausalLM& lm = as_causal_lm(*model);
    const int64_t t = 20;
    const Tensor tokens = Tensor::from_vector(random_tokens(2 * t, 3), {2, t});
    const Tensor full = full_logits(*model, tokens);
    const Tensor cached = cached_logits(lm, tokens, kChunks);
    EXPECT_TRUE(
        testing::all_close(cached, full, testing::eps_of(DType::F32), 64, "cached vs full"));
    // Logits::Last is the last row of All.
    auto cache = lm.new_cache(2);
    const Tensor last = lm.logits_with_cache(tokens, *cache, Logits::Last);
    EXPECT_EQ(last.shape(), (Shape{2, 1, kVocab}));
    EXPECT_TRUE(testing::all_close(last.to(DType::F32), full.narrow(1, t - 1, 1),
                                   testing::eps_of(DType::F32), 64, "last row"));
  }
}

// In bf16 (autocast, and a model cast to bf16: O2/O3 weights) both paths round every GEMM output
// to bf16, so a rounding difference upstream could move a value by an ulp: the tolerance is 16
// bf16 eps (measured: bit-identical here).
TEST(KVCache, CachedLogitsEqualFullForwardBf16) {
  const Tensor tokens = Tensor::from_vector(random_tokens(2 * 16, 4), {2, 16});
  const std::vector<int64_t> chunks = {5, 1, 1, 3, 1, 1, 4};
  for (const char* name : {"gpt2_tiny", "lstm"}) {
    SCOPED_TRACE(name);
    auto model = tiny(name);
    model->eval();
    CausalLM& lm = as_causal_lm(*model);
    {
      amp::Autocast ac(DeviceType::CPU, DType::BF16);
      const Tensor full = full_logits(*model, tokens);
      const Tensor cached = cached_logits(lm, tokens, chunks);
      EXPECT_TRUE(
          testing::all_close(cached, full, testing::eps_of(DType::BF16), 16, "autocast bf16"));
    }
    model->to(DType::BF16);
    const Tensor full = full_logits(*model, tokens);
    const Tensor cached = cached_logits(lm, tokens, chunks);
    auto cache = lm.new_cache(2);
    EXPECT_EQ(lm.logits_with_cache(tokens, *cache).dtype(), DType::BF16);
    EXPECT_TRUE(testing::all_close(cached, full, testing::eps_of(DType::BF16), 16, "bf16 model"));
  }
}

TEST(KVCache, BuffersArePreallocatedAndFilledInPlace) {
  auto model = tiny("gpt2_tiny");
  model->eval();
  CausalLM& lm = as_causal_lm(*model);
  auto cache = lm.new_cache(1, 10);
  auto* kv = dynamic_cast<KVCache*>(cache.get());
  ASSERT_NE(kv, nullptr);
  EXPECT_EQ(kv->layers(), 4);
  EXPECT_EQ(kv->nbytes(), 0) << "allocated at the first write";
  lm.logits_with_cache(Tensor::from_vector(random_tokens(3, 1), {1, 3}), *cache);
  ASSERT_TRUE(kv->keys(0).defined());
  EXPECT_EQ(kv->keys(0).shape(), (Shape{1, 4, 10, 32}));
  EXPECT_EQ(kv->nbytes(), 4 * 2 * 10 * 128 * 4);
  const void* data = kv->keys(3).data_ptr();
  lm.logits_with_cache(Tensor::from_vector(random_tokens(1, 2), {1, 1}), *cache);
  EXPECT_EQ(kv->keys(3).data_ptr(), data) << "no reallocation per step";
  EXPECT_EQ(kv->length(), 4);
  // The capacity and the context length bound it, with messages that say so.
  try {
    lm.logits_with_cache(Tensor::from_vector(random_tokens(7, 3), {1, 7}), *cache);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capacity 10"), std::string::npos) << e.what();
  }
  auto full = lm.new_cache(1);
  lm.logits_with_cache(Tensor::from_vector(random_tokens(kContext, 4), {1, kContext}), *full);
  try {
    lm.logits_with_cache(Tensor::from_vector(random_tokens(1, 5), {1, 1}), *full);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context length 48"), std::string::npos) << e.what();
  }
  EXPECT_THROW(lm.new_cache(1, kContext + 1), Error);
  EXPECT_THROW(lm.logits_with_cache(Tensor::zeros({2, 1}, DType::I64), *lm.new_cache(1)), Error);
  // A cache of another model is refused.
  auto lstm = tiny("lstm");
  EXPECT_THROW(as_causal_lm(*lstm).logits_with_cache(Tensor::zeros({1, 1}, DType::I64), *full),
               Error);
  // The layer-level entry refuses a graph: no gradient would flow through the cache.
  auto* blocks = dynamic_cast<Sequential*>(model->child("blocks").get());
  ASSERT_NE(blocks, nullptr);
  auto& block = dynamic_cast<TransformerBlock&>(*(*blocks)[0]);
  EXPECT_THROW(block.attn->attend_cached(Tensor::zeros({1, 1, 128}), *kv, 0), Error);
  // reset() starts a new sequence in the same buffers.
  full->reset();
  EXPECT_EQ(full->length(), 0);
  lm.logits_with_cache(Tensor::zeros({1, 2}, DType::I64), *full);
  EXPECT_EQ(full->length(), 2);
}

// A step through the cache does O(length) work: its transient memory (the new position's
// activations and one row of attention scores per head) is a fraction of one (T, C) activation
// of a full forward, which also holds (T, T) scores per head.
TEST(KVCache, OneStepDoesNoFullRecomputation) {
  auto model = make_model("gpt2_tiny", {.vocab_size = kVocab, .max_seq_len = 256, .seed = 1});
  model->eval();
  CausalLM& lm = as_causal_lm(*model);
  const std::vector<int64_t> ids = random_tokens(201, 9);
  const Tensor all = Tensor::from_vector(ids, {1, 201});
  auto cache = lm.new_cache(1);
  lm.logits_with_cache(all.narrow(1, 0, 200), *cache);

  const int64_t before = memory_stats().current_bytes;
  reset_peak_memory();
  lm.logits_with_cache(all.narrow(1, 200, 1), *cache, Logits::Last);
  const int64_t step_peak = memory_stats().peak_bytes - before;

  const int64_t before_full = memory_stats().current_bytes;
  reset_peak_memory();
  full_logits(*model, all);
  const int64_t full_peak = memory_stats().peak_bytes - before_full;
  const int64_t one_activation = 201 * 128 * 4;
  std::printf("transient memory: cached step %lld B, full forward %lld B\n",
              static_cast<long long>(step_peak), static_cast<long long>(full_peak));
  EXPECT_LT(step_peak, one_activation / 4);
  EXPECT_GT(full_peak, 10 * one_activation);
}

}  // namespace
}  // namespace mantissa::nn
