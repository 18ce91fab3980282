// BpeTokenizer: the tables, encoding (merges by rank with a pre-token cache), decoding and the JSON
// file. Training is in bpe_train.cpp.
#include "mantissa/data/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "data/bpe_common.h"
#include "data/file_io.h"
#include "data/pretokenize.h"
#include "io/atomic_file.h"
#include "mantissa/core/error.h"

namespace mantissa::data {

using detail::pair_key;

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  detail::for_each_pretoken(s, text.size(),
                            [&](size_t b, size_t e) { out.push_back(text.substr(b, e - b)); });
  return out;
}

// ---- tables ------------------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer() : BpeTokenizer({}, {std::string(kEndOfText)}) {}

BpeTokenizer::BpeTokenizer(std::vector<std::pair<uint32_t, uint32_t>> merges,
                           std::vector<std::string> specials)
    : merges_(std::move(merges)), specials_(std::move(specials)) {
  const size_t vocab = size_t(kByteTokens) + merges_.size() + specials_.size();
  ranks_.reserve(merges_.size());
  offsets_.reserve(vocab + 1);
  offsets_.push_back(0);
  for (int b = 0; b < kByteTokens; ++b) {
    bytes_.push_back(char(b));
    offsets_.push_back(bytes_.size());
  }
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto [left, right] = merges_[r];
    MT_ASSERT(left < kByteTokens + r && right < kByteTokens + r, "merge ", r, " is not valid");
    const size_t length = token_bytes(left).size() + token_bytes(right).size();
    MT_CHECK(length <= kMaxTokenBytes && bytes_.size() + length <= kMaxVocabularyBytes, "merge ", r,
             " makes a token of ", length, " bytes (", bytes_.size() + length,
             " for the vocabulary so far); tokens are at most ", kMaxTokenBytes,
             " bytes and all together ", kMaxVocabularyBytes, " bytes");
    ranks_.emplace(pair_key(left, right), uint32_t(r));
    // Copied through a temporary: bytes_ may reallocate while it is appended to.
    const std::string joined = std::string(token_bytes(left)) + std::string(token_bytes(right));
    bytes_ += joined;
    offsets_.push_back(bytes_.size());
  }
  for (const std::string& s : specials_) {
    if (s == kEndOfText) eot_ = uint32_t(offsets_.size() - 1);
    bytes_ += s;
    offsets_.push_back(bytes_.size());
  }
  MT_ASSERT(eot_ != 0, "a tokenizer without ", kEndOfText);
  fingerprint_ = detail::fingerprint(merges_, specials_);
}

std::string_view BpeTokenizer::token_bytes(uint32_t id) const {
  MT_CHECK(int64_t(id) < vocab_size(), "token id ", id, " is out of range for a vocabulary of ",
           vocab_size());
  return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

uint32_t BpeTokenizer::rank_of(uint32_t left, uint32_t right) const {
  const auto it = ranks_.find(pair_key(left, right));
  return it == ranks_.end() ? UINT32_MAX : it->second;
}

// ---- encoding ----------------------------------------------------------------------------------

// The lowest-ranked adjacent pair is merged first; equal ranks (several occurrences of one pair)
// left to right. Occurrences of a pair are non-overlapping ("aaa" with a+a is "Xa"), as training
// applies a merge. Symbols form a linked list and candidate merges a min-heap of (rank, position),
// validated when popped, so a long pre-token costs O(L log L), not O(L^2).
void BpeTokenizer::merge_word(std::string_view word, std::vector<uint32_t>& out) const {
  const auto n = int32_t(word.size());
  if (n == 0) return;
  struct Symbol {
    uint32_t id;
    int32_t prev, next;  // -1: none; a merged-away symbol has id UINT32_MAX
  };
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    sym[size_t(i)] = {uint32_t(static_cast<unsigned char>(word[size_t(i)])), i - 1,
                      i + 1 < n ? i + 1 : -1};
  using Candidate = std::pair<uint32_t, int32_t>;  // (rank, left position)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0 || sym[size_t(left)].next < 0) return;
    const uint32_t r = rank_of(sym[size_t(left)].id, sym[size_t(sym[size_t(left)].next)].id);
    if (r != UINT32_MAX) heap.emplace(r, left);
  };
  for (int32_t i = 0; i + 1 < n; ++i)
    consider(i);
  while (!heap.empty()) {
    const auto [r, pos] = heap.top();
    heap.pop();
    Symbol& a = sym[size_t(pos)];
    if (a.id == UINT32_MAX || a.next < 0) continue;
    Symbol& b = sym[size_t(a.next)];
    // Stale when either side changed since it was pushed (ranks are unique per pair).
    if (merges_[r].first != a.id || merges_[r].second != b.id) continue;
    a.id = uint32_t(kByteTokens) + r;
    a.next = b.next;
    if (b.next >= 0) sym[size_t(b.next)].prev = pos;
    b.id = UINT32_MAX;
    consider(a.prev);
    consider(pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next)
    out.push_back(sym[size_t(i)].id);
}

void BpeEncoder::encode(std::string_view text, std::vector<uint32_t>& out) {
  // Pre-tokens longer than this are encoded each time: rare, and they would crowd the cache.
  constexpr size_t kMaxCachedBytes = 256;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  if (tok_->merges_.empty()) {  // byte level: every byte is its token, no pre-split needed
    out.insert(out.end(), s, s + text.size());
    return;
  }
  detail::for_each_pretoken(s, text.size(), [&](size_t b, size_t e) {
    if (e - b == 1) {  // a lone byte (a space, a punctuation mark) is its own token
      out.push_back(s[b]);
      return;
    }
    const std::string_view word = text.substr(b, e - b);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      const auto first = ids_.begin() + it->second.begin;
      out.insert(out.end(), first, first + it->second.size);
      return;
    }
    const size_t before = out.size();
    tok_->merge_word(word, out);
    if (word.size() > kMaxCachedBytes) return;
    if (cache_.size() >= kMaxCacheEntries || ids_.size() > (size_t(1) << 30)) {
      cache_.clear();
      ids_.clear();
    }
    cache_.emplace(std::string(word), Span{uint32_t(ids_.size()), uint32_t(out.size() - before)});
    ids_.insert(ids_.end(), out.begin() + std::ptrdiff_t(before), out.end());
  });
}

