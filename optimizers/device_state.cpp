// The optimizer's device memory by buffer (device_state.hpp). Names follow the members of
// OptimizerBase, DenseOptimizer, ScapeOptimizer, ErrorFeedback and MaskExchange.
#include "optimizers/device_state.hpp"

#include <algorithm>

#include "optimizers/scape/mask_ownership.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/schedule.hpp"
#include "kernels/kernel_types.hpp"
#include "kernels/update_stats.hpp"

namespace scape {
namespace {

constexpr std::size_t kFloat = sizeof(float), kWord = sizeof(std::uint64_t), kIndex = sizeof(std::uint32_t);
constexpr std::size_t kMetricBlock = 8192;  // the metrics' blocks (ErrorFeedback, OptimizerBase, UpdateTracker)

std::size_t norm_blocks(std::size_t n) { return (n + kMetricBlock - 1) / kMetricBlock; }

// SCAPE's buffers beyond m (and v): statistic, masks, residual, index and payload buffers and
// the coded mask messages, for partitioned masks.
std::size_t scape_bytes(const OptimizerConfig& c, const ParamLayout& layout, int workers) {
  const std::size_t n = layout.size();
  const Sharding shards(n, workers);
  const std::size_t own = c.sharded ? shards.size(0) : n;
  // The densest mask of the run: all of N while a density warm-up runs.
  const double rho = c.density_warmup > 0 ? 1.0 : c.density();
  const MaskOwnership owners(layout, workers, c, c.scape);
  std::size_t k_total = 0, coded = 0;
  for (int w = 0; w < workers; ++w) {
    const std::size_t k = owners.k(w, rho);
    k_total += k;
    coded +=
        c.mask_encoding == MaskEncoding::bitmap ? owners.word_count(w) : kernels::ef_words(owners.segment_bits(w), k);
  }
  const std::size_t k_own = owners.k(0, rho);
  const std::size_t updated = c.sharded ? k_own : k_total;
  std::size_t bytes = 0;
  bytes += kFloat * own;                                    // stat_: the mask statistic of the own shard
  bytes += 2 * kWord * kernels::words_for(n);               // mask_, next_mask_
  bytes += kWord * shards.words(0);                         // local_bits_
  bytes += kWord * kernels::words_for(n);                   // ErrorFeedback::previous_mask_
  bytes += sizeof(double) * (n / kMetricBlock + 64);        // ErrorFeedback::partial_ (per tensor, rounded up)
  // The residual e_i, or the two device chunks it streams through (ResidualStore: at most N each).
  bytes += c.residual_offload ? 2 * kFloat * std::min<std::size_t>(c.offload_chunk, std::max<std::size_t>(n, 1))
                              : kFloat * n;
  if (c.residual_offload) bytes += kIndex * k_total;        // chunk_idx_
  bytes += kIndex * k_total + kFloat * k_total;             // idx_, b_
  if (c.scape.second_moment == SecondMoment::two_collectives)
    bytes += kFloat * (k_total + updated);                  // a_packed_, a_bar_
  bytes += (kIndex + 3 * kFloat) * updated;                 // update_idx_, b_bar_, g_hat_, own_values_
  bytes += kFloat * k_total;                                // all_values_
  if (c.scape.update == UpdateMode::dense) bytes += kFloat * own; // dense_g_
  bytes += kWord * (coded + coded / static_cast<std::size_t>(workers) + 2 + static_cast<std::size_t>(workers));
  // mask_scope = tensor: the selected positions of worker 0, its largest piece's top-k, and
  // its dense tensors' positions (optimizers/scape/mask_selection.cpp, select_pieces).
  if (c.scape.mask_scope == MaskScope::tensor && c.scape.mask_partition == MaskPartition::partitioned) {
    std::size_t largest = 0, dense = 0;
    for (const auto& p : owners.pieces(0)) {
      if (p.dense) dense += p.end - p.begin;
      else largest = std::max(largest, k_tensor_piece(rho, p.end - p.begin));
    }
    bytes += kIndex * (owners.k(0, rho) + largest + dense);
  }
  // Sharded momentum units: the owner's carried momentum over its shard.
  if (c.carries_owner_momentum()) bytes += kFloat * own;
  return bytes;
}

}  // namespace

std::size_t update_tracker_device_bytes(std::size_t n) {
  return kFloat * n + sizeof(std::int8_t) * n + sizeof(double) * kernels::kUpdateStats * norm_blocks(n);
}

std::size_t optimizer_device_bytes(const OptimizerConfig& config, const ParamLayout& layout, int workers) {
  const std::size_t n = layout.size();
  if (!runs_on_cuda(config.type)) {
    throw std::invalid_argument(std::string("optimizer_device_bytes: ") + to_string(config.type) +
                                " has no CUDA path");
  }
  const Sharding shards(n, workers);
  const std::size_t own = config.sharded ? shards.size(0) : n;
  const bool adamw = config.type == OptimizerType::adamw ||
                     (config.type == OptimizerType::scape && config.inner == InnerRule::adamw);
  std::size_t bytes = kFloat * own * (adamw ? 2 : 1);  // m_, and v_ for AdamW
  // Block sums of ||theta|| (UpdateTracker::norm_only; worker 0's after() uses its own, counted
  // in update_tracker_device_bytes).
  bytes += sizeof(double) * norm_blocks(n);
  if (config.type == OptimizerType::scape) return bytes + scape_bytes(config, layout, workers);
  return bytes + kFloat * own;  // DenseOptimizer::g_bar_ (the state range)
}

}  // namespace scape
