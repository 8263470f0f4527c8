// SCAPE: AdamS (or AdamW) with sparse communication on first-moment top-k masks, partitioned
// per owner shard, lagged by one step, one reduced payload, per-worker error feedback
// (docs/algorithms.md, "SCAPE": steps 1-9 of the paper formulation, the frozen_momentum
// formulation's own 1-9, and the switches). The step is scape_optimizer.cpp, the formulations'
// passes scape_formulation.cpp, the statistic and selection of the mask mask_selection.cpp.
// Every buffer lives in the memory of a KernelBackend (CPU or CUDA) and every pass over it is a
// backend kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/optimizer_base.hpp"
#include "optimizers/feedback/error_feedback.hpp"
#include "optimizers/scape/mask_exchange.hpp"
#include "optimizers/scape/mask_ownership.hpp"

namespace scape {

class ScapeOptimizer final : public OptimizerBase {
 public:
  ScapeOptimizer(const CommonOptimizerConfig& config, const ScapeSwitches& scape, const ParamLayout& layout,
                 Communicator& comm, int total_steps);
  ~ScapeOptimizer() override;

  void finish() override;
  std::span<const std::uint64_t> mask() const override { return mask_.span(); }
  std::span<const float> residual() const override { return feedback_.residual().host_view(); }
  // Over the shard S_w (the oracle's view), whoever owns its mask bits.
  std::span<const float> own_first_moment() const override {
    return m_.span().subspan(sharding_.begin(rank_) - state_begin_, sharding_.size(rank_));
  }
  std::string device_summary() const override;
  // Bits this worker computed at the end of the last step for the next mask (its own shard,
  // partitioned masks under lag 1): invariant 6 compares them with the next step's mask.
  std::span<const std::uint64_t> next_mask_local_bits() const { return local_bits_.span(); }
  // Sharded paper and artifact formulations: the undelivered momentum b1 m_prev, kept once by
  // the owner over its shard; empty otherwise. Under paper it is part of every worker's e_i
  // (residual() + this on the shard); under artifact, whose sharded ranks keep no residual
  // outside their own shard, of the owner's alone.
  std::span<const float> carried_momentum() const { return q_.span(); }
  const MaskOwnership& owners() const { return owners_; }
  // Device memory the residual occupies (N floats resident, two chunks offloaded).
  std::size_t residual_device_bytes() const { return feedback_.residual().device_bytes(); }

 private:
  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) override;
  void fill_final_metrics(StepMetrics& out) override {
    feedback_.fill_metrics(layout_, updates_.theta_norm(), t_, out);
  }
  // A masked update steps M_t only (decay alone moves the rest); a dense one steps everything.
  std::span<const std::uint64_t> stepped_coordinates() const override {
    return scape_.update == UpdateMode::masked ? mask_.span() : std::span<const std::uint64_t>{};
  }
  // The masked update measures itself: the decay of the coordinates off the mask and the
  // statistics are one pass (update_masked()).
  bool measures_own_update() const override { return scape_.update == UpdateMode::masked; }
  void save_policy_state(StateMap& state) const override;
  void load_policy_state(const StateMap& state) override;

  bool partitioned() const { return scape_.mask_partition == MaskPartition::partitioned; }
  // The paper and artifact formulations: the residual in momentum units, m zero off the mask.
  bool momentum_units() const { return scape_.formulation != Formulation::frozen_momentum; }
  // Sharded momentum-unit residuals: the owner keeps the momentum part (q_).
  bool carries_momentum() const { return carries_owner_momentum(config_, scape_); }
  // A sharded owner adds b1 m_prev (and q) to the reduced payload in step 5's pass
  // (owner_payload_gradient), which also zeroes q on the mask, unless the artifact's form or a
  // second collective needs them added in step 3.
  bool owner_momentum_in_step5() const {
    return config_.sharded && scape_.formulation != Formulation::artifact && !two_collectives();
  }
  // The mask (partitioned) or the index lists (local_union) cross the wire coded.
  bool coded() const { return config_.mask_encoding != MaskEncoding::bitmap; }
  bool two_collectives() const { return scape_.second_moment == SecondMoment::two_collectives; }
  std::size_t k_total(double rho) const;
  // The range the ranking statistic covers: the own shard (partitioned) or the whole buffer.
  std::size_t statistic_begin() const { return partitioned() ? own_begin_ : 0; }
  std::size_t statistic_end() const { return partitioned() ? own_end_ : n_; }
  bool statistic_reads_residual() const;

