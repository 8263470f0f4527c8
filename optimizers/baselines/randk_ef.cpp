// Random-k with a shared seed and error feedback (docs/algorithms.md, "Random-k with a shared
// seed"). The mask is a pure function of (seed, step), so no worker sends an index.
#include "optimizers/baselines/randk_ef.hpp"

#include "core/adam_step.hpp"
#include "kernels/cpu/kernels.hpp"
#include "util/rng.hpp"

namespace scape {
namespace {

// Keys the shared draw apart from every other random stream of the seed.
constexpr std::uint64_t kRandkPurpose = 0x72616e646b;  // "randk"

}  // namespace

RandkEfOptimizer::RandkEfOptimizer(const CommonOptimizerConfig& config, const ParamLayout& layout, Communicator& comm,
                                   int total_steps)
    : FeedbackOptimizer(config, layout, comm, total_steps) {
  draw_.assign_zero(n_);
  kernels_.synchronize();
}

void RandkEfOptimizer::draw_mask(int t, std::size_t k) {
  // No rank enters the key: every worker draws the same numbers. The top-K of N independent
  // uniforms is a uniformly random K-subset (ties, at 2^-53 resolution rounded to fp32, go to
  // the lower index, the same on every worker).
  const std::uint64_t key = rng::derive(rng::derive(config_.seed, kRandkPurpose), static_cast<std::uint64_t>(t));
  kernels_.random_statistic(key, 0, draw_.span());
  idx_.resize(k);
  kernels_.topk_abs_indices(draw_.span(), k, idx_.span());
  kernels_.zero_bytes(mask_.data(), mask_.bytes());
  kernels_.indices_to_bits(idx_.span(), 0, mask_.span());
}

void RandkEfOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  const int t = t_;
  const std::size_t k = begin_step(grads, out);
  const auto e = feedback_.residual().resident();
  out.nonfinite_grads = kernels_.accumulate(e, grads);
  draw_mask(t, k);
  values_.resize(k);
  kernels_.compact(e, idx_.span(), values_.span());
  feedback_.keep_off_mask(e, idx_.span());
  feedback_.measure_residual(layout_, t, out);  // final for this step, and still in cache
  kernels_.synchronize();
  feedback_.deliver(idx_.span(), t);
  comm_.all_reduce_mean(values_.span(), config_.wire_dtype, "grad_all_reduce");
  kernels_.fill(g_bar_.span(), 0.0f);
  kernels_.expand(values_.span(), idx_.span(), g_bar_.span());
  detail::clip_gradient(kernels_, clip_partial_, comm_, g_bar_.span(), config_.clip_grad, false);
  detail::dense_inner_step(kernels_, rule_, layout_, params, 0, n_, m_.span(), v_.span(), g_bar_.span(), config_,
                           out.lr, t);
  // Every worker's mask is the global mask, so fill-in |M_t| / K is 1.
  feedback_.record_mask(layout_, mask_, k, out);
}

}  // namespace scape
