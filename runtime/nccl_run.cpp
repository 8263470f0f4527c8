// NCCL runner (docs/runtime.md, "The NCCL backend"): run_mpi with NcclComm, and the
// NCCL backend of bench-comm.
#include "runtime/nccl_run.hpp"

#include <stdexcept>
#include <string>

#include "kernels/cuda/check.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "runtime/nccl_bootstrap.hpp"

namespace scape::runtime {

int run_nccl(const config::ExperimentConfig& config, train::RunOptions options, const MpiOptions& mpi) {
  config::ExperimentConfig on_gpu = config;
  on_gpu.optimizer.device = kernels::DeviceKind::cuda;
  CommBackend backend;
  backend.check = [&on_gpu] {
    if (kernels::cuda::visible_device_count() == 0) {
      throw std::runtime_error("--backend nccl: no CUDA device visible (check CUDA_VISIBLE_DEVICES and the driver)");
    }
    try {
      on_gpu.optimizer.validate();
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(std::string("--backend nccl runs the optimizer on the GPU: ") + e.what());
    }
  };
  backend.make = [](MPI_Comm world, const NetworkModel& net) -> std::unique_ptr<Communicator> {
    return make_nccl_comm(world, net);
  };
  backend.blocked_for = [](const Communicator& c) { return static_cast<const NcclComm&>(c).blocked_for(); };
  return run_mpi(on_gpu, std::move(options), mpi, backend);
}

BenchBackend nccl_bench_backend() {
  BenchBackend b;
  b.name = "nccl";
  b.make = [](MPI_Comm world) -> std::unique_ptr<Communicator> { return make_nccl_comm(world, NetworkModel{}); };
  b.allocate = [](std::size_t bytes) {
    void* p = nullptr;
    SCAPE_CUDA_CHECK(cudaMalloc(&p, bytes));
    SCAPE_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return p;
  };
  b.release = [](void* p) { cudaFree(p); };
  return b;
}

}  // namespace scape::runtime
