// The in-process runner: W threads as ranks over EmulatedComm, each running train_rank; rank 0
// writes the run file. The multi-process runners are runtime/mpi_run.hpp and nccl_run.hpp.
#pragma once

#include "config/config.hpp"
#include "train/run_log.hpp"

namespace scape::sim {

// Runs an experiment in this process with W emulated workers. Throws ConfigError for invalid
// configuration or input (nothing is written then); every later failure is recorded in the
// run file and returned in the outcome.
train::RunOutcome run_simulated(const config::ExperimentConfig& config, const train::RunOptions& options);

}  // namespace scape::sim
