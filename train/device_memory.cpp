// The device memory formula of a run (device_memory.hpp).
#include "train/device_memory.hpp"

#include <cstdio>

#include "config/model_shapes.hpp"
#include "optimizers/device_state.hpp"
#include "train/gradient_source.hpp"

namespace scape::train {

DeviceMemory device_memory_estimate(const config::ExperimentConfig& config, int workers, bool shared_workspace) {
  if (!config.has_data()) {
    throw config::ConfigError("model.type: \"" + config.model.type + "\" has no device memory estimate");
  }
  if (!runs_on_cuda(config.optimizer.type)) {
    throw config::ConfigError(std::string("optimizer.type: ") + to_string(config.optimizer.type) + " has no CUDA path");
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
  m.update_tracker = update_tracker_device_bytes(n);
  return m;
}

std::string describe(const DeviceMemory& m) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  char line[240];
  if (m.shared_workspace) {
    std::snprintf(line, sizeof line,
                  "%d workers x (params %.2f + grads %.2f + optimizer %.2f GiB) + activations %.2f GiB = %.1f GiB",
                  m.workers, m.params / kGiB, m.grads / kGiB, m.optimizer / kGiB, m.activations / kGiB,
                  m.total() / kGiB);
  } else {
    std::snprintf(line, sizeof line,
                  "%d workers x (params %.2f + grads %.2f + activations %.2f + optimizer %.2f GiB) = %.1f GiB",
                  m.workers, m.params / kGiB, m.grads / kGiB, m.activations / kGiB, m.optimizer / kGiB,
                  m.total() / kGiB);
  }
  return line;
}

}  // namespace scape::train
