// Baseline: random-k with a shared seed and error feedback (Stich et al. 2018, "Sparsified SGD
// with memory"). Every worker draws the same K coordinates from (seed, step), so only values
// travel: one all-reduce of K values; the inner AdamW or AdamS then runs densely on g_bar,
// which is zero off the mask (docs/algorithms.md, "Random-k with a shared seed").
#pragma once

#include <cstddef>
#include <cstdint>

#include "optimizers/baselines/feedback_optimizer.hpp"

namespace scape {

class RandkEfOptimizer final : public FeedbackOptimizer {
 public:
  RandkEfOptimizer(const CommonOptimizerConfig& config, const ParamLayout& layout, Communicator& comm, int total_steps);

 private:
  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) override;

  // The K coordinates of step t, the same on every worker: the top-K of a uniform draw keyed
  // by (seed, t), into idx_ (ascending) and mask_.
  void draw_mask(int t, std::size_t k);

  kernels::Buffer<float> draw_{kernels_};    // the uniform draw the shared mask is selected from
  kernels::Buffer<float> values_{kernels_};  // a_i on the mask, then their mean over workers
};

}  // namespace scape
