// Token files: flat uint16 streams and token shards (a header, then uint16 or uint32 tokens).
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "data/file_io.h"
#include "io/atomic_file.h"
#include "mantissa/core/error.h"
#include "mantissa/data/tokens.h"

namespace mantissa::data {

// Shards' uint32 tokens are read and written as memory holds them.
static_assert(std::endian::native == std::endian::little,
              "token files are little-endian, read here without swapping");

TokenDataset load_tokens(const std::string& path, int64_t vocab_size) {
  MT_CHECK(vocab_size >= 0 && vocab_size <= 65536,
           "load_tokens: vocab_size must be in 0..65536 "
           "(tokens are uint16), not ",
           vocab_size);
  const std::vector<uint8_t> bytes = read_file(path);
  MT_CHECK(bytes.size() < 8 || std::memcmp(bytes.data(), kTokenShardMagic, 8) != 0, "'", path,
           "' is a token shard (it has a header), not a flat uint16 token file: read it with "
           "load_token_shard");
  MT_CHECK(bytes.size() % 2 == 0, "'", path, "' is not a uint16 token file: its length ",
           bytes.size(), " is odd (truncated?)");
  MT_CHECK(!bytes.empty(), "'", path, "' is an empty token file");
  TokenDataset ds;
  ds.tokens.resize(bytes.size() / 2);
  uint32_t max = 0;
  for (size_t i = 0; i < ds.tokens.size(); ++i) {
    ds.tokens[i] = uint32_t(bytes[2 * i]) | uint32_t(bytes[2 * i + 1]) << 8;
    max = std::max(max, ds.tokens[i]);
  }
  if (vocab_size > 0) {
    MT_CHECK(int64_t(max) < vocab_size, "'", path, "' holds token ", max,
             ", out of range for a vocabulary of ", vocab_size);
    ds.vocab_size = vocab_size;
  } else {
    ds.vocab_size = int64_t(max) + 1;
  }
  ds.name = path;
  return ds;
}

void write_tokens(const std::string& path, std::span<const uint32_t> tokens) {
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    MT_CHECK(tokens[i] < 65536, "write_tokens '", path, "': token ", tokens[i], " at position ", i,
             " does not fit a flat uint16 file; write a token shard (write_token_shard)");
    narrow[i] = uint16_t(tokens[i]);
  }
  io::AtomicFile out(path, "writing token file '" + path + "'");
  out.write(narrow.data(), narrow.size() * sizeof(uint16_t));
  out.commit();
}

// ---- token shards ------------------------------------------------------------------------------

namespace {

void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = uint8_t(v >> (8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = uint8_t(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= uint32_t(p[i]) << (8 * i);
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= uint64_t(p[i]) << (8 * i);
  return v;
}

// Index and value of the first token >= vocab_size, or nullopt.
std::optional<std::pair<size_t, uint32_t>> first_out_of_range(std::span<const uint32_t> tokens,
                                                              int64_t vocab_size) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (int64_t(tokens[i]) >= vocab_size) return std::pair{i, tokens[i]};
  }
  return std::nullopt;
}

// An open file, closed on every path out.
struct File {
  std::FILE* f;
  ~File() {
    if (f != nullptr) std::fclose(f);
  }
};

// The header of an open shard whose size is `file_bytes`, checked against that size.
TokenShardHeader parse_header(const uint8_t* h, uint64_t file_bytes, const std::string& where) {
  MT_CHECK(std::memcmp(h, kTokenShardMagic, 8) == 0, where,
           " is not a Mantissa token shard: it does not start with \"MTTOKENS\" (a flat uint16 "
           "file without a header is read by load_tokens; a shard is made by 'mantissa "
           "tokenize')");
  TokenShardHeader hd;
  hd.version = get32(h + 8);
  MT_CHECK(hd.version == kTokenShardVersion, where, " has format version ", hd.version,
           "; this Mantissa reads version ", kTokenShardVersion,
           hd.version > kTokenShardVersion ? " (was it written by a newer Mantissa?)" : "");
  hd.header_bytes = get32(h + 12);
  MT_CHECK(hd.header_bytes == kTokenShardHeaderBytes, where, " declares a header of ",
           hd.header_bytes, " bytes; version 1 headers are ", kTokenShardHeaderBytes,
           " (corrupt header?)");
  hd.vocab_size = get32(h + 16);
  hd.token_bytes = int(get32(h + 20));
  hd.token_count = int64_t(get64(h + 24));
  hd.tokenizer_fingerprint = get64(h + 32);
  MT_CHECK(hd.vocab_size >= 1, where, " declares a vocabulary of 0 tokens (corrupt header?)");
  MT_CHECK(hd.token_bytes == 2 || hd.token_bytes == 4, where, " declares ", hd.token_bytes,
           " bytes per token; shards hold 2 (uint16) or 4 (uint32) (corrupt header?)");
  MT_CHECK(hd.token_bytes == 4 || hd.vocab_size <= 65536, where,
           " declares uint16 tokens for a "
           "vocabulary of ",
           hd.vocab_size, ", which needs uint32 (corrupt header?)");
  const uint64_t body = file_bytes - kTokenShardHeaderBytes;
  const auto count = uint64_t(hd.token_count);
  const auto width = uint64_t(hd.token_bytes);
  MT_CHECK(count <= body / width, where, " is truncated: its header announces ", count,
           " tokens of ", width, " bytes but only ", body,
           " bytes follow the header; re-create it");
  MT_CHECK(body == count * width, where, " has ", body - count * width, " bytes after its ", count,
           " tokens (trailing data, or a corrupt count)");
  return hd;
}

TokenShardHeader read_header(std::FILE* f, const std::string& path, const std::string& where) {
  struct stat st {};
  MT_CHECK(::fstat(::fileno(f), &st) == 0, "cannot stat ", where, ": ",
           std::system_category().message(errno));
  MT_CHECK(S_ISREG(st.st_mode), where, " is not a regular file");
  const auto size = uint64_t(st.st_size);
  MT_CHECK(size >= kTokenShardHeaderBytes, where, " is too short for a token shard: ", size,
           " bytes, less than its ", kTokenShardHeaderBytes, "-byte header",
           size == 0 ? " (an empty file)" : " (truncated?)");
  uint8_t h[kTokenShardHeaderBytes];
  MT_CHECK(std::fread(h, 1, sizeof(h), f) == sizeof(h), "error while reading '", path, "'");
  return parse_header(h, size, where);
}

std::FILE* open_shard(const std::string& path, const std::string& where) {
  std::error_code ec;
  MT_CHECK(std::filesystem::exists(path, ec), "cannot read ", where, ": no such file");
  MT_CHECK(!std::filesystem::is_directory(path, ec), "cannot read ", where,
           ": it is a directory, not a file");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MT_CHECK(f != nullptr, "cannot open ", where, ": ", std::system_category().message(errno));
  return f;
}

}  // namespace

