// The NcclComm of an MPI rank (docs/runtime.md, "The NCCL backend"): MPI picks the device and
// carries the NCCL id from rank 0 to every rank. Kept apart from runtime/nccl_comm.hpp so the
// communicator itself builds and runs without MPI (make_single_process_nccl_comm).
#pragma once

#include <mpi.h>

#include <memory>

#include "runtime/nccl_comm.hpp"

namespace scape::runtime {

// Builds the NcclComm of this MPI rank: device = (rank among the ranks on its node) modulo
// the number of visible devices; rank 0 creates the NCCL id and broadcasts it over `world`.
// Collective over `world`; when setup fails on any rank, every rank throws (no rank is left
// waiting in NCCL's initialisation).
std::unique_ptr<NcclComm> make_nccl_comm(MPI_Comm world, NetworkModel net);

}  // namespace scape::runtime
