// Linked into every test program (tests/CMakeLists.txt, mantissa_test): counts the tests that
// skipped themselves for want of a GPU (MT_REQUIRE_CUDA) and ends the program's output with one
// line, "N GPU tests skipped: no CUDA device", instead of leaving only gtest's list of names.
// scripts/test adds these lines up over a whole ctest run, which runs each test on its own.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "backend/cuda_test_util.h"

namespace {

class GpuSkipSummary : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo& info) override {
    const testing::TestResult& r = *info.result();
    if (!r.Skipped()) return;
    for (int i = 0; i < r.total_part_count(); ++i) {
      const testing::TestPartResult& part = r.GetTestPartResult(i);
      if (part.skipped() && std::string(part.message()).starts_with(MT_NO_CUDA_DEVICE)) {
        ++skipped_;
        return;
      }
    }
  }
  void OnTestProgramEnd(const testing::UnitTest&) override {
    if (skipped_ == 0) return;
    std::printf("%d GPU test%s skipped: " MT_NO_CUDA_DEVICE "\n", skipped_,
                skipped_ == 1 ? "" : "s");
    std::fflush(stdout);
  }
  int skipped_ = 0;
};

// Registered before main: the programs use gtest_main. gtest owns and deletes the listener.
const bool registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new GpuSkipSummary);
  return true;
}();

}  // namespace
