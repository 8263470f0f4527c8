// Hierarchical collectives over a two-level network (docs/PREDICTING.md, "Collectives").
#include "predict/topology.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace scape::predict {
namespace {

// The node-level step that runs before (reduce) or after (gather) the inter-node ring.
CollectiveKind intra_phase(CollectiveKind kind) {
  return kind == CollectiveKind::all_gather ? CollectiveKind::all_gather : CollectiveKind::reduce_scatter;
}

}  // namespace

double port_share(const Topology& topo, const Placement& p) {
  return std::min(1.0, static_cast<double>(topo.nics_per_node) / p.gpus_per_node);
}

Placement place(const Topology& topo, int workers) {
  if (workers < 1) throw std::invalid_argument("workers: must be >= 1, got " + std::to_string(workers));
  if (topo.gpus_per_node < 1) throw std::invalid_argument("network.gpus_per_node: must be >= 1");
  if (workers <= topo.gpus_per_node) return Placement{workers, 1};
  if (workers % topo.gpus_per_node != 0) {
    throw std::invalid_argument("workers: " + std::to_string(workers) +
                                " is not a multiple of network.gpus_per_node = " + std::to_string(topo.gpus_per_node));
  }
  return Placement{topo.gpus_per_node, workers / topo.gpus_per_node};
}

NetworkModel inter_link_per_gpu(const Topology& topo, const Placement& p, CollectiveKind kind) {
  NetworkModel link = topo.inter_for(kind);
  link.bandwidth_Bps *= port_share(topo, p);
  return link;
}

double collective_time(CollectiveKind kind, double payload_bytes, const Topology& topo, int workers, LinkLoad load) {
  const Placement p = place(topo, workers);
  if (p.nodes == 1) return alpha_beta_time(kind, p.gpus_per_node, payload_bytes, topo.intra);
  const NetworkModel inter = inter_link_per_gpu(topo, p, kind);
  const double per_rail = payload_bytes / p.gpus_per_node;
  const double node = alpha_beta_time(intra_phase(kind), p.gpus_per_node, payload_bytes, topo.intra);
  const std::optional<double> measured =
      topo.inter_curves ? loaded_time(*topo.inter_curves, kind, p.nodes, per_rail, load, port_share(topo, p))
                        : std::nullopt;
  const double across = measured ? *measured : alpha_beta_time(kind, p.nodes, per_rail, inter);
  // An all-reduce both reduces inside the node first and gathers inside it last.
  return kind == CollectiveKind::all_reduce ? 2 * node + across : node + across;
}

LinkBytes link_bytes_per_gpu(CollectiveKind kind, double payload_bytes, const Topology& topo, int workers) {
  const Placement p = place(topo, workers);
  if (p.nodes == 1) return {ring_bytes_sent_per_worker(kind, p.gpus_per_node, payload_bytes), 0.0};
  const double node = ring_bytes_sent_per_worker(intra_phase(kind), p.gpus_per_node, payload_bytes);
  const double across = ring_bytes_sent_per_worker(kind, p.nodes, payload_bytes / p.gpus_per_node);
  return {kind == CollectiveKind::all_reduce ? 2 * node : node, across};
}

}  // namespace scape::predict
