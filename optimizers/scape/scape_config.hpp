// SCAPE's own switches (optimizer.type = "scape"; docs/algorithms.md, "SCAPE" and "Switches"):
// their values, names, ranges and the checks that reject an inconsistent combination with the
// common fields. The JSON keys stay flat: optimizer.mask_lag sets scape.mask_lag.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/optimizer_config.hpp"

namespace scape {

enum class UpdateMode { masked, dense };
enum class MaskStatistic { first_moment, gradient, momentum_only, random };
enum class MaskPartition { partitioned, local_union };
enum class SecondMoment { single_buffer, two_collectives };
// SCAPE's algorithm (docs/algorithms.md, "SCAPE"): the authors' as their artifact computes it
// (paper), the artifact's code with its two quirks (artifact), or this project's earlier
// specification with the residual in gradient units and m frozen off the mask (frozen_momentum).
enum class Formulation { paper, artifact, frozen_momentum };
// Where SCAPE counts k: per parameter tensor (or its fragment in a shard), or per whole shard.
enum class MaskScope { tensor, shard };

UpdateMode parse_update_mode(std::string_view v);
MaskStatistic parse_mask_statistic(std::string_view v);
MaskPartition parse_mask_partition(std::string_view v);
SecondMoment parse_second_moment(std::string_view v);
Formulation parse_formulation(std::string_view v);
MaskScope parse_mask_scope(std::string_view v);
const char* to_string(UpdateMode v);
const char* to_string(MaskStatistic v);
const char* to_string(MaskPartition v);
const char* to_string(SecondMoment v);
const char* to_string(Formulation v);
const char* to_string(MaskScope v);
// The accepted names of SCAPE's enum switches ("update", "mask_statistic", "mask_partition",
// "second_moment", "formulation", "mask_scope"); an empty list for another key.
std::vector<std::string> scape_switch_names(std::string_view key);
// The ranges of SCAPE's numeric switches ("mask_lag").
std::span<const OptimizerKeyRange> scape_key_ranges();

struct ScapeSwitches {
  UpdateMode update = UpdateMode::masked;
  MaskStatistic mask_statistic = MaskStatistic::first_moment;
  MaskPartition mask_partition = MaskPartition::partitioned;
  int mask_lag = 1;
  SecondMoment second_moment = SecondMoment::single_buffer;
  // The algorithm, where it counts k, and the tensors always on its mask (by name substring;
  // absent from a config: {"norm", "bias"} under mask_scope = tensor, {} under shard).
  Formulation formulation = Formulation::paper;
  MaskScope mask_scope = MaskScope::tensor;
  std::vector<std::string> dense_tensors = {"norm", "bias"};

  // Whether a tensor of this name is always on SCAPE's mask.
  bool dense_tensor(std::string_view name) const;
};

// A momentum-unit residual (paper, artifact) with sharded state: the owner keeps every worker's
// undelivered b1 m_prev over its shard (docs/algorithms.md, "SCAPE").
bool carries_owner_momentum(const CommonOptimizerConfig& common, const ScapeSwitches& scape);
// The common config with adams_form = automatic resolved as SCAPE reads it: momentum_corrected
// under frozen_momentum, the artifact's form otherwise.
CommonOptimizerConfig with_scape_adams_form(const CommonOptimizerConfig& common, const ScapeSwitches& scape);
// SCAPE's checks of its switches against the common fields (mask_lag's range, the formulations'
// exclusions, local_union); throws std::invalid_argument naming the first offending key.
void validate_scape_switches(const CommonOptimizerConfig& common, const ScapeSwitches& scape);
// The parts of the fp8_e5m2 payload's checks that concern SCAPE's switches.
void validate_scape_fp8(const CommonOptimizerConfig& common, const ScapeSwitches& scape);

}  // namespace scape
