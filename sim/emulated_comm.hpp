// EmulatedComm: W threads of one process act as ranks. Reductions are done in rank order
// (mean_in_rank_order), so results are bit-for-bit deterministic whatever the thread timing.
// If one rank throws, the group is aborted and every rank blocked in a collective throws
// CommAborted instead of hanging; run_ranks rethrows the original error.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "core/communicator.hpp"

namespace scape::sim {

class CommAborted : public std::runtime_error {
 public:
  CommAborted() : std::runtime_error("collective aborted: another rank failed") {}
};

// State shared by the W ranks of one emulated group.
class EmulatedGroup {
 public:
  explicit EmulatedGroup(int workers);
  int workers() const { return workers_; }

  // Blocks until every rank has arrived; throws CommAborted once the group is aborted.
  void arrive_and_wait();
  // Aborts this group and every group split from it, so that no rank waits in a subgroup.
  void abort() noexcept;
  // A group of `workers` ranks split from this one (EmulatedComm::split), owned here so that it
  // lives as long as this group; born aborted when this group is.
  EmulatedGroup& make_child(int workers);
  // The group this one was split from, transitively (itself when it was not split).
  EmulatedGroup& root() { return parent_ == nullptr ? *this : parent_->root(); }

  // Per-rank published pointers, valid between the barriers of one collective.
  struct Slot {
    const void* send = nullptr;
    void* scratch = nullptr;
    std::size_t size = 0;
    std::vector<std::size_t> counts;
  };
  Slot& slot(int rank) { return slots_[static_cast<std::size_t>(rank)]; }

 private:
  int workers_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::size_t generation_ = 0;
  bool aborted_ = false;
  std::vector<Slot> slots_;
  EmulatedGroup* parent_ = nullptr;
  std::vector<std::unique_ptr<EmulatedGroup>> children_;  // guarded by mutex_
};

class EmulatedComm final : public Communicator {
 public:
  EmulatedComm(EmulatedGroup& group, int rank, NetworkModel net = {}, LinkClass link = LinkClass::inter);
  // The ranks of one color as a child group of this one, ranked in rank order.
  std::unique_ptr<Communicator> split(int color, LinkClass link, NetworkModel net) override;
  // Aborts the whole group, and the group it was split from. A failing rank must call it before it settles its own
  // pending collectives: the group's barriers do not tell one collective from another, so a deferred collective run by
  // the failing rank alone would be matched with a peer's unrelated barrier, and the peer would then read buffers the
  // failing rank frees.
  void abort() noexcept override;

 protected:
  SCAPE_COMMUNICATOR_BACKEND_HOOKS;  // Communicator's backend hooks (core/communicator.hpp)

 private:
  // publish_send, then throws std::invalid_argument naming `what` when this rank's counts differ
  // from rank 0's.
  void publish(const void* send, std::span<const std::size_t> counts, const char* what);

  EmulatedGroup& group_;
  std::vector<float> chunk_;
};

// Runs fn(comm) on W threads, one EmulatedComm each, each with omp_get_max_threads() / W
// OpenMP threads (at least 1). After all threads end, rethrows the
// first genuine error (lowest rank), never a CommAborted that it caused.
// `link`: the class the communicators' ledgers charge (intra when the W ranks share one node).
void run_ranks(int workers, const NetworkModel& net, const std::function<void(Communicator&)>& fn,
               LinkClass link = LinkClass::inter);
// The threads of run_ranks for a group whose communicators outlive them (one call per step of
// sim/stepped_simulator.hpp): fn(rank) on group.workers() threads, the same OpenMP slices and
// the same error rule. A throwing rank aborts the group.
void run_rank_threads(EmulatedGroup& group, const std::function<void(int rank)>& fn);

}  // namespace scape::sim
