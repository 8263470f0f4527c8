// MpiComm: the Communicator over MPI, one process per rank. Reductions use MPI's own
// collectives (MPI_Allreduce, MPI_Reduce_scatter) or, in deterministic mode, an all-to-all
// followed by the same rank-order mean as the simulator, so a run is bit-identical to
// EmulatedComm with the same W. The asynchronous collectives (the lagged all-gather, the
// gradient buckets of overlap_grad_reduce) run in order on a dedicated communication thread
// over a duplicated communicator, so they progress while the compute thread runs
// forward/backward without calling MPI (needs MPI_THREAD_MULTIPLE).
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/communicator.hpp"
#include "runtime/blocked_clock.hpp"

namespace scape::runtime {

struct MpiOptions {
  bool deterministic = false;
  double collective_timeout_s = 300;  // watchdog: a collective blocked longer is a failure
};

class MpiComm final : public Communicator {
 public:
  // `link`: the class its collectives are charged to (a split group's; the world's is inter).
  MpiComm(MPI_Comm world, NetworkModel net, MpiOptions options, LinkClass link = LinkClass::inter);
  ~MpiComm() override;

  // Seconds the oldest blocking MPI call of this rank has been running (0 when none), in this
  // communicator or any group split from it: the watchdog reads it from another thread.
  double blocked_for() const { return blocked_.blocked_for(); }
  MPI_Comm world() const { return world_; }
  bool waits_for_queued_kernels() const override { return false; }
  // MPI_Comm_split of this communicator (color, keyed by this rank, so the group keeps the
  // order), as an MpiComm of its own with the same options that frees the split communicator
  // when it goes; the watchdog sees its blocking calls through this one's blocked_for().
  std::unique_ptr<Communicator> split(int color, LinkClass link, NetworkModel net) override;

 protected:
  SCAPE_COMMUNICATOR_BACKEND_HOOKS;  // Communicator's backend hooks (core/communicator.hpp)
  std::unique_ptr<AsyncRequest> do_reduce_scatter_mean_async(std::span<const float> send, std::span<float> recv,
                                                             std::span<const std::size_t> counts) override;

 private:
  class AsyncCollective;
  friend class AsyncCollective;
  void comm_thread_main();
  void enqueue(std::function<void()> task);
  // Runs `collective` on the communication thread; its wait is exposed time of `kind` and its
  // duration is measured as `measured`.
  std::unique_ptr<AsyncRequest> run_async(CollectiveKind kind, std::string measured, std::function<void()> collective);
  // recv = the mean over the ranks of `comm` of this rank's segment of send: MPI_Reduce_scatter,
  // or in deterministic mode an all-to-all and the simulator's rank-order mean.
  void reduce_scatter_on(MPI_Comm comm, std::span<const float> send, std::span<float> recv,
                         std::span<const std::size_t> counts, std::vector<float>& gathered) const;

  MPI_Comm world_;
  bool owns_world_ = false;    // a split group frees its communicator
  MpiComm* parent_ = nullptr;  // the communicator it was split from
  MPI_Comm async_comm_ = MPI_COMM_NULL;
  MpiOptions options_;
  std::thread comm_thread_;
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  BlockedClock blocked_;
  std::vector<float> gathered_;        // the compute thread's all-to-all buffer
  std::vector<float> async_gathered_;  // the communication thread's
};

// MPI counts are int: throws naming the collective when a count does not fit.
int to_mpi_count(std::size_t n, const char* what);

}  // namespace scape::runtime
