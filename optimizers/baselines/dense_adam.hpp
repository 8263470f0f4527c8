// Dense data-parallel AdamW / AdamS: replicated state with one all-reduce, or the
// distributed optimizer (reduce-scatter, owners step their shard, parameter all-gather).
#pragma once

#include <utility>
#include <vector>

#include "core/optimizer_base.hpp"

namespace scape {

class DenseOptimizer final : public OptimizerBase {
 public:
  // `rule`: AdamW for optimizer.type = adamw, AdamS for adams.
  DenseOptimizer(const CommonOptimizerConfig& config, InnerRule rule, const ParamLayout& layout, Communicator& comm,
                 int total_steps);

  bool reduces_in_backward() const override { return config_.overlap_grad_reduce; }
  // Starts the reduce-scatter of grads[begin, end): each rank receives the part of the range
  // inside its shard (docs/algorithms.md, "Dense references").
  void gradient_ready(std::span<const float> grads, std::size_t begin, std::size_t end) override;
  void finish() override;

 private:
  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) override;
  // Waits for the step's buckets in the order they started; throws std::logic_error when their
  // ranges do not tile [0, N).
  void wait_for_buckets();

  kernels::Buffer<float> g_bar_{kernels_};  // mean gradient over the state range (all of N when replicated)
  std::vector<PendingCollective> buckets_;                        // this step's, in issue order
  std::vector<std::pair<std::size_t, std::size_t>> bucket_ranges_;  // their [begin, end)
};

}  // namespace scape
