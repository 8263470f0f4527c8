// The optimizer configuration as it was before the authors' formulation became the default
// (docs/algorithms.md, "SCAPE": formulation = frozen_momentum with k per whole shard, no dense
// tensors, and AdamS with its bias correction on m_prev): the tests written against that
// specification, and its independent reference in tests/test_reference.cpp, check it through
// this, so they keep checking the same algorithm.
#pragma once

#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"

namespace scape::testing {

inline OptimizerConfig earlier_formulation() {
  OptimizerConfig c;
  c.scape.formulation = Formulation::frozen_momentum;
  c.scape.mask_scope = MaskScope::shard;
  c.scape.dense_tensors.clear();
  c.adams_form = AdamsForm::momentum_corrected;
  return c;
}

// The earlier formulation's `type` with replicated optimizer state.
inline OptimizerConfig earlier_replicated(OptimizerType type) {
  OptimizerConfig c = earlier_formulation();
  c.type = type;
  c.sharded = false;
  return c;
}

}  // namespace scape::testing
