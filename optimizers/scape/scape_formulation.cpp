// The passes of SCAPE's paper and artifact formulations beside the ones every formulation
// shares (optimizers/scape/scape_optimizer.cpp), and the per-tensor mask selection of mask_scope = tensor
// (docs/algorithms.md, "SCAPE": mask scope, steps 3, 4 and 6, and `formulation = artifact`).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/fp8.hpp"

#include "core/adam_step.hpp"
#include "optimizers/scape/scape_optimizer.hpp"

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

void ScapeOptimizer::carry_momentum() {
  // Step 3 for the momentum part the owner keeps for every worker: q <- gamma (b1 m_prev + q)
  // off the mask, 0 on it (read before step 7 overwrites m).
  const auto q = carried_m_.span();
  kernels_.candidate_momentum(q, m_.span(), {}, static_cast<float>(config_.beta1), 0.0f);
  if (config_.residual_decay < 1.0) kernels_.scale(q, static_cast<float>(config_.residual_decay));
  kernels_.zero_at(q, update_idx_.span());
}

void ScapeOptimizer::double_count_residual(std::span<const float> grads) {
  // The artifact's GPU-resident residual path runs step 3 twice, leaving
  // (1-M)(2 (b1 m_prev + (1-b1) g_i) + e_i); with its residual offloaded it runs once.
  if (feedback_.residual().offloaded()) return;
  const auto e = feedback_.residual().resident();
  kernels_.candidate_momentum(e, m_.span(), grads, static_cast<float>(config_.beta1),
                              static_cast<float>(1.0 - config_.beta1));
  kernels_.zero_at(e, idx_.span());
}

void ScapeOptimizer::drop_unowned_residual() {
  // The artifact's sharded path forms c only on the own shard: other ranks' gradients at a
  // position reach neither the payload nor a residual.
  feedback_.residual().for_each_chunk(true, [&](std::size_t begin, std::span<float> e) {
    const std::size_t end = begin + e.size();
    const std::size_t lo = std::clamp(own_begin_, begin, end), hi = std::clamp(own_end_, begin, end);
    kernels_.fill(e.first(lo - begin), 0.0f);
    kernels_.fill(e.subspan(hi - begin), 0.0f);
  });
}

void ScapeOptimizer::clip_reconstructed() {
  // Step 6: clip the reconstructed gradient at clip_grad over the whole model, and the momentum
  // on the mask with it: m_new = b1 m_prev + (1-b1) g_hat.
  if (config_.clip_grad <= 0) return;
  const double factor =
      detail::clip_factor(kernels_, clip_partial_, comm_, g_bar_.span(), config_.clip_grad, config_.sharded);
  if (factor >= 1.0) return;
  kernels_.scale(g_bar_.span(), static_cast<float>(factor));
  kernels_.momentum_from_gradient(m_.span(), update_idx_.span(), g_bar_.span(), static_cast<float>(config_.beta1),
                            static_cast<float>(1.0 - config_.beta1), b_bar_.span());
}

void ScapeOptimizer::quantize_payload(int t) {
  // FP8 payload: the shared exponent s = floor(log2 max |c|) over every worker's payload, taken
  // at step 1, every 100 steps and when a value would overflow; each value goes as
  // e5m2(c / W 2^-s), and what it failed to deliver stays in the residual at its position
  // (in gradient units, divided by 1 - b1, under frozen_momentum).
  const auto workers = static_cast<std::size_t>(sharding_.workers());
  const float w = static_cast<float>(workers);
  kernels_.synchronize();
  const std::vector<float> mine{kernels_.max_magnitude(b_.span())};
  std::vector<float> peaks(workers);
  comm_.all_gather(mine, peaks, std::vector<std::size_t>(workers, 1), WireType::fp32, "fp8_scale_all_gather");
  const float peak = *std::max_element(peaks.begin(), peaks.end());
  const bool overflow = fp8_scaled_ && (peak / w) * std::ldexp(1.0f, -fp8_exponent_) > kernels::kE5m2Max;
  if (!fp8_scaled_ || (t - 1) % 100 == 0 || overflow) {
    fp8_exponent_ = peak > 0 ? std::ilogb(peak) : 0;
    fp8_scaled_ = true;
  }
  fp8_q_.resize(b_.size());
  fp8_error_.resize(b_.size());
  kernels_.quantize_e5m2(b_.span(), w, fp8_exponent_, fp8_q_.span(), fp8_error_.span());
  std::swap(b_, fp8_q_);
  if (!config_.residual || config_.residual_decay <= 0) return;  // no residual keeps it (gamma = 0 is residual off)
  if (!momentum_units()) kernels_.divide(fp8_error_.span(), static_cast<float>(1.0 - config_.beta1));
  kernels_.expand(fp8_error_.span(), idx_.span(), feedback_.residual().resident());
}

void ScapeOptimizer::zero_momentum_off_mask() {
  // Step 4: m = b_bar on the mask, 0 off it (its content lives on in the residuals).
  kernels_.fill(m_.span(), 0.0f);
  kernels_.expand(b_bar_.span(), update_idx_.span(), m_.span());
}

}  // namespace scape
