// Internal: what BPE training and the tokenizer share.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mantissa::data::detail {

// A pair of ids as one key; the order of keys is the order of (left, right), which breaks ties
// between equally frequent pairs in training (the lowest wins).
constexpr uint64_t pair_key(uint32_t left, uint32_t right) {
  return uint64_t(left) << 32 | right;
}

// FNV-1a over the format's name, the merges and the special tokens; never 0 (0 means "not
// recorded" in a token shard).
inline uint64_t fingerprint(const std::vector<std::pair<uint32_t, uint32_t>>& merges,
                            const std::vector<std::string>& specials) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto byte = [&](uint8_t b) { h = (h ^ b) * 0x100000001b3ull; };
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i)
      byte(uint8_t(v >> (8 * i)));
  };
  for (char c : std::string("mantissa-bpe/1"))
    byte(uint8_t(c));
  u32(uint32_t(merges.size()));
  for (const auto& [l, r] : merges) {
    u32(l);
    u32(r);
  }
  u32(uint32_t(specials.size()));
  for (const std::string& s : specials) {
    u32(uint32_t(s.size()));
    for (char c : s)
      byte(uint8_t(c));
  }
  return h == 0 ? 1 : h;
}

}  // namespace mantissa::data::detail
