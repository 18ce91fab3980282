// Internal: a file written whole or not at all. The bytes go to a temporary file in the target's
// directory (so rename() is atomic), which is synced and renamed over the target on commit();
// a failure before that (full disk, bad data found half way, a crash) leaves any earlier file at
// the target untouched and no temporary file behind. A process killed while it wrote (kill -9)
// cannot clean up: the next AtomicFile of the same target removes the temporary files of
// processes that no longer exist. safetensors checkpoints and token shards are written this way.
#pragma once

#include <cstddef>
#include <string>

namespace mantissa::io {

class AtomicFile {
 public:
  // `what` starts every error message, e.g. "saving safetensors file 'a.safetensors'".
  // Creates the temporary file now: an unwritable directory is reported before any work.
  AtomicFile(std::string path, std::string what);
  // Removes the temporary file unless commit() renamed it into place. Never throws.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  // fsync, close, rename over the target, then sync the directory (best effort).
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, what_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace mantissa::io