BpeEncoder BpeTokenizer::encoder() const {
  return BpeEncoder(*this);
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) const {
  return BpeEncoder(*this).encode(text);
}

std::vector<uint32_t> BpeTokenizer::encode_documents(std::span<const std::string> documents) const {
  BpeEncoder enc(*this);
  std::vector<uint32_t> out;
  for (const std::string& d : documents) {
    enc.encode(d, out);
    out.push_back(eot_);
  }
  return out;
}

std::string BpeTokenizer::decode(std::span<const uint32_t> ids) const {
  size_t total = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    MT_CHECK(int64_t(ids[i]) < vocab_size(), "decode: token id ", ids[i], " at position ", i,
             " is out of range for a vocabulary of ", vocab_size());
    total += offsets_[ids[i] + 1] - offsets_[ids[i]];
  }
  std::string text;
  text.reserve(total);
  for (uint32_t id : ids)
    text.append(bytes_, offsets_[id], offsets_[id + 1] - offsets_[id]);
  return text;
}

// ---- the file ----------------------------------------------------------------------------------

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kFormat = "mantissa-bpe";
constexpr int kVersion = 1;

uint64_t unsigned_of(const Json& v, const std::string& where, const std::string& what) {
  MT_CHECK(v.is_number_unsigned(), where, ": ", what, " must be a non-negative integer, not ",
           v.dump());
  return v.get<uint64_t>();
}

}  // namespace

