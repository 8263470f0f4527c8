// What the error-feedback baselines (raw top-k, shared-seed random-k) share on top of
// OptimizerBase: the ErrorFeedback state, the mask they last delivered, and the metrics and
// checkpoint entries both report from them.
#pragma once

#include <cstdint>
#include <span>

#include "core/error_feedback.hpp"
#include "core/optimizer_base.hpp"

namespace scape {

class FeedbackOptimizer : public OptimizerBase {
 public:
  std::span<const std::uint64_t> mask() const override { return mask_.span(); }
  std::span<const float> residual() const override { return feedback_.residual().host_view(); }

 protected:
  FeedbackOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm, int total_steps)
      : OptimizerBase(config, layout, comm, total_steps), feedback_(k_, n_, config) {
    mask_.assign_zero(kernels::words_for(n_));
    k_.synchronize();
  }

  ErrorFeedback feedback_;
  kernels::Buffer<std::uint64_t> mask_{k_};  // this worker's mask of the last step

 private:
  void fill_final_metrics(StepMetrics& out) override { feedback_.fill_metrics(layout_, updates_.theta_norm(), t_, out); }
  void save_policy_state(StateMap& state) const override { feedback_.save(state); }
  void load_policy_state(const StateMap& state) override { feedback_.load(state); }
};

}  // namespace scape
