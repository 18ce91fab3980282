// The safetensors file format (https://github.com/huggingface/safetensors): what checkpoints and
// the golden test data are stored in, readable by PyTorch, JAX and numpy without Mantissa.
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON, then the tensors' bytes.
// The header maps each name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets into the
// data that follows it) and an optional "__metadata__" map of strings to strings. The dtype tags
// are the last column of MT_FORALL_DTYPES (F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 U8 BOOL).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mantissa/tensor/tensor.h"

namespace mantissa {

// Writes `tensors` (any layout and device; stored contiguous, in this order) and `metadata` to
// `path`. Atomic: the bytes go to a temporary file in the same directory, which is synced and
// then renamed over `path`, so a failure (full disk, bad tensor, crash) leaves any earlier file
// at `path` intact. Names must be unique and not "__metadata__".
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // CPU, contiguous, in the header's order
  std::map<std::string, std::string> metadata;

  // The tensor called `name`, or nullptr.
  const Tensor* find(std::string_view name) const;
  // The tensor called `name`; throws listing the names there are.
  const Tensor& at(std::string_view name) const;
};

// Reads a whole safetensors file into CPU tensors. A file that is missing, truncated or not
// well formed is refused with a mantissa::Error naming the file and the problem; no corruption
// makes it read outside the file or crash.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace mantissa
