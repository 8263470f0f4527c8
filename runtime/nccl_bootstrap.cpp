// MPI bootstrap of NcclComm (runtime/nccl_bootstrap.hpp).
#include "runtime/nccl_bootstrap.hpp"

#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "runtime/mpi_check.hpp"
#include "runtime/nccl_check.hpp"

namespace scape::runtime {

std::unique_ptr<NcclComm> make_nccl_comm(MPI_Comm world, NetworkModel net) {
  int rank = 0, size = 0, local_rank = 0;
  SCAPE_MPI_CHECK(MPI_Comm_rank(world, &rank));
  SCAPE_MPI_CHECK(MPI_Comm_size(world, &size));
  MPI_Comm node = MPI_COMM_NULL;
  SCAPE_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  SCAPE_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  SCAPE_MPI_CHECK(MPI_Comm_free(&node));

  // Every step that can fail on one rank alone happens before the agreement below, so no rank
  // is left waiting in ncclCommInitRank for a rank that gave up.
  std::string error;
  int device = -1;
  ncclUniqueId id{};
  try {
    const int devices = kernels::cuda::visible_device_count();
    if (devices == 0) throw std::runtime_error("no CUDA device visible");
    device = local_rank % devices;
    SCAPE_CUDA_CHECK(cudaSetDevice(device));
    if (rank == 0) SCAPE_NCCL_CHECK(ncclGetUniqueId(&id));
  } catch (const std::exception& e) {
    error = "rank " + std::to_string(rank) + ": " + e.what();
  }
  int failed = error.empty() ? 0 : 1, any = 0;
  SCAPE_MPI_CHECK(MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, world));
  if (any) throw std::runtime_error("NCCL setup failed: " + (error.empty() ? std::string("on another rank") : error));
  SCAPE_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, world));
  return std::make_unique<NcclComm>(rank, size, id, device, net);
}

}  // namespace scape::runtime
