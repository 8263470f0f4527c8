// The watchdog's view of a communicator (docs/runtime.md): how long the rank's current
// blocking call has been running, written by the thread that blocks and read by the MPI
// runner's monitor thread. Shared by MpiComm and NcclComm.
#pragma once

#include <atomic>
#include <chrono>

namespace scape::runtime {

class BlockedClock {
 public:
  // Seconds the current blocking call has been running; 0 when none.
  double blocked_for() const {
    const double since = since_.load();
    return since > 0 ? now_s() - since : 0.0;
  }

  // Marks the rank blocked for the scope's lifetime: unmarked however the call ends, so an
  // error thrown from inside is reported as that error, never later as a hang.
  class Scope {
   public:
    explicit Scope(BlockedClock& clock) : clock_(clock) { clock_.since_.store(now_s()); }
    ~Scope() { clock_.since_.store(0.0); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    BlockedClock& clock_;
  };

 private:
  static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  std::atomic<double> since_{0.0};
};

}  // namespace scape::runtime
