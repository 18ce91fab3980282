// BPE training with incremental pair counts (the scheme of Hugging Face tokenizers' trainer):
// the corpus is reduced to its distinct pre-tokens with their counts ("words"); the count of every
// adjacent pair, weighted by the words' counts, and the list of words each pair occurs in are kept
// up to date as merges are made, so a merge touches only the words that hold its pair. The most
// frequent pair comes from a max-heap whose entries may be stale: a pair's count only falls after
// the merge that created its right or left symbol, so an entry whose count is no longer current is
// pushed back with the current count when it surfaces.
#include <algorithm>
#include <queue>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "data/bpe_common.h"
#include "data/pretokenize.h"
#include "mantissa/core/error.h"
#include "mantissa/data/tokenizer.h"

namespace mantissa::data {
namespace {

using detail::pair_key;

struct Word {
  std::vector<uint32_t> symbols;
  int64_t count;
};

struct HeapEntry {
  int64_t count;
  uint64_t pair;
};

// The heap's top is the highest count; among equal counts the lowest (left, right).
struct Lower {
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    return a.count < b.count || (a.count == b.count && a.pair > b.pair);
  }
};

bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const detail::Char c = detail::char_at(p, s.size(), i);
    if (c.len == 1 && p[i] >= 0x80) return false;
    i += c.len;
  }
  return true;
}

void check_options(const BpeTrainOptions& o) {
  MT_CHECK(!o.special_tokens.empty() && std::find(o.special_tokens.begin(), o.special_tokens.end(),
                                                  kEndOfText) != o.special_tokens.end(),
           "BPE training: the special tokens must include ", kEndOfText,
           " (it separates documents)");
  std::set<std::string> seen;
  for (const std::string& s : o.special_tokens) {
    MT_CHECK(!s.empty() && valid_utf8(s), "BPE training: special token \"", s,
             "\" must be non-empty valid UTF-8 text");
    MT_CHECK(seen.insert(s).second, "BPE training: special token \"", s, "\" is given twice");
  }
  const auto least = BpeTokenizer::kByteTokens + int64_t(o.special_tokens.size());
  MT_CHECK(o.vocab_size >= least && o.vocab_size <= int64_t(UINT32_MAX),
           "BPE training: ", "vocab_size ", o.vocab_size, " must be at least ", least,
           " (256 bytes + ", o.special_tokens.size(), " special tokens) and fit uint32 ids");
  MT_CHECK(o.min_frequency >= 1, "BPE training: min_frequency must be >= 1, not ", o.min_frequency);
}

}  // namespace

BpeTokenizer BpeTokenizer::train(std::span<const std::string> documents,
                                 const BpeTrainOptions& options) {
  check_options(options);
  const int64_t target = options.vocab_size - kByteTokens - int64_t(options.special_tokens.size());

  // The distinct pre-tokens of two bytes or more (a single byte has no pair to merge).
  std::unordered_map<std::string_view, int64_t> counts;
  for (const std::string& doc : documents) {
    const auto* s = reinterpret_cast<const unsigned char*>(doc.data());
    detail::for_each_pretoken(s, doc.size(), [&](size_t b, size_t e) {
      if (e - b >= 2) ++counts[std::string_view(doc).substr(b, e - b)];
    });
  }
  std::vector<Word> words;
  words.reserve(counts.size());
  for (const auto& [text, count] : counts) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    words.push_back({std::vector<uint32_t>(p, p + text.size()), count});
  }
  counts.clear();

  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<uint32_t>> where;  // pair -> words (may hold stale)
  for (uint32_t w = 0; w < words.size(); ++w) {
    const std::vector<uint32_t>& s = words[w].symbols;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t key = pair_key(s[i], s[i + 1]);
      pair_count[key] += words[w].count;
      std::vector<uint32_t>& list = where[key];
      if (list.empty() || list.back() != w) list.push_back(w);
    }
  }
  std::vector<HeapEntry> entries;
  entries.reserve(pair_count.size());
  for (const auto& [key, count] : pair_count)
    entries.push_back({count, key});
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, Lower> heap(Lower{}, std::move(entries));

  std::vector<std::pair<uint32_t, uint32_t>> merges;
  std::unordered_set<uint64_t> created;  // pairs holding the new symbol, pushed after each merge
  while (int64_t(merges.size()) < target && !heap.empty()) {
    const HeapEntry top = heap.top();
    heap.pop();
    const auto found = pair_count.find(top.pair);
    const int64_t current = found == pair_count.end() ? 0 : found->second;
    if (current != top.count) {
      if (current > 0) heap.push({current, top.pair});
      continue;
    }
    if (current < options.min_frequency) break;

    const auto a = uint32_t(top.pair >> 32), b = uint32_t(top.pair);
    const auto x = uint32_t(kByteTokens + int64_t(merges.size()));
    merges.emplace_back(a, b);
    std::vector<uint32_t> list = std::move(where[top.pair]);
    where.erase(top.pair);
    std::sort(list.begin(), list.end());
    list.erase(std::unique(list.begin(), list.end()), list.end());
    created.clear();
    for (uint32_t w : list) {
      std::vector<uint32_t>& s = words[w].symbols;
      const int64_t count = words[w].count;
      auto change = [&](uint32_t left, uint32_t right, int64_t delta) {
        const uint64_t key = pair_key(left, right);
        pair_count[key] += delta * count;
        if (delta > 0) {
          created.insert(key);
          std::vector<uint32_t>& l = where[key];
          if (l.empty() || l.back() != w) l.push_back(w);
        }
      };
      // Each occurrence of (a, b), left to right, becomes x; its neighbours' pairs move to x.
      size_t out = 0;
      for (size_t i = 0; i < s.size();) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          if (out > 0) {
            change(s[out - 1], a, -1);
            change(s[out - 1], x, +1);
          }
          if (i + 2 < s.size()) {
            change(b, s[i + 2], -1);
            change(x, s[i + 2], +1);
          }
          s[out++] = x;
          i += 2;
        } else {
          s[out++] = s[i++];
        }
      }
      s.resize(out);
    }
    pair_count.erase(top.pair);
    for (uint64_t key : created) {
      const auto it = pair_count.find(key);
      if (it != pair_count.end() && it->second > 0) heap.push({it->second, key});
    }
    // Counts that fell to zero would only crowd the map.
    for (uint64_t key : created) {
      const auto it = pair_count.find(key);
      if (it != pair_count.end() && it->second == 0) pair_count.erase(it);
    }
  }
  return BpeTokenizer(std::move(merges), options.special_tokens);
}

}  // namespace mantissa::data
