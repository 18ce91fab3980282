// Internal: the reading half of the safetensors format, without tensors. SafetensorsReader opens a
// file, checks the header length against the file's size, parses the JSON header and checks that
// the tensors tile the data exactly; read() then copies one tensor's bytes into memory the caller
// owns. load_safetensors (safetensors.cpp) allocates the tensors; the fuzz target
// (fuzz/safetensors_fuzz.cpp) reads into plain buffers, so it links without the tensor library.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mantissa/core/dtype.h"
#include "mantissa/core/shape.h"

namespace mantissa::io {

// The header key of the metadata map (strings to strings); no tensor may be called so.
inline constexpr char kSafetensorsMetadataKey[] = "__metadata__";

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;  // data_offsets, relative to the end of the header
  uint64_t end;
};

class SafetensorsReader {
 public:
  // Throws a mantissa::Error naming the file and the problem for anything not well formed. Every
  // size is checked against the file's length before memory is allocated for it.
  explicit SafetensorsReader(const std::string& path);
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads the end - begin bytes of `e` (one of entries()) into `dst`; a BOOL tensor's bytes must
  // be 0 or 1.
  void read(const SafetensorsEntry& e, void* dst) const;

 private:
  std::string path_, where_;
  struct File {  // closed on every way out, a constructor that throws half way included
    int fd = -1;
    File() = default;
    File(const File&) = delete;
    File& operator=(const File&) = delete;
    ~File();
  };
  File file_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mantissa::io
