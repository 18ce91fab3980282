#include "mantissa/io/safetensors.h"
#include "harness/temp_dir.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mantissa/core/error.h"

namespace mantissa {
namespace {

namespace fs = std::filesystem;

class Safetensors : public testing::TempDirTest {
 protected:
  // Every file in the directory: a failed save must leave no temporary file behind.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = char((v >> (8 * i)) & 0xFF);
  return s;
}

// A file made by hand: the header text as given (no padding), then `data`.
std::string handmade(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

std::string raw_bytes(const Tensor& t) {
  Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

// One (2, 3) tensor per dtype, with values every format holds exactly.
NamedTensors one_of_each_dtype() {
  NamedTensors out;
  for (const DTypeInfo& info : kDTypeTable) {
    std::vector<double> v;
    for (int i = 0; i < 6; ++i) {
      if (info.dtype == DType::Bool) {
        v.push_back(i % 3 == 0);
      } else if (info.dtype == DType::U8) {
        v.push_back(40 * i);
      } else if (info.is_float) {
        v.push_back((i - 3) / 2.0);
      } else {
        v.push_back(3 * i - 5);
      }
    }
    out.emplace_back(std::string(info.safetensors), Tensor::from_vector(v, {2, 3}, info.dtype));
  }
  return out;
}

// Loading `path` throws a mantissa::Error that names the file and says `problem`.
void expect_refused(const std::string& path, const std::string& problem) {
  try {
    load_safetensors(path);
    ADD_FAILURE() << "loading " << path << " did not throw (expected: " << problem << ")";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(problem), std::string::npos)
        << "expected '" << problem << "' in: " << e.message();
  }
}

TEST_F(Safetensors, RoundTripsEveryDType) {
  auto tensors = one_of_each_dtype();
  tensors.emplace_back("scalar", Tensor::scalar(-7.25, DType::F64));
  tensors.emplace_back("empty", Tensor::zeros({0, 5}, DType::BF16));
  tensors.emplace_back("transposed", Tensor::arange(12, DType::I32).view({3, 4}).t());
  const std::map<std::string, std::string> metadata = {{"step", "42"}, {"format", "pt"}};
  save_safetensors(file("a.safetensors"), tensors, metadata);

  const SafetensorsFile back = load_safetensors(file("a.safetensors"));
  EXPECT_EQ(back.metadata, metadata);
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, want] = tensors[i];
    const auto& [got_name, got] = back.tensors[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(got_name, name) << "tensors come back in the order they were saved";
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_EQ(got.shape(), want.shape());
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(raw_bytes(got), raw_bytes(want)) << "bit-exact";
  }
  EXPECT_EQ(back.at("transposed").to_vector<double>(),
            (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(back.find("missing"), nullptr);
  EXPECT_THROW(back.at("missing"), Error);
}

TEST_F(Safetensors, WritesTheExactFormat) {
  save_safetensors(file("a.safetensors"),
                   {{"w", Tensor::from_vector(std::vector<float>{1.5f, -2.0f}, {2})},
                    {"b", Tensor::from_vector(std::vector<int64_t>{7}, {1})}},
                   {{"k", "v"}});
  const std::string bytes = read_bytes(file("a.safetensors"));
  const std::string header =
      R"({"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})";
  const size_t padded = (header.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes.size(), 8 + padded + 16);
  EXPECT_EQ(bytes.substr(0, 8), le64(padded));
  EXPECT_EQ(bytes.substr(8, padded), header + std::string(padded - header.size(), ' '));
  float w[2];
  std::memcpy(w, bytes.data() + 8 + padded, 8);
  EXPECT_EQ(w[0], 1.5f);
  EXPECT_EQ(w[1], -2.0f);
  int64_t b;
  std::memcpy(&b, bytes.data() + 8 + padded + 8, 8);
  EXPECT_EQ(b, 7);
}

TEST_F(Safetensors, EmptyFileHasNoMetadataKey) {
  save_safetensors(file("a.safetensors"), {});
  EXPECT_EQ(read_bytes(file("a.safetensors")), le64(8) + "{}      ");
  const SafetensorsFile back = load_safetensors(file("a.safetensors"));
  EXPECT_TRUE(back.tensors.empty());
  EXPECT_TRUE(back.metadata.empty());
}

TEST_F(Safetensors, RefusesBadTensorLists) {
  const std::string path = file("a.safetensors");
  save_safetensors(path, {{"x", Tensor::ones({3})}});
  const std::string before = read_bytes(path);
  EXPECT_THROW(save_safetensors(path, {{"x", Tensor::ones({2})}, {"x", Tensor::ones({2})}}), Error);
  EXPECT_THROW(save_safetensors(path, {{"__metadata__", Tensor::ones({2})}}), Error);
  EXPECT_THROW(save_safetensors(path, {{"u", Tensor()}}), Error);
  EXPECT_THROW(save_safetensors(path, {{std::string("\xff\xfe"), Tensor::ones({2})}}), Error);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"a.safetensors"});
}

