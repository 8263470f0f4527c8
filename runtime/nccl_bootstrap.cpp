// MPI bootstrap of NcclComm (runtime/nccl_bootstrap.hpp).
#include "runtime/nccl_bootstrap.hpp"

#include <stdexcept>
#include <string>

namespace scape::runtime {
namespace {

void mpi_check(int status, const char* call) {
  if (status != MPI_SUCCESS) throw std::runtime_error(std::string(call) + " failed (MPI error " + std::to_string(status) + ")");
}

}  // namespace

std::unique_ptr<NcclComm> make_nccl_comm(MPI_Comm world, NetworkModel net) {
  int rank = 0, size = 0, local_rank = 0;
  mpi_check(MPI_Comm_rank(world, &rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(world, &size), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  mpi_check(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_free(&node), "MPI_Comm_free");

  // Every step that can fail on one rank alone happens before the agreement below, so no rank
  // is left waiting in ncclCommInitRank for a rank that gave up.
  std::string error;
  int device = -1;
  ncclUniqueId id{};
  try {
    const int devices = visible_cuda_devices();
    if (devices == 0) throw std::runtime_error("no CUDA device visible");
    device = local_rank % devices;
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    if (rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  } catch (const std::exception& e) {
    error = "rank " + std::to_string(rank) + ": " + e.what();
  }
  int failed = error.empty() ? 0 : 1, any = 0;
  mpi_check(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, world), "MPI_Allreduce");
  if (any) throw std::runtime_error("NCCL setup failed: " + (error.empty() ? std::string("on another rank") : error));
  mpi_check(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, world), "MPI_Bcast");
  return std::make_unique<NcclComm>(rank, size, id, device, net);
}

}  // namespace scape::runtime
