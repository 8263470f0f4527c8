// Baseline: DiLoCo (Douillard et al. 2023, arXiv 2311.08105) and Streaming DiLoCo (Douillard et
// al. 2025, arXiv 2501.18512). Each worker takes inner_steps = H steps of AdamW or AdamS on its own
// parameters; then the pseudo-gradients Delta_i = theta_global - theta_i are all-reduced (mean) at
// outer_wire precision and theta_global takes one SGD step with Nesterov momentum, as
// torch.optim.SGD(nesterov=True) computes it, and every worker restarts from it. With
// streaming_fragments = F one of F contiguous fragments of the flat buffer is synced about every H / F
// steps (docs/algorithms.md, "DiLoCo").
#pragma once

#include "optimizers/baselines/outer_loop.hpp"

namespace scape {

class DilocoOptimizer final : public OuterLoopOptimizer {
 public:
  DilocoOptimizer(const CommonOptimizerConfig& config, const OuterLoopSwitches& outer, const DilocoSwitches& diloco,
                  const ParamLayout& layout, Communicator& comm, int total_steps);

 private:
  void outer_step(std::span<const float> params, std::size_t lo, std::size_t hi, StepMetrics& out) override;
  // x <- the mean over workers of x, at outer_wire precision (fp8_e5m2: each worker's values
  // scaled by a shared power of two and rounded to e5m2 before the sum).
  void all_reduce_pseudo_gradient(std::span<float> x);

  const DilocoSwitches diloco_;
  kernels::Buffer<float> momentum_{kernels_};  // the outer momentum buffer over [0, N)
  kernels::Buffer<float> delta_{kernels_}, mean_{kernels_}, scratch_{kernels_};  // one fragment each
  kernels::Buffer<float> fp8_values_{kernels_}, fp8_error_{kernels_};              // outer_wire = fp8_e5m2
  kernels::Buffer<double> norm_partial_{kernels_};
};

}  // namespace scape
