// Dense inside the node, the method between nodes (hierarchical.hpp).
#include "optimizers/hierarchical.hpp"

#include <stdexcept>
#include <string>
#include <utility>

#include "core/adam_step.hpp"

namespace scape {
namespace {

std::vector<std::size_t> part_sizes(const std::vector<RailPart>& parts) {
  std::vector<std::size_t> sizes;
  for (const auto& p : parts) sizes.push_back(p.size());
  return sizes;
}

int checked_rail(const Communicator& world, int ranks_per_node) {
  if (ranks_per_node < 1 || world.size() % ranks_per_node != 0) {
    throw std::invalid_argument("topology.ranks_per_node: " + std::to_string(ranks_per_node) +
                                " does not divide workers = " + std::to_string(world.size()));
  }
  return world.rank() % ranks_per_node;
}

void append(std::vector<CommRecord>& to, std::vector<CommRecord> records) {
  for (auto& r : records) to.push_back(std::move(r));
}

}  // namespace

HierarchicalOptimizer::HierarchicalOptimizer(const ParamLayout& layout, Communicator& world, int ranks_per_node,
                                             RailSplit split, std::optional<NetworkModel> node_link,
                                             const MakeRailMethod& make_rail_method)
    : n_(layout.size()),
      rail_(checked_rail(world, ranks_per_node)),
      parts_(split_into_rails(layout, ranks_per_node, split)),
      counts_(part_sizes(parts_)),
      world_(world) {
  const NetworkModel net = world.ledger().network();
  // Every rank splits in the same order: its node (consecutive ranks), then its rail.
  node_ = world.split(world.rank() / ranks_per_node, LinkClass::intra, node_link.value_or(net));
  rail_comm_ = world.split(rail_, LinkClass::inter, net);
  rail_method_ = make_rail_method(part().layout, *rail_comm_);
  kernels::KernelBackend& host = kernels::cpu_backend();  // hierarchy = "node" runs on the cpu
  node_whole_ = kernels::Buffer<float>(host, n_);
  rail_grads_ = kernels::Buffer<float>(host, part().size());
  rail_params_ = kernels::Buffer<float>(host, part().size());
}

HierarchicalOptimizer::~HierarchicalOptimizer() = default;

StepMetrics HierarchicalOptimizer::step(std::span<float> params, std::span<const float> grads) {
  detail::check_step_sizes(params, grads, n_);
  // (a) The gradient packed rail by rail, then each rail's node mean to its local rank.
  std::size_t at = 0;
  for (const RailPart& p : parts_) {
    pack_rail(p, grads, node_whole_.span().subspan(at, p.size()));
    at += p.size();
  }
  node_->reduce_scatter_mean(node_whole_, rail_grads_, counts_, WireType::fp32, "node_grad_reduce_scatter");
  std::vector<CommRecord> node_records = node_->ledger().drain();
  // (b) The method on the rail's part.
  pack_rail(part(), params, rail_params_);
  StepMetrics out = rail_method_->step(rail_params_, rail_grads_);
  // (c) Every rail's updated part to the whole node, into the packed gradient's buffer: a send
  // buffer is the caller's again once its blocking collective has returned (MPI's rule, which the
  // emulated reduce-scatter keeps by a barrier after every rank has read the others' buffers).
  node_->all_gather(rail_params_, node_whole_, counts_, WireType::fp32, "node_param_all_gather");
  at = 0;
  for (const RailPart& p : parts_) {
    unpack_rail(p, std::as_const(node_whole_).span().subspan(at, p.size()), params);
    at += p.size();
  }
  append(node_records, std::move(out.comm));
  append(node_records, node_->ledger().drain());
  out.comm = std::move(node_records);
  out.tensor_residual_norm.clear();
  out.tensor_mask_density.clear();
  out.tensor_mask_jaccard.clear();
  t_ = rail_method_->steps_done();
  world_.absorb_measurements(*node_);
  world_.absorb_measurements(*rail_comm_);
  return out;
}

void HierarchicalOptimizer::load_state(const StateMap& state) {
  rail_method_->load_state(state);
  t_ = rail_method_->steps_done();
}

}  // namespace scape
