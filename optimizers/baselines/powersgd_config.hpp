// PowerSGD's switch (optimizer.type = "powersgd"; docs/algorithms.md, "PowerSGD"): the rank r of
// each matrix's factors (clipped to min(rows, cols)).
#pragma once

#include <span>

#include "core/optimizer_config.hpp"

namespace scape {

struct PowersgdSwitches {
  int rank = 4;
};

std::span<const OptimizerKeyRange> powersgd_key_ranges();
void validate_powersgd_switches(const PowersgdSwitches& powersgd);

}  // namespace scape