TEST_F(Safetensors, FailedWriteKeepsTheOldFile) {
  const std::string path = file("a.safetensors");
  save_safetensors(path, {{"x", Tensor::ones({3})}});
  const std::string before = read_bytes(path);

  // A file-size limit makes write() fail part way (EFBIG), as a full disk would.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    save_safetensors(path, {{"big", Tensor::ones({100000})}});
  } catch (const Error& e) {
    message = e.message();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);

  EXPECT_NE(message.find("left as it was"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"a.safetensors"});
  EXPECT_EQ(load_safetensors(path).at("x").to_vector<float>(), (std::vector<float>{1, 1, 1}));
}

// A real full disk: a 64 KiB tmpfs mounted for the test (root only; skipped where mounting is
// not allowed). The second save runs out of space half way.
TEST_F(Safetensors, AFullDiskKeepsTheOldFileAndSaysSo) {
  const std::string disk = file("disk");
  fs::create_directory(disk);
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=64k") != 0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno)
                 << "): needs root; the RLIMIT_FSIZE test above covers the same path";
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{disk};
  const std::string path = disk + "/run.safetensors";
  save_safetensors(path, {{"x", Tensor::ones({1000})}});
  const std::string before = read_bytes(path);
  std::string message;
  try {
    save_safetensors(path, {{"x", Tensor::ones({100000})}});  // 400 KB on a 64 KiB disk
  } catch (const Error& e) {
    message = e.message();
  }
  EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
  EXPECT_NE(message.find("'" + path + "' was left as it was"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(disk), fs::directory_iterator()), 1)
      << "no temporary file is left to fill the disk";
}

TEST_F(Safetensors, FailedRenameLeavesNoTemporaryFile) {
  fs::create_directory(file("d"));
  EXPECT_THROW(save_safetensors(file("d"), {{"x", Tensor::ones({3})}}), Error);
  EXPECT_EQ(listing(), std::vector<std::string>{"d"});
  EXPECT_THROW(save_safetensors(file("no/such/dir/a.safetensors"), {}), Error);
}

TEST_F(Safetensors, OverwritesAnExistingFile) {
  const std::string path = file("a.safetensors");
  save_safetensors(path, {{"x", Tensor::ones({300})}});
  save_safetensors(path, {{"y", Tensor::zeros({2}, DType::I32)}});
  const SafetensorsFile back = load_safetensors(path);
  ASSERT_EQ(back.tensors.size(), 1u);
  EXPECT_EQ(back.tensors[0].first, "y");
  EXPECT_EQ(listing(), std::vector<std::string>{"a.safetensors"});
}

// ---- corrupted files ---------------------------------------------------------------------------

TEST_F(Safetensors, RefusesMissingFile) {
  expect_refused(file("nothing.safetensors"), "cannot open");
  expect_refused(dir_.string(), "not a regular file");
}

TEST_F(Safetensors, RefusesFileShorterThanTheHeaderLength) {
  write_bytes(file("a"), "");
  expect_refused(file("a"), "shorter than the 8-byte header length");
  write_bytes(file("a"), "\x10\x00\x00");
  expect_refused(file("a"), "shorter than the 8-byte header length");
}

TEST_F(Safetensors, RefusesHeaderLengthBeyondTheFile) {
  write_bytes(file("a"), le64(1000) + "{}");
  expect_refused(file("a"), "header length 1000 runs past the end of the file");
  write_bytes(file("a"), le64(~uint64_t(0)) + "{}");
  expect_refused(file("a"), "runs past the end of the file");
}

TEST_F(Safetensors, RefusesInvalidJson) {
  write_bytes(file("a"), handmade(R"({"x": {"dtype": "F32", )", ""));
  expect_refused(file("a"), "not valid JSON");
  write_bytes(file("a"), handmade(R"({"x": 1} trailing)", ""));
  expect_refused(file("a"), "not valid JSON");
  write_bytes(file("a"), handmade(R"(["x"])", ""));
  expect_refused(file("a"), "does not start with '{'");
  write_bytes(file("a"), handmade(std::string("{\"\xff\": 1}"), ""));
  expect_refused(file("a"), "not valid JSON");
}

