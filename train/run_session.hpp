// What every runner does around its communicator and its loop (docs/ARCHITECTURE.md, "One run
// session"): check the devices, load the data, read the checkpoint to resume from, open rank 0's
// run log; at the end turn an exception into the failure of the step it came from and finish
// the log. A runner (sim/sim_run.cpp, runtime/mpi_run.cpp, runtime/nccl_single.cpp) keeps only
// its communicator, its exchange of reports and the call of train_rank.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "config/config.hpp"
#include "train/checkpoint.hpp"
#include "train/gradient_source.hpp"
#include "train/run_log.hpp"

namespace scape::train {

// How the run's workers share devices: require_devices() checks the memory estimate for
// `workers_per_device` workers on one GPU, sharing one activation workspace when
// `shared_workspace`.
struct DeviceUse {
  int workers_per_device = 1;
  bool shared_workspace = false;
};

class RunSession {
 public:
  // Checks the devices, loads the source data and, with options.resume, the checkpoint.
  // Throws config::ConfigError naming the field or file; nothing is written then.
  RunSession(const config::ExperimentConfig& config, const RunOptions& options, DeviceUse devices);

  // Creates (or reopens, when resuming) the run file: rank 0 only. Throws when it cannot.
  RunLog& open_log();
  RunLog* log() { return log_.get(); }  // nullptr before open_log() and on other ranks
  const SourceData& data() const { return *data_; }
  const Checkpoint* resume() const { return options_.resume ? &checkpoint_ : nullptr; }

  // Runs the runner's loop; an exception from it becomes the failure "step N: what" (N the step
  // the log was in). Then finishes the log (rank 0) and returns the outcome, wall time included.
  RunOutcome run(const std::function<void()>& loop);
  // Finishes the log with `failure` (empty: completed) and sets the outcome's wall time.
  RunOutcome finish(const std::string& failure);
  // Seconds since the session started (setup included).
  double elapsed_s() const;

 private:
  const config::ExperimentConfig& config_;
  const RunOptions& options_;
  const std::chrono::steady_clock::time_point start_;
  std::unique_ptr<SourceData> data_;
  Checkpoint checkpoint_;
  std::unique_ptr<RunLog> log_;
};

}  // namespace scape::train
