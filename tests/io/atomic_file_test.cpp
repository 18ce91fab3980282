// AtomicFile (src/io/atomic_file.cpp): the temporary files that a killed writer left behind are
// removed by the next writer of the same target when their process no longer exists, and only
// then: a live process's, this process's own, another target's and foreign names stay.
#include "io/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace mantissa::io {
namespace {

namespace fs = std::filesystem;

// The pid of a child that has exited and been reaped: no process has it (until the kernel hands
// it out again, far in the future on a machine that is not forking thousands of processes).
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

void touch(const fs::path& p) {
  std::ofstream(p) << "partial";
}

TEST(AtomicFile, RemovesTheTemporariesOfDeadWritersOnly) {
  const fs::path dir = fs::temp_directory_path() / ("mt_atomic_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string dead = std::to_string(dead_pid());
  const fs::path stale = dir / ("run.safetensors.tmp." + dead + ".123.0");
  const fs::path live = dir / ("run.safetensors.tmp." + std::to_string(::getppid()) + ".123.0");
  const fs::path mine = dir / ("run.safetensors.tmp." + std::to_string(::getpid()) + ".9.9");
  const fs::path other_target = dir / ("other.safetensors.tmp." + dead + ".123.0");
  const fs::path foreign = dir / "run.safetensors.tmp.notapid.1";
  for (const fs::path& p : {stale, live, mine, other_target, foreign})
    touch(p);

  AtomicFile f((dir / "run.safetensors").string(), "test");
  EXPECT_FALSE(fs::exists(stale)) << "a dead writer's temporary file stayed";
  EXPECT_TRUE(fs::exists(live)) << "a live process's temporary file was removed";
  EXPECT_TRUE(fs::exists(mine));
  EXPECT_TRUE(fs::exists(other_target));
  EXPECT_TRUE(fs::exists(foreign));
  const std::string data = "complete";
  f.write(data.data(), data.size());
  f.commit();
  std::ifstream in(dir / "run.safetensors");
  std::string back;
  in >> back;
  EXPECT_EQ(back, data);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mantissa::io
