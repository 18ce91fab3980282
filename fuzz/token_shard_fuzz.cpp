// Fuzz target: token files -- a token shard (header, then uint16 or uint32 tokens) and a flat
// uint16 token file, as the language-model data path reads them.
#include <cstdint>

#include "fuzz_input.h"
#include "mantissa/data/tokens.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string& path = fuzz::input_file(data, size);
  fuzz::expect_only_mantissa_errors([&] {
    const data::TokenShardHeader h = data::read_token_shard_header(path);
    const data::TokenDataset ds = data::load_token_shard(path);
    FUZZ_REQUIRE(ds.size() == h.token_count, "%lld tokens read, %lld announced",
                 (long long)ds.size(), (long long)h.token_count);
    FUZZ_REQUIRE(ds.vocab_size == h.vocab_size, "vocabulary %lld, header %lld",
                 (long long)ds.vocab_size, (long long)h.vocab_size);
    for (uint32_t t : ds.tokens)
      FUZZ_REQUIRE(int64_t(t) < ds.vocab_size, "token %u of a vocabulary of %lld", t,
                   (long long)ds.vocab_size);
  });
  fuzz::expect_only_mantissa_errors([&] {
    const data::TokenDataset ds = data::load_tokens(path, 0);
    FUZZ_REQUIRE(size_t(ds.size()) * 2 == size, "%lld tokens from %zu bytes", (long long)ds.size(),
                 size);
  });
  return 0;
}
