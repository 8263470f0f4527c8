// What one worker hands rank 0 after a step (WorkerReport), and the exchange that carries
// the reports there and rank 0's decision back (StepExchange; one per runner).
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/optimizer.hpp"
#include "core/state.hpp"

namespace scape::train {

// Spans stay valid until the exchange returns. Which fields rank 0 reads, and how it combines
// them over workers, is train/metric_table.hpp's table.
struct WorkerReport {
  double loss = 0;
  bool loss_given = false;  // the caller stated the loss (GivenGradient::has_loss), NaN included
  double compute_s = 0;            // thread CPU seconds of forward/backward
  double optimizer_s = 0;          // thread CPU seconds of the optimizer step and its collectives
  double compute_wall_s = 0;       // wall seconds of forward/backward
  double optimizer_wall_s = 0;     // wall seconds of the optimizer step, its collectives included
  // Seconds the model's GPU stream spent on forward/backward (CUDA events); NaN on the CPU.
  double compute_device_s = std::numeric_limits<double>::quiet_NaN();
  StepMetrics metrics;
  std::span<const float> grads;        // g_i
  std::span<const float> accumulated;  // a_i = e_i + g_i (empty without the oracle)
  std::span<const float> first_moment; // m_prev over this worker's shard S_w (SCAPE with the oracle)
  std::map<std::string, double> measured;  // wall seconds per collective purpose (real backends)
  double exposed_wait_s = 0;               // time blocked waiting for asynchronous all-gathers
  double grad_wait_exposed_s = 0;          // time blocked waiting for the gradient buckets (overlap_grad_reduce)
  // optimizer_wall_s less this worker's own blocking collectives and waits: its kernels. Taken per
  // worker because the columns of the parts are maxima over workers, which need not be one worker's.
  double optimizer_kernel_wall_s = 0;
  // Set by a multi-process exchange in rank 0's own report: the bytes its gathers of the
  // diagnostics (g_i for grad_norm; a_i and the m_prev shards for the oracle) moved to rank 0
  // this step, and the wall seconds rank 0 spent in them. 0 where nothing is sent (the simulator).
  double diagnostic_bytes = 0;
  double diagnostic_s = 0;
};

// Rank 0's decision after a step, which every rank returns from StepExchange::exchange: go on,
// stop (the run diverged), or stop after a checkpoint where checkpoints are on (a stop signal:
// train/stop_signal.hpp).
enum class StepVerdict : int { go_on = 0, stop = 1, interrupt = 2 };

// Moves reports to rank 0 and rank 0's decision back. The simulator implements it with
// shared memory; a multi-process runtime with its own messages. Not counted in the optimizer's
// ledger: a multi-process exchange reports what its diagnostics sent in rank 0's report
// (diagnostic_bytes, the run file's bytes_sent_diagnostics).
class StepExchange {
 public:
  virtual ~StepExchange() = default;
  // Every rank calls it; on rank 0, `decide` sees all reports in rank order. Every rank
  // returns rank 0's decision.
  virtual StepVerdict exchange(int rank, const WorkerReport& report,
                               const std::function<StepVerdict(std::span<const WorkerReport* const>)>& decide) = 0;
  // Every rank's optimizer state, in rank order, on rank 0 (empty elsewhere).
  virtual std::vector<StateMap> gather_states(int rank, const StateMap& mine) = 0;
  virtual void barrier(int rank) = 0;
};

}  // namespace scape::train