void BpeTokenizer::save(const std::string& path) const {
  Json merges = Json::array();
  for (const auto& [l, r] : merges_)
    merges.push_back(Json::array({l, r}));
  Json specials = Json::array();
  for (size_t k = 0; k < specials_.size(); ++k) {
    specials.push_back(
        {{"id", kByteTokens + num_merges() + int64_t(k)}, {"content", specials_[k]}});
  }
  const Json doc = {{"format", kFormat},       {"version", kVersion}, {"vocab_size", vocab_size()},
                    {"pre_tokenizer", "gpt2"}, {"merges", merges},    {"special_tokens", specials}};
  // One merge per line: readable and diffable, and still one JSON document.
  std::string text = "{\n";
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    text += "  " + Json(it.key()).dump() + ": ";
    if (it.key() == "merges" || it.key() == "special_tokens") {
      text += "[";
      for (size_t i = 0; i < it->size(); ++i)
        text += (i ? ",\n    " : "\n    ") + (*it)[i].dump();
      text += it->empty() ? "]" : "\n  ]";
    } else {
      text += it->dump();
    }
    text += std::next(it) == doc.end() ? "\n" : ",\n";
  }
  text += "}\n";
  io::AtomicFile out(path, "saving tokenizer file '" + path + "'");
  out.write(text.data(), text.size());
  out.commit();
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  const std::string where = "tokenizer file '" + path + "'";
  const std::vector<uint8_t> bytes = read_file(path);
  MT_CHECK(!bytes.empty(), where, " is empty");
  Json doc;
  try {
    doc = Json::parse(bytes.begin(), bytes.end());
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number beyond a double's range ("1e999").
    MT_CHECK(false, where, " is not valid JSON: ", e.what());
  }
  MT_CHECK(doc.is_object(), where, " holds JSON but not an object");
  const auto format = doc.find("format");
  if (format == doc.end() || *format != kFormat) {
    MT_CHECK(!doc.contains("model"), where,
             " looks like a Hugging Face tokenizer.json; Mantissa reads its own format, written "
             "by 'mantissa tokenize' or BpeTokenizer::save");
    MT_CHECK(false, where, " is not a Mantissa BPE tokenizer: its \"format\" is ",
             format == doc.end() ? "missing" : format->dump(), ", expected \"", kFormat, "\"");
  }
  const auto version = doc.find("version");
  MT_CHECK(version != doc.end() && version->is_number_integer(), where,
           " has no integer \"version\"");
  MT_CHECK(*version == kVersion, where, " has format version ", version->dump(),
           "; this Mantissa reads version ", kVersion);
  const auto pre = doc.find("pre_tokenizer");
  MT_CHECK(pre == doc.end() || *pre == "gpt2", where, " asks for pre-tokenizer ", pre->dump(),
           "; Mantissa has \"gpt2\"");

  const auto jm = doc.find("merges");
  MT_CHECK(jm != doc.end() && !jm->is_null(), where, " has no \"merges\" array");
  MT_CHECK(jm->is_array(), where, ": its \"merges\" is ", jm->type_name(),
           ", not an array of [left id, right id] pairs");
  std::vector<std::pair<uint32_t, uint32_t>> merges;
  merges.reserve(jm->size());
  std::unordered_map<uint64_t, size_t> seen;
  std::vector<uint64_t> lengths(size_t(kByteTokens), 1);  // of every token so far, in bytes
  uint64_t total = uint64_t(kByteTokens);
  for (size_t r = 0; r < jm->size(); ++r) {
    const Json& m = (*jm)[r];
    const std::string what = "merge " + std::to_string(r);
    MT_CHECK(m.is_array() && m.size() == 2, where, ": ", what, " is ", m.dump(),
             ", not a pair [left id, right id]");
    const uint64_t left = unsigned_of(m[0], where, what + "'s left id");
    const uint64_t right = unsigned_of(m[1], where, what + "'s right id");
    const uint64_t defined = uint64_t(kByteTokens) + r;
    MT_CHECK(left < defined && right < defined, where, ": ", what, " ", m.dump(), " refers to id ",
             std::max(left, right),
             ", unknown at that point (a merge may use "
             "the bytes 0..255 and the ids of earlier merges, here 0..",
             defined - 1, ")");
    const auto [it, fresh] = seen.emplace(pair_key(uint32_t(left), uint32_t(right)), r);
    MT_CHECK(fresh, where, ": ", what, " ", m.dump(), " repeats merge ", it->second);
    // Lengths before any byte is stored: each merge may double the longest token.
    lengths.push_back(lengths[left] + lengths[right]);
    total += lengths.back();
    MT_CHECK(lengths.back() <= kMaxTokenBytes && total <= kMaxVocabularyBytes, where, ": ", what,
             " ", m.dump(), " makes a token of ", lengths.back(), " bytes (", total,
             " for the vocabulary so far); tokens are at most ", kMaxTokenBytes,
             " bytes and all together ", kMaxVocabularyBytes, " (a damaged or hostile file)");
    merges.emplace_back(uint32_t(left), uint32_t(right));
  }

  const auto js = doc.find("special_tokens");
  MT_CHECK(js != doc.end() && js->is_array(), where, " has no \"special_tokens\" array");
  std::vector<std::string> specials;
  for (size_t k = 0; k < js->size(); ++k) {
    const Json& t = (*js)[k];
    const std::string what = "special token " + std::to_string(k);
    MT_CHECK(t.is_object() && t.contains("id") && t.contains("content") && t["content"].is_string(),
             where, ": ", what, " is ", t.dump(), ", not {\"id\": ..., \"content\": \"...\"}");
    const uint64_t id = unsigned_of(t["id"], where, what + "'s id");
    const uint64_t expected = uint64_t(kByteTokens) + merges.size() + k;
    MT_CHECK(id == expected, where, ": ", what, " ", t.dump(), " has id ", id,
             "; special tokens follow the merges, so its id must be ", expected);
    std::string content = t["content"].get<std::string>();
    MT_CHECK(!content.empty(), where, ": ", what, " has empty content");
    MT_CHECK(std::find(specials.begin(), specials.end(), content) == specials.end(), where, ": ",
             what, " repeats \"", content, "\"");
    specials.push_back(std::move(content));
  }
  MT_CHECK(std::find(specials.begin(), specials.end(), kEndOfText) != specials.end(), where,
           " has no ", kEndOfText, " special token (documents are separated by it)");

  const auto jv = doc.find("vocab_size");
  MT_CHECK(jv != doc.end(), where, " has no \"vocab_size\"");
  const uint64_t vocab = unsigned_of(*jv, where, "vocab_size");
  const uint64_t holds = uint64_t(kByteTokens) + merges.size() + specials.size();
  MT_CHECK(vocab == holds, where, " declares vocab_size ", vocab, " but holds 256 bytes + ",
           merges.size(), " merges + ", specials.size(), " special tokens = ", holds);
  MT_CHECK(vocab <= uint64_t(UINT32_MAX), where, ": vocab_size ", vocab,
           " does not fit uint32 ids");
  return BpeTokenizer(std::move(merges), std::move(specials));
}

}  // namespace mantissa::data
