// Residual, delivery staleness and previous mask of the sparse policies (see error_feedback.hpp).
#include "optimizers/feedback/error_feedback.hpp"

#include <cmath>

#include "kernels/cpu/kernels.hpp"

namespace scape {

ErrorFeedback::ErrorFeedback(kernels::KernelBackend& k, std::size_t n, const CommonOptimizerConfig& config)
    : kernels_(k),
      keep_(config.residual && config.residual_decay > 0),
      decay_(static_cast<float>(config.residual_decay)),
      clip_(config.residual_clip),
      e_(k, n, config.residual_offload, config.offload_chunk),
      staleness_(n) {
  previous_mask_.assign_zero(kernels::words_for(n));
  kernels_.synchronize();
}

double ErrorFeedback::clip(const ParamLayout& layout, std::span<const float> grads) {
  if (clip_ == 0) return 0.0;
  // An offloaded residual is clipped where it lives, in host memory, before the accumulate
  // pass uploads it; the previous pass has waited for every copy back.
  kernels::KernelBackend& where = e_.offloaded() ? kernels::cpu_backend() : kernels_;
  auto& partial = e_.offloaded() ? host_partial_ : partial_;
  const std::span<float> e = e_.host_view();
  kernels_.synchronize();
  metrics::tensor_sum_squares(where, partial, layout, e, residual_sums_);
  metrics::tensor_sum_squares(kernels_, partial_, layout, grads, grad_sums_);
  const auto& slots = layout.slots();
  double removed = 0;
  for (std::size_t s = 0; s < slots.size(); ++s) {
    const double norm = std::sqrt(residual_sums_[s]);
    const double bound = clip_ * std::sqrt(grad_sums_[s]);
    if (!(norm > bound)) continue;  // also a NaN norm or bound: left as it is
    const float factor = static_cast<float>(bound / norm);
    const auto part = e.subspan(slots[s].offset, slots[s].numel());
    // A zero factor drops the tensor's residual as +0 (0 * a would keep -0 and turn inf into NaN).
    if (factor == 0.0f) {
      where.fill(part, 0.0f);
    } else {
      where.scale(part, factor);
    }
    const double cut = (1.0 - static_cast<double>(factor)) * norm;
    removed += cut * cut;
  }
  where.synchronize();
  return std::sqrt(removed);
}

void ErrorFeedback::keep_off_mask(std::span<float> a, std::span<const std::uint32_t> delivered) {
  if (!keep_) {
    // Exactly residual = false: +0 everywhere, whatever a held (no 0 * a, which keeps -0 and NaN).
    kernels_.fill(a, 0.0f);
    return;
  }
  if (!delivered.empty()) kernels_.zero_at(a, delivered);
  // gamma = 1 is the default path: no multiplication at all.
  if (decay_ != 1.0f) kernels_.scale(a, decay_);
}

void ErrorFeedback::record_mask(const ParamLayout& layout, const kernels::Buffer<std::uint64_t>& mask,
                                std::size_t k_total, StepMetrics& out) {
  if (!tensor_counts_)
    tensor_counts_ = std::make_unique<metrics::RangeCounter>(kernels_, metrics::tensor_ranges(layout));
  const auto previous =
      have_previous_mask_ ? std::span<const std::uint64_t>(previous_mask_.span()) : std::span<const std::uint64_t>{};
  tensor_counts_->count(mask.span(), previous);
  metrics::fill_mask_metrics(*tensor_counts_, layout, have_previous_mask_, k_total, out);
  previous_mask_.resize(mask.size());
  kernels_.copy_bytes(mask.data(), previous_mask_.data(), mask.bytes());
  have_previous_mask_ = true;
}

void ErrorFeedback::measure_residual(const ParamLayout& layout, int t, StepMetrics& out) {
  // An offloaded residual is read where it lives, in host memory.
  kernels::KernelBackend& where = e_.offloaded() ? kernels::cpu_backend() : kernels_;
  auto& partial = e_.offloaded() ? host_partial_ : partial_;
  auto& peak = e_.offloaded() ? host_peak_ : peak_;
  metrics::fill_residual_metrics(where, partial, peak, layout, e_.host_view(), out);
  measured_step_ = t;
}

void ErrorFeedback::fill_metrics(const ParamLayout& layout, double theta_norm, int t, StepMetrics& out) {
  if (measured_step_ != t) measure_residual(layout, t, out);
  out.residual_to_param = metrics::residual_to_param(out.residual_norm, theta_norm);
  staleness_.fill(t, out);
}

void ErrorFeedback::save(StateMap& state) const {
  put_state(state, "residual", e_.host_view());
  put_state(state, "previous_mask", previous_mask_.span());
  put_state_value(state, "have_previous_mask", static_cast<std::uint8_t>(have_previous_mask_));
  staleness_.save(state, "staleness.");
}

void ErrorFeedback::load(const StateMap& state) {
  get_state_exact(state, "residual", e_.host_view());
  get_state_exact(state, "previous_mask", previous_mask_.span());
  have_previous_mask_ = get_state_value<std::uint8_t>(state, "have_previous_mask") != 0;
  staleness_.load(state, "staleness.");
}

}  // namespace scape
