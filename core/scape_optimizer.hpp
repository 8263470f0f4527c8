// SCAPE: AdamS (or AdamW) with sparse communication on first-moment top-k masks, partitioned
// per owner shard, lagged by one step, one synchronized buffer, per-worker error feedback
// (docs/algorithms.md, "SCAPE", steps 1-8 and the switches).
#pragma once

#include <vector>

#include "core/metrics.hpp"
#include "core/optimizer.hpp"

namespace scape {

class ScapeOptimizer final : public Optimizer {
 public:
  ScapeOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm, int total_steps);
  ~ScapeOptimizer() override;

  StepMetrics step(std::span<float> params, std::span<const float> grads) override;
  void finish() override;
  void save_state(StateMap& state) override;
  void load_state(const StateMap& state) override;
  std::span<const std::uint64_t> mask() const override { return mask_; }
  std::span<const float> residual() const override { return e_; }
  // Bits this worker computed at the end of the last step for the next mask (its own shard,
  // partitioned masks under lag 1): invariant 6 compares them with the next step's mask.
  std::span<const std::uint64_t> next_mask_local_bits() const { return local_bits_; }

 private:
  bool partitioned() const { return config_.mask_partition == MaskPartition::partitioned; }
  std::size_t k_total(double rho) const;
  // The ranking statistic of this worker over its own shard (partitioned) or the whole
  // buffer (local_union), from m_prev and a_i; `use_step` keys the random statistic.
  void compute_statistic(int use_step);
  // Selects this worker's part of the mask for density rho from stat_ into its send buffer.
  void select_local(double rho);
  void gather_mask_now();
  void start_mask_gather();
  void receive_mask();
  void pack_payload();
  void synchronize(std::span<const std::size_t> counts);
  void reconstruct_gradient();
  void update_masked(std::span<float> params, double eta, int t, std::span<const std::size_t> counts);
  void update_dense(std::span<float> params, double eta, int t);
  std::vector<std::size_t> mask_counts_per_shard() const;

  OptimizerConfig config_;
  const ParamLayout& layout_;
  Communicator& comm_;
  LrSchedule schedule_;
  Sharding sharding_;
  std::size_t n_;
  int rank_;
  std::size_t state_begin_, state_end_;  // optimizer state kept by this worker
  std::size_t own_begin_, own_end_;      // this worker's shard (it computes its mask bits)

  std::vector<float> e_;                 // residual; holds a_i = e_i + g_i during a step
  std::vector<float> m_, v_;             // moments over [state_begin_, state_end_)
  std::vector<float> stat_;
  std::vector<std::uint64_t> mask_, previous_mask_, next_mask_;
  std::vector<std::uint64_t> local_bits_;        // partitioned: own shard words (send buffer)
  std::vector<std::uint32_t> local_indices_;     // local_union: own top-K (send buffer)
  std::vector<std::uint32_t> gathered_indices_;  // local_union: everyone's top-K
  std::vector<std::size_t> gathered_counts_;
  PendingAllGather pending_;
  bool have_previous_mask_ = false;

  std::vector<std::uint32_t> idx_;        // mask positions, ascending (mask order)
  std::vector<std::uint32_t> update_idx_;  // positions this worker updates, relative to state_begin_
  std::size_t update_offset_ = 0;         // where update_idx_ starts inside idx_
  std::vector<float> b_, a_packed_;        // send payloads
  std::vector<float> b_bar_, a_bar_;       // synchronized values for update_idx_
  std::vector<float> g_bar_;               // reconstructed gradient for update_idx_
  std::vector<float> dense_g_;             // update = dense: g_bar over the state range
  std::vector<float> own_values_, all_values_;  // parameter all-gather of updated values

  metrics::StalenessTracker staleness_;
  metrics::UpdateTracker updates_;
};

}  // namespace scape
