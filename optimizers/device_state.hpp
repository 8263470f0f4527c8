// The device memory an optimizer's state and buffers take on one worker, from the shapes alone:
// the optimizer's part of a device run's memory estimate (train/device_memory.hpp). One term per
// buffer, at the largest size it reaches (buffers only grow): the densest mask of the run sets
// the size of the index and payload buffers.
#pragma once

#include <cstddef>

#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"

namespace scape {

// Bytes on worker 0 (the largest shard) of W workers. Throws std::invalid_argument for the
// types without a CUDA path (runs_on_cuda).
std::size_t optimizer_device_bytes(const OptimizerConfig& config, const ParamLayout& layout, int workers);

// Worker 0's update statistics (metrics::UpdateTracker): the copy of theta, the signs and the
// per-block sums; the other workers keep only their norm's block sums (in the above).
std::size_t update_tracker_device_bytes(std::size_t n);

}  // namespace scape
