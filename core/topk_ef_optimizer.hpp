// Baseline: raw-gradient top-k with error feedback (DGC-style). Each worker sends its own
// top-K (index, value) pairs of a_i = e_i + g_i by all-gather; the inner AdamW or AdamS then
// runs densely on g_bar = (1/W) sum_i a_i restricted to L_i (docs/algorithms.md, "Baseline").
#pragma once

#include <vector>

#include "core/metrics.hpp"
#include "core/optimizer.hpp"

namespace scape {

class TopkEfOptimizer final : public Optimizer {
 public:
  TopkEfOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm, int total_steps);
  StepMetrics step(std::span<float> params, std::span<const float> grads) override;
  void save_state(StateMap& state) override;
  void load_state(const StateMap& state) override;
  std::span<const std::uint64_t> mask() const override { return local_mask_; }
  std::span<const float> residual() const override { return e_; }

 private:
  void pack_pairs();
  void sum_pairs_in_rank_order(std::size_t k);

  OptimizerConfig config_;
  const ParamLayout& layout_;
  Communicator& comm_;
  LrSchedule schedule_;
  std::size_t n_;
  std::vector<float> e_, m_, v_, g_bar_;
  kernels::Buffer<double> partial_{kernels::cpu_backend()};  // block sums of the residual metrics
  std::vector<std::uint32_t> idx_;
  std::vector<std::byte> send_, recv_;
  std::vector<std::uint64_t> local_mask_, previous_mask_, union_mask_;
  bool have_previous_mask_ = false;
  metrics::StalenessTracker staleness_;
  metrics::UpdateTracker updates_;
};

}  // namespace scape
