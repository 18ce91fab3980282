// Fuzz target: a safetensors file (checkpoints, golden data) as load_safetensors reads it -- the
// header length, the JSON header (dtypes, shapes, offsets, metadata) and every tensor's bytes.
#include <cstdint>
#include <vector>

#include "fuzz_input.h"
#include "io/safetensors_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string& path = fuzz::input_file(data, size);
  fuzz::expect_only_mantissa_errors([&] {
    const io::SafetensorsReader reader(path);
    uint64_t total = 0;
    std::vector<unsigned char> bytes;
    for (const io::SafetensorsEntry& e : reader.entries()) {
      // What the loader allocates is what the header promises and no more than the file holds.
      const uint64_t n = e.end - e.begin;
      FUZZ_REQUIRE(n == uint64_t(e.shape.numel()) * dtype_size(e.dtype), "tensor '%s'",
                   e.name.c_str());
      total += n;
      FUZZ_REQUIRE(total <= size, "tensors claim %llu bytes of a %zu-byte file",
                   (unsigned long long)total, size);
      bytes.resize(n);
      reader.read(e, bytes.data());
    }
  });
  return 0;
}