TEST_F(Safetensors, RefusesUnknownDType) {
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})",
                                  std::string(16, '\0')));
  expect_refused(file("a"), "unknown dtype 'F128'");
  write_bytes(file("a"), handmade(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", "abcd"));
  expect_refused(file("a"), "no \"dtype\"");
}

TEST_F(Safetensors, RefusesShapeThatDisagreesWithTheOffsets) {
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                                  std::string(20, '\0')));
  expect_refused(file("a"), "needs 24 bytes but data_offsets [0, 20] hold 20");
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                                  std::string(4, '\0')));
  expect_refused(file("a"), "non-negative integer");
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
                                  std::string(4, '\0')));
  expect_refused(file("a"), "non-negative integer");
  write_bytes(
      file("a"),
      handmade(R"({"x":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}})", "z"));
  expect_refused(file("a"), "at most 8");
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"U8","shape":[4294967296,4294967296],)"
                                  R"("data_offsets":[0,1]}})",
                                  "z"));
  expect_refused(file("a"), "impossibly large shape");
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[1]}})", "z"));
  expect_refused(file("a"), "no \"data_offsets\" pair");
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}})", "z"));
  expect_refused(file("a"), "reversed data_offsets");
}

TEST_F(Safetensors, RefusesOffsetsOutsideTheData) {
  write_bytes(file("a"),
              handmade(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[100,104]}})", "abcd"));
  expect_refused(file("a"), "outside the 4 bytes after the header");
}

TEST_F(Safetensors, RefusesOverlappingTensors) {
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                  R"("y":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                                  "abcd"));
  expect_refused(file("a"), "tensors 'x' and 'y' overlap");
}

TEST_F(Safetensors, RefusesHolesAndTrailingBytes) {
  write_bytes(file("a"),
              handmade(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})", "abcd"));
  expect_refused(file("a"), "bytes [0, 2) of the data belong to no tensor");
  write_bytes(file("a"),
              handmade(R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "abcd"));
  expect_refused(file("a"), "2 bytes after the last tensor's data belong to no tensor");
}

TEST_F(Safetensors, RefusesTruncatedData) {
  const std::string path = file("a.safetensors");
  save_safetensors(path, one_of_each_dtype());
  const std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 3));
  expect_refused(path, "the data is truncated");
}

TEST_F(Safetensors, RefusesOtherMalformedHeaders) {
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                  R"("x":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                  "ab"));
  expect_refused(file("a"), "names 'x' twice");
  write_bytes(file("a"), handmade(R"({"__metadata__":{"k":1}})", ""));
  expect_refused(file("a"), "metadata 'k' is 1, not a string");
  write_bytes(file("a"), handmade(R"({"__metadata__":[]})", ""));
  expect_refused(file("a"), "must be an object of strings");
  write_bytes(file("a"), handmade(R"({"x":[0,1]})", "a"));
  expect_refused(file("a"), "tensor 'x' is described by [0,1]");
  write_bytes(file("a"), handmade(R"({"x":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                                  std::string("\x01\x07", 2)));
  expect_refused(file("a"), "BOOL tensor 'x' holds 7 at element 1");
}

// No damage to a valid file may crash the reader or throw anything but mantissa::Error.
TEST_F(Safetensors, SurvivesEveryTruncationAndRandomDamage) {
  const std::string path = file("a.safetensors");
  save_safetensors(path,
                   {{"w", Tensor::ones({2, 3})},
                    {"mask", Tensor::ones({4}, DType::Bool)},
                    {"h", Tensor::ones({3}, DType::BF16)}},
                   {{"k", "v"}});
  const std::string good = read_bytes(path);
  const std::string bad = file("bad.safetensors");

  for (size_t n = 0; n < good.size(); ++n) {
    write_bytes(bad, good.substr(0, n));
    EXPECT_THROW(load_safetensors(bad), Error) << "truncated to " << n << " bytes";
  }
  std::vector<size_t> digits;  // where damage keeps the JSON valid but changes shapes and offsets
  for (size_t i = 8; i < good.size(); ++i) {
    if (good[i] >= '0' && good[i] <= '9') digits.push_back(i);
  }
  std::mt19937_64 rng(7);
  int loaded = 0;
  const int trials = 1500;
  for (int trial = 0; trial < trials; ++trial) {
    std::string damaged = good;
    const int changes = 1 + int(rng() % 3);
    for (int c = 0; c < changes; ++c) {
      if (trial % 2 == 0) {
        damaged[digits[rng() % digits.size()]] = char('0' + rng() % 10);
      } else {
        damaged[rng() % damaged.size()] = char(rng() & 0xFF);
      }
    }
    write_bytes(bad, damaged);
    try {
      load_safetensors(bad);
      ++loaded;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "trial " << trial << " threw a non-mantissa exception: " << e.what();
    }
  }
  EXPECT_LT(loaded, trials) << "damage was noticed at least sometimes";
}

// ---- against the reference implementation (Python's safetensors package) ----------------------

#ifndef MANTISSA_PYTHON
#define MANTISSA_PYTHON ""
#endif
#ifndef MANTISSA_REFERENCE_DIR
#define MANTISSA_REFERENCE_DIR ""
#endif

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s)
    q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The command prefix that runs the check script, or why it cannot run.
std::string python_check(std::string* why) {
  const std::string python = MANTISSA_PYTHON;
  const std::string script = std::string(MANTISSA_REFERENCE_DIR) + "/safetensors_check.py";
  if (python.empty() || python.find("NOTFOUND") != std::string::npos) {
    *why = "no Python was found at configure time (set MANTISSA_PYTHON)";
    return {};
  }
  if (!fs::exists(script)) {
    *why = "the check script " + script + " is missing";
    return {};
  }
  const std::string probe =
      quoted(python) + " -c 'import numpy, ml_dtypes, safetensors' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0) {
    *why =
        python + " lacks numpy, ml_dtypes or safetensors (run scripts/setup, or pip install them)";
    return {};
  }
  return quoted(python) + " " + quoted(script);
}

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char b : bytes)
    h = (h ^ b) * 0x100000001B3ull;
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

