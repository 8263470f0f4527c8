// Rank 0's side of a run, shared by every runner: the run file (one row of combined metrics
// per step), checkpoints, the progress line and the outcome a runner returns.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "core/layout.hpp"
#include "core/state.hpp"
#include "run_file/recorder.hpp"
#include "run_file/run_lock.hpp"
#include "train/gradient_source.hpp"
#include "train/worker_report.hpp"

namespace scape::train {

struct RunOptions {
  std::filesystem::path out;      // run file; the checkpoint is out + ".ckpt"
  bool quiet = false;
  // Progress line: a prefix naming the run (a sweep's point) and the least time between lines.
  std::string progress_label;
  double progress_every_seconds = 2;
  int checkpoint_every = 0;       // 0: no checkpoints
  bool resume = false;
  bool allow_unchecked_checkpoint = false;  // --resume may read a SCAPECK1 checkpoint (no checksum)
  // The caller holds the run file's writer lock (run_file/run_lock.hpp) already (a sweep's point);
  // otherwise the run log takes it before it opens the file.
  bool writer_lock_held = false;
  bool measured_comm = false;     // record comm_time_measured_<purpose> and mask_wait_exposed
  // Simulator: every worker uses one model and activation workspace in turn (always with
  // device = cuda; on the CPU, where it serializes the workers' forward/backward, for tests).
  bool share_model = false;
  // Called by every rank before each step (fault injection in tests); may throw.
  std::function<void(int rank, int step)> before_step;
  // Tokens per step of the progress line's tok/s; 0: from the config's model and data (none
  // without them). An external caller (the Python package) knows its own.
  double tokens_per_step = 0;
  std::string scape_version;
  std::string git_sha;
};

// interrupted: a stop signal ended the run at a step boundary (train/stop_signal.hpp).
enum class RunStatus { completed, diverged, failed, interrupted };
const char* to_string(RunStatus s);

struct RunOutcome {
  RunStatus status = RunStatus::failed;
  int steps_completed = 0;
  std::string error;
  double final_val_loss = 0;   // NaN without validation
  double final_train_loss = 0;
  double bytes_per_step = 0;   // mean bytes sent per worker per step
  double mean_mask_jaccard = 0;
  double step_time_model = 0;  // mean modelled step time, seconds
  double wall_s = 0;
  std::size_t n_params = 0;
  int signal = 0;  // the stop signal of an interrupted run (its exit status is 128 + it)
};

class StepCombiner;
namespace detail {
class Progress;
}  // namespace detail

class RunLog {
 public:
  // Creates the run file, or reopens it at `resume_step` with options.resume.
  RunLog(const config::ExperimentConfig& config, const ParamLayout& layout, const RunOptions& options, int resume_step);
  ~RunLog();
  // Combines the workers' reports into one row; returns stop when the run diverged, interrupt when
  // a stop signal came (train/stop_signal.hpp) before the last step.
  StepVerdict record_step(int t, std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask,
                          GradientSource& source, std::span<const float> params);
  void write_checkpoint(int t, const std::vector<StateMap>& states, std::span<const float> params);
  void write_final_params(std::span<const float> params);
  // Sets the final status (failed when `failure` is not empty) and returns the outcome.
  RunOutcome finish(const std::string& failure);
  // Closes the run file now (else the destructor does): for a process about to be aborted,
  // whose destructors never run, so that the file opens plainly rather than needing a repair.
  void close();
  int steps_completed() const;
  // Rank 0's steady-clock seconds at the start of step t (RankLoop::step), and after the last
  // step (RankLoop::finish): the row of the step before gets its step_wall_time (a column of
  // measured runs only), the time from its start to this one.
  void step_started(int t, double wall_s);
  void steps_ended(double wall_s);
  // The last recorded row: each /metrics column by name, in the run file's order, then
  // "val_loss" when that step evaluated. Empty before the first step.
  std::vector<std::pair<std::string, double>> last_row() const;

 private:
  const config::ExperimentConfig& config_;
  const RunOptions& options_;
  std::string config_json_;  // the resolved config, compact: what a checkpoint records
  std::optional<run_file::RunFileLock> writer_lock_;  // released after the recorder closed the file
  std::unique_ptr<run_file::RunRecorder> recorder_;
  std::unique_ptr<StepCombiner> combiner_;
  std::vector<std::string> column_names_;
  bool evaluated_last_ = false;
  std::unique_ptr<detail::Progress> progress_;
  std::mutex mutex_;
  RunOutcome outcome_;
  double bytes_total_ = 0, jaccard_total_ = 0, step_time_total_ = 0;
  int jaccard_count_ = 0, rows_ = 0;
  double last_val_ = std::numeric_limits<double>::quiet_NaN();
  double last_loss_ = std::numeric_limits<double>::quiet_NaN();
  bool diverged_ = false;
  int interrupted_by_ = 0;     // the stop signal that ended the run
  int interrupted_rank_ = -1;  // the MPI rank it reached (-1: this process)
  int checkpoint_step_ = 0;    // the step of the checkpoint on disk (0: none)
  // step_wall_time's index among the columns (none: -1), and the last step that started and when.
  int step_wall_column_ = -1;
  int started_step_ = 0;
  double started_s_ = 0;
};

}  // namespace scape::train
