// What DiLoCo and SparseLoCo share on top of OptimizerBase: every worker steps its own parameters
// theta_i with its own AdamW or AdamS state, and at the outer steps the workers exchange their
// pseudo-gradients Delta_i = theta_global - theta_i over one fragment of the flat buffer, update
// the global parameters theta_global there and restart from them (docs/algorithms.md, "DiLoCo").
// The schedule, theta_global, the one-step delay of overlap_outer and the metrics live here; the
// exchange and the outer update are each method's.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "core/optimizer_base.hpp"
#include "optimizers/baselines/outer_loop_config.hpp"

namespace scape {

// The fragment boundaries b_0 = 0 < b_1 < ... < b_F = N of Streaming DiLoCo: b_f is the tensor
// boundary nearest to f N / F (ties to the lower); when that leaves a fragment empty (fewer
// tensors than fragments, or one tensor holding most of N) every b_f is floor(f N / F) instead.
// Throws std::invalid_argument when N < F.
std::vector<std::size_t> fragment_boundaries(const ParamLayout& layout, int fragments);

// The fragment synced at step t (1-based), or -1: fragment f at every step t with
// t mod H = floor((f + 1) H / F) mod H, so each fragment once every H steps, F <= H offsets
// spread as evenly as whole steps allow (every H / F steps when F divides H: fragment
// (t / P - 1) mod F at the steps P = H / F divides).
int fragment_synced_at(int step, int inner_steps, int fragments);

class OuterLoopOptimizer : public OptimizerBase {
 protected:
  OuterLoopOptimizer(const CommonOptimizerConfig& config, const OuterLoopSwitches& outer, const ParamLayout& layout,
                     Communicator& comm, int total_steps, int fragments);

  // The method's outer step on [lo, hi): forms this worker's pseudo-gradient from global_ and
  // params, exchanges it and writes the new theta_global into global_[lo, hi). Fills
  // out.pseudo_grad_norm and out.param_drift.
  virtual void outer_step(std::span<const float> params, std::size_t lo, std::size_t hi, StepMetrics& out) = 0;

  // delta = global_[lo, lo + delta.size()) - params[lo, ...), rounded once (negate, then add).
  void pseudo_gradient(std::span<const float> params, std::size_t lo, std::span<float> delta);

  const OuterLoopSwitches outer_;
  kernels::Buffer<float> global_{kernels_};  // theta_global over [0, N)

 private:
  void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) final;
  // params[lo, hi) = global_[lo, hi) + (params - snapshot_)[lo, hi): the outer step delivered
  // one inner step late keeps that inner step.
  void apply_delayed(std::span<float> params, std::size_t lo, std::size_t hi);

  const int total_steps_;
  const std::vector<std::size_t> bounds_;     // F + 1 fragment boundaries
  kernels::Buffer<float> snapshot_{kernels_};  // overlap_outer: theta_i when its outer step started
};

}  // namespace scape
