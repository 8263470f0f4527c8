// SCAPE's mask selection: the ranking statistic and this worker's top-k part of the mask
// (docs/algorithms.md, "SCAPE": step 9, and step 2 when the mask is chosen within the step;
// "Mask owners and pieces" for mask_scope = tensor). The all-gather that joins the parts is the
// step's (optimizers/scape/scape_optimizer.cpp).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "optimizers/scape/scape_optimizer.hpp"
#include "util/rng.hpp"

namespace scape {
namespace {

constexpr std::uint64_t kRandomMaskPurpose = 0x6d61736b;  // "mask"

}  // namespace

void ScapeOptimizer::statistic_part(std::span<const float> a, std::size_t first) {
  // Step 9's ranking statistic (frozen_momentum: its step 9): the owner's view of this step's
  // first moment, m~ = b1 m_prev + (1-b1) a, before masking; the gradient statistic ranks |a|
  // instead.
  float* s = stat_.data() + (first - statistic_begin());
  // The paper formulation ranks |c_i|: the residual already holds it, but for the owner's b1 m_prev
  // and its q in sharded mode, which are added here in that order.
  const bool copy = scape_.mask_statistic == MaskStatistic::gradient || (momentum_units() && !config_.sharded);
  if (copy) {
    kernels_.copy_bytes(a.data(), s, a.size_bytes());
    return;
  }
  if (momentum_units()) {
    const auto m = m_.span().subspan(first - state_begin_, a.size());
    const std::span<float> out(s, a.size());
    const auto b1 = static_cast<float>(config_.beta1);
    if (carries_momentum()) {
      kernels_.carried_first_moment_statistic(m, a, q_.span().subspan(first - state_begin_, a.size()), b1, out);
    } else {
      kernels_.first_moment_statistic(m, a, b1, 1.0f, out);
    }
    return;
  }
  const auto m = m_.span().subspan(first - state_begin_, a.size());
  kernels_.first_moment_statistic(m, a, static_cast<float>(config_.beta1), static_cast<float>(1.0 - config_.beta1),
                                  std::span<float>(s, a.size()));
}

void ScapeOptimizer::prepare_statistic(int use_step) {
  const std::size_t lo = statistic_begin();
  const std::size_t count = statistic_end() - lo;
  if (scape_.mask_statistic == MaskStatistic::momentum_only) {
    stat_.resize(count);
    kernels_.copy_bytes(m_.data() + (lo - state_begin_), stat_.data(), count * sizeof(float));
  } else if (scape_.mask_statistic == MaskStatistic::random) {
    // Keyed by the step that uses the mask and, for local_union, by the worker.
    std::uint64_t key =
        rng::derive(rng::derive(config_.seed, kRandomMaskPurpose), static_cast<std::uint64_t>(use_step));
    if (!partitioned()) key = rng::derive(key, static_cast<std::uint64_t>(rank_));
    stat_.resize(count);
    kernels_.random_statistic(key, lo, stat_.span());
  }
}

void ScapeOptimizer::select_local(double rho) {
  selected_rho_ = rho;
  if (partitioned() && scape_.mask_scope == MaskScope::tensor) {
    select_pieces(rho);
  } else if (partitioned()) {
    kernels_.topk_abs_mask(stat_.span(), k_for(rho, own_end_ - own_begin_), local_bits_.span());
  } else {
    local_indices_.resize(k_for(rho, n_));
    kernels_.topk_abs_indices(stat_.span(), local_indices_.size(), local_indices_.span());
  }
}

void ScapeOptimizer::select_pieces(double rho) {
  // Each tensor piece ranks its own statistic; its indices (relative to the piece) are moved to
  // the own segment's bit 0 = element 64 word_begin by a wrapping rebase, then set as bits.
  const std::size_t base = 64 * owners_.word_begin(rank_);
  std::size_t largest = 0;
  for (const auto& piece : owners_.pieces(rank_)) {
    if (!piece.dense) largest = std::max(largest, k_tensor_piece(rho, piece.end - piece.begin));
  }
  piece_top_.resize(largest);  // once: a resize would free memory that queued kernels still read
  piece_idx_.resize(owners_.k(rank_, rho));
  std::size_t pos = 0;
  for (const auto& piece : owners_.pieces(rank_)) {
    if (piece.dense) continue;
    const std::size_t n = piece.end - piece.begin, k = k_tensor_piece(rho, n);
    kernels_.topk_abs_indices(stat_.span().subspan(piece.begin - own_begin_, n), k, piece_top_.span());
    const auto shift = static_cast<std::uint32_t>(0u - static_cast<std::uint32_t>(piece.begin - base));
    // The next piece's selection rewrites piece_top_ after this rebase, in stream order.
    kernels_.rebase_indices(piece_top_.span().first(k), shift, piece_idx_.span().subspan(pos, k));
    pos += k;
  }
  if (!dense_idx_.empty()) kernels_.copy_bytes(dense_idx_.data(), piece_idx_.data() + pos, dense_idx_.bytes());
  kernels_.zero_bytes(local_bits_.data(), local_bits_.bytes());
  kernels_.indices_to_bits(piece_idx_.span(), 0, local_bits_.span());
}

}  // namespace scape
