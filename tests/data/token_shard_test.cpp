// Token shards: the header byte for byte, uint16 and uint32 bodies, every malformed file named
// with what is wrong, atomic writes; TokenWindows over ids beyond uint16.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "harness/errors.h"
#include "harness/temp_dir.h"
#include "mantissa/core/error.h"
#include "mantissa/data/tokens.h"

namespace mantissa::data {
namespace {

namespace fs = std::filesystem;

using testing::error_of;

class TokenShard : public testing::TempDirTest {
 protected:
  std::string read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::string write(const std::string& name, const std::string& bytes) {
    std::ofstream(file(name), std::ios::binary) << bytes;
    return file(name);
  }
  std::vector<std::string> listing() {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  static void put32(std::string& b, size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i)
      b[at + size_t(i)] = char(v >> (8 * i));
  }
  static uint64_t get64(const std::string& b, size_t at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
      v |= uint64_t(uint8_t(b[at + size_t(i)])) << (8 * i);
    return v;
  }
};

TEST_F(TokenShard, HeaderAndUint16Body) {
  const std::vector<uint32_t> tokens = {0, 1, 4095, 256, 7};
  write_token_shard(file("a.bin"), tokens, 4096, 0x1122334455667788ull);
  const std::string b = read(file("a.bin"));
  ASSERT_EQ(b.size(), 64u + 2 * 5);
  EXPECT_EQ(b.substr(0, 8), "MTTOKENS");
  EXPECT_EQ(get64(b, 8) & 0xFFFFFFFF, 1u);      // version
  EXPECT_EQ(get64(b, 8) >> 32, 64u);            // header bytes
  EXPECT_EQ(get64(b, 16) & 0xFFFFFFFF, 4096u);  // vocabulary
  EXPECT_EQ(get64(b, 16) >> 32, 2u);            // bytes per token
  EXPECT_EQ(get64(b, 24), 5u);
  EXPECT_EQ(get64(b, 32), 0x1122334455667788ull);
  EXPECT_EQ(b.substr(40, 24), std::string(24, '\0'));
  EXPECT_EQ(uint8_t(b[64 + 4]), 0xFF);  // 4095 little-endian
  EXPECT_EQ(uint8_t(b[64 + 5]), 0x0F);

  const TokenDataset ds = load_token_shard(file("a.bin"));
  EXPECT_EQ(ds.tokens, tokens);
  EXPECT_EQ(ds.vocab_size, 4096);
  EXPECT_EQ(ds.tokenizer_fingerprint, 0x1122334455667788ull);
  EXPECT_EQ(ds.name, file("a.bin"));
  const TokenShardHeader h = read_token_shard_header(file("a.bin"));
  EXPECT_EQ(h.token_count, 5);
  EXPECT_EQ(h.token_bytes, 2);
  EXPECT_EQ(load_token_shard(file("a.bin"), 4096, 0x1122334455667788ull).size(), 5);
  // 65536 is the largest uint16 vocabulary.
  write_token_shard(file("b.bin"), std::vector<uint32_t>{65535}, 65536);
  EXPECT_EQ(read_token_shard_header(file("b.bin")).token_bytes, 2);
  EXPECT_EQ(load_token_shard(file("b.bin")).tokens[0], 65535u);
}

TEST_F(TokenShard, Uint32BodyForLargeVocabularies) {
  const std::vector<uint32_t> tokens = {0, 65536, 100255, 70000, 3};
  write_token_shard(file("big.bin"), tokens, 100256);
  EXPECT_EQ(read(file("big.bin")).size(), 64u + 4 * 5);
  const TokenDataset ds = load_token_shard(file("big.bin"), 100256);
  EXPECT_EQ(ds.tokens, tokens);
  EXPECT_EQ(read_token_shard_header(file("big.bin")).token_bytes, 4);
  // The windows carry ids beyond uint16 into I64 batches unchanged.
  const TokenWindows windows(ds, 3);
  ASSERT_EQ(windows.size(), 2);
  EXPECT_EQ(windows.get(0)[0].to_vector<int64_t>(), (std::vector<int64_t>{0, 65536, 100255}));
  EXPECT_EQ(windows.get(1)[1].to_vector<int64_t>(), (std::vector<int64_t>{100255, 70000, 3}));
  // The flat uint16 files cannot hold them.
  EXPECT_HAS(error_of([&] { write_tokens(file("flat.bin"), tokens); }), "does not fit");
  EXPECT_FALSE(fs::exists(file("flat.bin")));
}

TEST_F(TokenShard, EmptyShardIsValid) {
  write_token_shard(file("e.bin"), {}, 257);
  EXPECT_EQ(read(file("e.bin")).size(), 64u);
  const TokenDataset ds = load_token_shard(file("e.bin"));
  EXPECT_EQ(ds.size(), 0);
  EXPECT_EQ(ds.vocab_size, 257);
}

TEST_F(TokenShard, EveryBadShardIsNamedWithWhatIsWrong) {
  write_token_shard(file("good.bin"), std::vector<uint32_t>{1, 2, 3, 4}, 300, 42);
  const std::string good = read(file("good.bin"));
  auto patched = [&](const std::string& name, size_t at, uint32_t v) {
    std::string b = good;
    put32(b, at, v);
    return write(name, b);
  };
  std::string flat(10, '\0');
  struct Case {
    std::string path, expected;
  };
  const std::vector<Case> cases = {
      {file("missing.bin"), "no such file"},
      {write("empty.bin", ""), "an empty file"},
      {write("short.bin", good.substr(0, 40)), "too short"},
      {write("flat.bin", flat), "too short"},
      {write("magic.bin", "XXTOKENS" + good.substr(8)), "does not start with \"MTTOKENS\""},
      {patched("version.bin", 8, 2), "version 2"},
      {patched("hsize.bin", 12, 128), "header of 128 bytes"},
      {patched("vocab0.bin", 16, 0), "vocabulary of 0"},
      {patched("width.bin", 20, 3), "3 bytes per token"},
      {patched("narrow.bin", 16, 70000), "needs uint32"},
      {write("truncated.bin", good.substr(0, good.size() - 1)), "truncated"},
      {patched("count.bin", 24, 1000), "truncated"},
      {write("trailing.bin", good + "xy"), "2 bytes after its 4 tokens"},
      {patched("id.bin", 64 + 2, 300), "token 300 at position 1"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { load_token_shard(c.path); });
    EXPECT_HAS(msg, c.path);
    EXPECT_HAS(msg, c.expected);
  }
  fs::create_directory(file("dir.bin"));
  EXPECT_HAS(error_of([&] { load_token_shard(file("dir.bin")); }), "directory");
  // A shard read with the wrong tokenizer.
  EXPECT_HAS(error_of([&] { load_token_shard(file("good.bin"), 4096); }),
             "vocabulary of 300 tokens, not 4096");
  EXPECT_HAS(error_of([&] { load_token_shard(file("good.bin"), 300, 43); }), "another tokenizer");
  // A shard given to the reader of headerless files.
  EXPECT_HAS(error_of([&] { load_tokens(file("good.bin")); }), "load_token_shard");
}

TEST_F(TokenShard, WriteRefusesOutOfRangeIdsAndWritesNothing) {
  const std::string msg = error_of([&] {
    write_token_shard(file("x.bin"), std::vector<uint32_t>{1, 2, 300}, 300);
  });
  EXPECT_HAS(msg, "token 300 at position 2");
  EXPECT_HAS(msg, file("x.bin"));
  EXPECT_HAS(error_of([&] { write_token_shard(file("x.bin"), {}, 0); }), "vocabulary size");
  EXPECT_TRUE(listing().empty());
  EXPECT_THROW(write_token_shard(file("no/such/dir/x.bin"), {}, 10), Error);
}

TEST_F(TokenShard, FailedWriteKeepsTheOldFile) {
  const std::string path = file("a.bin");
  write_token_shard(path, std::vector<uint32_t>{1, 2, 3}, 10);
  const std::string before = read(path);
  // A file-size limit makes write() fail part way (EFBIG), as a full disk would.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    write_token_shard(path, std::vector<uint32_t>(100000, 7), 10);
  } catch (const Error& e) {
    message = e.message();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_HAS(message, "left as it was");
  EXPECT_EQ(read(path), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"a.bin"});
  EXPECT_EQ(load_token_shard(path).tokens, (std::vector<uint32_t>{1, 2, 3}));
}

}  // namespace
}  // namespace mantissa::data
