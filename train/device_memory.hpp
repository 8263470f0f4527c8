// The memory a run with device = cuda holds on its GPU, from the config alone (checked before
// anything is allocated or written): each of the W simulated workers keeps its own parameters
// and gradients (4N bytes each), its model's activation workspace for data.batch_size sequences
// of model.block_size tokens, and its optimizer's state and buffers (core/device_state.hpp).
// docs/runtime.md states the formula; tests/test_device_memory.cpp checks it against what the
// CPU backends allocate in the same run.
#pragma once

#include <cstddef>
#include <string>

#include "experiments/config.hpp"

namespace scape::train {

struct DeviceMemory {
  std::size_t params = 0, grads = 0, activations = 0, optimizer = 0;  // bytes per worker
  int workers = 1;

  std::size_t per_worker() const { return params + grads + activations + optimizer; }
  std::size_t total() const { return per_worker() * static_cast<std::size_t>(workers); }
};

// For gpt and llama models with an optimizer that has a CUDA path; throws
// experiments::ConfigError naming the key otherwise.
DeviceMemory device_memory_estimate(const experiments::ExperimentConfig& config);

// "8 workers x (params 0.50 + grads 0.50 + activations 4.10 + optimizer 0.71 GiB) = 46.4 GiB".
std::string describe(const DeviceMemory& m);

}  // namespace scape::train
