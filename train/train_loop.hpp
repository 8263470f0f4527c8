// The training loop shared by the simulator (W threads over EmulatedComm) and the real
// runtime: data shard -> forward/backward -> optimizer step -> metrics, with rank 0 combining
// the workers' reports into one row of the run file per step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/optimizer.hpp"
#include "experiments/config.hpp"
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
  virtual void barrier() = 0;
};

struct RunOptions {
  std::filesystem::path out;      // run file; the checkpoint is out + ".ckpt"
  bool quiet = false;
  int checkpoint_every = 0;       // 0: no checkpoints
  bool resume = false;
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

// Runs an experiment in this process with W emulated workers. Throws ConfigError for invalid
// configuration or input (nothing is written then); every later failure is recorded in the
// run file and returned in the outcome.
RunOutcome run_simulated(const experiments::ExperimentConfig& config, const RunOptions& options);

}  // namespace scape::train
