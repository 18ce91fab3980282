// The host allocator (src/core/allocator.cpp): an allocation the machine cannot give is an error
// that says how much was asked, how much is in use and at peak, and which flags would help — not
// an abort.
#include <gtest/gtest.h>

#include <string>

#include "mantissa/core/error.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa {
namespace {

TEST(HostAllocator, OutOfMemoryNamesTheSizesAndWhatHelps) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer aborts on an impossible allocation instead of returning null";
#endif
  const Tensor held = Tensor::zeros({1 << 20}, DType::F32);  // 4 MiB in use
  try {
    const Tensor t = Tensor::empty({int64_t(1) << 56}, DType::F32);  // 2^58 bytes
    FAIL() << "allocated 2^58 bytes";
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* part : {"out of host memory", "288230376151711744 bytes", "in use", "peak",
                             "--batch-size", "--checkpoint-activations", "--opt-level O2"})
      EXPECT_NE(m.find(part), std::string::npos) << "'" << part << "' missing from: " << m;
  }
  EXPECT_EQ(held.numel(), 1 << 20);
}

}  // namespace
}  // namespace mantissa
