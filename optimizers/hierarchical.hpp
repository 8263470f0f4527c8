// optimizer.hierarchy = "node" (docs/algorithms.md, "Hierarchy"): dense inside a node of G
// consecutive ranks, the method between nodes. Each step on rank (node r, local rank l):
//   (a) a reduce-scatter of the gradient over the node, so that l holds the node's mean gradient
//       of rail l's part of the layout (optimizers/rail_partition.hpp);
//   (b) the unchanged method (SCAPE, AdamS, DiLoCo) on that part, with the rail communicator of
//       local rank l of every node: its masks, moments, residual and payload are the rail's alone;
//   (c) an all-gather of the updated parts inside the node, so every rank holds all of theta.
// The node's collectives go at fp32 (a copy inside the node, not a payload to shrink).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/communicator.hpp"
#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "kernels/backend.hpp"
#include "optimizers/rail_partition.hpp"

namespace scape {

class HierarchicalOptimizer final : public Optimizer {
 public:
  // Builds the method of one rail on its part of the layout and its rail communicator.
  using MakeRailMethod = std::function<std::unique_ptr<Optimizer>(const ParamLayout& part, Communicator& rail)>;

  // Collective over `world` (it splits it into node and rail communicators, which record in
  // their own ledgers: node collectives as intra, rail ones as inter). `ranks_per_node` must
  // divide world.size(). `node_link` models the node's collectives (empty: the world's link).
  HierarchicalOptimizer(const ParamLayout& layout, Communicator& world, int ranks_per_node, RailSplit split,
                        std::optional<NetworkModel> node_link, const MakeRailMethod& make_rail_method);
  ~HierarchicalOptimizer() override;

  // Reports the rail method's metrics (those of this rank's rail only), with the node's
  // collectives added to `comm`; the per-tensor metrics are left empty (the rail's tensors are
  // not the layout's). The node's and the rail's measured times move to the world communicator,
  // where the run's report takes them.
  StepMetrics step(std::span<float> params, std::span<const float> grads) override;
  void finish() override { rail_method_->finish(); }
  std::string device_summary() const override { return rail_method_->device_summary(); }
  void save_state(StateMap& state) override { rail_method_->save_state(state); }
  void load_state(const StateMap& state) override;

  // This rank's rail, its part and its method (the identity tests compare them with flat runs).
  int rail() const { return rail_; }
  const RailPart& part() const { return parts_[static_cast<std::size_t>(rail_)]; }
  const Optimizer& rail_method() const { return *rail_method_; }

 private:
  std::size_t n_;
  int rail_;
  std::vector<RailPart> parts_;
  std::vector<std::size_t> counts_;  // parts_' sizes: the node collectives' counts
  Communicator& world_;              // takes the groups' measured times after each step
  std::unique_ptr<Communicator> node_, rail_comm_;
  std::unique_ptr<Optimizer> rail_method_;
  // The whole model's floats in rail order (N: the packed gradient, then the gathered
  // parameters), the rail's gradient and parameters (its part each): Buffers of the host's
  // backend, which the device-memory estimate counts (optimizers/device_state.hpp) and its test
  // measures.
  kernels::Buffer<float> node_whole_, rail_grads_, rail_params_;
};

}  // namespace scape
