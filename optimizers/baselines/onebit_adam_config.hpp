// 1-bit Adam's switches (optimizer.type = "onebit_adam"; docs/algorithms.md, "1-bit Adam"): dense
// AdamW steps before the variance is frozen, and the coordinates that share one scale of the sign
// compression.
#pragma once

#include <cstddef>
#include <span>

#include "core/optimizer_config.hpp"

namespace scape {

struct OnebitAdamSwitches {
  int freeze_step = 100;
  std::size_t sign_chunk = 2048;
};

std::span<const OptimizerKeyRange> onebit_adam_key_ranges();
void validate_onebit_adam_switches(const OnebitAdamSwitches& onebit);

}  // namespace scape
