// The training loop shared by every runner (sim/sim_run.hpp, runtime/mpi_run.hpp): data
// shard -> forward/backward -> optimizer step -> report to rank 0, whose RunLog writes the row.
#pragma once

#include "core/communicator.hpp"
#include "experiments/config.hpp"
#include "train/checkpoint.hpp"
#include "train/gradient_source.hpp"
#include "train/run_log.hpp"
#include "train/worker_report.hpp"

namespace scape::train {

// One rank's part of a run, shared by every runner: `log` is rank 0's (nullptr elsewhere),
// `resume` the checkpoint to continue from (nullptr for a fresh run).
void train_rank(const experiments::ExperimentConfig& config, const SourceData& data, const RunOptions& options,
                Communicator& comm, StepExchange& exchange, RunLog* log, const Checkpoint* resume);

// Throws experiments::ConfigError naming `device` or `optimizer.device` when it asks for cuda
// and this build has no CUDA or this machine no visible device (checked before anything is
// written).
void require_devices(const experiments::ExperimentConfig& config);

}  // namespace scape::train
