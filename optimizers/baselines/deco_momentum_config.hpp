// DeMo's switches (optimizer.type = "demo"; docs/algorithms.md, "DeMo"): coordinates per DCT chunk
// of the flat buffer, and coefficients each chunk sends.
#pragma once

#include <cstddef>
#include <span>

#include "core/optimizer_config.hpp"

namespace scape {

struct DecoMomentumSwitches {
  std::size_t chunk = 64;
  std::size_t topk = 4;
};

std::span<const OptimizerKeyRange> deco_momentum_key_ranges();
void validate_deco_momentum_switches(const DecoMomentumSwitches& demo);

}  // namespace scape
