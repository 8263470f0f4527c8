// The optimizer factory and the collectives of each configuration.
#include "optimizers/make_optimizer.hpp"

#include <stdexcept>
#include <string>

#include "optimizers/baselines/deco_momentum.hpp"
#include "optimizers/baselines/dense_adam.hpp"
#include "optimizers/baselines/diloco.hpp"
#include "optimizers/baselines/onebit_adam.hpp"
#include "optimizers/baselines/powersgd.hpp"
#include "optimizers/baselines/randk_ef.hpp"
#include "optimizers/baselines/sparseloco.hpp"
#include "optimizers/baselines/topk_ef.hpp"
#include "optimizers/hierarchical.hpp"
#include "optimizers/scape/mask_codec.hpp"
#include "optimizers/scape/scape_optimizer.hpp"

namespace scape {

namespace {

std::vector<std::string> flat_purposes(const OptimizerConfig& c) {
  switch (c.type) {
    case OptimizerType::adamw:
    case OptimizerType::adams:
      if (c.sharded && c.clip_grad > 0) return {"grad_reduce_scatter", "clip_norm_all_gather", "param_all_gather"};
      if (c.sharded) return {"grad_reduce_scatter", "param_all_gather"};
      return {"grad_all_reduce"};
    case OptimizerType::topk_ef:
      return {"topk_all_gather"};
    case OptimizerType::randk_ef:
      return {"grad_all_reduce"};
    case OptimizerType::onebit_adam:
      return {"grad_all_reduce", "momentum_all_to_all", "momentum_all_gather"};
    case OptimizerType::powersgd:
      return {"lowrank_p_all_reduce", "lowrank_q_all_reduce", "grad_all_reduce"};
    case OptimizerType::demo:
      return {"demo_all_gather"};
    case OptimizerType::diloco:
      if (c.diloco.outer_wire == WireType::fp8_e5m2) return {"outer_scale_all_gather", "outer_all_reduce"};
      return {"outer_all_reduce"};
    case OptimizerType::sparseloco:
      return {"sparseloco_all_gather"};
    case OptimizerType::scape:
      break;
  }
  const bool two = c.scape.second_moment == SecondMoment::two_collectives;
  std::vector<std::string> out;
  if (c.wire_dtype == WireType::fp8_e5m2) out.push_back("fp8_scale_all_gather");
  out.push_back(c.scape.mask_partition == MaskPartition::partitioned ? "mask_all_gather" : "index_all_gather");
  if (c.scape.mask_partition == MaskPartition::partitioned && !mask_sizes_known(c.mask_encoding)) {
    out.push_back("mask_size_all_gather");
  }
  if (c.sharded) {
    out.push_back("grad_reduce_scatter");
    if (two) out.push_back("accum_reduce_scatter");
    if (c.clip_grad > 0) out.push_back("clip_norm_all_gather");
    out.push_back("param_all_gather");
  } else {
    out.push_back("grad_all_reduce");
    if (two) out.push_back("accum_all_reduce");
  }
  return out;
}

// The method itself, on all of `layout` and `comm` (hierarchy flat).
std::unique_ptr<Optimizer> make_flat_optimizer(const OptimizerConfig& config, const ParamLayout& layout,
                                               Communicator& comm, int total_steps) {
  // Each method gets the common fields and its own switches; only here are they assembled.
  const CommonOptimizerConfig& common = config;
  switch (config.type) {
    case OptimizerType::adamw:
      return std::make_unique<DenseOptimizer>(common, InnerRule::adamw, layout, comm, total_steps);
    case OptimizerType::adams:
      return std::make_unique<DenseOptimizer>(common, InnerRule::adams, layout, comm, total_steps);
    case OptimizerType::scape: return std::make_unique<ScapeOptimizer>(common, config.scape, layout, comm, total_steps);
    case OptimizerType::topk_ef: return std::make_unique<TopkEfOptimizer>(common, layout, comm, total_steps);
    case OptimizerType::randk_ef: return std::make_unique<RandkEfOptimizer>(common, layout, comm, total_steps);
    case OptimizerType::onebit_adam:
      return std::make_unique<OnebitAdamOptimizer>(common, config.onebit, layout, comm, total_steps);
    case OptimizerType::powersgd:
      return std::make_unique<PowersgdOptimizer>(common, config.powersgd, layout, comm, total_steps);
    case OptimizerType::demo:
      return std::make_unique<DecoMomentumOptimizer>(common, config.demo, layout, comm, total_steps);
    case OptimizerType::diloco:
      return std::make_unique<DilocoOptimizer>(common, config.outer, config.diloco, layout, comm, total_steps);
    case OptimizerType::sparseloco:
      return std::make_unique<SparselocoOptimizer>(common, config.outer, config.sparseloco, layout, comm, total_steps);
  }
  throw std::invalid_argument("optimizer.type: unknown optimizer");
}

}  // namespace

std::vector<std::string> collective_purposes(const OptimizerConfig& c) {
  std::vector<std::string> out = flat_purposes(c);
  if (c.hierarchy == Hierarchy::node) {
    out.insert(out.begin(), "node_grad_reduce_scatter");
    out.push_back("node_param_all_gather");
  }
  return out;
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm,
                                          int total_steps) {
  config.validate();
  if (total_steps < 1) throw std::invalid_argument("steps: must be >= 1, got " + std::to_string(total_steps));
  if (layout.size() == 0) throw std::invalid_argument("make_optimizer: the parameter layout is empty");
  if (config.hierarchy == Hierarchy::flat) return make_flat_optimizer(config, layout, comm, total_steps);
  // Each rail runs the flat method on its part; the node's collectives are the wrapper's.
  OptimizerConfig rail_config = config;
  rail_config.hierarchy = Hierarchy::flat;
  rail_config.rail_split = RailSplit::tensors;
  return std::make_unique<HierarchicalOptimizer>(layout, comm, config.ranks_per_node, config.rail_split,
                                                 config.node_link, [&](const ParamLayout& part, Communicator& rail) {
                                                   return make_flat_optimizer(rail_config, part, rail, total_steps);
                                                 });
}

}  // namespace scape
