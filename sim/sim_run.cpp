// Simulated runner: the report exchange through shared memory, and the W worker threads.
#include "sim/sim_run.hpp"

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sim/emulated_comm.hpp"
#include "sim/sim_exchange.hpp"
#include "train/run_session.hpp"
#include "train/train_loop.hpp"

namespace scape::sim {
train::RunOutcome run_simulated(const config::ExperimentConfig& config, const train::RunOptions& options) {
  // On a GPU the workers take turns with one model and workspace (W copies of the activations
  // would not fit a large model; the GPU runs one worker's batch at full width anyway).
  const bool share = config.has_data() && (config.device == kernels::DeviceKind::cuda || options.share_model);
  train::RunSession session(config, options, {config.workers, share});  // ConfigError: nothing written
  const std::unique_ptr<kernels::KernelBackend> model_device =
      share && config.device != kernels::DeviceKind::cpu ? kernels::make_backend(config.device) : nullptr;
  const std::unique_ptr<train::SharedModel> shared =
      share ? train::make_shared_model(config, session.data(), model_device ? *model_device : kernels::cpu_backend())
            : nullptr;
  train::RunLog& log = session.open_log();
  std::vector<Communicator*> comms(static_cast<std::size_t>(config.workers), nullptr);
  SimExchange exchange(config.workers, comms.data());
  return session.run([&] {
    run_ranks(
        config.workers, config.world_link(),
        [&](Communicator& comm) {
          comms[static_cast<std::size_t>(comm.rank())] = &comm;
          comm.barrier();  // every rank has registered its communicator
          train::train_rank(config, session.data(), options, comm, exchange, comm.rank() == 0 ? &log : nullptr,
                            session.resume(), shared.get());
        },
        config.world_link_class());
  });
}

}  // namespace scape::sim