  // One pass over the residual, chunk by chunk: step 1 (c_i; frozen_momentum: a_i = e_i + g_i)
  // when `accumulate`, the part of step 9's statistic that reads it when `statistic`, step 3's
  // payload on the mask and step 4's residual (delivered coordinates restart from zero) when
  // `deliver`. Returns how many gradient entries were not finite.
  std::size_t residual_pass(std::span<const float> grads, bool accumulate, bool statistic, bool deliver);
  void deliver_part(std::size_t begin, std::span<float> a);
  // Step 1 on the chunk a at `begin`, fused on the own shard with step 9's statistic and step 4's
  // carry of q (candidate_statistic_carry); returns how many gradient entries were not finite.
  std::size_t candidate_with_carry(std::span<const float> grads, std::size_t begin, std::span<float> a);
  // The statistic and selection of the mask (mask_selection.cpp): step 9, and step 2 when the
  // mask is chosen within the step. statistic_part: the part that reads the residual pass's
  // chunk a, starting at position `first`.
  void statistic_part(std::span<const float> a, std::size_t first);
  // The statistic where it does not read a_i (momentum_only, random keyed by `use_step`).
  void prepare_statistic(int use_step);
  // Selects this worker's part of the mask for density rho from stat_ into its send buffer.
  void select_local(double rho);
  // mask_scope = tensor: top-k of every tensor piece separately, and every bit of a dense one.
  void select_pieces(double rho);
  // The formulations' passes beside the shared ones (scape_formulation.cpp).
  void carry_momentum();
  float carry_decay() const;  // gamma on q's carry: residual_decay, 1 (no multiplication) when >= 1
  void double_count_residual(std::span<const float> grads);
  void drop_unowned_residual();
  void clip_reconstructed();
  bool fp8() const { return config_.wire_dtype == WireType::fp8_e5m2; }
  void quantize_payload(int t);
  void zero_momentum_off_mask();
  // Mask words per shard, in rank order (the counts of the partitioned mask all-gather).
  std::vector<std::size_t> mask_word_counts() const;
  void start_coded_exchange(bool overlapped);
  void gather_mask_now();
  void start_mask_gather();
  void receive_mask();
  // idx_ (mask positions, ascending), payload sizes and the per-shard counts of mask_.
  void index_mask();
  // Step 3 (frozen_momentum: its step 5): reduces the payload b_ on M_t into b_bar_ (and a_bar_).
  void reduce_payload();
  void reconstruct_gradient();
  void update_masked(std::span<float> params, double eta, int t);
  void update_dense(std::span<float> params, double eta, int t);
  std::vector<std::size_t> mask_counts_per_shard();

  const ScapeSwitches scape_;
  const MaskOwnership owners_;       // who selects which mask bits
  std::size_t own_begin_, own_end_;  // this worker's range (it computes its mask bits)

  ErrorFeedback feedback_;  // residual e_i (holds a_i = e_i + g_i during a step), staleness, previous mask
  kernels::Buffer<float> stat_{kernels_};
  kernels::Buffer<std::uint64_t> mask_{kernels_}, next_mask_{kernels_};
  metrics::RangeCounter shard_counts_{kernels_,
                                      metrics::shard_ranges(sharding_)};  // mask bits per shard, on the device
  kernels::Buffer<std::uint64_t> local_bits_{kernels_};          // partitioned: own segment words (send buffer)
  kernels::Buffer<std::uint32_t> piece_idx_{kernels_}, piece_top_{kernels_};  // mask_scope = tensor: selected positions
  kernels::Buffer<std::uint32_t> dense_idx_{kernels_};           // positions of dense tensors in the own segment
  kernels::Buffer<float> q_{kernels_};                           // carries_momentum(): q over the own shard
  bool q_carried_ = false;  // this step's residual pass carried q off the mask (carry_momentum: zero it on it)
  kernels::Buffer<float> fp8_q_{kernels_}, fp8_error_{kernels_};       // fp8(): the quantized payload and its error
  int fp8_exponent_ = 0;                                   // fp8(): the shared scale 2^exponent
  bool fp8_scaled_ = false;                                // fp8(): the exponent has been taken
  kernels::Buffer<std::uint32_t> local_indices_{kernels_};       // local_union: own top-K (send buffer)
  kernels::Buffer<std::uint32_t> gathered_indices_{kernels_};    // local_union: everyone's top-K
  std::vector<std::size_t> gathered_counts_;
  PendingCollective pending_;
  MaskExchange exchange_;    // coded(): the mask all-gather and its coding
  double selected_rho_ = 0;  // the density select_local drew the send buffer at

  kernels::Buffer<std::uint32_t> idx_{kernels_};         // mask positions, ascending (mask order)
  kernels::Buffer<std::uint32_t> chunk_idx_{kernels_};   // offloaded: idx_ of one chunk, relative to it
  std::vector<std::size_t> counts_;                // mask entries per shard (partitioned)
  kernels::Buffer<std::uint32_t> update_idx_{kernels_};  // positions this worker updates, relative to state_begin_
  std::size_t update_offset_ = 0;                  // where update_idx_ starts inside idx_
  std::vector<std::uint64_t> decay_ends_;          // the weight decay by pieces (update_masked)
  std::vector<float> decay_factors_;
  kernels::Buffer<float> b_{kernels_}, a_packed_{kernels_};    // send payloads
  kernels::Buffer<float> b_bar_{kernels_}, a_bar_{kernels_};   // reduced values for update_idx_
  kernels::Buffer<float> g_hat_{kernels_};                     // reconstructed gradient for update_idx_
  kernels::Buffer<float> dense_g_{kernels_};                   // update = dense: g_hat over the state range
  kernels::Buffer<float> own_values_{kernels_}, all_values_{kernels_};  // parameter all-gather of updated values
};

}  // namespace scape
