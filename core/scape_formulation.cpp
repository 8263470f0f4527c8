// The passes of SCAPE's paper and artifact formulations beside the ones every formulation
// shares (core/scape_optimizer.cpp), and the per-tensor mask selection of mask_scope = tensor
// (docs/algorithms.md, "SCAPE": mask scope, steps 3, 4 and 6, and `formulation = artifact`).
#include <algorithm>

#include "core/optim_common.hpp"
#include "core/scape_optimizer.hpp"

namespace scape {

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
    k_.topk_abs_indices(stat_.span().subspan(piece.begin - own_begin_, n), k, piece_top_.span());
    const auto shift = static_cast<std::uint32_t>(0u - static_cast<std::uint32_t>(piece.begin - base));
    // The next piece's selection rewrites piece_top_ after this rebase, in stream order.
    k_.rebase_indices(piece_top_.span().first(k), shift, piece_idx_.span().subspan(pos, k));
    pos += k;
  }
  if (!dense_idx_.empty()) k_.copy_bytes(dense_idx_.data(), piece_idx_.data() + pos, dense_idx_.bytes());
  k_.zero_bytes(local_bits_.data(), local_bits_.bytes());
  k_.indices_to_bits(piece_idx_.span(), 0, local_bits_.span());
}

void ScapeOptimizer::carry_momentum() {
  // Step 3 for the momentum part the owner keeps for every worker: q <- gamma (b1 m_prev + q)
  // off the mask, 0 on it (read before step 7 overwrites m).
  const auto q = carried_m_.span();
  k_.candidate_momentum(q, m_.span(), {}, static_cast<float>(config_.beta1), 0.0f);
  if (config_.residual_decay < 1.0) k_.scale(q, static_cast<float>(config_.residual_decay));
  k_.zero_at(q, update_idx_.span());
}

void ScapeOptimizer::double_count_residual(std::span<const float> grads) {
  // The artifact's GPU-resident residual path runs step 3 twice, leaving
  // (1-M)(2 (b1 m_prev + (1-b1) g_i) + e_i); with its residual offloaded it runs once.
  if (feedback_.residual().offloaded()) return;
  const auto e = feedback_.residual().resident();
  k_.candidate_momentum(e, m_.span(), grads, static_cast<float>(config_.beta1), static_cast<float>(1.0 - config_.beta1));
  k_.zero_at(e, idx_.span());
}

void ScapeOptimizer::drop_unowned_residual() {
  // The artifact's sharded path forms c only on the own shard: other ranks' gradients at a
  // position reach neither the payload nor a residual.
  feedback_.residual().for_each_chunk(true, [&](std::size_t begin, std::span<float> e) {
    const std::size_t end = begin + e.size();
    const std::size_t lo = std::clamp(own_begin_, begin, end), hi = std::clamp(own_end_, begin, end);
    k_.fill(e.first(lo - begin), 0.0f);
    k_.fill(e.subspan(hi - begin), 0.0f);
  });
}

void ScapeOptimizer::clip_reconstructed() {
  // Step 6: clip the reconstructed gradient at clip_grad over the whole model, and the momentum
  // on the mask with it: m_new = b1 m_prev + (1-b1) g_hat.
  if (config_.clip_grad <= 0) return;
  const double factor = detail::clip_factor(k_, clip_partial_, comm_, g_bar_.span(), config_.clip_grad, config_.sharded);
  if (factor >= 1.0) return;
  k_.scale(g_bar_.span(), static_cast<float>(factor));
  k_.momentum_from_gradient(m_.span(), update_idx_.span(), g_bar_.span(), static_cast<float>(config_.beta1),
                            static_cast<float>(1.0 - config_.beta1), b_bar_.span());
}

void ScapeOptimizer::zero_momentum_off_mask() {
  // Step 4: m = b_bar on the mask, 0 off it (its content lives on in the residuals).
  k_.fill(m_.span(), 0.0f);
  k_.expand(b_bar_.span(), update_idx_.span(), m_.span());
}

}  // namespace scape
