// The device memory an optimizer's state and buffers take on one worker, from the shapes alone:
// the optimizer's part of a device run's memory estimate (train/device_memory.hpp) and of
// `scape predict`'s memory columns. One term per buffer, at the largest size it reaches (buffers
// only grow): the densest mask of the run sets the size of the index and payload buffers.
// Under optimizer.hierarchy = "node" a rank holds its rail's method over the rail's part among
// the W / G nodes, and the hierarchical wrapper's three buffers (optimizers/hierarchical.hpp).
#pragma once

#include <cstddef>

#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"

namespace scape {

// The types counted buffer by buffer: those with a CUDA path (runs_on_cuda) and DiLoCo, which runs
// on the host but keeps the same kind of Buffers (counted as a GPU would hold them).
bool has_device_bytes(OptimizerType t);

// Bytes on the worker that holds the most of W workers: worker 0 (the largest shard) when flat;
// under hierarchy = "node" a rank of the rail whose part costs the most. Throws
// std::invalid_argument for the types has_device_bytes rejects.
std::size_t optimizer_device_bytes(const OptimizerConfig& config, const ParamLayout& layout, int workers);

// The W workers' bytes together: W times the above when flat; under hierarchy = "node" W / G
// times the sum over the G rails (whose parts differ).
std::size_t optimizer_device_bytes_all(const OptimizerConfig& config, const ParamLayout& layout, int workers);

// The state alone, on the worker that holds the most: the buffers kept from step to step (and
// in a checkpoint), without the step's scratch: the moments m (and v for AdamW) over the owned
// shard, SCAPE's resident residual (an offloaded one is on the host) and carried momentum,
// DiLoCo's theta_global, outer momentum and overlap_outer snapshot. Under hierarchy = "node"
// over the rail's part: the residual and every replicated buffer fall by G.
std::size_t optimizer_state_bytes(const OptimizerConfig& config, const ParamLayout& layout, int workers);

// Worker 0's update statistics (metrics::UpdateTracker): the copy of theta, the signs and the
// per-block sums; the other workers keep only their norm's block sums (in the above). SCAPE's
// masked update measures without the copy (every worker's kept values and block sums are in
// the above): the signs alone.
std::size_t update_tracker_device_bytes(const OptimizerConfig& config, std::size_t n);

}  // namespace scape
