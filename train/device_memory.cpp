// The device memory formula of a run (device_memory.hpp).
#include "train/device_memory.hpp"

#include <algorithm>
#include <cstdio>

#include "config/model_shapes.hpp"
#include "optimizers/device_state.hpp"
#include "train/gradient_source.hpp"

namespace scape::train {

DeviceMemory device_memory_estimate(const config::ExperimentConfig& config, int workers, bool shared_workspace) {
  if (!config.has_data()) {
    throw config::ConfigError("model.type: \"" + config.model.type + "\" has no device memory estimate");
  }
  if (!has_device_bytes(config.optimizer.type)) {
    throw config::ConfigError(std::string("optimizer.type: ") + to_string(config.optimizer.type) +
                              " has no device memory estimate");
  }
  const model::LanguageModelSpec spec = config::language_model_spec(config.model);
  const std::size_t n = spec.layout().size();
  DeviceMemory m;
  m.workers = workers;
  m.shared_workspace = shared_workspace;
  m.params = m.grads = n * sizeof(float);
  m.activations = spec.workspace_bytes(static_cast<std::size_t>(config.data.batch_size),
                                       static_cast<std::size_t>(spec.block_size()));
  m.optimizer = optimizer_device_bytes(config.optimizer, spec.layout(), config.workers);
  // All W workers on this GPU (the simulator) hold every rail's part; fewer hold at most the
  // largest each (which of them share the GPU is not known here).
  m.optimizer_all = workers == config.workers
                        ? optimizer_device_bytes_all(config.optimizer, spec.layout(), config.workers)
                        : m.optimizer * static_cast<std::size_t>(workers);
  m.update_tracker = update_tracker_device_bytes(config.optimizer, n);
  return m;
}

std::string describe(const DeviceMemory& m) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const double optimizer = static_cast<double>(m.optimizer_all) / std::max(m.workers, 1);
  char line[240];
  if (m.shared_workspace) {
    std::snprintf(line, sizeof line,
                  "%d workers x (params %.2f + grads %.2f + optimizer %.2f GiB) + activations %.2f GiB = %.1f GiB",
                  m.workers, m.params / kGiB, m.grads / kGiB, optimizer / kGiB, m.activations / kGiB, m.total() / kGiB);
  } else {
    std::snprintf(line, sizeof line,
                  "%d workers x (params %.2f + grads %.2f + activations %.2f + optimizer %.2f GiB) = %.1f GiB",
                  m.workers, m.params / kGiB, m.grads / kGiB, m.activations / kGiB, optimizer / kGiB, m.total() / kGiB);
  }
  return line;
}

}  // namespace scape::train
