// Baseline: raw-gradient top-k with error feedback (DGC-style). Each worker sends its own
// top-K (index, value) pairs of a_i = e_i + g_i by all-gather; the inner AdamW or AdamS then
// runs densely on g_bar = (1/W) sum_i a_i restricted to L_i (docs/algorithms.md, "Baseline").
#pragma once

#include <cstddef>
#include <cstdint>

#include "optimizers/baselines/feedback_optimizer.hpp"

namespace scape {

class TopkEfOptimizer final : public FeedbackOptimizer {
 public:
  TopkEfOptimizer(const CommonOptimizerConfig& config, const ParamLayout& layout, Communicator& comm, int total_steps);

 private:
  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) override;

  // a_i = e_i + g_i; L_i = top-k of |a_i| into idx_ and mask_, its values into
  // sent_values_; the residual keeps a_i off L_i. Returns the non-finite gradient entries.
  std::size_t select(std::span<const float> grads, std::size_t k);
  // The all-gather of (index, value) records, unpacked into recv_idx_ and recv_values_; with a
  // coded mask_encoding each worker's indices travel Elias-Fano coded (exchange_coded).
  void exchange_pairs();
  void exchange_coded();
  // g_bar = (1/W) sum over workers in rank order of their delivered values, zero elsewhere;
  // returns how many coordinates some worker delivered.
  std::size_t average_delivered(std::size_t k);

  kernels::Buffer<float> sent_values_{kernels_};      // a_i on L_i, in idx_ order
  kernels::Buffer<std::byte> send_{kernels_}, recv_{kernels_};  // wire records
  kernels::Buffer<std::uint32_t> recv_idx_{kernels_};  // every worker's L_i, in rank order
  kernels::Buffer<float> recv_values_{kernels_};
  kernels::Buffer<std::uint64_t> union_mask_{kernels_};
  kernels::Buffer<std::uint32_t> union_idx_{kernels_};  // the coordinates some worker delivered, ascending
  kernels::Buffer<float> union_values_{kernels_};       // g_bar on them, compacted
  kernels::Buffer<std::uint64_t> code_{kernels_};  // mask_encoding other than bitmap: Elias-Fano indices
  double codec_s_ = 0;                        // this step's coding and decoding
};

}  // namespace scape