TEST_F(Safetensors, PythonReadsWhatMantissaWrites) {
  std::string why;
  const std::string check = python_check(&why);
  if (check.empty()) GTEST_SKIP() << "skipped: " << why;

  auto tensors = one_of_each_dtype();
  tensors.emplace_back("scalar", Tensor::scalar(2.5));
  tensors.emplace_back("empty", Tensor::zeros({0, 4}, DType::F16));
  tensors.emplace_back("strided", Tensor::arange(12, DType::F64).view({3, 4}).t());
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "\u00e9t\u00e9"}};
  const std::string path = file("mantissa.safetensors");
  save_safetensors(path, tensors, metadata);

  const std::string out = file("report.json");
  const std::string cmd = check + " read " + quoted(path) + " > " + quoted(out);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto report = nlohmann::json::parse(read_bytes(out));
  using StringMap = std::map<std::string, std::string>;
  EXPECT_EQ(report["metadata"].get<StringMap>(), metadata);
  ASSERT_EQ(report["tensors"].size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    const auto& r = report["tensors"][i];
    SCOPED_TRACE(name);
    EXPECT_EQ(r["name"], name);
    EXPECT_EQ(r["dtype"], std::string(dtype_info(t.dtype()).safetensors));
    EXPECT_EQ(r["shape"].get<std::vector<int64_t>>(), t.shape().vec());
    EXPECT_EQ(r["fnv1a64"], hex64(fnv1a64(raw_bytes(t))));
    double sum = 0;
    for (double v : t.to_vector<double>())
      sum += v;  // exact: few, dyadic values
    EXPECT_EQ(r["sum"].get<double>(), sum);
  }
}

TEST_F(Safetensors, MantissaReadsWhatPythonWrites) {
  std::string why;
  const std::string check = python_check(&why);
  if (check.empty()) GTEST_SKIP() << "skipped: " << why;

  const std::string path = file("python.safetensors");
  const std::string cmd = check + " write " + quoted(path);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  const SafetensorsFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"writer", "safetensors.numpy"},
                                                            {"note", "\u00e9t\u00e9"}}));
  EXPECT_EQ(f.tensors.size(), size_t(kNumDTypes) + 2);
  for (const auto& [name, want] : one_of_each_dtype()) {
    SCOPED_TRACE(name);
    const Tensor& got = f.at(name);
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_EQ(got.shape(), want.shape());
    EXPECT_EQ(raw_bytes(got), raw_bytes(want));
    EXPECT_EQ(got.to_vector<double>(), want.to_vector<double>());
  }
  EXPECT_EQ(f.at("scalar").shape(), Shape{});
  EXPECT_EQ(f.at("scalar").item(), 2.5);
  EXPECT_EQ(f.at("empty").shape(), (Shape{0, 4}));
  EXPECT_EQ(f.at("empty").dtype(), DType::F32);
}

}  // namespace
}  // namespace mantissa
