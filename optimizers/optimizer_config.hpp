// The whole optimizer config: the method type, the common fields (core/optimizer_config.hpp) and
// each method's switches from beside its method, assembled here with the checks that span them
// (docs/algorithms.md, "Switches"; the JSON keys are config/optimizer_keys.cpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/optimizer_config.hpp"
#include "optimizers/baselines/deco_momentum_config.hpp"
#include "optimizers/baselines/onebit_adam_config.hpp"
#include "optimizers/baselines/outer_loop_config.hpp"
#include "optimizers/baselines/powersgd_config.hpp"
#include "optimizers/scape/scape_config.hpp"

namespace scape {

enum class OptimizerType { adamw, adams, scape, topk_ef, randk_ef, onebit_adam, powersgd, demo, diloco, sparseloco };
OptimizerType parse_optimizer_type(std::string_view v);
const char* to_string(OptimizerType v);

// The accepted names of an enum switch ("type", and every method's: "inner", "update", ...), in
// the order errors list them; the config key table reads them from here so each name is written
// once. Throws std::invalid_argument for another key.
std::vector<std::string> optimizer_switch_names(std::string_view key);
// The range of a numeric optimizer key ("lr", "mask_lag", "freeze_step", ...), from the table of
// the part that owns it; throws std::invalid_argument for a key without one.
const OptimizerKeyRange& optimizer_key_range(std::string_view key);

// Defaults are the documented ones (docs/algorithms.md). The JSON keys stay flat:
// optimizer.mask_lag sets scape.mask_lag.
struct OptimizerConfig : CommonOptimizerConfig {
  OptimizerType type = OptimizerType::scape;
  ScapeSwitches scape;
  OnebitAdamSwitches onebit;
  PowersgdSwitches powersgd;
  DecoMomentumSwitches demo;
  OuterLoopSwitches outer;
  DilocoSwitches diloco;
  SparselocoSwitches sparseloco;

  // outer_lr, with a negative value resolved to the type's default: 0.7 for DiLoCo, 0.9 for
  // SparseLoCo.
  double resolved_outer_lr() const;
  // adams_form, with automatic resolved: momentum_corrected for SCAPE's frozen_momentum, the
  // artifact's form for everything else.
  AdamsForm resolved_adams_form() const;
  // SCAPE with a momentum-unit residual and sharded state (carries_owner_momentum).
  bool carries_owner_momentum() const;
  // Throws std::invalid_argument naming the first offending parameter and its value.
  void validate() const;
};

// The local-SGD methods: H inner steps on each worker's own parameters, then an outer step.
inline bool has_outer_loop(OptimizerType t) { return t == OptimizerType::diloco || t == OptimizerType::sparseloco; }

// The comparison baselines (topk_ef, randk_ef, onebit_adam, powersgd, demo, diloco, sparseloco)
// keep replicated optimizer state only.
inline bool replicated_only(OptimizerType t) {
  return t == OptimizerType::topk_ef || t == OptimizerType::randk_ef || t == OptimizerType::onebit_adam ||
         t == OptimizerType::powersgd || t == OptimizerType::demo || has_outer_loop(t);
}

// The types with a CUDA path (device = cuda): SCAPE and the dense AdamW and AdamS; the
// baselines run on the CPU.
inline bool runs_on_cuda(OptimizerType t) {
  return t == OptimizerType::scape || t == OptimizerType::adamw || t == OptimizerType::adams;
}

// Whether the optimizer reports the sparse metrics (mask, residual, staleness): SCAPE, topk_ef
// and randk_ef.
bool has_sparse_metrics(const OptimizerConfig& c);

}  // namespace scape
