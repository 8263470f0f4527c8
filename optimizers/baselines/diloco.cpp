// DiLoCo's outer step: the pseudo-gradient all-reduce and the Nesterov SGD step on theta_global
// (docs/algorithms.md, "DiLoCo"). The arithmetic runs as backend kernels.
#include "optimizers/baselines/diloco.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/metrics.hpp"

namespace scape {

DilocoOptimizer::DilocoOptimizer(const CommonOptimizerConfig& config, const OuterLoopSwitches& outer,
                                 const DilocoSwitches& diloco, const ParamLayout& layout, Communicator& comm,
                                 int total_steps)
    : OuterLoopOptimizer(config, outer, layout, comm, total_steps, diloco.streaming_fragments), diloco_(diloco) {
  momentum_.assign_zero(n_);
  keep_in_checkpoint("diloco.momentum", momentum_);
  delta_.assign_zero(n_);
  mean_.assign_zero(n_);
  scratch_.assign_zero(n_);
  if (diloco.outer_wire == WireType::fp8_e5m2) {
    fp8_values_.assign_zero(n_);
    fp8_error_.assign_zero(n_);
  }
  kernels_.synchronize();
}

void DilocoOptimizer::all_reduce_pseudo_gradient(std::span<float> x) {
  const WireType wire = diloco_.outer_wire;
  if (wire != WireType::fp8_e5m2) {
    comm_.all_reduce_mean(x, wire, "outer_all_reduce");
    return;
  }
  // fp8: the exponent s puts the largest magnitude over all workers in [2^14, 2^15), the binade
  // below e5m2's largest finite value (57344), so small entries keep the most range; 2^s stays a
  // normal float. The collective carries the e5m2 values exactly in fp32 lanes and sums them in
  // fp32 (core/communicator.hpp), and the mean is scaled back by 2^s.
  const auto workers = static_cast<std::size_t>(comm_.size());
  kernels_.synchronize();
  const std::vector<float> mine{kernels_.max_magnitude(x)};
  std::vector<float> peaks(workers);
  comm_.all_gather(mine, peaks, std::vector<std::size_t>(workers, 1), WireType::fp32, "outer_scale_all_gather");
  const float peak = *std::max_element(peaks.begin(), peaks.end());
  const int exponent = peak > 0 ? std::max(std::ilogb(peak) - 14, -126) : 0;
  const std::span<float> rounding = fp8_error_.span().first(x.size());  // not kept: no error feedback
  kernels_.quantize_e5m2(x, 1.0f, exponent, fp8_values_.span().first(x.size()), rounding);
  kernels_.copy_bytes(fp8_values_.data(), x.data(), x.size_bytes());
  kernels_.synchronize();
  comm_.all_reduce_mean(x, WireType::fp8_e5m2, "outer_all_reduce");
  kernels_.scale(x, std::ldexp(1.0f, exponent));
}

void DilocoOptimizer::outer_step(std::span<const float> params, std::size_t lo, std::size_t hi, StepMetrics& out) {
  const std::size_t n = hi - lo;
  const std::span<float> delta = delta_.span().first(n), mean = mean_.span().first(n);
  const std::span<float> scratch = scratch_.span().first(n);
  pseudo_gradient(params, lo, delta);
  out.pseudo_grad_norm = metrics::device_l2_norm(kernels_, norm_partial_, delta);
  kernels_.copy_bytes(delta.data(), mean.data(), delta.size_bytes());
  kernels_.synchronize();
  all_reduce_pseudo_gradient(mean);
  // theta_i - theta_bar = mean_j Delta_j - Delta_i, with the mean as the wire delivered it.
  kernels_.copy_bytes(delta.data(), scratch.data(), delta.size_bytes());
  kernels_.scale(scratch, -1.0f);
  kernels_.accumulate(scratch, mean);
  out.param_drift = metrics::device_l2_norm(kernels_, norm_partial_, scratch);
  // torch.optim.SGD(nesterov=True, dampening=0): buf = mu buf + D; step = D + mu buf;
  // theta_global -= outer_lr step.
  const auto mu = static_cast<float>(diloco_.outer_momentum);
  const std::span<float> buf = momentum_.span().subspan(lo, n);
  kernels_.scale(buf, mu);
  kernels_.accumulate(buf, mean);
  kernels_.copy_bytes(buf.data(), scratch.data(), buf.size_bytes());
  kernels_.scale(scratch, mu);
  kernels_.accumulate(scratch, mean);
  kernels_.scale(scratch, -static_cast<float>(outer_.resolved_outer_lr(kDilocoOuterLr)));
  kernels_.accumulate(global_.span().subspan(lo, n), scratch);
}

}  // namespace scape
