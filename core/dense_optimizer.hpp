// Dense data-parallel AdamW / AdamS: replicated state with one all-reduce, or the
// distributed optimizer (reduce-scatter, owners step their shard, parameter all-gather).
#pragma once

#include <vector>

#include "core/metrics.hpp"
#include "core/optimizer.hpp"

namespace scape {

class DenseOptimizer final : public Optimizer {
 public:
  DenseOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm, int total_steps);
  StepMetrics step(std::span<float> params, std::span<const float> grads) override;
  void save_state(StateMap& state) override;
  void load_state(const StateMap& state) override;

 private:
  OptimizerConfig config_;
  const ParamLayout& layout_;
  Communicator& comm_;
  LrSchedule schedule_;
  InnerRule rule_;
  Sharding sharding_;
  std::size_t state_begin_;  // first coordinate whose optimizer state this worker keeps
  std::size_t state_end_;
  std::vector<float> m_, v_, g_bar_;
  metrics::UpdateTracker updates_;
};

}  // namespace scape
