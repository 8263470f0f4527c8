// Dense AdamW / AdamS (docs/algorithms.md, "Dense references" and the dense payload rows of
// "Communication volume").
#include "core/dense_optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "core/optim_common.hpp"

namespace scape {

DenseOptimizer::DenseOptimizer(const OptimizerConfig& config, const ParamLayout& layout, Communicator& comm,
                               int total_steps)
    : OptimizerBase(config, layout, comm, total_steps) {
  g_bar_.assign_zero(state_end_ - state_begin_);
  k_.synchronize();
}

void DenseOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  metrics::mark_sparse_metrics_not_applicable(out);
  out.nonfinite_grads = k_.count_nonfinite(grads);
  if (config_.sharded) {
    const auto counts = sharding_.sizes();
    comm_.reduce_scatter_mean(grads, g_bar_.span(), counts, config_.wire_dtype, "grad_reduce_scatter");
    detail::dense_inner_step(k_, rule_, layout_, params, state_begin_, state_end_, m_.span(), v_.span(), g_bar_.span(),
                             config_, out.lr, t_);
    k_.synchronize();
    comm_.all_gather(params.subspan(state_begin_, state_end_ - state_begin_), params, counts, config_.param_dtype,
                     "param_all_gather");
    return;
  }
  k_.copy_bytes(grads.data(), g_bar_.data(), grads.size_bytes());
  k_.synchronize();
  comm_.all_reduce_mean(g_bar_.span(), config_.wire_dtype, "grad_all_reduce");
  detail::dense_inner_step(k_, rule_, layout_, params, 0, n_, m_.span(), v_.span(), g_bar_.span(), config_, out.lr, t_);
}

}  // namespace scape
