// The per-worker state of the sparse communication policies (SCAPE, top-k): the
// error-feedback residual e_i, the step each coordinate was last delivered, and the previous
// step's mask; with the metrics and checkpoint entries they produce (docs/algorithms.md,
// "SCAPE" step 4, "Baseline" and "Metrics").
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/metrics.hpp"
#include "core/state.hpp"
#include "kernels/backend.hpp"
#include "optimizers/feedback/residual_store.hpp"

namespace scape {

class ErrorFeedback {
 public:
  // The residual lives on backend k, resident or (config.residual_offload) streamed in
  // chunks; config also gives the switches residual, residual_decay and residual_clip.
  ErrorFeedback(kernels::KernelBackend& k, std::size_t n, const CommonOptimizerConfig& config);

  ResidualStore& residual() { return e_; }
  const ResidualStore& residual() const { return e_; }
  // residual_clip, before step 1: scales each tensor of e_i whose norm exceeds c times that
  // tensor's norm of grads (which live on the backend) down to that bound. Returns the norm of
  // what was removed (0 when the switch is off).
  double clip(const ParamLayout& layout, std::span<const float> grads);
  // SCAPE's step 4 on a piece of a_i (a chunk, or the whole buffer) whose delivered positions, relative
  // to it, are `delivered`: they restart from zero and the rest keeps residual_decay * a_i;
  // without a residual (residual = false or residual_decay = 0) the whole piece becomes +0.
  void keep_off_mask(std::span<float> a, std::span<const std::uint32_t> delivered);
  // The coordinates delivered at step t (host-readable indices).
  void deliver(std::span<const std::uint32_t> indices, int t) { staleness_.deliver(indices, t); }
  // Mask metrics of this step's mask against the previous step's, then remembers it.
  void record_mask(const ParamLayout& layout, const kernels::Buffer<std::uint64_t>& mask, std::size_t k_total,
                   StepMetrics& out);
  // The residual metrics of step t into out, taken now: a policy calls this as soon as its
  // residual is final for the step, while the residual is still in cache (after the step's
  // collectives it is not, on cores shared by many ranks). Optional: fill_metrics takes them
  // itself when this was not called at step t.
  void measure_residual(const ParamLayout& layout, int t, StepMetrics& out);
  // Residual and staleness metrics at the end of step t, given ||theta||_2 after it.
  void fill_metrics(const ParamLayout& layout, double theta_norm, int t, StepMetrics& out);
  // Entries "residual", "previous_mask", "have_previous_mask" and "staleness.*".
  void save(StateMap& state) const;
  void load(const StateMap& state);

 private:
  kernels::KernelBackend& kernels_;
  bool keep_;    // residual on and residual_decay > 0
  float decay_;  // residual_decay, applied only when below 1
  double clip_;  // residual_clip, 0 = off
  ResidualStore e_;
  kernels::Buffer<std::uint64_t> previous_mask_{kernels_};
  std::unique_ptr<metrics::RangeCounter> tensor_counts_;  // the mask metrics' counts (built on first use)
  bool have_previous_mask_ = false;
  int measured_step_ = -1;                     // the step whose residual metrics measure_residual took
  kernels::Buffer<double> partial_{kernels_};  // block sums of the residual metrics
  kernels::Buffer<double> host_partial_{kernels::cpu_backend()};  // the same for an offloaded residual
  kernels::Buffer<float> peak_{kernels_};                         // block maxima of the residual
  kernels::Buffer<float> host_peak_{kernels::cpu_backend()};      // the same for an offloaded residual
  metrics::StalenessTracker staleness_;
  std::vector<double> residual_sums_, grad_sums_;  // per-tensor sums of squares for clip()
};

}  // namespace scape
