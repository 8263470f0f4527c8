// Named network presets for the alpha-beta model (docs/network.md gives the figures and their
// sources). Shared by the simulator and the predictor.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/ledger.hpp"

namespace scape::presets {

struct NetworkPreset {
  const char* name;
  const char* description;
  double alpha_us;        // per message step (one hop of a ring), microseconds
  double bandwidth_GBps;  // per-worker link bandwidth, one direction, 1e9 bytes per second
};

const std::vector<NetworkPreset>& network_presets();
// Throws std::invalid_argument naming `field` and listing the presets when unknown.
const NetworkPreset& find_network_preset(std::string_view name, std::string_view field);
NetworkModel to_network_model(double alpha_us, double bandwidth_GBps);

}  // namespace scape::presets
