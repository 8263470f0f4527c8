// The optimizer section's key table, whose ranges core declares, and the run files' optimizer_key_types().
#include "config/config_keys.hpp"

#include <string>
#include <vector>

#include "config/key_table_support.hpp"

namespace scape::config {
namespace {

using namespace key_table_support;

const std::vector<std::string> kSparse = {"scape", "topk_ef", "randk_ef"};
// The keys SparseLoCo shares with the sparse optimizers: its density and how its indices are coded.
const std::vector<std::string> kSparseOrSparseloco = {"scape", "topk_ef", "randk_ef", "sparseloco"};
const std::vector<std::string> kScape = {"scape"};
const std::vector<std::string> kDense = {"adamw", "adams"};
const std::vector<std::string> kOnebit = {"onebit_adam"};
const std::vector<std::string> kInnerRule = {"scape", "topk_ef", "randk_ef", "powersgd", "diloco", "sparseloco"};
const std::vector<std::string> kPowersgd = {"powersgd"};
const std::vector<std::string> kDemo = {"demo"};
const std::vector<std::string> kOuterLoop = {"diloco", "sparseloco"};
const std::vector<std::string> kDiloco = {"diloco"};
// The methods with a node hierarchy (optimizer.hierarchy = "node").
const std::vector<std::string> kHierarchical = {"scape", "adams", "diloco"};
const std::vector<std::string> kSparseloco = {"sparseloco"};
const std::vector<std::string> kWireTypes = wire_type_names();
// The optimizers whose update rule can be AdamS, and those that form a synchronized gradient to clip.
const std::vector<std::string> kAdamsRule = {"adams",    "scape",  "topk_ef",   "randk_ef",
                                             "powersgd", "diloco", "sparseloco"};
const std::vector<std::string> kClipped = {"adamw", "adams", "scape", "topk_ef", "randk_ef", "powersgd"};

json record_min_lr(const OptimizerConfig& c) { return c.resolved_min_lr(); }
json record_outer_lr(const OptimizerConfig& c) { return c.resolved_outer_lr(); }
void assign_outer_lr(OptimizerConfig& c, const json& v) { c.outer.outer_lr = v.get<double>(); }
void assign_min_lr(OptimizerConfig& c, const json& v) { c.min_lr = v.get<double>(); }
json record_adams_form(const OptimizerConfig& c) { return to_string(c.resolved_adams_form()); }
void assign_adams_form(OptimizerConfig& c, const json& v) { c.adams_form = parse_adams_form(v.get<std::string>()); }
json record_betas(const OptimizerConfig& c) { return {c.beta1, c.beta2}; }
void assign_betas(OptimizerConfig& c, const json& v) {
  c.beta1 = v[0].get<double>();
  c.beta2 = v[1].get<double>();
}

}  // namespace

// The range core declares for an optimizer key (OptimizerConfig::validate() enforces the same).
Range core_range(const char* key) {
  const OptimizerKeyRange& r = optimizer_key_range(key);
  return {r.minimum, r.maximum, r.exclusive_minimum, r.exclusive_maximum};
}

// Ranges come from core (core_range); min_lr's bound by lr and the betas stay in validate().
const KeyTable<OptimizerConfig>& optimizer_keys() {
  using C = OptimizerConfig;
  static const KeyTable<C> t({
      {{"type",
        Kind::string,
        "adamw, adams (dense), scape, topk_ef (raw-gradient top-k with error feedback), randk_ef (shared-seed random-k "
        "with error feedback), onebit_adam (1-bit Adam), powersgd (rank-r PowerSGD with error feedback), demo (DeMo: "
        "DCT top-k of local momentum, sign steps), diloco (DiLoCo and Streaming DiLoCo: inner steps, outer Nesterov "
        "step on the averaged pseudo-gradient), sparseloco (SparseLoCo: inner steps, chunked top-k of an "
        "error-feedback accumulator of pseudo-gradients, quantized)",
        {},
        optimizer_switch_names("type")},
       SCAPE_MEMBER(C, type)},
      {{"lr", Kind::number, "peak learning rate", core_range("lr")}, SCAPE_MEMBER(C, lr)},
      // The range of the JSON value: a negative min_lr in the struct means "lr / 10".
      {{"min_lr", Kind::number, "final learning rate of the cosine schedule (default lr/10)", {0, kInf}},
       record_min_lr,
       assign_min_lr,
       Default::derived},
      {{"warmup_steps", Kind::integer, "linear warm-up steps", core_range("warmup_steps")},
       SCAPE_MEMBER(C, warmup_steps)},
      {{"betas", Kind::number_pair, "[beta1, beta2]"}, record_betas, assign_betas},
      {{"eps", Kind::number, "epsilon of the denominator", core_range("eps")}, SCAPE_MEMBER(C, eps)},
      {{"weight_decay", Kind::number, "decoupled weight decay on flagged tensors", core_range("weight_decay")},
       SCAPE_MEMBER(C, weight_decay)},
      {{"bias_correction", Kind::boolean, "Adam bias correction"}, SCAPE_MEMBER(C, bias_correction)},
      {{"sparsity",
        Kind::number,
        "fraction of coordinates not sent (density = 1 - sparsity; sparseloco: of each chunk)",
        core_range("sparsity"),
        {},
        kSparseOrSparseloco},
       SCAPE_MEMBER(C, sparsity)},
      {{"sharded", Kind::boolean,
        "distributed optimizer state (default true; false for topk_ef, randk_ef, onebit_adam, powersgd and demo)"},
       SCAPE_MEMBER(C, sharded),
       Default::derived},
      {{"overlap_grad_reduce",
        Kind::boolean,
        "reduce-scatter the gradient in buckets during the backward pass, one per model block (default false; "
        "recorded only when true)",
        {},
        {},
        kDense},
       [](const C& c) -> json { return c.overlap_grad_reduce ? json(true) : json(json::value_t::discarded); },
       [](C& c, const json& v) { assign(c.overlap_grad_reduce, v); }},
      // Recorded only when not flat (as overlap_grad_reduce): flat runs keep their run ids.
      {{"hierarchy",
        Kind::string,
        "flat (default: all W ranks exchange as one group) or node (dense reduce-scatter inside each node of "
        "topology.ranks_per_node ranks, the method between nodes rail by rail, all-gather inside the node); "
        "recorded only when node",
        {},
        optimizer_switch_names("hierarchy"),
        kHierarchical},
       [](const C& c) -> json {
         return c.hierarchy == Hierarchy::flat ? json(json::value_t::discarded) : json(to_string(c.hierarchy));
       },
       [](C& c, const json& v) { assign(c.hierarchy, v); },
       Default::derived},
      {{"rail_split",
        Kind::string,
        "hierarchy node: a rail's part of the layout, tensors (default: whole tensors balanced by size) or rows "
        "(every tensor cut on dim 0 into ranks_per_node slices, k per slice); recorded only under hierarchy node",
        {},
        optimizer_switch_names("rail_split"),
        kHierarchical},
       [](const C& c) -> json {
         return c.hierarchy == Hierarchy::flat ? json(json::value_t::discarded) : json(to_string(c.rail_split));
       },
       [](C& c, const json& v) { assign(c.rail_split, v); },
       Default::derived},
      {{"wire_dtype", Kind::string, "precision of gradient payloads", {}, kWireTypes}, SCAPE_MEMBER(C, wire_dtype)},
      {{"param_dtype", Kind::string, "precision of parameter payloads", {}, kWireTypes}, SCAPE_MEMBER(C, param_dtype)},
      {{"inner",
        Kind::string,
        "update rule of the sparse optimizers, powersgd, and the inner steps of diloco and sparseloco",
        {},
        optimizer_switch_names("inner"),
        kInnerRule},
       SCAPE_MEMBER(C, inner)},
      {{"update", Kind::string, "masked or dense update", {}, optimizer_switch_names("update"), kScape},
       SCAPE_MEMBER(C, scape.update)},
      {{"mask_statistic", Kind::string, "what top-k ranks", {}, optimizer_switch_names("mask_statistic"), kScape},
       SCAPE_MEMBER(C, scape.mask_statistic)},
      {{"mask_partition",
        Kind::string,
        "per-owner shards or union of local masks",
        {},
        optimizer_switch_names("mask_partition"),
        kScape},
       SCAPE_MEMBER(C, scape.mask_partition)},
      {{"mask_lag",
        Kind::integer,
        "1 = mask computed one step ahead, 0 = blocking",
        core_range("mask_lag"),
        {},
        kScape},
       SCAPE_MEMBER(C, scape.mask_lag)},
      {{"second_moment",
        Kind::string,
        "one synchronized buffer or two collectives",
        {},
        optimizer_switch_names("second_moment"),
        kScape},
       SCAPE_MEMBER(C, scape.second_moment)},
      {{"mask_encoding",
        Kind::string,
        "how masks and index lists are coded on the wire (sparseloco: bitmap or elias_fano)",
        {},
        optimizer_switch_names("mask_encoding"),
        kSparseOrSparseloco},
       SCAPE_MEMBER(C, mask_encoding)},
      {{"residual", Kind::boolean, "error feedback (keep undelivered gradient)", {}, {}, kSparse},
       SCAPE_MEMBER(C, residual)},
      {{"residual_decay",
        Kind::number,
        "factor gamma the residual keeps off the mask each step (1 = all, 0 = none)",
        core_range("residual_decay"),
        {},
        kSparse},
       SCAPE_MEMBER(C, residual_decay)},
      {{"residual_clip",
        Kind::number,
        "cap each tensor's residual norm at this multiple of its gradient norm (0 = off)",
        core_range("residual_clip"),
        {},
        kSparse},
       SCAPE_MEMBER(C, residual_clip)},
      {{"density_warmup",
        Kind::integer,
        "steps of exponential density decay from 1 (0 = off)",
        core_range("density_warmup"),
        {},
        kSparse},
       SCAPE_MEMBER(C, density_warmup)},
      {{"density_start",
        Kind::number,
        "density s at step 1 of the warm-up, decaying geometrically to 1 - sparsity",
        core_range("density_start"),
        {},
        kSparse},
       SCAPE_MEMBER(C, density_start)},
      {{"density_cooldown",
        Kind::integer,
        "steps of geometric density rise back to 1 (0 = off)",
        core_range("density_cooldown"),
        {},
        kSparse},
       SCAPE_MEMBER(C, density_cooldown)},
      {{"density_cooldown_start",
        Kind::integer,
        "0-based step at which the density cool-down starts",
        core_range("density_cooldown_start"),
        {},
        kSparse},
       SCAPE_MEMBER(C, density_cooldown_start)},
      {{"formulation",
        Kind::string,
        "SCAPE's algorithm: paper (the authors' artifact, residual in momentum units, m zero off the mask), "
        "artifact (its code with its quirks), frozen_momentum (the earlier formulation)",
        {},
        optimizer_switch_names("formulation"),
        kScape},
       SCAPE_MEMBER(C, scape.formulation)},
      {{"mask_scope",
        Kind::string,
        "where k is counted: per tensor (or its fragment in a shard) or per whole shard",
        {},
        optimizer_switch_names("mask_scope"),
        kScape},
       SCAPE_MEMBER(C, scape.mask_scope)},
      {{"dense_tensors",
        Kind::string_list,
        "name substrings of the tensors always on the mask (default [\"norm\", \"bias\"] under mask_scope = tensor, "
        "[] under shard)",
        {},
        {},
        kScape},
       SCAPE_MEMBER(C, scape.dense_tensors),
       Default::derived},
      {{"adams_form",
        Kind::string,
        "where AdamS's bias corrections sit: artifact (on v and m, the artifact's AdamS.py) or momentum_corrected "
        "(on m_prev inside the root); default momentum_corrected for formulation = frozen_momentum, else artifact",
        {},
        optimizer_switch_names("adams_form"),
        kAdamsRule},
       record_adams_form,
       assign_adams_form,
       Default::derived},
      {{"clip_grad",
        Kind::number,
        "global-norm clipping of the synchronized gradient (SCAPE: the reconstructed one) at this norm (0 = off)",
        core_range("clip_grad"),
        {},
        kClipped},
       SCAPE_MEMBER(C, clip_grad)},
      {{"device",
        Kind::string,
        "where the optimizer's kernels and state live (default: the top-level device; cuda needs a CUDA build and GPU)",
        {},
        kernels::device_kind_names(),
        kScape},
       SCAPE_MEMBER(C, device)},
      {{"residual_offload",
        Kind::boolean,
        "keep the residual in pinned host memory, streamed through two device chunks",
        {},
        {},
        kScape},
       SCAPE_MEMBER(C, residual_offload)},
      {{"offload_chunk",
        Kind::integer,
        "elements per device chunk of the offloaded residual",
        core_range("offload_chunk"),
        {},
        kScape},
       SCAPE_MEMBER(C, offload_chunk)},
      {{"freeze_step",
        Kind::integer,
        "1-bit Adam: dense AdamW steps before the variance is frozen and momentum is sent as signs",
        core_range("freeze_step"),
        {},
        kOnebit},
       SCAPE_MEMBER(C, onebit.freeze_step)},
      {{"sign_chunk",
        Kind::integer,
        "1-bit Adam: coordinates of a shard that share one scale of the sign compression",
        core_range("sign_chunk"),
        {},
        kOnebit},
       SCAPE_MEMBER(C, onebit.sign_chunk)},
      {{"powersgd_rank",
        Kind::integer,
        "PowerSGD: rank of each matrix's factors (clipped to min(rows, cols))",
        core_range("powersgd_rank"),
        {},
        kPowersgd},
       SCAPE_MEMBER(C, powersgd.rank)},
      {{"demo_chunk",
        Kind::integer,
        "DeMo: coordinates of the flat buffer per DCT chunk",
        core_range("demo_chunk"),
        {},
        kDemo},
       SCAPE_MEMBER(C, demo.chunk)},
      {{"demo_topk",
        Kind::integer,
        "DeMo: DCT coefficients each chunk sends (at most demo_chunk)",
        core_range("demo_topk"),
        {},
        kDemo},
       SCAPE_MEMBER(C, demo.topk)},
      {{"inner_steps",
        Kind::integer,
        "diloco, sparseloco: inner steps H of each worker between two outer steps",
        core_range("inner_steps"),
        {},
        kOuterLoop},
       SCAPE_MEMBER(C, outer.inner_steps)},
      {{"outer_lr",
        Kind::number,
        "diloco, sparseloco: learning rate of the outer step (default 0.7 for diloco, 0.9 for sparseloco)",
        core_range("outer_lr"),
        {},
        kOuterLoop},
       record_outer_lr,
       assign_outer_lr,
       Default::derived},
      {{"overlap_outer",
        Kind::boolean,
        "diloco, sparseloco: apply the outer step one inner step late, so that its collective overlaps that step "
        "(DiLoCoX's one-step delay)",
        {},
        {},
        kOuterLoop},
       SCAPE_MEMBER(C, outer.overlap_outer)},
      {{"outer_momentum",
        Kind::number,
        "diloco: Nesterov momentum of the outer SGD step",
        core_range("outer_momentum"),
        {},
        kDiloco},
       SCAPE_MEMBER(C, diloco.outer_momentum)},
      {{"outer_wire", Kind::string, "diloco: precision of the pseudo-gradient all-reduce", {}, kWireTypes, kDiloco},
       SCAPE_MEMBER(C, diloco.outer_wire)},
      {{"streaming_fragments",
        Kind::integer,
        "diloco: fragments F <= inner_steps of the flat buffer, each synced once every inner_steps steps at staggered "
        "offsets (Streaming DiLoCo; 1 = off)",
        core_range("streaming_fragments"),
        {},
        kDiloco},
       SCAPE_MEMBER(C, diloco.streaming_fragments)},
      {{"chunk",
        Kind::integer,
        "sparseloco: coordinates of a tensor that share one top-k",
        core_range("chunk"),
        {},
        kSparseloco},
       SCAPE_MEMBER(C, sparseloco.chunk)},
      {{"quant_bits",
        Kind::integer,
        "sparseloco: bits of each sent value, 2 or 8 (0: the value at wire_dtype)",
        core_range("quant_bits"),
        {},
        kSparseloco},
       SCAPE_MEMBER(C, sparseloco.quant_bits)},
      {{"ef_decay",
        Kind::number,
        "sparseloco: decay beta of the error-feedback accumulator of pseudo-gradients",
        core_range("ef_decay"),
        {},
        kSparseloco},
       SCAPE_MEMBER(C, sparseloco.ef_decay)},
  });
  return t;
}

json optimizer_key_types() {
  const json schema = section_schema(optimizer_keys().fields, "type");
  json types = json::object();
  for (const auto& [key, spec] : schema.at("properties").items()) types[key] = spec.at("x-applies-to");
  return types;
}

#undef SCAPE_MEMBER

}  // namespace scape::config
