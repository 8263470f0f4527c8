// The stop-signal flag and its handlers (stop_signal.hpp).
#include "train/stop_signal.hpp"

#include <atomic>
#include <csignal>

namespace scape::train {
namespace {

std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler stores into it");

extern "C" void on_stop_signal(int signal) {
  int none = 0;
  if (!g_stop.compare_exchange_strong(none, signal)) {
    // A second signal: the user means it. Default action, re-raised (both async-signal-safe).
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // reads and writes in flight go on; the loop looks at the flag
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int stop_signal() { return g_stop.load(); }

namespace {
StopRequest g_noted;  // rank 0's exchange thread writes it; its run log reads it on that thread
}  // namespace

StopRequest stop_request() { return g_noted.signal != 0 ? g_noted : StopRequest{stop_signal(), -1}; }

void note_stop_signal(int signal, int rank) {
  if (g_noted.signal == 0 && signal != 0) g_noted = {signal, rank};
}

const char* signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace scape::train
