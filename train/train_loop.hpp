// The training loop shared by every runner (sim/sim_run.hpp, runtime/mpi_run.hpp): data
// shard -> forward/backward -> optimizer step -> report to rank 0, whose RunLog writes the row.
#pragma once

#include "config/config.hpp"
#include "core/communicator.hpp"
#include "train/checkpoint.hpp"
#include "train/gradient_source.hpp"
#include "train/run_log.hpp"
#include "train/worker_report.hpp"

namespace scape::train {

// One rank's part of a run, shared by every runner: `log` is rank 0's (nullptr elsewhere),
// `resume` the checkpoint to continue from (nullptr for a fresh run), `shared` the model every
// worker of the simulator uses in turn (nullptr: this rank makes its own).
void train_rank(const config::ExperimentConfig& config, const SourceData& data, const RunOptions& options,
                Communicator& comm, StepExchange& exchange, RunLog* log, const Checkpoint* resume,
                SharedModel* shared = nullptr);

// Throws config::ConfigError naming `device` or `optimizer.device` when it asks for cuda
// and this build has no CUDA or this machine no visible device, or when the run's memory
// estimate (train/device_memory.hpp) for `workers_per_device` workers on one GPU (sharing one
// activation workspace when `shared_workspace`) exceeds the
// device's free memory (checked before anything is written).
void require_devices(const config::ExperimentConfig& config, int workers_per_device, bool shared_workspace);

}  // namespace scape::train
