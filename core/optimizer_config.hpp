// What every optimizer, or several, read from their config: the hyper-parameters, the update
// rule, the density schedule, the error-feedback residual and the wires, with their names,
// ranges and checks. Each method's own switches sit beside the method (optimizers/scape/,
// optimizers/baselines/); optimizers/optimizer_config.hpp assembles them with the method type
// (docs/algorithms.md, "Switches"; the JSON keys are config/optimizer_keys.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/communicator.hpp"
#include "core/schedule.hpp"
#include "kernels/backend.hpp"

namespace scape {

enum class InnerRule { adams, adamw };
// How a mask crosses the wire (SCAPE, topk_ef, SparseLoCo; docs/algorithms.md, "Mask coding");
// "auto" picks per step and shard the smallest of the other three.
enum class MaskEncoding { bitmap, elias_fano, delta, auto_select };
// Where AdamS's bias corrections sit: on v and m as the artifact's AdamS.py (artifact), or on
// m_prev inside the root (momentum_corrected); automatic is the artifact's form unless the
// method resolves it first (SCAPE's frozen_momentum: momentum_corrected).
enum class AdamsForm { automatic, artifact, momentum_corrected };
// Where the data-parallel ranks exchange (docs/algorithms.md, "Hierarchy"): all W ranks as one
// group (flat), or dense inside each node of G ranks and the method between the nodes, rail by
// rail (node). A rail's part of the layout is whole tensors balanced by size (tensors) or slice
// l of every tensor cut on dim 0 into G slices (rows).
enum class Hierarchy { flat, node };
enum class RailSplit { tensors, rows };

// Parsers for switch values; an unknown value throws std::invalid_argument naming the
// parameter, the value and the accepted values.
InnerRule parse_inner_rule(std::string_view v);
MaskEncoding parse_mask_encoding(std::string_view v);
AdamsForm parse_adams_form(std::string_view v);  // "automatic" is not a name users give
Hierarchy parse_hierarchy(std::string_view v);
RailSplit parse_rail_split(std::string_view v);
const char* to_string(Hierarchy v);
const char* to_string(RailSplit v);
const char* to_string(InnerRule v);
const char* to_string(MaskEncoding v);
const char* to_string(AdamsForm v);
// The accepted names of the enum switches above ("inner", "mask_encoding", "adams_form",
// "hierarchy", "rail_split"), in the
// order errors list them; an empty list for another key.
std::vector<std::string> common_switch_names(std::string_view key);

// The range of a numeric optimizer key, written once: OptimizerConfig::validate() enforces it
// and the config key table publishes it in the JSON Schema. NaN is never in range.
struct OptimizerKeyRange {
  const char* key;
  double minimum;
  double maximum;
  bool exclusive_minimum;
  bool exclusive_maximum;
  const char* rule;  // how an error states the range
};
// The range of `key` among `ranges`, or nullptr.
const OptimizerKeyRange* find_key_range(std::span<const OptimizerKeyRange> ranges, std::string_view key);
// The ranges of the keys of CommonOptimizerConfig ("lr", "sparsity", ...).
std::span<const OptimizerKeyRange> common_key_ranges();
// Throws std::invalid_argument "optimizer.<key>: <value> is out of range (<rule>)" unless value
// lies in the range of `key` in `ranges` (which must declare one).
void check_key_range(std::span<const OptimizerKeyRange> ranges, const char* key, double value);
// The range check's error, for checks a range cannot state.
[[noreturn]] void reject_out_of_range(const std::string& parameter, double value, const std::string& rule);
// Throws std::invalid_argument "optimizer.<key>: <why>".
[[noreturn]] void reject_switch(const std::string& key, const std::string& why);

// The fields every method reads, or several do. Defaults are the documented ones
// (docs/algorithms.md).
struct CommonOptimizerConfig {
  double lr = 6e-4;
  double min_lr = -1.0;  // negative: lr / 10
  int warmup_steps = 0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool bias_correction = true;
  double sparsity = 0.99;  // density rho = 1 - sparsity (SCAPE and top-k only)
  bool sharded = true;     // distributed optimizer; topk_ef and randk_ef require false
  // Dense sharded AdamW / AdamS: reduce-scatter the gradient bucket by bucket while the backward
  // pass goes on (Megatron's --overlap-grad-reduce) instead of once after it; fp32 wire only.
  bool overlap_grad_reduce = false;
  WireType wire_dtype = WireType::fp32;   // gradient-like payloads
  WireType param_dtype = WireType::fp32;  // parameter payloads
  InnerRule inner = InnerRule::adams;     // SCAPE, topk_ef, randk_ef and powersgd
  MaskEncoding mask_encoding = MaskEncoding::elias_fano;  // SCAPE and topk_ef
  bool residual = true;
  // Keep the residual in (pinned) host memory and stream it through two device chunks of
  // offload_chunk elements each (SCAPE only; docs/algorithms.md, "Devices and residual offload").
  bool residual_offload = false;
  std::size_t offload_chunk = std::size_t{1} << 22;
  // Off the mask the residual keeps residual_decay * a_i (1 keeps it all, 0 equals residual =
  // false); residual_clip > 0 caps each tensor's ||e_i|| at that multiple of its ||g_i|| before
  // step 1 (0 = off). SCAPE, topk_ef and randk_ef.
  double residual_decay = 1.0;
  double residual_clip = 0.0;
  int density_warmup = 0;
  // The density schedule's start density s and the geometric cool-down back to 1 over
  // density_cooldown steps from step density_cooldown_start (0 steps = off).
  double density_start = 1.0;
  int density_cooldown = 0;
  int density_cooldown_start = 0;
  AdamsForm adams_form = AdamsForm::automatic;
  // Global-norm clipping of the synchronized (SCAPE: reconstructed) gradient at this norm; 0 = off.
  double clip_grad = 0.0;
  std::uint64_t seed = 0;  // the random mask statistic and randk_ef's shared mask
  // Where the optimizer's kernels and state live (SCAPE, AdamW and AdamS for cuda;
  // docs/algorithms.md, "Devices and residual offload").
  kernels::DeviceKind device = kernels::DeviceKind::cpu;
  Hierarchy hierarchy = Hierarchy::flat;
  RailSplit rail_split = RailSplit::tensors;
  // G, the ranks of one node (topology.ranks_per_node; not an optimizer key): W = nodes x G,
  // a node's ranks consecutive.
  int ranks_per_node = 1;
  // The link between the ranks of one node that the node's collectives are modelled with
  // (network.intra; not an optimizer key); empty: the world communicator's link.
  std::optional<NetworkModel> node_link;

  double density() const { return 1.0 - sparsity; }
  double resolved_min_lr() const { return min_lr < 0 ? lr / 10.0 : min_lr; }
  // adams_form with automatic as the artifact's form (a method that resolves it otherwise has
  // done so before its base sees the config).
  AdamsForm resolved_adams_form() const {
    return adams_form == AdamsForm::automatic ? AdamsForm::artifact : adams_form;
  }
  DensitySchedule density_schedule() const {
    return {density(), density_start, density_warmup, density_cooldown, density_cooldown_start};
  }
  // The checks of the fields every method reads (lr, min_lr, warmup_steps, betas, eps,
  // weight_decay); throws std::invalid_argument naming the first offending parameter and its value.
  void validate_hyperparameters() const;
  // The checks of the density schedule and the residual, for the methods that read them.
  void validate_sparse_fields() const;
};

}  // namespace scape
