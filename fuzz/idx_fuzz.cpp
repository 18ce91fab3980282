// Fuzz target: an IDX file (the MNIST container of Fashion-MNIST), gzip-compressed or raw, read as
// labels (1 dim), images (3 dims) and the other ranks read_idx takes.
#include <cstdint>

#include "fuzz_input.h"
#include "mantissa/data/images.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string& path = fuzz::input_file(data, size);
  for (int dims = 1; dims <= 4; ++dims) {
    fuzz::expect_only_mantissa_errors([&] {
      const data::IdxArray a = data::read_idx(path, dims);
      FUZZ_REQUIRE(a.dims.size() == size_t(dims), "%zu dims read for %d", a.dims.size(), dims);
      uint64_t count = 1;
      for (int64_t d : a.dims)
        count *= uint64_t(d);
      FUZZ_REQUIRE(count == a.data.size(), "dims hold %llu bytes, data %zu",
                   (unsigned long long)count, a.data.size());
    });
  }
  return 0;
}
