// The training loop shared by the simulator (W threads over EmulatedComm) and the real
// runtime: data shard -> forward/backward -> optimizer step -> metrics, with rank 0 combining
// the workers' reports into one row of the run file per step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/optimizer.hpp"
#include "core/state.hpp"
#include "experiments/config.hpp"
#include "experiments/recorder.hpp"
#include "train/gradient_source.hpp"

namespace scape::train {

// What one worker knows after its step; spans stay valid until the exchange returns.
struct WorkerReport {
  double loss = 0;
  double compute_s = 0;            // thread CPU seconds of forward/backward
  double optimizer_s = 0;          // thread CPU seconds of the optimizer step and its collectives
  StepMetrics metrics;
  std::span<const float> grads;        // g_i
  std::span<const float> accumulated;  // a_i = e_i + g_i (empty without the oracle)
  std::map<std::string, double> measured;  // wall seconds per collective purpose (real backends)
  double exposed_wait_s = 0;               // time blocked waiting for asynchronous all-gathers
};

// Moves reports to rank 0 and rank 0's decision back. The simulator implements it with
// shared memory; a multi-process runtime with its own messages. Not counted in the ledger.
class StepExchange {
 public:
  virtual ~StepExchange() = default;
  // Every rank calls it; on rank 0, `decide` sees all reports in rank order. Every rank
  // returns rank 0's decision (true: stop).
  virtual bool exchange(int rank, const WorkerReport& report,
                        const std::function<bool(std::span<const WorkerReport* const>)>& decide) = 0;
  // Every rank's optimizer state, in rank order, on rank 0 (empty elsewhere).
  virtual std::vector<StateMap> gather_states(int rank, const StateMap& mine) = 0;
  virtual void barrier(int rank) = 0;
};

struct RunOptions {
  std::filesystem::path out;      // run file; the checkpoint is out + ".ckpt"
  bool quiet = false;
  int checkpoint_every = 0;       // 0: no checkpoints
  bool resume = false;
  bool measured_comm = false;     // record comm_time_measured_<purpose> and mask_wait_exposed
  // Called by every rank before each step (fault injection in tests); may throw.
  std::function<void(int rank, int step)> before_step;
  std::string scape_version;
  std::string git_sha;
};

enum class RunStatus { completed, diverged, failed };
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
};

// What a checkpoint holds: every rank's optimizer state and the (identical) parameters.
struct Checkpoint {
  int step = 0;
  std::vector<StateMap> states;
  std::vector<float> params;
};
std::filesystem::path checkpoint_path(const std::filesystem::path& out);
// Throws ConfigError when the checkpoint is missing, corrupt or from another config.
Checkpoint load_checkpoint(const experiments::ExperimentConfig& config, const RunOptions& options, std::size_t n);

namespace detail {
struct Aggregator;
class Progress;
}  // namespace detail

// Rank 0's side of a run: the run file, the progress line and the running summary.
class RunLog {
 public:
  RunLog(const experiments::ExperimentConfig& config, const ParamLayout& layout, const RunOptions& options,
         int resume_step);
  ~RunLog();
  // Combines the workers' reports into one row; returns true when the run must stop (diverged).
  bool record_step(int t, std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask,
                   GradientSource& source, std::span<const float> params);
  void write_checkpoint(int t, const std::vector<StateMap>& states, std::span<const float> params);
  void write_final_params(std::span<const float> params);
  // Sets the final status (failed when `failure` is not empty) and returns the outcome.
  RunOutcome finish(const std::string& failure);
  int steps_completed() const;

 private:
  const experiments::ExperimentConfig& config_;
  const RunOptions& options_;
  const ParamLayout& layout_;
  std::string id_;
  std::vector<std::string> metric_names_;
  std::unique_ptr<experiments::RunRecorder> recorder_;
  std::unique_ptr<detail::Aggregator> aggregator_;
  std::unique_ptr<detail::Progress> progress_;
  std::mutex mutex_;
  RunOutcome outcome_;
  double bytes_total_ = 0, jaccard_total_ = 0, step_time_total_ = 0;
  int jaccard_count_ = 0, rows_ = 0;
  double last_val_ = std::numeric_limits<double>::quiet_NaN();
  double last_loss_ = std::numeric_limits<double>::quiet_NaN();
  bool diverged_ = false;
};

// One rank's part of a run, shared by every backend: `log` is rank 0's (nullptr elsewhere),
// `resume` the checkpoint to continue from (nullptr for a fresh run).
void train_rank(const experiments::ExperimentConfig& config, const SourceData& data, const RunOptions& options,
                Communicator& comm, StepExchange& exchange, RunLog* log, const Checkpoint* resume);

// Throws experiments::ConfigError naming optimizer.device when it asks for cuda and this build
// has no CUDA or this machine no visible device (checked before anything is written).
void require_optimizer_device(const experiments::ExperimentConfig& config);

// Runs an experiment in this process with W emulated workers. Throws ConfigError for invalid
// configuration or input (nothing is written then); every later failure is recorded in the
// run file and returned in the outcome.
RunOutcome run_simulated(const experiments::ExperimentConfig& config, const RunOptions& options);

}  // namespace scape::train
