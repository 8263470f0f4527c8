// One rank's training state across steps, advanced one step at a time: the body of
// train_rank's loop (train/train_loop.hpp), and what the Python package drives when the caller
// supplies the gradients (sim/stepped_simulator.hpp).
#pragma once

#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "core/communicator.hpp"
#include "core/optimizer.hpp"
#include "kernels/backend.hpp"
#include "kernels/device_span.hpp"
#include "model/gradient_ready.hpp"
#include "train/checkpoint.hpp"
#include "train/gradient_source.hpp"
#include "train/run_log.hpp"
#include "train/worker_report.hpp"

namespace scape::train {

// The gradient of one step handed in by the caller instead of taken from the rank's source,
// with its training loss and the seconds the caller's forward and backward pass took (the
// compute_time of the run file and the modelled step time); NaN when the caller has none.
struct GivenGradient {
  std::span<const float> grads;
  double loss = std::numeric_limits<double>::quiet_NaN();
  double compute_s = std::numeric_limits<double>::quiet_NaN();
  bool has_loss = false;  // the caller gave a loss: a NaN there is a diverged step, not "no loss"
};

// The failure a run records when its caller closes it: the caller's own when given; else none
// after all `total` steps or once it stopped (diverged), else "closed after step k of T".
std::string closing_failure(const std::string& caller_failure, int steps_done, int total, bool stopped);

// Throws std::logic_error when a stepped run cannot take another step: closed ("step: the
// <closed_what> is closed"), stopped at a divergence, or all `total` steps taken.
void require_next_step(bool closed, const char* closed_what, bool stopped, int steps_done, int total);

class RankLoop {
 public:
  // As train_rank's arguments; `log` is rank 0's (nullptr elsewhere).
  RankLoop(const config::ExperimentConfig& config, const SourceData& data, const RunOptions& options,
           Communicator& comm, StepExchange& exchange, RunLog* log, const Checkpoint* resume, SharedModel* shared);
  ~RankLoop();
  RankLoop(const RankLoop&) = delete;
  RankLoop& operator=(const RankLoop&) = delete;

  // The first step this rank takes (1, or the one after the resumed checkpoint).
  int first_step() const { return first_; }
  // Step t: the gradient (from the source, or `given` when its span is not empty: N values),
  // the optimizer step, the report to rank 0 and, at the checkpoint interval, the checkpoint.
  // Collective. Returns true when rank 0 decided to stop (the run diverged, or a stop signal came:
  // then checkpointed first where checkpoints are on).
  bool step(int t, const GivenGradient& given = {});
  // Ends the run: settles asynchronous collectives, and rank 0 writes the final parameters.
  // Collective; call once, after the last step.
  void finish();
  // After a failure on this rank: aborts the communicator, then settles the optimizer's
  // asynchronous collectives (which may still read the gradient or write the optimizer's
  // buffers) before any buffer is freed. A second failure while settling is dropped.
  void abandon() noexcept;

  // This rank's parameters (memory of the run's device; read after the step returned).
  std::span<const float> params() const { return params_.span(); }
  const Optimizer& optimizer() const { return *opt_; }

 private:
  const config::ExperimentConfig& config_;
  const RunOptions& options_;
  Communicator& comm_;
  StepExchange& exchange_;
  RunLog* log_;
  std::unique_ptr<kernels::KernelBackend> device_;
  kernels::KernelBackend* backend_;
  std::unique_ptr<GradientSource> source_;
  std::unique_ptr<Optimizer> opt_;
  kernels::Buffer<float> params_, grads_;
  std::vector<float> acc_, moment_;
  int first_ = 1;
  std::unique_ptr<kernels::DeviceSpan> compute_span_;
  bool want_oracle_ = false;
  model::GradientReady gradient_ready_;
};

}  // namespace scape::train
