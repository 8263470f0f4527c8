// What every optimizer shares, whatever its update rule and communication policy: the
// configuration, layout, communicator, learning-rate schedule, the KernelBackend its kernels
// and state live on, the range of coordinates whose state this worker keeps, the moments m and
// v, the step counter, update statistics, their checkpoint entries and the per-step
// bookkeeping (input checks, staging, ledger drain). A policy implements update(); see
// docs/algorithms.md for the rules and policies.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/metrics.hpp"
#include "core/optimizer.hpp"
#include "kernels/backend.hpp"

namespace scape {

class OptimizerBase : public Optimizer {
 public:
  ~OptimizerBase() override;

  // Checks the inputs, counts the step, stages inputs the backend cannot address, runs
  // update() and fills the metrics every optimizer reports. params and grads must be
  // host-addressable (host or managed memory).
  StepMetrics step(std::span<float> params, std::span<const float> grads) final;
  std::string device_summary() const override { return kernels_.description(); }
  // t, m, v and the update statistics, then the policy's own entries. Both complete
  // outstanding asynchronous collectives first (finish()).
  void save_state(StateMap& state) final;
  void load_state(const StateMap& state) final;

 protected:
  // `rule` is the update rule the method steps with (AdamW or AdamS).
  OptimizerBase(const CommonOptimizerConfig& config, InnerRule rule, const ParamLayout& layout, Communicator& comm,
                int total_steps);

  // The policy's step t_ (already counted): params and grads are spans the backend's kernels
  // can address; out already holds step and lr. On return the kernels may
  // still be queued.
  virtual void update(std::span<float> params, std::span<const float> grads, StepMetrics& out) = 0;
  // Metrics that need the parameters after the step (updates_.theta_norm()).
  virtual void fill_final_metrics(StepMetrics&) {}
  // The coordinates the last update() stepped, as mask words over N (empty: every coordinate),
  // host-readable after kernels_.synchronize(): what update_sign_flip counts.
  virtual std::span<const std::uint64_t> stepped_coordinates() const { return {}; }
  // True when update() measures its own update, through updates_.decay_stepped() and then
  // decay_rest_and_measure() on the worker that records the statistics (tracks_updates()) or
  // decay_rest_and_norm() on the others: step() then skips its copy of theta and its pass.
  virtual bool measures_own_update() const { return false; }
  // This worker records the update statistics (worker 0: replicas are identical, docs/algorithms.md,
  // invariant 4); the others measure only ||theta||.
  bool tracks_updates() const { return rank_ == 0; }
  // Checkpoint entries beyond t, m, v and the update statistics; the names are the checkpoint
  // format and must not change. A policy whose extra state is whole float buffers names them
  // once with keep_in_checkpoint instead; the rest overrides these two.
  virtual void save_policy_state(StateMap&) const {}
  virtual void load_policy_state(const StateMap&) {}
  // Saves `buffer` under `name` with the state and loads it back at its exact size (the buffer
  // outlives the optimizer's base, as a member of the policy does).
  void keep_in_checkpoint(std::string name, kernels::Buffer<float>& buffer);

  const CommonOptimizerConfig config_;
  const ParamLayout& layout_;
  Communicator& comm_;
  const LrSchedule schedule_;
  const InnerRule rule_;  // AdamW or AdamS
  const Sharding sharding_;
  const std::size_t n_;
  const int rank_;
  // Optimizer state kept by this worker: its shard when sharded, else [0, N).
  const std::size_t state_begin_, state_end_;

  std::unique_ptr<kernels::KernelBackend> backend_;
  kernels::KernelBackend& kernels_;
  kernels::Buffer<float> m_{kernels_}, v_{kernels_};  // moments over [state_begin_, state_end_); v for AdamW only
  kernels::Buffer<double> clip_partial_{kernels_};  // block sums of clip_grad's norm
  metrics::UpdateTracker updates_;

 private:
  kernels::Buffer<float> params_stage_{kernels_}, grads_stage_{kernels_};  // inputs the kernels cannot read
  std::vector<std::pair<std::string, kernels::Buffer<float>*>> kept_buffers_;
};

}  // namespace scape
