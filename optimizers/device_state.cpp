// The optimizer's device memory by buffer (device_state.hpp). Names follow the members of
// OptimizerBase, DenseOptimizer, ScapeOptimizer, ErrorFeedback, MaskExchange, OuterLoopOptimizer,
// DilocoOptimizer and HierarchicalOptimizer.
#include "optimizers/device_state.hpp"

#include <algorithm>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "optimizers/rail_partition.hpp"
#include "optimizers/scape/mask_ownership.hpp"

#include "core/adam_step.hpp"
#include "core/schedule.hpp"
#include "kernels/kernel_types.hpp"
#include "kernels/update_stats.hpp"

namespace scape {
namespace {

constexpr std::size_t kFloat = sizeof(float), kWord = sizeof(std::uint64_t), kIndex = sizeof(std::uint32_t);
constexpr std::size_t kMetricBlock = 8192;  // the metrics' blocks (ErrorFeedback, OptimizerBase, UpdateTracker)

std::size_t norm_blocks(std::size_t n) { return (n + kMetricBlock - 1) / kMetricBlock; }

// SCAPE's masked update measures its own update (ScapeOptimizer::measures_own_update).
bool measures_own_update(const OptimizerConfig& c) {
  return c.type == OptimizerType::scape && c.scape.update == UpdateMode::masked;
}

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
  if (measures_own_update(c)) {
    // UpdateTracker::decay_stepped and decay_rest_and_*: the mask's kept values, the decay's
    // pieces and the statistics' block sums, on every worker.
    std::vector<std::uint64_t> ends;
    std::vector<float> factors;
    detail::weight_decay_pieces(layout, n, c, 0.0, ends, factors);
    bytes +=
        kFloat * k_total + (kWord + kFloat) * ends.size() + sizeof(double) * kernels::kUpdateStats * norm_blocks(n);
  }
  return bytes;
}

// DiLoCo's buffers beyond the moments (optimizers/baselines/diloco.hpp, outer_loop.hpp): theta_global,
// the outer momentum, the pseudo-gradient, its mean and a scratch (N each; the fragment in use is
// a prefix), the fp8 values and rounding, the overlap_outer snapshot, the pseudo-gradient's block
// sums.
std::size_t diloco_bytes(const OptimizerConfig& c, std::size_t n) {
  const std::size_t copies = 5 + (c.diloco.outer_wire == WireType::fp8_e5m2 ? 2 : 0) + (c.outer.overlap_outer ? 1 : 0);
  return kFloat * n * copies + sizeof(double) * norm_blocks(n);
}

bool two_moments(const OptimizerConfig& c) {
  return c.type == OptimizerType::adamw || (c.type != OptimizerType::adams && c.inner == InnerRule::adamw);
}

std::size_t own_shard(const OptimizerConfig& c, std::size_t n, int workers) {
  return c.sharded ? Sharding(n, workers).size(0) : n;
}

// Worker 0's bytes of the flat method.
std::size_t flat_device_bytes(const OptimizerConfig& c, const ParamLayout& layout, int workers) {
  const std::size_t n = layout.size();
  const std::size_t own = own_shard(c, n, workers);
  std::size_t bytes = kFloat * own * (two_moments(c) ? 2 : 1);  // m_, and v_ for AdamW
  // Block sums of ||theta|| (UpdateTracker::norm_only; worker 0's after() uses its own, counted
  // in update_tracker_device_bytes); SCAPE's masked update has its own (scape_bytes).
  if (!measures_own_update(c)) bytes += sizeof(double) * norm_blocks(n);
  if (c.type == OptimizerType::scape) return bytes + scape_bytes(c, layout, workers);
  if (c.type == OptimizerType::diloco) return bytes + diloco_bytes(c, n);
  return bytes + kFloat * own;  // DenseOptimizer::g_bar_ (the state range)
}

std::size_t flat_state_bytes(const OptimizerConfig& c, const ParamLayout& layout, int workers) {
  const std::size_t n = layout.size();
  const std::size_t own = own_shard(c, n, workers);
  std::size_t floats = own * (two_moments(c) ? 2 : 1);
  if (c.type == OptimizerType::scape) {
    if (!c.residual_offload) floats += n;
    if (c.carries_owner_momentum()) floats += own;
  }
  if (c.type == OptimizerType::diloco) floats += n * (c.outer.overlap_outer ? 3 : 2);
  return kFloat * floats;
}

using FlatBytes = std::function<std::size_t(const OptimizerConfig&, const ParamLayout&, int)>;

// One rank's bytes of each rail of a node (flat: one entry, worker 0's). A rank of rail l holds
// the flat method over rail l's part among the W / G nodes and, in the device figure, the
// wrapper's whole-model buffer (N: the packed gradient, then the gathered parameters) and the
// rail's gradient and parameters (its part each).
std::vector<std::size_t> rank_bytes(const OptimizerConfig& c, const ParamLayout& layout, int workers,
                                    const FlatBytes& flat, bool with_wrapper) {
  if (!has_device_bytes(c.type)) {
    throw std::invalid_argument(std::string("optimizer_device_bytes: ") + to_string(c.type) +
                                " has no buffer-by-buffer count");
  }
  if (c.hierarchy == Hierarchy::flat) return {flat(c, layout, workers)};
  OptimizerConfig rail = c;
  rail.hierarchy = Hierarchy::flat;
  rail.rail_split = RailSplit::tensors;
  const int nodes = workers / c.ranks_per_node;
  std::vector<std::size_t> out;
  for (const RailPart& part : split_into_rails(layout, c.ranks_per_node, c.rail_split)) {
    const std::size_t wrapper = with_wrapper ? kFloat * (layout.size() + 2 * part.size()) : 0;
    out.push_back(flat(rail, part.layout, nodes) + wrapper);
  }
  return out;
}

}  // namespace

bool has_device_bytes(OptimizerType t) { return runs_on_cuda(t) || t == OptimizerType::diloco; }

std::size_t update_tracker_device_bytes(const OptimizerConfig& config, std::size_t n) {
  if (measures_own_update(config)) return sizeof(std::int8_t) * n;
  return kFloat * n + sizeof(std::int8_t) * n + sizeof(double) * kernels::kUpdateStats * norm_blocks(n);
}

std::size_t optimizer_device_bytes(const OptimizerConfig& config, const ParamLayout& layout, int workers) {
  const auto ranks = rank_bytes(config, layout, workers, flat_device_bytes, true);
  return *std::max_element(ranks.begin(), ranks.end());
}

std::size_t optimizer_device_bytes_all(const OptimizerConfig& config, const ParamLayout& layout, int workers) {
  const auto ranks = rank_bytes(config, layout, workers, flat_device_bytes, true);
  const auto groups = static_cast<std::size_t>(workers) / ranks.size();  // nodes, or W single workers
  return groups * std::accumulate(ranks.begin(), ranks.end(), std::size_t{0});
}

std::size_t optimizer_state_bytes(const OptimizerConfig& config, const ParamLayout& layout, int workers) {
  const auto ranks = rank_bytes(config, layout, workers, flat_state_bytes, false);
  return *std::max_element(ranks.begin(), ranks.end());
}

}  // namespace scape
