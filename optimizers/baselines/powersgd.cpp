// PowerSGD with error feedback and warm start (docs/algorithms.md, "PowerSGD"). The
// factorisation runs as backend kernels; the factors of all matrices travel packed, in two
// all-reduces, and the vectors in a third.
#include "optimizers/baselines/powersgd.hpp"
#include "optimizers/baselines/powersgd_config.hpp"

#include <algorithm>
#include <vector>

#include "core/adam_step.hpp"
#include "core/metrics.hpp"
#include "util/rng.hpp"

namespace scape {
namespace {

// Keys the initial Q apart from every other random stream of the seed.
constexpr std::uint64_t kPowersgdPurpose = 0x706f77657273;  // "powers"

}  // namespace

PowersgdPlan powersgd_plan(const ParamLayout& layout, int rank) {
  PowersgdPlan plan;
  for (const TensorSlot& slot : layout.slots()) {
    if (slot.shape.size() < 2) {
      plan.vectors.push_back({slot.offset, slot.numel(), plan.vector_size});
      plan.vector_size += slot.numel();
      continue;
    }
    const std::size_t rows = slot.shape[0];
    const std::size_t cols = slot.numel() / rows;
    const std::size_t r = std::min({static_cast<std::size_t>(rank), rows, cols});
    plan.matrices.push_back({slot.offset, rows, cols, r, plan.p_size, plan.q_size});
    plan.p_size += rows * r;
    plan.q_size += cols * r;
  }
  return plan;
}

PowersgdOptimizer::PowersgdOptimizer(const CommonOptimizerConfig& config, const PowersgdSwitches& powersgd,
                                     const ParamLayout& layout, Communicator& comm, int total_steps)
    : OptimizerBase(config, config.inner, layout, comm, total_steps), plan_(powersgd_plan(layout, powersgd.rank)) {
  error_.assign_zero(n_);
  p_.assign_zero(plan_.p_size);
  keep_in_checkpoint("powersgd.error", error_);
  keep_in_checkpoint("powersgd.q", q_);
  g_bar_.assign_zero(n_);
  vectors_.assign_zero(plan_.vector_size);
  // The warm start begins from the same standard normal Q on every worker: a pure function of
  // (seed, matrix, entry), so P = mean_i(M_i Q) is one matrix's product with one Q.
  std::vector<float> q(plan_.q_size);
  for (std::size_t s = 0; s < plan_.matrices.size(); ++s) {
    const auto& m = plan_.matrices[s];
    const std::uint64_t key = rng::derive(rng::derive(config.seed, kPowersgdPurpose), s);
    for (std::size_t j = 0; j < m.cols * m.rank; ++j) q[m.q_offset + j] = static_cast<float>(rng::normal(key, j));
  }
  q_.assign_zero(plan_.q_size);
  kernels_.copy_bytes(q.data(), q_.data(), q.size() * sizeof(float));
  kernels_.synchronize();
}

void PowersgdOptimizer::power_iteration() {
  const auto e = error_.span();
  for (const auto& m : plan_.matrices) {
    kernels_.lowrank_project(e.subspan(m.offset, m.rows * m.cols), m.rows, m.cols,
                             q_.span().subspan(m.q_offset, m.cols * m.rank),
                             p_.span().subspan(m.p_offset, m.rows * m.rank));
  }
  kernels_.synchronize();
  comm_.all_reduce_mean(p_.span(), config_.wire_dtype, "lowrank_p_all_reduce");
  for (const auto& m : plan_.matrices) {
    const auto p = p_.span().subspan(m.p_offset, m.rows * m.rank);
    kernels_.orthonormalize_columns(p, m.rows);
    kernels_.lowrank_project_t(e.subspan(m.offset, m.rows * m.cols), m.rows, m.cols, p,
                         q_.span().subspan(m.q_offset, m.cols * m.rank));
  }
  kernels_.synchronize();
  comm_.all_reduce_mean(q_.span(), config_.wire_dtype, "lowrank_q_all_reduce");
}

void PowersgdOptimizer::reduce_vectors(std::span<const float> grads) {
  for (const auto& v : plan_.vectors) {
    kernels_.copy_bytes(grads.data() + v.offset, vectors_.data() + v.packed_offset, v.size * sizeof(float));
  }
  kernels_.synchronize();
  comm_.all_reduce_mean(vectors_.span(), config_.wire_dtype, "grad_all_reduce");
  for (const auto& v : plan_.vectors) {
    kernels_.copy_bytes(vectors_.data() + v.packed_offset, g_bar_.data() + v.offset, v.size * sizeof(float));
  }
}

void PowersgdOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  metrics::mark_sparse_metrics_not_applicable(out);
  // M = e_i + g_i on the matrices; the vectors' part of e_i stays zero (their g_i is added
  // there too and removed again by the fill below, which keeps one accumulate call).
  out.nonfinite_grads = kernels_.accumulate(error_.span(), grads);
  for (const auto& v : plan_.vectors) kernels_.fill(error_.span().subspan(v.offset, v.size), 0.0f);
  if (!plan_.matrices.empty()) {
    power_iteration();
    // Every worker now holds the same P and Q: delivers P Q^T and keeps M - P Q^T.
    for (const auto& m : plan_.matrices) {
      const std::size_t size = m.rows * m.cols;
      kernels_.lowrank_residual(error_.span().subspan(m.offset, size), m.rows, m.cols,
                          p_.span().subspan(m.p_offset, m.rows * m.rank),
                          q_.span().subspan(m.q_offset, m.cols * m.rank), g_bar_.span().subspan(m.offset, size));
    }
  }
  if (!plan_.vectors.empty()) reduce_vectors(grads);
  detail::clip_gradient(kernels_, clip_partial_, comm_, g_bar_.span(), config_.clip_grad, false);
  detail::dense_inner_step(kernels_, rule_, layout_, params, 0, n_, m_.span(), v_.span(), g_bar_.span(), config_,
                           out.lr, t_);
}

namespace {
constexpr OptimizerKeyRange kPowersgdRanges[] = {{"powersgd_rank", 1, 4096, false, false, "must be in [1, 4096]"}};
}  // namespace

std::span<const OptimizerKeyRange> powersgd_key_ranges() { return kPowersgdRanges; }

void validate_powersgd_switches(const PowersgdSwitches& powersgd) {
  check_key_range(kPowersgdRanges, "powersgd_rank", powersgd.rank);
}

}  // namespace scape
