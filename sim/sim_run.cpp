// Simulated runner: the report exchange through shared memory, and the W worker threads.
#include "sim/sim_run.hpp"

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sim/emulated_comm.hpp"
#include "sim/sim_exchange.hpp"
#include "train/checkpoint.hpp"
#include "train/train_loop.hpp"

namespace scape::sim {
train::RunOutcome run_simulated(const experiments::ExperimentConfig& config, const train::RunOptions& options) {
  const auto wall_start = std::chrono::steady_clock::now();
  // On a GPU the workers take turns with one model and workspace (W copies of the activations
  // would not fit a large model; the GPU runs one worker's batch at full width anyway).
  const bool share = config.has_data() && (config.device == kernels::DeviceKind::cuda || options.share_model);
  train::require_devices(config, config.workers, share);  // ConfigError: nothing written
  const std::unique_ptr<train::SourceData> data = train::load_source_data(config);  // ConfigError: nothing written
  const std::unique_ptr<kernels::KernelBackend> model_device =
      share && config.device != kernels::DeviceKind::cpu ? kernels::make_backend(config.device) : nullptr;
  const std::unique_ptr<train::SharedModel> shared =
      share ? train::make_shared_model(config, *data, model_device ? *model_device : kernels::cpu_backend()) : nullptr;
  train::Checkpoint checkpoint;
  if (options.resume) checkpoint = train::load_checkpoint(config, options.out, data->layout().size());
  train::RunLog log(config, data->layout(), options, checkpoint.step);
  std::vector<Communicator*> comms(static_cast<std::size_t>(config.workers), nullptr);
  SimExchange exchange(config.workers, comms.data());
  std::string failure;
  try {
    run_ranks(config.workers, config.network.model(), [&](Communicator& comm) {
      comms[static_cast<std::size_t>(comm.rank())] = &comm;
      comm.barrier();  // every rank has registered its communicator
      train::train_rank(config, *data, options, comm, exchange, comm.rank() == 0 ? &log : nullptr,
                        options.resume ? &checkpoint : nullptr, shared.get());
    });
  } catch (const std::exception& e) {
    failure = "step " + std::to_string(log.steps_completed() + 1) + ": " + e.what();
  }
  train::RunOutcome outcome = log.finish(failure);
  outcome.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return outcome;
}

}  // namespace scape::sim
