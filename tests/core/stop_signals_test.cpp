// mantissa::StopSignals: the handler runs on its own signal stack, the previous handler comes
// back, and OpenMP's threads block the signals (so the kernel delivers them to the installer).
#include "mantissa/core/stop_signals.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>

#include <atomic>
#include <csignal>
#include <vector>

namespace mantissa {
namespace {

std::atomic<int> g_seen{0};
std::atomic<bool> g_on_alt_stack{false};

void record(int sig) {
  stack_t now;
  sigaltstack(nullptr, &now);
  g_on_alt_stack = (now.ss_flags & SS_ONSTACK) != 0;
  g_seen = sig;
}

void other(int) {}

TEST(StopSignals, HandlerRunsOnItsOwnStackAndThePreviousComesBack) {
  struct sigaction before = {};
  before.sa_handler = other;
  sigemptyset(&before.sa_mask);
  struct sigaction saved_int, saved_term;
  sigaction(SIGINT, &before, &saved_int);
  sigaction(SIGTERM, &before, &saved_term);
  stack_t stack_before;  // none, or a sanitizer's own
  sigaltstack(nullptr, &stack_before);
  {
    const StopSignals stop(record);
    g_seen = 0;
    ASSERT_EQ(raise(SIGINT), 0);
    EXPECT_EQ(g_seen.load(), SIGINT);
    EXPECT_TRUE(g_on_alt_stack.load()) << "the handler ran on the interrupted thread's stack";
    g_seen = 0;
    ASSERT_EQ(raise(SIGTERM), 0);
    EXPECT_EQ(g_seen.load(), SIGTERM);
  }
  struct sigaction now;
  sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, other) << "SIGINT's previous handler is back";
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, other);
  stack_t stack;
  sigaltstack(nullptr, &stack);
  EXPECT_EQ(stack.ss_flags & SS_DISABLE, stack_before.ss_flags & SS_DISABLE)
      << "the thread's previous signal stack (or none) is back";
  if (!(stack_before.ss_flags & SS_DISABLE)) {
    EXPECT_EQ(stack.ss_sp, stack_before.ss_sp);
  }
  {
    const StopSignals sigint_only(record, /*sigterm_too=*/false);
    sigaction(SIGTERM, nullptr, &now);
    EXPECT_EQ(now.sa_handler, other) << "SIGTERM is left alone";
  }
  sigaction(SIGINT, &saved_int, nullptr);
  sigaction(SIGTERM, &saved_term, nullptr);
}

TEST(StopSignals, OpenMpThreadsBlockTheSignalsAndTheInstallerDoesNot) {
  // The pool at the size it had when StopSignals was made (a larger team later would start new
  // threads with the installer's mask: the library sets its thread count before it installs).
  const int threads = omp_get_max_threads();
  std::vector<int> blocked(size_t(threads), -1);
  {
    const StopSignals stop(record);
#pragma omp parallel num_threads(threads)
    {
      sigset_t mask;
      pthread_sigmask(SIG_BLOCK, nullptr, &mask);
      blocked[size_t(omp_get_thread_num())] = sigismember(&mask, SIGINT);
    }
  }
  EXPECT_EQ(blocked[0], 0) << "the installing thread receives SIGINT";
  for (int t = 1; t < threads; ++t) {
    if (blocked[size_t(t)] >= 0) {
      EXPECT_EQ(blocked[size_t(t)], 1) << "OpenMP thread " << t;
    }
  }
}

}  // namespace
}  // namespace mantissa
