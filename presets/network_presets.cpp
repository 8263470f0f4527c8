// Network presets (docs/network.md has the sources and the reasoning behind each latency).
#include "presets/network_presets.hpp"

#include "util/name_table.hpp"

namespace scape::presets {

const std::vector<NetworkPreset>& network_presets() {
  static const std::vector<NetworkPreset> presets = {
      {"ib_ndr400", "InfiniBand NDR 400 Gb/s, one port per GPU", 5.0, 50.0},
      {"nvlink_h100", "NVLink 4 (H100/H200 class), 900 GB/s bidirectional per GPU", 3.0, 450.0},
      {"pcie_gen5", "PCIe Gen5 x16", 5.0, 64.0},
      {"eth_100g", "100 Gb Ethernet (RoCE)", 10.0, 12.5},
      {"loopback", "shared memory on one host (MPI runs on a laptop)", 1.0, 10.0},
      {"wan_1g", "1 Gb/s link between datacentres (the local-SGD methods' regime)", 10000.0, 0.125},
  };
  return presets;
}

const NetworkPreset& find_network_preset(std::string_view name, std::string_view field) {
  return find_by_name(network_presets(), name, field, "network preset");
}

NetworkModel to_network_model(double alpha_us, double bandwidth_GBps) {
  return NetworkModel{alpha_us * 1e-6, bandwidth_GBps * 1e9};
}

}  // namespace scape::presets
