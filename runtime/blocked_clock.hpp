// The watchdog's view of a communicator (docs/runtime.md): how long the rank's current
// blocking call has been running, written by the thread that blocks and read by the MPI
// runner's monitor thread. Shared by MpiComm and NcclComm.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>

namespace scape::runtime {

class BlockedClock {
 public:
  // Seconds the current blocking call has been running, here or on a clock adopted by this one
  // (the groups split from a communicator); 0 when none.
  double blocked_for() const {
    const double since = since_.load();
    double longest = since > 0 ? now_s() - since : 0.0;
    std::lock_guard lock(children_mutex_);
    for (const BlockedClock* child : children_) longest = std::max(longest, child->blocked_for());
    return longest;
  }

  // A split group's clock, watched through this one until it is disowned (before it goes).
  void adopt(const BlockedClock& child) {
    std::lock_guard lock(children_mutex_);
    children_.push_back(&child);
  }
  void disown(const BlockedClock& child) {
    std::lock_guard lock(children_mutex_);
    std::erase(children_, &child);
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
  mutable std::mutex children_mutex_;
  std::vector<const BlockedClock*> children_;
};

}  // namespace scape::runtime
