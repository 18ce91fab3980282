// What every fuzz target shares: the input as a file (the loaders read paths, as the program
// does) and the rule that a malformed input may only ever end in a mantissa::Error.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "mantissa/core/error.h"

namespace mantissa::fuzz {

// The fuzz input written to a file of this process's own (on /dev/shm when there is one), which
// is overwritten by the next input and removed when the process exits.
inline const std::string& input_file(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string p = std::string(dir) + "/mantissa-fuzz-" + std::to_string(getpid());
    std::atexit([] { std::remove(input_file(nullptr, 0).c_str()); });
    return p;
  }();
  if (data == nullptr) return path;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
  return path;
}

// Runs `parse`; a mantissa::Error is the expected answer to a malformed input, anything else
// that escapes (std::bad_alloc, std::length_error, a library's own exception) is a finding.
template <typename F>
void expect_only_mantissa_errors(F&& parse) {
  try {
    parse();
  } catch (const mantissa::Error&) {
  } catch (const std::exception& e) {
    std::fprintf(stderr, "an exception other than mantissa::Error escaped: %s\n", e.what());
    std::abort();
  }
}

// A property the parser promises broke: report and stop (libFuzzer saves the input).
#define FUZZ_REQUIRE(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) {                                               \
      std::fprintf(stderr, "fuzz property failed: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                         \
      std::fprintf(stderr, "\n");                                \
      std::abort();                                              \
    }                                                            \
  } while (0)

}  // namespace mantissa::fuzz
