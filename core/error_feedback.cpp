// Residual, delivery staleness and previous mask of the sparse policies (see error_feedback.hpp).
#include "core/error_feedback.hpp"

#include "kernels/cpu/kernels.hpp"

namespace scape {

ErrorFeedback::ErrorFeedback(kernels::KernelBackend& k, std::size_t n, bool offload, std::size_t offload_chunk)
    : k_(k), e_(k, n, offload, offload_chunk), staleness_(n) {
  previous_mask_.assign_zero(kernels::words_for(n));
  k_.synchronize();
}

void ErrorFeedback::record_mask(const ParamLayout& layout, const kernels::Buffer<std::uint64_t>& mask,
                                std::size_t k_total, StepMetrics& out) {
  k_.synchronize();
  const auto previous =
      have_previous_mask_ ? std::span<const std::uint64_t>(previous_mask_.span()) : std::span<const std::uint64_t>{};
  metrics::fill_mask_metrics(layout, mask.span(), previous, k_total, out);
  previous_mask_.resize(mask.size());
  k_.copy_bytes(mask.data(), previous_mask_.data(), mask.bytes());
  have_previous_mask_ = true;
}

void ErrorFeedback::fill_metrics(const ParamLayout& layout, double theta_norm, int t, StepMetrics& out) {
  // An offloaded residual is read where it lives, in host memory.
  kernels::KernelBackend& where = e_.offloaded() ? kernels::cpu_backend() : k_;
  auto& partial = e_.offloaded() ? host_partial_ : partial_;
  metrics::fill_residual_metrics(where, partial, layout, e_.host_view(), theta_norm, out);
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
