// The method type's names, the lookups over every part's switch names and ranges, and the
// checks that span the common fields, the type and each method's switches.
#include "optimizers/optimizer_config.hpp"

#include <stdexcept>
#include <string>

#include "util/name_table.hpp"

namespace scape {
namespace {

constexpr EnumName<OptimizerType> kTypes[] = {
    {"adamw", OptimizerType::adamw},       {"adams", OptimizerType::adams},
    {"scape", OptimizerType::scape},       {"topk_ef", OptimizerType::topk_ef},
    {"randk_ef", OptimizerType::randk_ef}, {"onebit_adam", OptimizerType::onebit_adam},
    {"powersgd", OptimizerType::powersgd}, {"demo", OptimizerType::demo},
    {"diloco", OptimizerType::diloco},     {"sparseloco", OptimizerType::sparseloco}};

// The outer learning rate a negative outer_lr stands for.
double default_outer_lr(OptimizerType t) {
  return t == OptimizerType::sparseloco ? kSparselocoOuterLr : kDilocoOuterLr;
}

bool sparse_type(OptimizerType t) {
  return t == OptimizerType::scape || t == OptimizerType::topk_ef || t == OptimizerType::randk_ef;
}

// fp8_e5m2 is SCAPE's payload, quantized by the optimizer with a shared scale and its error
// kept in the residual (docs/algorithms.md, "FP8 payload").
void check_fp8(const OptimizerConfig& c) {
  if (c.param_dtype == WireType::fp8_e5m2) {
    reject_switch("param_dtype", "fp8_e5m2 is SCAPE's gradient payload only; parameters go at fp32 or bf16");
  }
  if (c.type != OptimizerType::scape) {
    reject_switch("wire_dtype",
                  std::string("fp8_e5m2 is SCAPE's payload (a shared power-of-two scale, the error kept in the "
                              "residual); ") +
                      to_string(c.type) + " takes fp32 or bf16");
  }
  validate_scape_fp8(c, c.scape);
}

// clip_grad clips a synchronized gradient; these types never form one.
void check_clip(const OptimizerConfig& c) {
  if (c.clip_grad > 0 && (c.type == OptimizerType::onebit_adam || c.type == OptimizerType::demo)) {
    reject_switch("clip_grad", std::string(to_string(c.type)) +
                                   " never forms the synchronized gradient that clip_grad clips (it sends "
                                   "compressed momentum); set clip_grad = 0");
  }
  if (c.clip_grad > 0 && has_outer_loop(c.type)) {
    reject_switch("clip_grad", std::string(to_string(c.type)) +
                                   " never forms the synchronized gradient that clip_grad clips (its inner steps "
                                   "take each worker's own gradient); set clip_grad = 0");
  }
}

bool has_hierarchy(OptimizerType t) {
  return t == OptimizerType::scape || t == OptimizerType::adams || t == OptimizerType::diloco;
}

// optimizer.hierarchy = "node": the methods built for it, and the switches one rail cannot
// honour, since it sees only its part of the model.
void check_hierarchy(const OptimizerConfig& c) {
  if (c.ranks_per_node < 1) {
    throw std::invalid_argument("topology.ranks_per_node: must be >= 1, got " + std::to_string(c.ranks_per_node));
  }
  if (c.hierarchy == Hierarchy::flat) {
    if (c.rail_split != RailSplit::tensors) {
      reject_switch("rail_split", "splits the layout among a node's rails: it needs optimizer.hierarchy = \"node\"");
    }
    return;
  }
  if (!has_hierarchy(c.type)) {
    reject_switch("hierarchy", std::string("\"node\" is built for scape, adams and diloco, not ") + to_string(c.type) +
                                   "; set optimizer.hierarchy = \"flat\"");
  }
  if (c.clip_grad > 0) {
    reject_switch("clip_grad",
                  "under optimizer.hierarchy = \"node\" each rail sees only its part of the model, not the whole "
                  "model's norm that clip_grad clips by; set clip_grad = 0");
  }
  if (c.overlap_grad_reduce) {
    reject_switch("overlap_grad_reduce",
                  "under optimizer.hierarchy = \"node\" the node's reduce-scatter runs after the backward pass");
  }
  if (c.device != kernels::DeviceKind::cpu) {
    reject_switch("hierarchy", "\"node\" runs the optimizer on the cpu only (optimizer.device \"cpu\")");
  }
}

void check_overlap_grad_reduce(const OptimizerConfig& c) {
  if (c.type != OptimizerType::adamw && c.type != OptimizerType::adams) {
    throw std::invalid_argument(std::string("optimizer.overlap_grad_reduce: only the dense optimizers (adamw, "
                                            "adams) reduce their gradient in buckets, not ") +
                                to_string(c.type));
  }
  if (!c.sharded) {
    throw std::invalid_argument(
        "optimizer.overlap_grad_reduce: buckets are reduce-scattered; set optimizer.sharded = true");
  }
  if (c.wire_dtype != WireType::fp32) {
    throw std::invalid_argument(
        "optimizer.overlap_grad_reduce: the buckets go at fp32; set optimizer.wire_dtype = fp32");
  }
}

}  // namespace

OptimizerType parse_optimizer_type(std::string_view v) { return find_by_name(kTypes, v, "optimizer.type").value; }
const char* to_string(OptimizerType v) { return name_of(kTypes, v); }

std::vector<std::string> optimizer_switch_names(std::string_view key) {
  if (key == "type") return names_of(kTypes);
  for (auto names : {common_switch_names(key), scape_switch_names(key)}) {
    if (!names.empty()) return names;
  }
  throw std::invalid_argument("optimizer_switch_names: '" + std::string(key) + "' is not an enum switch");
}

const OptimizerKeyRange& optimizer_key_range(std::string_view key) {
  for (auto ranges : {common_key_ranges(), scape_key_ranges(), onebit_adam_key_ranges(), powersgd_key_ranges(),
                      deco_momentum_key_ranges(), outer_loop_key_ranges()}) {
    if (const OptimizerKeyRange* r = find_key_range(ranges, key)) return *r;
  }
  throw std::invalid_argument("optimizer_key_range: '" + std::string(key) + "' has no declared range");
}

double OptimizerConfig::resolved_outer_lr() const { return outer.resolved_outer_lr(default_outer_lr(type)); }

AdamsForm OptimizerConfig::resolved_adams_form() const {
  if (type == OptimizerType::scape) return with_scape_adams_form(*this, scape).resolved_adams_form();
  return CommonOptimizerConfig::resolved_adams_form();
}

bool OptimizerConfig::carries_owner_momentum() const {
  return type == OptimizerType::scape && ::scape::carries_owner_momentum(*this, scape);
}

void OptimizerConfig::validate() const {
  validate_hyperparameters();
  if (sparse_type(type)) validate_sparse_fields();
  if (wire_dtype == WireType::fp8_e5m2 || param_dtype == WireType::fp8_e5m2) check_fp8(*this);
  check_key_range(common_key_ranges(), "clip_grad", clip_grad);
  check_clip(*this);
  if (has_outer_loop(type)) {
    validate_outer_loop_switches(outer, default_outer_lr(type));
    if (type == OptimizerType::diloco) validate_diloco_switches(outer, diloco);
    if (type == OptimizerType::sparseloco) validate_sparseloco_switches(*this, sparseloco);
  }
  if (type == OptimizerType::scape) validate_scape_switches(*this, scape);
  if (device != kernels::DeviceKind::cpu && !runs_on_cuda(type)) {
    throw std::invalid_argument(std::string("optimizer.device: ") + kernels::to_string(device) +
                                " runs optimizer types scape, adamw and adams only; " + to_string(type) +
                                " runs on the cpu");
  }
  check_hierarchy(*this);
  if (overlap_grad_reduce) check_overlap_grad_reduce(*this);
  if (type != OptimizerType::scape && residual_offload) {
    throw std::invalid_argument(std::string("optimizer.residual_offload: only optimizer type scape keeps an "
                                            "offloadable residual, not ") +
                                to_string(type));
  }
  check_key_range(common_key_ranges(), "offload_chunk", static_cast<double>(offload_chunk));
  if (type == OptimizerType::onebit_adam) validate_onebit_adam_switches(onebit);
  if (type == OptimizerType::powersgd) validate_powersgd_switches(powersgd);
  if (type == OptimizerType::demo) validate_deco_momentum_switches(demo);
  if (replicated_only(type) && sharded) {
    throw std::invalid_argument(std::string("optimizer.sharded: ") + to_string(type) +
                                " keeps replicated optimizer state; set sharded = false");
  }
}

bool has_sparse_metrics(const OptimizerConfig& c) { return sparse_type(c.type); }

}  // namespace scape
