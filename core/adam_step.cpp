// The Adam scalars, weight decay, the dense inner step and global-norm clipping that every
// optimizer shares.
#include "core/adam_step.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/metrics.hpp"

namespace scape {

namespace detail {

void check_step_sizes(std::span<const float> params, std::span<const float> grads, std::size_t n) {
  if (params.size() != n || grads.size() != n) {
    throw std::invalid_argument("optimizer step: params (" + std::to_string(params.size()) + ") and grads (" +
                                std::to_string(grads.size()) + ") must both have the layout size " +
                                std::to_string(n));
  }
}

kernels::AdamScalars adam_scalars(const CommonOptimizerConfig& c, double eta, int t, bool decayed) {
  kernels::AdamScalars s;
  s.lr = eta;
  s.beta1 = c.beta1;
  s.beta2 = c.beta2;
  s.eps = c.eps;
  s.decay = decayed ? 1.0 - eta * c.weight_decay : 1.0;
  s.bc1 = c.bias_correction ? 1.0 - std::pow(c.beta1, t) : 1.0;
  s.bc2 = c.bias_correction ? 1.0 - std::pow(c.beta2, t) : 1.0;
  s.adams_artifact_form = c.resolved_adams_form() == AdamsForm::artifact;
  return s;
}

void apply_weight_decay(kernels::KernelBackend& k, const ParamLayout& layout, std::span<float> theta, std::size_t begin,
                        std::size_t end, const CommonOptimizerConfig& c, double eta) {
  const float factor = static_cast<float>(1.0 - eta * c.weight_decay);
  for_each_tensor_piece(layout, begin, end, [&](std::size_t lo, std::size_t hi, bool decay) {
    if (decay) k.scale(theta.subspan(lo, hi - lo), factor);
  });
}

void weight_decay_pieces(const ParamLayout& layout, std::size_t n, const CommonOptimizerConfig& c, double eta,
                         std::vector<std::uint64_t>& ends, std::vector<float>& factors) {
  const float factor = static_cast<float>(1.0 - eta * c.weight_decay);
  ends.clear();
  factors.clear();
  for_each_tensor_piece(layout, 0, n, [&](std::size_t lo, std::size_t hi, bool decay) {
    if (lo > (ends.empty() ? 0 : ends.back())) {  // a gap between tensors is not decayed
      ends.push_back(lo);
      factors.push_back(1.0f);
    }
    ends.push_back(hi);
    factors.push_back(decay ? factor : 1.0f);
  });
  if (n > (ends.empty() ? 0 : ends.back())) {
    ends.push_back(n);
    factors.push_back(1.0f);
  }
}

void dense_inner_step(kernels::KernelBackend& k, InnerRule rule, const ParamLayout& layout, std::span<float> theta,
                      std::size_t begin, std::size_t end, std::span<float> m, std::span<float> v,
                      std::span<const float> g, const CommonOptimizerConfig& c, double eta, int t) {
  for_each_tensor_piece(layout, begin, end, [&](std::size_t lo, std::size_t hi, bool decay) {
    const auto s = adam_scalars(c, eta, t, decay);
    const std::size_t n = hi - lo;
    const std::size_t local = lo - begin;
    if (rule == InnerRule::adamw) {
      k.adamw_step(theta.subspan(lo, n), m.subspan(local, n), v.subspan(local, n), g.subspan(local, n), s);
    } else {
      k.adams_step(theta.subspan(lo, n), m.subspan(local, n), g.subspan(local, n), s);
    }
  });
}

double clip_factor(kernels::KernelBackend& k, kernels::Buffer<double>& partial, Communicator& comm,
                   std::span<const float> part, double clip_grad, bool parts_split) {
  if (clip_grad <= 0) return 1.0;
  double total = metrics::device_sum_squares(k, partial, part);
  if (parts_split && comm.size() > 1) {
    const auto workers = static_cast<std::size_t>(comm.size());
    std::vector<double> sums(workers);
    const std::vector<std::size_t> counts(workers, sizeof(double));
    comm.all_gather_bytes(std::as_bytes(std::span<const double>(&total, 1)), std::as_writable_bytes(std::span(sums)),
                          counts, "clip_norm_all_gather");
    total = 0;
    for (const double s : sums) total += s;
  }
  const double factor = clip_grad / (std::sqrt(total) + 1e-6);
  return factor < 1.0 ? factor : 1.0;
}

double clip_gradient(kernels::KernelBackend& k, kernels::Buffer<double>& partial, Communicator& comm,
                     std::span<float> g, double clip_grad, bool parts_split) {
  const double factor = clip_factor(k, partial, comm, g, clip_grad, parts_split);
  if (factor < 1.0) k.scale(g, static_cast<float>(factor));
  return factor;
}

}  // namespace detail

}  // namespace scape
