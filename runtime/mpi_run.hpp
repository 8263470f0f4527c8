// The real runtime over MPI: every process runs train_rank on its own data shard with an
// MpiComm; rank 0 writes the run file (the simulator's layout plus measured times). A rank
// that fails, or a collective blocked past the watchdog's timeout, ends every rank promptly
// with the failing rank's message, and the run file is closed with status failed.
#pragma once

#include "experiments/config.hpp"
#include "runtime/mpi_comm.hpp"
#include "train/train_loop.hpp"

namespace scape::runtime {

// Call between MPI_Init_thread(MPI_THREAD_MULTIPLE) and MPI_Finalize, on every rank with the
// same arguments. Returns the exit status of the run (0, 2, 3, 1 as `scape run`), the same on
// every rank.
int run_mpi(const experiments::ExperimentConfig& config, train::RunOptions options, const MpiOptions& mpi);

}  // namespace scape::runtime
