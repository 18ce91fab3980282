#include "io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <system_error>
#include <utility>

#include "mantissa/core/error.h"

namespace mantissa::io {
namespace {

std::string errno_text(int e) {
  return std::system_category().message(e);
}

// Makes the rename itself durable. Best effort: the new file is already in place, and some file
// systems cannot sync a directory.
void sync_directory(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

// Removes the temporary files of `path` (PATH.tmp.<pid>.<stamp>.<n>) that a process which no
// longer exists left behind: killed while it wrote (kill -9, a power cut), it could not remove
// them. A live process's are left alone (another run may be writing the same file), and so is
// any name this did not write. Best effort: errors are ignored.
void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const size_t digits_end = name.find('.', prefix.size());
    if (digits_end == std::string::npos || digits_end == prefix.size() ||
        digits_end - prefix.size() > 9)
      continue;
    pid_t pid = 0;
    bool numeric = true;
    for (size_t i = prefix.size(); i < digits_end; ++i) {
      numeric = numeric && name[i] >= '0' && name[i] <= '9';
      pid = pid * 10 + (name[i] - '0');
    }
    if (!numeric || pid <= 0 || pid == ::getpid()) continue;
    // ESRCH: no such process. EPERM (someone else's live process) or success: leave it.
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove(it->path(), rm);
  }
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {
  remove_stale_temporaries(path_);
  static std::atomic<uint64_t> counter{0};
  const auto stamp = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int attempt = 0; attempt < 100; ++attempt) {
    tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(stamp) + "." +
           std::to_string(counter.fetch_add(1));
    // 0666 less the umask: the permissions a plain new file would get.
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ >= 0) return;
    const int e = errno;
    if (e == EEXIST) continue;
    tmp_.clear();  // nothing was created
    MT_CHECK(false, what_, ": cannot create a temporary file in its directory: ", errno_text(e));
  }
  tmp_.clear();
  MT_CHECK(false, what_, ": no free temporary file name");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty() && !committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t n) {
  MT_ASSERT(fd_ >= 0 && !committed_, "AtomicFile::write after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    const int e = errno;
    MT_CHECK(w > 0, what_, ": writing '", tmp_, "' failed: ", w < 0 ? errno_text(e) : "no progress",
             " (is the disk full?); '", path_, "' was left as it was");
    p += w;
    n -= size_t(w);
  }
}

void AtomicFile::commit() {
  MT_ASSERT(fd_ >= 0 && !committed_, "AtomicFile::commit twice");
  // The bytes must be on disk before the rename makes them the file: a crash in between must not
  // leave an empty or partial file under the final name.
  if (::fsync(fd_) != 0) {
    const int e = errno;
    MT_CHECK(false, what_, ": syncing '", tmp_, "' failed: ", errno_text(e), "; '", path_,
             "' was left as it was");
  }
  // Closes now, reporting the error close() can give (deferred write errors on some systems).
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) {
    const int e = errno;
    MT_CHECK(false, what_, ": closing '", tmp_, "' failed: ", errno_text(e), "; '", path_,
             "' was left as it was");
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    MT_CHECK(false, what_, ": cannot replace it: ", errno_text(e));
  }
  committed_ = true;
  sync_directory(path_);
}

}  // namespace mantissa::io
