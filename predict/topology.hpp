// Two-level network of the predictor: G GPUs per node joined by NVLink, nodes joined by
// InfiniBand or Ethernet, and hierarchical collectives over it (docs/PREDICTING.md,
// "Collectives"). Every level is costed with the ledger's ring alpha-beta formula, so one
// GPU per node is exactly the flat ring the simulator models.
#pragma once

#include <array>
#include <optional>

#include "core/ledger.hpp"
#include "predict/link_load.hpp"

namespace scape::predict {

struct Topology {
  int gpus_per_node = 1;
  int nics_per_node = 1;  // inter-node ports per node; one per GPU is a rail-optimized node
  NetworkModel intra;     // GPU to GPU inside a node, per GPU and direction
  NetworkModel inter;     // one port, per direction
  // A calibrated link per collective kind (indexed by CollectiveKind) replaces `inter` for
  // that kind: measured collectives differ in their effective latency and bandwidth.
  std::array<std::optional<NetworkModel>, kCollectiveKindCount> inter_by_kind{};
  // A shaped link's idle and busy regimes (predict/link_load.hpp): measured curves that replace
  // the lines for the kinds they hold; none: one regime, the alpha-beta lines.
  std::optional<LoadCurves> inter_curves{};
  NetworkModel inter_for(CollectiveKind kind) const {
    return inter_by_kind[static_cast<std::size_t>(kind)].value_or(inter);
  }
};

// How W workers sit: W <= G fills one node with W GPUs, otherwise M = W / G full nodes.
struct Placement {
  int gpus_per_node = 1;  // g, the GPUs of a node that take part
  int nodes = 1;          // M
};
// Throws std::invalid_argument when workers < 1 or W > G is not a multiple of G.
Placement place(const Topology& topo, int workers);

// The share of a node's inter-node ports one of its g GPUs has: min(1, nics / g).
double port_share(const Topology& topo, const Placement& p);

// The inter-node link as one GPU sees it: the port bandwidth shared by the g / nics GPUs
// behind each port when a node has fewer ports than GPUs.
NetworkModel inter_link_per_gpu(const Topology& topo, const Placement& p, CollectiveKind kind);

// Time of a collective over `payload_bytes` in total (the ledger's n) among W workers:
//   reduce-scatter: ring RS over g on NVLink of n, then ring RS over M across nodes of n/g
//   all-gather:     ring AG over M across nodes of n/g, then ring AG over g on NVLink of n
//   all-reduce:     RS over g of n + ring AR over M of n/g + AG over g of n
// The g rails (GPUs of equal local rank) run their inter-node rings in parallel. With
// topo.inter_curves, the ring across nodes is costed on the curve of its kind in regime `load`
// (what the link did before) when the curves ran on as many ranks as it spans.
double collective_time(CollectiveKind kind, double payload_bytes, const Topology& topo, int workers,
                       LinkLoad load = LinkLoad::busy);

// Bytes one GPU sends on each level for the same collective.
struct LinkBytes {
  double intra = 0;
  double inter = 0;
};
LinkBytes link_bytes_per_gpu(CollectiveKind kind, double payload_bytes, const Topology& topo, int workers);

}  // namespace scape::predict
