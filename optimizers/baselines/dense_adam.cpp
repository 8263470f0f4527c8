// Dense AdamW / AdamS (docs/algorithms.md, "Dense references" and the dense payload rows of
// "Communication volume").
#include "optimizers/baselines/dense_adam.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/adam_step.hpp"

namespace scape {

DenseOptimizer::DenseOptimizer(const CommonOptimizerConfig& config, InnerRule rule, const ParamLayout& layout,
                               Communicator& comm, int total_steps)
    : OptimizerBase(config, rule, layout, comm, total_steps) {
  g_bar_.assign_zero(state_end_ - state_begin_);
  kernels_.synchronize();
}

void DenseOptimizer::gradient_ready(std::span<const float> grads, std::size_t begin, std::size_t end) {
  if (!config_.overlap_grad_reduce)
    throw std::logic_error("DenseOptimizer::gradient_ready without overlap_grad_reduce");
  if (grads.size() != n_ || begin >= end || end > n_) {
    throw std::invalid_argument("DenseOptimizer::gradient_ready: range [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") of a gradient of " + std::to_string(grads.size()) +
                                " values, N = " + std::to_string(n_));
  }
  // The bucket's part inside each rank's shard: shards are contiguous in rank order, so these
  // are the consecutive segments of grads[begin, end) that a reduce-scatter hands out.
  std::vector<std::size_t> counts(static_cast<std::size_t>(sharding_.workers()));
  for (int w = 0; w < sharding_.workers(); ++w) {
    const std::size_t lo = std::max(begin, sharding_.begin(w)), hi = std::min(end, sharding_.end(w));
    counts[static_cast<std::size_t>(w)] = hi > lo ? hi - lo : 0;
  }
  const std::size_t mine_begin = std::clamp(begin, state_begin_, state_end_) - state_begin_;
  const std::span<float> recv = g_bar_.span().subspan(mine_begin, counts[static_cast<std::size_t>(rank_)]);
  buckets_.push_back(
      comm_.reduce_scatter_mean_async(grads.subspan(begin, end - begin), recv, counts, "grad_reduce_scatter"));
  bucket_ranges_.emplace_back(begin, end);
}

void DenseOptimizer::wait_for_buckets() {
  auto ranges = std::move(bucket_ranges_);
  finish();  // every bucket, in the order they started
  std::sort(ranges.begin(), ranges.end());
  std::size_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != covered) {
      throw std::logic_error("overlap_grad_reduce: the backward pass's gradient buckets " +
                             std::string(begin < covered ? "overlap" : "leave a gap") + " at index " +
                             std::to_string(std::min(begin, covered)) + " of " + std::to_string(n_));
    }
    covered = end;
  }
  if (covered != n_) {
    throw std::logic_error("overlap_grad_reduce: the backward pass's gradient buckets end at " +
                           std::to_string(covered) + " of " + std::to_string(n_));
  }
}

void DenseOptimizer::finish() {
  for (auto& bucket : buckets_) bucket.wait();
  buckets_.clear();
  bucket_ranges_.clear();
}

void DenseOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  metrics::mark_sparse_metrics_not_applicable(out);
  out.nonfinite_grads = kernels_.count_nonfinite(grads);
  if (config_.sharded) {
    const auto counts = sharding_.sizes();
    if (!buckets_.empty()) {
      wait_for_buckets();  // g_bar_ holds this shard's mean gradient, reduced during the backward pass
    } else {
      comm_.reduce_scatter_mean(grads, g_bar_.span(), counts, config_.wire_dtype, "grad_reduce_scatter");
    }
    detail::clip_gradient(kernels_, clip_partial_, comm_, g_bar_.span(), config_.clip_grad, true);
    detail::dense_inner_step(kernels_, rule_, layout_, params, state_begin_, state_end_, m_.span(), v_.span(),
                             g_bar_.span(), config_, out.lr, t_);
    kernels_.synchronize();
    comm_.all_gather(params.subspan(state_begin_, state_end_ - state_begin_), params, counts, config_.param_dtype,
                     "param_all_gather");
    return;
  }
  kernels_.copy_bytes(grads.data(), g_bar_.data(), grads.size_bytes());
  kernels_.synchronize();
  comm_.all_reduce_mean(g_bar_.span(), config_.wire_dtype, "grad_all_reduce");
  detail::clip_gradient(kernels_, clip_partial_, comm_, g_bar_.span(), config_.clip_grad, false);
  detail::dense_inner_step(kernels_, rule_, layout_, params, 0, n_, m_.span(), v_.span(), g_bar_.span(), config_,
                           out.lr, t_);
}

}  // namespace scape