void write_token_shard(const std::string& path, std::span<const uint32_t> tokens,
                       int64_t vocab_size, uint64_t tokenizer_fingerprint) {
  const std::string what = "writing token shard '" + path + "'";
  MT_CHECK(vocab_size >= 1 && vocab_size <= int64_t(UINT32_MAX), what,
           ": the vocabulary size must be in 1..2^32 - 1, not ", vocab_size);
  if (auto bad = first_out_of_range(tokens, vocab_size)) {
    MT_CHECK(false, what, ": token ", bad->second, " at position ", bad->first,
             " is out of range for a vocabulary of ", vocab_size, "; nothing was written");
  }
  const int width = vocab_size <= 65536 ? 2 : 4;
  uint8_t h[kTokenShardHeaderBytes] = {};
  std::memcpy(h, kTokenShardMagic, 8);
  put32(h + 8, kTokenShardVersion);
  put32(h + 12, kTokenShardHeaderBytes);
  put32(h + 16, uint32_t(vocab_size));
  put32(h + 20, uint32_t(width));
  put64(h + 24, tokens.size());
  put64(h + 32, tokenizer_fingerprint);

  io::AtomicFile out(path, what);
  out.write(h, sizeof(h));
  if (width == 4) {
    out.write(tokens.data(), tokens.size() * sizeof(uint32_t));
  } else {
    // Narrowed a block at a time: no second copy of a large stream.
    constexpr size_t kBlock = 1 << 16;
    std::vector<uint16_t> block(std::min(kBlock, tokens.size()));
    for (size_t i = 0; i < tokens.size(); i += kBlock) {
      const size_t n = std::min(kBlock, tokens.size() - i);
      for (size_t j = 0; j < n; ++j)
        block[j] = uint16_t(tokens[i + j]);
      out.write(block.data(), n * sizeof(uint16_t));
    }
  }
  out.commit();
}

TokenShardHeader read_token_shard_header(const std::string& path) {
  const std::string where = "token shard '" + path + "'";
  File file{open_shard(path, where)};
  return read_header(file.f, path, where);
}

TokenDataset load_token_shard(const std::string& path, int64_t expected_vocab,
                              uint64_t expected_fingerprint) {
  const std::string where = "token shard '" + path + "'";
  File file{open_shard(path, where)};
  const TokenShardHeader hd = read_header(file.f, path, where);
  MT_CHECK(expected_vocab <= 0 || expected_vocab == hd.vocab_size, where,
           " was encoded for a vocabulary of ", hd.vocab_size, " tokens, not ", expected_vocab,
           ": it does not belong to this tokenizer");
  MT_CHECK(expected_fingerprint == 0 || hd.tokenizer_fingerprint == 0 ||
               expected_fingerprint == hd.tokenizer_fingerprint,
           where, " was encoded by another tokenizer (fingerprint ", hd.tokenizer_fingerprint,
           ", this one's is ", expected_fingerprint, ") of the same vocabulary size");

  TokenDataset ds;
  ds.tokens.resize(size_t(hd.token_count));
  const size_t n = ds.tokens.size();
  if (hd.token_bytes == 4) {
    MT_CHECK(std::fread(ds.tokens.data(), 4, n, file.f) == n, "error while reading ", where,
             " (did it change while being read?)");
  } else {
    constexpr size_t kBlock = 1 << 16;
    std::vector<uint16_t> block(std::min(kBlock, n));
    for (size_t i = 0; i < n; i += kBlock) {
      const size_t m = std::min(kBlock, n - i);
      MT_CHECK(std::fread(block.data(), 2, m, file.f) == m, "error while reading ", where,
               " (did it change while being read?)");
      for (size_t j = 0; j < m; ++j)
        ds.tokens[i + j] = block[j];
    }
  }
  if (auto bad = first_out_of_range(ds.tokens, hd.vocab_size)) {
    MT_CHECK(false, where, " holds token ", bad->second, " at position ", bad->first,
             ", out of range for its vocabulary of ", hd.vocab_size, " (corrupt shard?)");
  }
  ds.vocab_size = hd.vocab_size;
  ds.tokenizer_fingerprint = hd.tokenizer_fingerprint;
  ds.name = path;
  return ds;
}

}  // namespace mantissa::data
