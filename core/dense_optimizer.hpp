// Dense data-parallel AdamW / AdamS: replicated state with one all-reduce, or the
// distributed optimizer (reduce-scatter, owners step their shard, parameter all-gather).
#pragma once

#include "core/optimizer_base.hpp"

namespace scape {

class DenseOptimizer final : public OptimizerBase {
 public:
  DenseOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm, int total_steps);

 private:
  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) override;

  kernels::Buffer<float> g_bar_{k_};  // mean gradient over the state range (all of N when replicated)
};

}  // namespace scape
