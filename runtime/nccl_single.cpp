// One NCCL rank in this process (nccl_single.hpp).
#include "runtime/nccl_single.hpp"

#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.hpp"
#include "runtime/nccl_comm.hpp"
#include "train/run_session.hpp"
#include "train/train_loop.hpp"

namespace scape::runtime {
namespace {

// The only rank's report goes straight to its log; its state is the whole checkpoint.
class SingleRankExchange final : public train::StepExchange {
 public:
  train::StepVerdict exchange(
      int, const train::WorkerReport& report,
      const std::function<train::StepVerdict(std::span<const train::WorkerReport* const>)>& decide) override {
    const train::WorkerReport* const reports[] = {&report};
    return decide(reports);
  }
  std::vector<StateMap> gather_states(int, const StateMap& mine) override { return {mine}; }
  void barrier(int) override {}
};

}  // namespace

train::RunOutcome run_nccl_single_process(const config::ExperimentConfig& config, const train::RunOptions& options_in) {
  if (config.workers != 1) {
    throw config::ConfigError("workers: " + std::to_string(config.workers) +
                              ": --backend nccl in a scape built without MPI runs one rank, in this process; set "
                              "workers = 1, or rebuild with MPI and start one rank per GPU with mpirun");
  }
  config::ExperimentConfig on_gpu = config;
  on_gpu.optimizer.device = kernels::DeviceKind::cuda;
  try {
    on_gpu.optimizer.validate();
  } catch (const std::invalid_argument& e) {
    throw config::ConfigError(std::string("--backend nccl runs the optimizer on the GPU: ") + e.what());
  }
  if (kernels::cuda::visible_device_count() == 0) {
    throw config::ConfigError("--backend nccl: no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)");
  }
  train::RunOptions options = options_in;
  options.measured_comm = true;
  train::RunSession session(on_gpu, options, {1, false});  // ConfigError: nothing written
  train::RunLog& log = session.open_log();
  return session.run([&] {
    const std::unique_ptr<NcclComm> comm = make_single_process_nccl_comm(on_gpu.network.model());
    SingleRankExchange exchange;
    train::train_rank(on_gpu, session.data(), options, *comm, exchange, &log, session.resume());
  });
}

}  // namespace scape::runtime
