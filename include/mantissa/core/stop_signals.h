// Catching SIGINT and SIGTERM to stop a run cleanly (`mantissa train`, Python's Trainer.fit):
// where a handler may run, and the threads it must not run on.
//
// A signal handler runs on the stack of the thread the kernel picks, below that thread's stack
// pointer. Run there, on the library's compute threads, it corrupted the heap: Ctrl-C during
// `mantissa train --model mlp --data synthetic` aborted ("corrupted double-linked list",
// "free(): invalid pointer", in the first free after the stop) in 4 of 20 runs on an AVX2 machine,
// with the data-loader workers off too (3 of 20), and in 0 of 30 once the handler ran on an
// alternate stack. So the handler runs on a stack of its own, on the thread that installs it, and
// the threads the library starts (OpenMP's, the data loader's, the communicator's) block these
// signals, so that the kernel delivers them to that thread.
#pragma once

#include <csignal>

namespace mantissa {

// While alive, SIGINT (and SIGTERM unless sigterm_too is false) run `handler` on an alternate
// stack of the constructing thread, which must be the one that waits for the run (normally the
// main thread). OpenMP's pool, at the size it has then (set the thread count first), is made to
// block them. The previous handlers and the thread's signal stack come back at destruction. The
// handler must be async-signal-safe (set an atomic flag, write(2)).
class StopSignals {
 public:
  explicit StopSignals(void (*handler)(int), bool sigterm_too = true);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  int count_;  // SIGINT, then SIGTERM when it is caught too
  struct sigaction previous_[2];
  stack_t previous_stack_;
  char* stack_;
};

// Blocks SIGINT and SIGTERM on the calling thread: the first thing each of the library's helper
// threads does.
void block_stop_signals_on_this_thread();

}  // namespace mantissa
