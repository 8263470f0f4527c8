// The passes where SCAPE's formulations differ, beside the step they share
// (optimizers/scape/scape_optimizer.cpp): the owner's q (step 4), the artifact's two quirks, the
// clipping of step 6, the fp8 payload of step 3 and m <- 0 off the mask (step 7)
// (docs/algorithms.md, "SCAPE": the paper formulation's steps, "The artifact formulation's two
// quirks", "Wire precision").
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/fp8.hpp"

#include "core/adam_step.hpp"
#include "optimizers/scape/scape_optimizer.hpp"

namespace scape {

float ScapeOptimizer::carry_decay() const {
  return config_.residual_decay < 1.0 ? static_cast<float>(config_.residual_decay) : 1.0f;
}

void ScapeOptimizer::carry_momentum() {
  // Step 4 for the momentum part the owner keeps for every worker: q <- gamma (b1 m_prev + q)
  // off the mask, 0 on it (read before step 7 overwrites m). The same pass does step 7's m <- 0
  // off the mask: until then only step 7's update reads m, and only on the mask, where it stays.
  if (q_carried_) {
    // The residual pass has carried q off the mask and kept it on the mask, where step 3 read it
    // (and owner_payload_gradient zeroed it after).
    if (!owner_momentum_in_step5()) kernels_.zero_at(q_.span(), update_idx_.span());
    return;
  }
  kernels_.carry_momentum_off_mask(q_.span(), m_.span(), mask_.span(), state_begin_, static_cast<float>(config_.beta1),
                                   carry_decay());
}

void ScapeOptimizer::double_count_residual(std::span<const float> grads) {
  // artifact, replicated (its first quirk): the GPU-resident residual path runs step 4 twice, leaving
  // (1-M)(2 (b1 m_prev + (1-b1) g_i) + e_i); with its residual offloaded it runs once.
  if (feedback_.residual().offloaded()) return;
  const auto e = feedback_.residual().resident();
  kernels_.candidate_momentum(e, m_.span(), grads, static_cast<float>(config_.beta1),
                              static_cast<float>(1.0 - config_.beta1));
  kernels_.zero_at(e, idx_.span());
}

void ScapeOptimizer::drop_unowned_residual() {
  // artifact, sharded (its second quirk): the path forms c only on the own shard, so other ranks'
  // gradients at a position reach neither the payload (step 3) nor a residual (step 4).
  feedback_.residual().for_each_chunk(true, [&](std::size_t begin, std::span<float> e) {
    const std::size_t end = begin + e.size();
    const std::size_t lo = std::clamp(own_begin_, begin, end), hi = std::clamp(own_end_, begin, end);
    kernels_.fill(e.first(lo - begin), 0.0f);
    kernels_.fill(e.subspan(hi - begin), 0.0f);
  });
}

void ScapeOptimizer::clip_reconstructed() {
  // Step 6 (frozen_momentum: after its step 6): clip the reconstructed gradient at clip_grad over
  // the whole model, and the momentum on the mask with it: b_bar = b1 m_prev + (1-b1) g_hat.
  if (config_.clip_grad <= 0) return;
  const double factor =
      detail::clip_factor(kernels_, clip_partial_, comm_, g_hat_.span(), config_.clip_grad, config_.sharded);
  if (factor >= 1.0) return;
  kernels_.scale(g_hat_.span(), static_cast<float>(factor));
  kernels_.momentum_from_gradient(m_.span(), update_idx_.span(), g_hat_.span(), static_cast<float>(config_.beta1),
                                  static_cast<float>(1.0 - config_.beta1), b_bar_.span());
}

void ScapeOptimizer::quantize_payload(int t) {
  // Step 3's FP8 payload: the shared exponent s = floor(log2 max |c|) over every worker's payload,
  // taken at step 1, every 100 steps and when a value would overflow; each value goes as
  // e5m2(c / W 2^-s), and what it failed to deliver stays in step 4's residual at its position
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
  // Step 7's last part (paper and artifact): m = b_bar on the mask, 0 off it (its content lives
  // on in the residuals). The inner rule has written m = b_bar on the mask; with carried momentum
  // carry_momentum has zeroed it off the mask, so nothing is left to do (an expand of b_bar here
  // rewrote the same values: a pass over m's cache lines at 10% density).
  if (carries_momentum()) return;
  kernels_.fill(m_.span(), 0.0f);
  kernels_.expand(b_bar_.span(), update_idx_.span(), m_.span());
}

}  // namespace scape
