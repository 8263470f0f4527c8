// Switch parsing and the configuration checks.
#include "core/optimizer_config.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "util/name_table.hpp"

namespace scape {
namespace {

constexpr EnumName<OptimizerType> kTypes[] = {{"adamw", OptimizerType::adamw},
                                              {"adams", OptimizerType::adams},
                                              {"scape", OptimizerType::scape},
                                              {"topk_ef", OptimizerType::topk_ef},
                                              {"randk_ef", OptimizerType::randk_ef},
                                              {"onebit_adam", OptimizerType::onebit_adam},
                                              {"powersgd", OptimizerType::powersgd},
                                              {"demo", OptimizerType::demo},
                                              {"diloco", OptimizerType::diloco},
                                              {"sparseloco", OptimizerType::sparseloco}};
constexpr EnumName<InnerRule> kInner[] = {{"adams", InnerRule::adams}, {"adamw", InnerRule::adamw}};
constexpr EnumName<UpdateMode> kUpdate[] = {{"masked", UpdateMode::masked}, {"dense", UpdateMode::dense}};
constexpr EnumName<MaskStatistic> kStatistic[] = {{"first_moment", MaskStatistic::first_moment},
                                                  {"gradient", MaskStatistic::gradient},
                                                  {"momentum_only", MaskStatistic::momentum_only},
                                                  {"random", MaskStatistic::random}};
constexpr EnumName<MaskPartition> kPartition[] = {{"partitioned", MaskPartition::partitioned},
                                                  {"local_union", MaskPartition::local_union}};
constexpr EnumName<SecondMoment> kSecond[] = {{"single_buffer", SecondMoment::single_buffer},
                                              {"two_collectives", SecondMoment::two_collectives}};
constexpr EnumName<MaskEncoding> kEncoding[] = {{"bitmap", MaskEncoding::bitmap},
                                                {"elias_fano", MaskEncoding::elias_fano},
                                                {"delta", MaskEncoding::delta},
                                                {"auto", MaskEncoding::auto_select}};

constexpr EnumName<Formulation> kFormulation[] = {{"paper", Formulation::paper},
                                                  {"artifact", Formulation::artifact},
                                                  {"frozen_momentum", Formulation::frozen_momentum}};
constexpr EnumName<MaskScope> kScope[] = {{"tensor", MaskScope::tensor}, {"shard", MaskScope::shard}};
// "automatic" is what an absent adams_form resolves from; a config names one of the other two.
constexpr EnumName<AdamsForm> kAdamsForm[] = {{"artifact", AdamsForm::artifact},
                                              {"momentum_corrected", AdamsForm::momentum_corrected}};

constexpr double kInf = std::numeric_limits<double>::infinity();

// min_lr (at most lr) and the betas (a pair) keep their own checks in validate().
constexpr OptimizerKeyRange kRanges[] = {
    {"lr", 0, kInf, true, true, "must be finite and > 0"},
    {"warmup_steps", 0, kInf, false, true, "must be >= 0"},
    {"eps", 0, kInf, true, true, "must be finite and > 0"},
    {"weight_decay", 0, kInf, false, true, "must be >= 0"},
    {"sparsity", 0, 1, false, true, "must be in [0, 1): the density 1 - sparsity must lie in (0, 1]"},
    {"density_warmup", 0, kInf, false, true, "must be >= 0"},
    {"density_start", 0, 1, true, false, "must be in (0, 1]"},
    {"density_cooldown", 0, kInf, false, true, "must be >= 0 (0 = off)"},
    {"density_cooldown_start", 0, kInf, false, true, "must be >= 0"},
    {"clip_grad", 0, kInf, false, true, "must be finite and >= 0 (0 = off)"},
    {"residual_decay", 0, 1, false, false, "must be in [0, 1]"},
    {"residual_clip", 0, kInf, false, true, "must be finite and >= 0 (0 = off)"},
    {"mask_lag", 0, 1, false, false, "must be 0 or 1"},
    {"offload_chunk", 1024, 1 << 30, false, false, "must be in [1024, 2^30] elements"},
    {"freeze_step", 1, kInf, false, true, "must be >= 1 (the variance is frozen after a dense Adam step)"},
    {"sign_chunk", 1, 1 << 30, false, false, "must be in [1, 2^30] elements"},
    {"powersgd_rank", 1, 4096, false, false, "must be in [1, 4096]"},
    {"demo_chunk", 1, 4096, false, false, "must be in [1, 4096] elements (the DCT basis is chunk^2 floats)"},
    {"demo_topk", 1, 4096, false, false, "must be in [1, demo_chunk]"},
    {"inner_steps", 1, 1e6, false, false, "must be in [1, 10^6]"},
    {"outer_lr", 0, kInf, true, true, "must be finite and > 0"},
    {"outer_momentum", 0, 1, false, true, "must be in [0, 1)"},
    {"streaming_fragments", 1, 1024, false, false, "must be in [1, 1024] and at most optimizer.inner_steps"},
    {"chunk", 1, 1 << 24, false, false, "must be in [1, 2^24] elements"},
    {"quant_bits", 0, 8, false, false, "must be 0 (off), 2 or 8"},
    {"ef_decay", 0, 1, false, false, "must be in [0, 1]"},
};

bool in_range(const OptimizerKeyRange& r, double x) {
  const bool above = r.exclusive_minimum ? x > r.minimum : x >= r.minimum;
  const bool below = r.exclusive_maximum ? x < r.maximum : x <= r.maximum;
  return above && below;
}

[[noreturn]] void bad(const std::string& parameter, double value, const std::string& rule) {
  std::ostringstream os;
  os << parameter << ": " << value << " is out of range (" << rule << ")";
  throw std::invalid_argument(os.str());
}

void check_range(const char* key, double value) {
  const OptimizerKeyRange& r = optimizer_key_range(key);
  if (!in_range(r, value)) bad(std::string("optimizer.") + key, value, r.rule);
}

}  // namespace

const OptimizerKeyRange& optimizer_key_range(std::string_view key) {
  for (const auto& r : kRanges) {
    if (key == r.key) return r;
  }
  throw std::invalid_argument("optimizer_key_range: '" + std::string(key) + "' has no declared range");
}

OptimizerType parse_optimizer_type(std::string_view v) { return find_by_name(kTypes, v, "optimizer.type").value; }
InnerRule parse_inner_rule(std::string_view v) { return find_by_name(kInner, v, "optimizer.inner").value; }
UpdateMode parse_update_mode(std::string_view v) { return find_by_name(kUpdate, v, "optimizer.update").value; }
MaskStatistic parse_mask_statistic(std::string_view v) {
  return find_by_name(kStatistic, v, "optimizer.mask_statistic").value;
}
MaskPartition parse_mask_partition(std::string_view v) {
  return find_by_name(kPartition, v, "optimizer.mask_partition").value;
}
SecondMoment parse_second_moment(std::string_view v) {
  return find_by_name(kSecond, v, "optimizer.second_moment").value;
}
MaskEncoding parse_mask_encoding(std::string_view v) {
  return find_by_name(kEncoding, v, "optimizer.mask_encoding").value;
}
Formulation parse_formulation(std::string_view v) {
  return find_by_name(kFormulation, v, "optimizer.formulation").value;
}
MaskScope parse_mask_scope(std::string_view v) { return find_by_name(kScope, v, "optimizer.mask_scope").value; }
AdamsForm parse_adams_form(std::string_view v) { return find_by_name(kAdamsForm, v, "optimizer.adams_form").value; }
const char* to_string(Formulation v) { return name_of(kFormulation, v); }
const char* to_string(MaskScope v) { return name_of(kScope, v); }
const char* to_string(AdamsForm v) { return v == AdamsForm::automatic ? "automatic" : name_of(kAdamsForm, v); }
const char* to_string(OptimizerType v) { return name_of(kTypes, v); }
const char* to_string(InnerRule v) { return name_of(kInner, v); }
const char* to_string(UpdateMode v) { return name_of(kUpdate, v); }
const char* to_string(MaskStatistic v) { return name_of(kStatistic, v); }
const char* to_string(MaskPartition v) { return name_of(kPartition, v); }
const char* to_string(SecondMoment v) { return name_of(kSecond, v); }
const char* to_string(MaskEncoding v) { return name_of(kEncoding, v); }

std::vector<std::string> optimizer_switch_names(std::string_view key) {
  if (key == "type") return names_of(kTypes);
  if (key == "inner") return names_of(kInner);
  if (key == "update") return names_of(kUpdate);
  if (key == "mask_statistic") return names_of(kStatistic);
  if (key == "mask_partition") return names_of(kPartition);
  if (key == "second_moment") return names_of(kSecond);
  if (key == "mask_encoding") return names_of(kEncoding);
  if (key == "formulation") return names_of(kFormulation);
  if (key == "mask_scope") return names_of(kScope);
  if (key == "adams_form") return names_of(kAdamsForm);
  throw std::invalid_argument("optimizer_switch_names: '" + std::string(key) + "' is not an enum switch");
}

AdamsForm OptimizerConfig::resolved_adams_form() const {
  if (adams_form != AdamsForm::automatic) return adams_form;
  return type == OptimizerType::scape && scape.formulation == Formulation::frozen_momentum
             ? AdamsForm::momentum_corrected
             : AdamsForm::artifact;
}

double OptimizerConfig::resolved_outer_lr() const {
  if (outer.outer_lr >= 0) return outer.outer_lr;
  return type == OptimizerType::sparseloco ? 0.9 : 0.7;
}

bool OptimizerConfig::dense_tensor(std::string_view name) const {
  for (const auto& part : scape.dense_tensors) {
    if (!part.empty() && name.find(part) != std::string_view::npos) return true;
  }
  return false;
}

namespace {

[[noreturn]] void reject(const std::string& key, const std::string& why) {
  throw std::invalid_argument("optimizer." + key + ": " + why);
}

// The switches that have no meaning under SCAPE's paper and artifact formulations, whose
// residual is in momentum units and whose m is zero off the mask (docs/algorithms.md, "Switches").
void check_formulation(const OptimizerConfig& c) {
  const std::string f = to_string(c.scape.formulation);
  if (c.scape.formulation != Formulation::frozen_momentum) {
    if (c.scape.update == UpdateMode::dense) {
      reject("update", "dense steps m off the mask, which formulation = " + f +
                           " sets to zero; use update = masked or formulation = frozen_momentum");
    }
    if (c.scape.mask_statistic == MaskStatistic::gradient) {
      reject("mask_statistic",
             "gradient ranks the raw accumulated gradient e + g, which formulation = " + f +
                 " does not keep (its residual is in momentum units); use formulation = frozen_momentum");
    }
    if (c.scape.second_moment == SecondMoment::two_collectives) {
      reject("second_moment", "two_collectives reduces e + g apart from the momentum, which formulation = " + f +
                                  " does not keep; use formulation = frozen_momentum");
    }
  }
  if (c.scape.formulation != Formulation::frozen_momentum && c.sharded && c.residual_clip > 0) {
    reject("residual_clip", "under formulation = " + f + " with optimizer.sharded = true the owner keeps each "
                            "residual's momentum part apart, which a per-worker clip cannot see; set sharded = false");
  }
  if (c.scape.formulation == Formulation::artifact) {
    if (!c.residual || c.residual_decay != 1.0 || c.residual_clip != 0.0) {
      reject(!c.residual ? "residual" : (c.residual_decay != 1.0 ? "residual_decay" : "residual_clip"),
             "formulation = artifact reproduces the artifact's code, which keeps the whole residual; use "
             "formulation = paper");
    }
  }
  if (c.scape.mask_scope == MaskScope::shard && !c.scape.dense_tensors.empty()) {
    reject("dense_tensors", "mask_scope = shard counts k over whole shards, dense tensors included; set "
                            "optimizer.dense_tensors = [] or optimizer.mask_scope = tensor");
  }
}

// fp8_e5m2 is SCAPE's payload, quantized by the optimizer with a shared scale and its error
// kept in the residual (docs/algorithms.md, "FP8 payload").
void check_fp8(const OptimizerConfig& c) {
  if (c.param_dtype == WireType::fp8_e5m2) {
    reject("param_dtype", "fp8_e5m2 is SCAPE's gradient payload only; parameters go at fp32 or bf16");
  }
  if (c.type != OptimizerType::scape) {
    reject("wire_dtype", std::string("fp8_e5m2 is SCAPE's payload (a shared power-of-two scale, the error kept in the "
                                     "residual); ") + to_string(c.type) + " takes fp32 or bf16");
  }
  if (c.sharded) reject("wire_dtype", "fp8_e5m2 is implemented for replicated state; set optimizer.sharded = false");
  if (c.scape.residual_offload) {
    reject("wire_dtype",
           "fp8_e5m2 writes its rounding error into a resident residual; set optimizer.residual_offload = false");
  }
  if (c.scape.second_moment == SecondMoment::two_collectives) {
    reject("wire_dtype", "fp8_e5m2 quantizes the one synchronized buffer; set optimizer.second_moment = single_buffer");
  }
}

// DiLoCo and SparseLoCo (docs/algorithms.md, "DiLoCo" and "SparseLoCo").
void check_outer_loop(const OptimizerConfig& c) {
  check_range("inner_steps", c.outer.inner_steps);
  check_range("outer_lr", c.resolved_outer_lr());
  if (c.type == OptimizerType::diloco) {
    check_range("outer_momentum", c.diloco.outer_momentum);
    check_range("streaming_fragments", c.diloco.streaming_fragments);
    if (c.diloco.streaming_fragments > c.outer.inner_steps) {
      reject("streaming_fragments", std::to_string(c.diloco.streaming_fragments) +
                                        " is more than optimizer.inner_steps = " +
                                        std::to_string(c.outer.inner_steps) +
                                        " (each fragment is synced at its own step of every inner_steps)");
    }
    return;
  }
  check_range("sparsity", c.sparsity);
  check_range("chunk", static_cast<double>(c.sparseloco.chunk));
  check_range("quant_bits", c.sparseloco.quant_bits);
  const int bits = c.sparseloco.quant_bits;
  if (bits != 0 && bits != 2 && bits != 8) bad("optimizer.quant_bits", bits, "must be 0 (off), 2 or 8");
  check_range("ef_decay", c.sparseloco.ef_decay);
  if (c.mask_encoding != MaskEncoding::bitmap && c.mask_encoding != MaskEncoding::elias_fano) {
    reject("mask_encoding", std::string(to_string(c.mask_encoding)) +
                                " codes a mask against the previous step's; sparseloco sends its indices as bitmap "
                                "(each within its chunk) or elias_fano");
  }
}

}  // namespace

void OptimizerConfig::validate() const {
  check_range("lr", lr);
  if (min_lr >= 0 && !(min_lr <= lr)) bad("optimizer.min_lr", min_lr, "must be in [0, lr]");
  check_range("warmup_steps", warmup_steps);
  if (!(beta1 >= 0 && beta1 < 1)) bad("optimizer.betas[0]", beta1, "must be in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) bad("optimizer.betas[1]", beta2, "must be in [0, 1)");
  check_range("eps", eps);
  check_range("weight_decay", weight_decay);
  const bool sparse = type == OptimizerType::scape || type == OptimizerType::topk_ef || type == OptimizerType::randk_ef;
  if (sparse) {
    const double rho = density();
    check_range("sparsity", sparsity);
    if (!(rho > 0 && rho <= 1)) bad("optimizer.sparsity", sparsity, "density 1 - sparsity must lie in (0, 1]");
    check_range("density_warmup", density_warmup);
    check_range("residual_decay", residual_decay);
    check_range("residual_clip", residual_clip);
    check_range("density_start", density_start);
    check_range("density_cooldown", density_cooldown);
    check_range("density_cooldown_start", density_cooldown_start);
    if (density_cooldown > 0 && density_warmup > 0) {
      reject("density_cooldown", "the cool-down replaces the density warm-up (as in the artifact); set "
                                 "optimizer.density_warmup = 0 or density_cooldown = 0");
    }
  }
  if (wire_dtype == WireType::fp8_e5m2 || param_dtype == WireType::fp8_e5m2) check_fp8(*this);
  check_range("clip_grad", clip_grad);
  if (clip_grad > 0 && (type == OptimizerType::onebit_adam || type == OptimizerType::demo)) {
    reject("clip_grad", std::string(to_string(type)) + " never forms the synchronized gradient that clip_grad "
                                                        "clips (it sends compressed momentum); set clip_grad = 0");
  }
  if (clip_grad > 0 && has_outer_loop(type)) {
    reject("clip_grad", std::string(to_string(type)) + " never forms the synchronized gradient that clip_grad "
                                                        "clips (its inner steps take each worker's own gradient); "
                                                        "set clip_grad = 0");
  }
  if (has_outer_loop(type)) check_outer_loop(*this);
  if (type == OptimizerType::scape) {
    check_range("mask_lag", scape.mask_lag);
    check_formulation(*this);
    if (scape.mask_partition == MaskPartition::local_union && sharded) {
      throw std::invalid_argument(
          "optimizer.mask_partition: local_union needs the momentum on every worker; set optimizer.sharded = false");
    }
    if (scape.mask_partition == MaskPartition::local_union && scape.update == UpdateMode::dense) {
      throw std::invalid_argument("optimizer.update: dense is only defined for mask_partition = partitioned");
    }
  }
  if (device != kernels::DeviceKind::cpu && !runs_on_cuda(type)) {
    throw std::invalid_argument(std::string("optimizer.device: ") + kernels::to_string(device) +
                                " runs optimizer types scape, adamw and adams only; " + to_string(type) +
                                " runs on the cpu");
  }
  if (overlap_grad_reduce) {
    if (type != OptimizerType::adamw && type != OptimizerType::adams) {
      throw std::invalid_argument(std::string("optimizer.overlap_grad_reduce: only the dense optimizers (adamw, "
                                              "adams) reduce their gradient in buckets, not ") + to_string(type));
    }
    if (!sharded) {
      throw std::invalid_argument("optimizer.overlap_grad_reduce: buckets are reduce-scattered; set "
                                  "optimizer.sharded = true");
    }
    if (wire_dtype != WireType::fp32) {
      throw std::invalid_argument("optimizer.overlap_grad_reduce: the buckets go at fp32; set "
                                  "optimizer.wire_dtype = fp32");
    }
  }
  if (type != OptimizerType::scape && scape.residual_offload) {
    throw std::invalid_argument(std::string("optimizer.residual_offload: only optimizer type scape keeps an "
                                            "offloadable residual, not ") + to_string(type));
  }
  check_range("offload_chunk", static_cast<double>(scape.offload_chunk));
  if (type == OptimizerType::onebit_adam) {
    check_range("freeze_step", onebit.freeze_step);
    check_range("sign_chunk", static_cast<double>(onebit.sign_chunk));
  }
  if (type == OptimizerType::powersgd) check_range("powersgd_rank", powersgd.rank);
  if (type == OptimizerType::demo) {
    check_range("demo_chunk", static_cast<double>(demo.chunk));
    check_range("demo_topk", static_cast<double>(demo.topk));
    if (demo.topk > demo.chunk)
      bad("optimizer.demo_topk", static_cast<double>(demo.topk), "must be in [1, demo_chunk]");
  }
  if (replicated_only(type) && sharded) {
    throw std::invalid_argument(std::string("optimizer.sharded: ") + to_string(type) +
                                " keeps replicated optimizer state; set sharded = false");
  }
}

bool has_sparse_metrics(const OptimizerConfig& c) {
  return c.type == OptimizerType::scape || c.type == OptimizerType::topk_ef || c.type == OptimizerType::randk_ef;
}

}  // namespace scape
