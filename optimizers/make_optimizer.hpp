// The optimizer factory: the one place that knows every method (optimizers/scape/ and
// optimizers/baselines/), and the collectives each configuration records.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"

namespace scape {

// Purposes of the collectives this configuration can record (bytes_sent_<purpose> metrics).
std::vector<std::string> collective_purposes(const OptimizerConfig& config);

// Builds the optimizer for one rank. `total_steps` is T of the learning-rate schedule.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const ParamLayout& layout,
                                          Communicator& comm, int total_steps);

}  // namespace scape
