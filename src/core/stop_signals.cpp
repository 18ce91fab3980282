#include "mantissa/core/stop_signals.h"

#include <omp.h>
#include <pthread.h>

#include "mantissa/core/error.h"

namespace mantissa {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM};
constexpr size_t kStackBytes = size_t(64) * 1024;

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  for (const int sig : kSignals)
    sigaddset(&s, sig);
  return s;
}

}  // namespace

void block_stop_signals_on_this_thread() {
  const sigset_t s = stop_set();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
}

StopSignals::StopSignals(void (*handler)(int), bool sigterm_too)
    : count_(sigterm_too ? 2 : 1), stack_(new char[kStackBytes]) {
  // OpenMP's pool threads (started by the first parallel region, or by this one) block the
  // signals; the calling thread is the pool's master and keeps them.
#pragma omp parallel
  {
    if (omp_get_thread_num() != 0) block_stop_signals_on_this_thread();
  }
  stack_t ss = {};
  ss.ss_sp = stack_;
  ss.ss_size = kStackBytes;
  if (sigaltstack(&ss, &previous_stack_) != 0) {
    delete[] stack_;
    MT_CHECK(false, "could not set a signal stack for the stop signals");
  }
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sa.sa_flags = SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < count_; ++i)
    sigaction(kSignals[i], &sa, &previous_[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < count_; ++i)
    sigaction(kSignals[i], &previous_[i], nullptr);
  // A signal stack cannot be changed while it is in use; the handler has returned by now.
  sigaltstack(&previous_stack_, nullptr);
  delete[] stack_;
}

}  // namespace mantissa
