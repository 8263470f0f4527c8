// The memory a run with device = cuda holds on its GPU, from the config alone (checked before
// anything is allocated or written): each of the W simulated workers keeps its own parameters
// and gradients (4N bytes each) and its optimizer's state and buffers (optimizers/device_state.hpp);
// the model's activation workspace for data.batch_size sequences of model.block_size tokens is
// held once when the workers share one model (the simulator on a GPU), else once per worker.
// docs/runtime.md states the formula; tests/test_device_memory.cpp checks it against what the
// CPU backends allocate in the same run.
#pragma once

#include <cstddef>
#include <string>

#include "config/config.hpp"

namespace scape::train {

struct DeviceMemory {
  std::size_t params = 0, grads = 0, optimizer = 0;  // bytes per worker (optimizer: the worker with the most)
  std::size_t optimizer_all = 0;  // every worker's optimizer bytes together (the rails' parts differ)
  std::size_t activations = 0;                        // bytes of one activation workspace
  std::size_t update_tracker = 0;                     // worker 0's update statistics (once)
  int workers = 1;
  bool shared_workspace = false;  // one workspace for every worker (train/gradient_source.hpp)

  std::size_t per_worker() const { return params + grads + optimizer + (shared_workspace ? 0 : activations); }
  std::size_t total() const {
    return (per_worker() - optimizer) * static_cast<std::size_t>(workers) + optimizer_all +
           (shared_workspace ? activations : 0) + update_tracker;
  }
};

// `workers` on one GPU, with one shared activation workspace or one each. For gpt and llama
// models with an optimizer whose buffers are counted (optimizers/device_state.hpp:
// has_device_bytes, the CUDA types and DiLoCo); throws config::ConfigError naming the key
// otherwise.
DeviceMemory device_memory_estimate(const config::ExperimentConfig& config, int workers, bool shared_workspace);

// "8 workers x (params 0.46 + grads 0.46 + optimizer 0.64 GiB) + activations 5.60 GiB = 18.1 GiB"
// (shared workspace; otherwise the activations are inside the parentheses). The optimizer term is
// the workers' mean, which differs from `optimizer` when the rails' parts differ.
std::string describe(const DeviceMemory& m);

}  // namespace scape::train
