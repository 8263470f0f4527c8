// What the error-feedback baselines (raw top-k, shared-seed random-k) share on top of
// OptimizerBase: the ErrorFeedback state, the mask they last delivered, and the metrics and
// checkpoint entries both report from them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/optimizer_base.hpp"
#include "core/schedule.hpp"
#include "optimizers/feedback/error_feedback.hpp"

namespace scape {

class FeedbackOptimizer : public OptimizerBase {
 public:
  std::span<const std::uint64_t> mask() const override { return mask_.span(); }
  std::span<const float> residual() const override { return feedback_.residual().host_view(); }

 protected:
  FeedbackOptimizer(const CommonOptimizerConfig& config, const ParamLayout& layout, Communicator& comm, int total_steps)
      : OptimizerBase(config, config.inner, layout, comm, total_steps), feedback_(kernels_, n_, config) {
    mask_.assign_zero(kernels::words_for(n_));
    g_bar_.assign_zero(n_);
    kernels_.synchronize();
  }

  // The opening of a step: records rho_t, clips the gradient where residual_clip says (its
  // metric), and returns the step's mask size k = k_for(rho_t, N).
  std::size_t begin_step(std::span<const float> grads, StepMetrics& out) {
    const double rho = density_at(config_.density_schedule(), t_);
    out.target_density = rho;
    out.residual_clipped_norm = feedback_.clip(layout_, grads);
    return k_for(rho, n_);
  }

  ErrorFeedback feedback_;
  kernels::Buffer<std::uint64_t> mask_{kernels_};  // this worker's mask of the last step
  kernels::Buffer<std::uint32_t> idx_{kernels_};   // the same mask's coordinates, ascending
  kernels::Buffer<float> g_bar_{kernels_};         // the step's synchronized gradient over [0, N)

 private:
  void fill_final_metrics(StepMetrics& out) override {
    feedback_.fill_metrics(layout_, updates_.theta_norm(), t_, out);
  }
  void save_policy_state(StateMap& state) const override { feedback_.save(state); }
  void load_policy_state(const StateMap& state) override { feedback_.load(state); }
};

}  // namespace scape
