// SCAPE's switch names, ranges and checks (see scape_config.hpp).
#include "optimizers/scape/scape_config.hpp"

#include <stdexcept>
#include <string>

#include "util/name_table.hpp"

namespace scape {
namespace {

constexpr EnumName<UpdateMode> kUpdate[] = {{"masked", UpdateMode::masked}, {"dense", UpdateMode::dense}};
constexpr EnumName<MaskStatistic> kStatistic[] = {{"first_moment", MaskStatistic::first_moment},
                                                  {"gradient", MaskStatistic::gradient},
                                                  {"momentum_only", MaskStatistic::momentum_only},
                                                  {"random", MaskStatistic::random}};
constexpr EnumName<MaskPartition> kPartition[] = {{"partitioned", MaskPartition::partitioned},
                                                  {"local_union", MaskPartition::local_union}};
constexpr EnumName<SecondMoment> kSecond[] = {{"single_buffer", SecondMoment::single_buffer},
                                              {"two_collectives", SecondMoment::two_collectives}};
constexpr EnumName<Formulation> kFormulation[] = {{"paper", Formulation::paper},
                                                  {"artifact", Formulation::artifact},
                                                  {"frozen_momentum", Formulation::frozen_momentum}};
constexpr EnumName<MaskScope> kScope[] = {{"tensor", MaskScope::tensor}, {"shard", MaskScope::shard}};

constexpr OptimizerKeyRange kRanges[] = {
    {"mask_lag", 0, 1, false, false, "must be 0 or 1"},
};

// The switches that have no meaning under SCAPE's paper and artifact formulations, whose
// residual is in momentum units and whose m is zero off the mask (docs/algorithms.md, "Switches").
void check_formulation(const CommonOptimizerConfig& c, const ScapeSwitches& s) {
  const std::string f = to_string(s.formulation);
  if (s.formulation != Formulation::frozen_momentum) {
    if (s.update == UpdateMode::dense) {
      reject_switch("update", "dense steps m off the mask, which formulation = " + f +
                                  " sets to zero; use update = masked or formulation = frozen_momentum");
    }
    if (s.mask_statistic == MaskStatistic::gradient) {
      reject_switch("mask_statistic",
                    "gradient ranks the raw accumulated gradient e + g, which formulation = " + f +
                        " does not keep (its residual is in momentum units); use formulation = frozen_momentum");
    }
    if (s.second_moment == SecondMoment::two_collectives) {
      reject_switch("second_moment", "two_collectives reduces e + g apart from the momentum, which formulation = " + f +
                                         " does not keep; use formulation = frozen_momentum");
    }
  }
  if (s.formulation != Formulation::frozen_momentum && c.sharded && c.residual_clip > 0) {
    reject_switch("residual_clip", "under formulation = " + f +
                                       " with optimizer.sharded = true the owner keeps each residual's momentum part "
                                       "apart, which a per-worker clip cannot see; set sharded = false");
  }
  if (s.formulation == Formulation::artifact) {
    if (!c.residual || c.residual_decay != 1.0 || c.residual_clip != 0.0) {
      reject_switch(!c.residual ? "residual" : (c.residual_decay != 1.0 ? "residual_decay" : "residual_clip"),
                    "formulation = artifact reproduces the artifact's code, which keeps the whole residual; use "
                    "formulation = paper");
    }
  }
  if (s.mask_scope == MaskScope::shard && !s.dense_tensors.empty()) {
    reject_switch("dense_tensors",
                  "mask_scope = shard counts k over whole shards, dense tensors included; set "
                  "optimizer.dense_tensors = [] or optimizer.mask_scope = tensor");
  }
}

}  // namespace

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
Formulation parse_formulation(std::string_view v) {
  return find_by_name(kFormulation, v, "optimizer.formulation").value;
}
MaskScope parse_mask_scope(std::string_view v) { return find_by_name(kScope, v, "optimizer.mask_scope").value; }
const char* to_string(UpdateMode v) { return name_of(kUpdate, v); }
const char* to_string(MaskStatistic v) { return name_of(kStatistic, v); }
const char* to_string(MaskPartition v) { return name_of(kPartition, v); }
const char* to_string(SecondMoment v) { return name_of(kSecond, v); }
const char* to_string(Formulation v) { return name_of(kFormulation, v); }
const char* to_string(MaskScope v) { return name_of(kScope, v); }

std::vector<std::string> scape_switch_names(std::string_view key) {
  if (key == "update") return names_of(kUpdate);
  if (key == "mask_statistic") return names_of(kStatistic);
  if (key == "mask_partition") return names_of(kPartition);
  if (key == "second_moment") return names_of(kSecond);
  if (key == "formulation") return names_of(kFormulation);
  if (key == "mask_scope") return names_of(kScope);
  return {};
}

std::span<const OptimizerKeyRange> scape_key_ranges() { return kRanges; }

bool ScapeSwitches::dense_tensor(std::string_view name) const {
  for (const auto& part : dense_tensors) {
    if (!part.empty() && name.find(part) != std::string_view::npos) return true;
  }
  return false;
}

bool carries_owner_momentum(const CommonOptimizerConfig& common, const ScapeSwitches& scape) {
  return scape.formulation != Formulation::frozen_momentum && common.sharded && common.residual &&
         common.residual_decay > 0;
}

CommonOptimizerConfig with_scape_adams_form(const CommonOptimizerConfig& common, const ScapeSwitches& scape) {
  CommonOptimizerConfig out = common;
  if (out.adams_form == AdamsForm::automatic) {
    out.adams_form =
        scape.formulation == Formulation::frozen_momentum ? AdamsForm::momentum_corrected : AdamsForm::artifact;
  }
  return out;
}

void validate_scape_switches(const CommonOptimizerConfig& common, const ScapeSwitches& scape) {
  check_key_range(kRanges, "mask_lag", scape.mask_lag);
  check_formulation(common, scape);
  if (scape.mask_partition == MaskPartition::local_union && common.sharded) {
    throw std::invalid_argument(
        "optimizer.mask_partition: local_union needs the momentum on every worker; set optimizer.sharded = false");
  }
  if (scape.mask_partition == MaskPartition::local_union && scape.update == UpdateMode::dense) {
    throw std::invalid_argument("optimizer.update: dense is only defined for mask_partition = partitioned");
  }
}

void validate_scape_fp8(const CommonOptimizerConfig& common, const ScapeSwitches& scape) {
  if (common.sharded) {
    reject_switch("wire_dtype", "fp8_e5m2 is implemented for replicated state; set optimizer.sharded = false");
  }
  if (common.residual_offload) {
    reject_switch(
        "wire_dtype",
        "fp8_e5m2 writes its rounding error into a resident residual; set optimizer.residual_offload = false");
  }
  if (scape.second_moment == SecondMoment::two_collectives) {
    reject_switch("wire_dtype",
                  "fp8_e5m2 quantizes the one synchronized buffer; set optimizer.second_moment = single_buffer");
  }
}

}  // namespace scape
