// SIGTERM / SIGINT handling of the training loop (see stop_signals.h).
#include "train/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace trillion {
namespace {

volatile sig_atomic_t g_received = 0;  // the first signal's number
struct sigaction g_previous_term, g_previous_int;

// Async-signal-safe: a flag and a write(2) for the first signal, _exit for the second.
void on_stop_signal(int signal) {
  if (g_received != 0) _exit(128 + signal);
  g_received = signal;
  const char message[] = "trillion: stop requested; finishing this step and writing a checkpoint (signal again to exit now)\n";
  const ssize_t ignored = write(STDERR_FILENO, message, sizeof(message) - 1);
  (void)ignored;
}

}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);  // the handler runs with both signals blocked: a second waits for the first
  sigaddset(&action.sa_mask, SIGTERM);
  sigaddset(&action.sa_mask, SIGINT);
  action.sa_flags = SA_RESTART;  // interrupted system calls (a checkpoint's writes) carry on
  sigaction(SIGTERM, &action, &g_previous_term);
  sigaction(SIGINT, &action, &g_previous_int);
}

StopSignals::~StopSignals() {
  sigaction(SIGTERM, &g_previous_term, nullptr);
  sigaction(SIGINT, &g_previous_int, nullptr);
}

int StopSignals::received() const { return g_received; }

bool StopSignals::stop_requested(const ProcessGroup& world) const {
  const double mine = g_received != 0 ? 1.0 : 0.0;
  return (world.size() > 1 ? world.all_reduce_sum(mine) : mine) > 0.0;
}

}  // namespace trillion
