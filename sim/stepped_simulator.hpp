// The simulator driven one step at a time by a caller that brings the gradients (the Python
// package's scape.Simulator): W emulated ranks over EmulatedComm, each a train::RankLoop of a
// model.type "external" run, and rank 0's run file, exactly as `scape run` writes it. A step
// with the gradients of a replayed trace gives the parameters, metrics and bytes of `scape run`
// on that trace bit for bit (tests/test_stepped_simulator.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "sim/emulated_comm.hpp"
#include "train/gradient_source.hpp"
#include "train/rank_loop.hpp"
#include "train/run_log.hpp"

namespace scape::sim {

class SimExchange;

class SteppedSimulator {
 public:
  // `config` must have model.type "external"; `data` holds the layout and initial parameters.
  // Creates the run file at options.out. Throws config::ConfigError for another model type.
  SteppedSimulator(config::ExperimentConfig config, std::unique_ptr<train::ExternalData> data,
                   train::RunOptions options);
  // Closes the run (close()) when the caller did not.
  ~SteppedSimulator();
  SteppedSimulator(const SteppedSimulator&) = delete;
  SteppedSimulator& operator=(const SteppedSimulator&) = delete;

  int workers() const { return config_.workers; }
  int total_steps() const { return config_.steps; }
  int steps_done() const { return steps_done_; }
  std::size_t size() const { return data_->layout().size(); }
  const ParamLayout& layout() const { return data_->layout(); }
  const config::ExperimentConfig& config() const { return config_; }

  // Step steps_done() + 1: worker w's gradient is grads[w] (size() values) with training loss
  // losses[w] (NaN: none). Returns true when the run diverged (a non-finite gradient, loss or
  // update): the run file says so and no further step is taken. Throws std::invalid_argument for
  // a wrong number or size of gradients and std::logic_error past total_steps() or after close;
  // a failure inside a rank closes the run as failed and is rethrown as std::runtime_error.
  // `compute_s[w]` (optional, empty or W values): the seconds of worker w's forward and backward
  // pass, for compute_time and the modelled step time (else the near-zero handover is timed).
  bool step(std::span<const std::span<const float>> grads, std::span<const double> losses,
            std::span<const double> compute_s = {});
  // Rank 0's parameters after the last step (every replica holds the same values).
  std::span<const float> params() const;
  // Worker w's error-feedback residual and rank 0's global mask of the last step (empty for
  // dense optimizers).
  std::span<const float> residual(int worker) const;
  std::span<const std::uint64_t> mask() const;
  // The last step's row of the run file (train::RunLog::last_row).
  std::vector<std::pair<std::string, double>> last_row() const;
  // Ends the run: the final parameters and the status (completed after total_steps(); failed,
  // naming the step, when closed earlier; failed with `failure` when the caller gives one, e.g.
  // its own exception). Idempotent: later calls return the same outcome.
  const train::RunOutcome& close(const std::string& failure = {});
  bool closed() const { return closed_; }

 private:
  void fail(const std::string& failure);
  void release_log();

  config::ExperimentConfig config_;
  std::unique_ptr<train::ExternalData> data_;
  train::RunOptions options_;
  std::unique_ptr<train::RunLog> log_;  // until the run closes
  std::vector<std::pair<std::string, double>> last_row_;  // after it closed
  EmulatedGroup group_;
  std::vector<std::unique_ptr<EmulatedComm>> comms_;
  std::vector<Communicator*> comm_ptrs_;
  std::unique_ptr<SimExchange> exchange_;
  std::vector<std::unique_ptr<train::RankLoop>> loops_;
  int steps_done_ = 0;
  bool stopped_ = false;  // diverged or failed: no further step
  bool closed_ = false;
  train::RunOutcome outcome_;
};

}  // namespace scape::sim
