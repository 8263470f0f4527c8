// The real runtime over MPI: every process runs train_rank on its own data shard with an
// MpiComm; rank 0 writes the run file (the simulator's layout plus measured times). A rank
// that fails, or a collective blocked past the watchdog's timeout, ends every rank promptly
// with the failing rank's message, and the run file is closed with status failed.
#pragma once

#include <functional>
#include <memory>

#include "config/config.hpp"
#include "runtime/mpi_comm.hpp"
#include "train/train_loop.hpp"

namespace scape::runtime {

// Call between MPI_Init_thread(MPI_THREAD_MULTIPLE) and MPI_Finalize, on every rank with the
// same arguments. Returns the exit status of the run (0, 2, 3, 1 as `scape run`), the same on
// every rank. Trains over MpiComm.
int run_mpi(const config::ExperimentConfig& config, train::RunOptions options, const MpiOptions& mpi);

// The communicator a run trains over, for runners other than MpiComm (runtime/nccl_run.hpp).
struct CommBackend {
  // Runs on every rank with the rest of the setup; throws when this rank cannot run (every
  // rank then stops with exit status 2 and rank 0 prints each rank's message). Optional.
  std::function<void()> check;
  // Builds this rank's communicator; collective over world. A throw on every rank stops the
  // run with exit status 1.
  std::function<std::unique_ptr<Communicator>(MPI_Comm world, const NetworkModel& net)> make;
  // Seconds the communicator's oldest blocking call has been running (the watchdog's input).
  std::function<double(const Communicator&)> blocked_for;
};

int run_mpi(const config::ExperimentConfig& config, train::RunOptions options, const MpiOptions& mpi,
            const CommBackend& backend);

}  // namespace scape::runtime
