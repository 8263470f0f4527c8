// Dense AdamW / AdamS (docs/algorithms.md, "Dense references" and the dense payload rows of
// "Communication volume").
#include "core/dense_optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "core/optim_common.hpp"

namespace scape {

DenseOptimizer::DenseOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm,
                               int total_steps)
    : config_(config),
      layout_(layout),
      comm_(comm),
      schedule_{config.lr, config.resolved_min_lr(), config.warmup_steps, total_steps},
      rule_(config.type == OptimizerType::adamw ? InnerRule::adamw : InnerRule::adams),
      sharding_(layout.size(), comm.size()),
      state_begin_(config.sharded ? sharding_.begin(comm.rank()) : 0),
      state_end_(config.sharded ? sharding_.end(comm.rank()) : layout.size()),
      m_(state_end_ - state_begin_, 0.0f),
      v_(rule_ == InnerRule::adamw ? state_end_ - state_begin_ : 0, 0.0f),
      g_bar_(config.sharded ? state_end_ - state_begin_ : layout.size(), 0.0f),
      updates_(layout.size()) {}

StepMetrics DenseOptimizer::step(std::span<float> params, std::span<const float> grads) {
  const std::size_t n = layout_.size();
  detail::check_step_sizes(params, grads, n);
  const int t = ++t_;
  StepMetrics out;
  out.step = t;
  out.lr = learning_rate(schedule_, t);
  metrics::mark_sparse_metrics_not_applicable(out);
  out.local_grad_norm = metrics::l2_norm(grads);
  out.nonfinite_grads = static_cast<std::size_t>(
      std::count_if(grads.begin(), grads.end(), [](float g) { return !std::isfinite(g); }));
  updates_.before(params);

  if (config_.sharded) {
    const auto counts = sharding_.sizes();
    comm_.reduce_scatter_mean(grads, g_bar_, counts, config_.wire_dtype, "grad_reduce_scatter");
    detail::dense_inner_step(kernels::cpu_backend(), rule_, layout_, params, state_begin_, state_end_, m_, v_, g_bar_, config_, out.lr, t);
    comm_.all_gather(params.subspan(state_begin_, state_end_ - state_begin_), params, counts, config_.param_dtype,
                     "param_all_gather");
  } else {
    std::copy(grads.begin(), grads.end(), g_bar_.begin());
    comm_.all_reduce_mean(g_bar_, config_.wire_dtype, "grad_all_reduce");
    detail::dense_inner_step(kernels::cpu_backend(), rule_, layout_, params, 0, n, m_, v_, g_bar_, config_, out.lr, t);
  }

  updates_.after(params, out);
  out.comm = comm_.ledger().drain();
  return out;
}

void DenseOptimizer::save_state(StateMap& state) {
  put_state_value(state, "t", t_);
  put_state(state, "m", m_);
  put_state(state, "v", v_);
  updates_.save(state, "updates.");
}

void DenseOptimizer::load_state(const StateMap& state) {
  t_ = get_state_value<int>(state, "t");
  get_state(state, "m", m_);
  get_state(state, "v", v_);
  updates_.load(state, "updates.");
}

}  // namespace scape
