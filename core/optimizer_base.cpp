// The scaffolding every optimizer shares (see optimizer_base.hpp).
#include "core/optimizer_base.hpp"

#include <cmath>
#include <limits>

#include "core/adam_step.hpp"

namespace scape {

OptimizerBase::OptimizerBase(const CommonOptimizerConfig& config, InnerRule rule, const ParamLayout& layout,
                             Communicator& comm, int total_steps)
    : config_(config),
      layout_(layout),
      comm_(comm),
      schedule_{config.lr, config.resolved_min_lr(), config.warmup_steps, total_steps},
      rule_(rule),
      sharding_(layout.size(), comm.size()),
      n_(layout.size()),
      rank_(comm.rank()),
      state_begin_(config.sharded ? sharding_.begin(rank_) : 0),
      state_end_(config.sharded ? sharding_.end(rank_) : n_),
      backend_(kernels::make_backend(config.device)),
      kernels_(*backend_),
      updates_(kernels_, n_) {
  m_.assign_zero(state_end_ - state_begin_);
  v_.assign_zero(rule_ == InnerRule::adamw ? state_end_ - state_begin_ : 0);
  kernels_.synchronize();
}

OptimizerBase::~OptimizerBase() = default;

StepMetrics OptimizerBase::step(std::span<float> params_in, std::span<const float> grads_in) {
  detail::check_step_sizes(params_in, grads_in, n_);
  StepMetrics out;
  out.step = ++t_;
  out.lr = learning_rate(schedule_, t_);

  // Inputs the backend's kernels cannot address are staged through its own buffers. Every
  // pass below, the metrics' included, then runs as kernels on the backend's memory: on a GPU
  // only the metrics' block sums reach the host.
  const bool stage_params = !kernels_.can_access(params_in.data());
  std::span<float> params = params_in;
  std::span<const float> grads = grads_in;
  if (stage_params) {
    params_stage_.resize(n_);
    kernels_.copy_bytes(params_in.data(), params_stage_.data(), params_in.size_bytes());
    params = params_stage_.span();
  }
  if (!kernels_.can_access(grads_in.data())) {
    grads_stage_.resize(n_);
    kernels_.copy_bytes(grads_in.data(), grads_stage_.data(), grads_in.size_bytes());
    grads = grads_stage_.span();
  }
  // The update statistics (a copy of theta and a pass over it) are worker 0's only: replicas
  // are identical (docs/algorithms.md, invariant 4) and the run records worker 0's values.
  const bool track_updates = tracks_updates();
  const bool measured_in_update = measures_own_update();
  if (track_updates && !measured_in_update) updates_.before(params);

  update(params, grads, out);

  if (!track_updates)
    out.update_norm = out.update_max = out.update_sign_flip = std::numeric_limits<double>::quiet_NaN();
  if (measured_in_update) {
    // update() has measured ||theta|| and, on the worker that tracks them, the statistics.
  } else if (track_updates) {
    updates_.after(params, out, stepped_coordinates());
  } else {
    updates_.norm_only(params);
  }
  if (stage_params) kernels_.copy_bytes(params_stage_.data(), params_in.data(), params_in.size_bytes());
  kernels_.synchronize();
  fill_final_metrics(out);
  out.comm = comm_.ledger().drain();
  return out;
}

void OptimizerBase::keep_in_checkpoint(std::string name, kernels::Buffer<float>& buffer) {
  kept_buffers_.emplace_back(std::move(name), &buffer);
}

void OptimizerBase::save_state(StateMap& state) {
  finish();
  kernels_.synchronize();
  put_state_value(state, "t", t_);
  put_state(state, "m", m_.span());
  put_state(state, "v", v_.span());
  updates_.save(state, "updates.");
  for (const auto& [name, buffer] : kept_buffers_) put_state(state, name, buffer->span());
  save_policy_state(state);
}

void OptimizerBase::load_state(const StateMap& state) {
  finish();  // a collective still in flight would write state after the load
  kernels_.synchronize();
  t_ = get_state_value<int>(state, "t");
  get_state_exact(state, "m", m_.span());
  get_state_exact(state, "v", v_.span());
  updates_.load(state, "updates.");
  for (const auto& [name, buffer] : kept_buffers_) get_state_exact(state, name, buffer->span());
  load_policy_state(state);
}

}  // namespace scape
