// The outer loop of DiLoCo and SparseLoCo: inner steps, the sync schedule, theta_global and the
// one-step delay (docs/algorithms.md, "DiLoCo").
#include "optimizers/baselines/outer_loop.hpp"
#include "optimizers/baselines/outer_loop_config.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/adam_step.hpp"
#include "core/metrics.hpp"

namespace scape {

std::vector<std::size_t> fragment_boundaries(const ParamLayout& layout, int fragments) {
  const std::size_t n = layout.size();
  const auto f_count = static_cast<std::size_t>(fragments);
  if (fragments < 1 || n < f_count) {
    throw std::invalid_argument("optimizer.streaming_fragments: " + std::to_string(fragments) +
                                " fragments of a model of " + std::to_string(n) + " parameters");
  }
  std::vector<std::size_t> tensor_edges;  // 0, every tensor's end
  tensor_edges.push_back(0);
  for (const auto& slot : layout.slots()) tensor_edges.push_back(slot.end());
  std::vector<std::size_t> bounds(f_count + 1, 0);
  bounds[f_count] = n;
  bool aligned = true;
  for (std::size_t f = 1; f < f_count; ++f) {
    const double target = static_cast<double>(f) * static_cast<double>(n) / static_cast<double>(f_count);
    std::size_t best = 0;
    for (const std::size_t edge : tensor_edges) {
      // Strictly nearer wins, so a tie keeps the lower edge (the edges ascend).
      if (std::fabs(static_cast<double>(edge) - target) < std::fabs(static_cast<double>(best) - target)) best = edge;
    }
    bounds[f] = best;
    aligned = aligned && bounds[f] > bounds[f - 1];
  }
  aligned = aligned && bounds[f_count] > bounds[f_count - 1];
  if (!aligned) {
    for (std::size_t f = 1; f < f_count; ++f) bounds[f] = f * n / f_count;
  }
  return bounds;
}

int fragment_synced_at(int step, int inner_steps, int fragments) {
  if (step < 1) return -1;
  const int phase = step % inner_steps;
  for (int f = 0; f < fragments; ++f) {
    if ((f + 1) * inner_steps / fragments % inner_steps == phase) return f;
  }
  return -1;
}

OuterLoopOptimizer::OuterLoopOptimizer(const CommonOptimizerConfig& config, const OuterLoopSwitches& outer,
                                       const ParamLayout& layout, Communicator& comm, int total_steps, int fragments)
    : OptimizerBase(config, config.inner, layout, comm, total_steps),
      outer_(outer),
      total_steps_(total_steps),
      bounds_(fragment_boundaries(layout, fragments)) {
  global_.assign_zero(n_);
  keep_in_checkpoint("outer.global", global_);
  if (outer.overlap_outer) {
    snapshot_.assign_zero(n_);
    keep_in_checkpoint("outer.snapshot", snapshot_);
  }
  kernels_.synchronize();
}

void OuterLoopOptimizer::pseudo_gradient(std::span<const float> params, std::size_t lo, std::span<float> delta) {
  kernels_.copy_bytes(params.data() + lo, delta.data(), delta.size_bytes());
  kernels_.scale(delta, -1.0f);
  kernels_.accumulate(delta, global_.span().subspan(lo, delta.size()));
}

void OuterLoopOptimizer::apply_delayed(std::span<float> params, std::size_t lo, std::size_t hi) {
  const std::span<float> local_step = snapshot_.span().subspan(lo, hi - lo);
  const std::span<float> mine = params.subspan(lo, hi - lo);
  kernels_.scale(local_step, -1.0f);
  kernels_.accumulate(local_step, mine);  // the inner step taken while the outer step was on the wire
  kernels_.copy_bytes(global_.data() + lo, mine.data(), mine.size_bytes());
  kernels_.accumulate(mine, local_step);
}

void OuterLoopOptimizer::update(std::span<float> params, std::span<const float> grads, StepMetrics& out) {
  metrics::mark_sparse_metrics_not_applicable(out);
  // A fresh run's theta_global is theta_0 (a resumed one loads it from the checkpoint).
  if (t_ == 1) kernels_.copy_bytes(params.data(), global_.data(), params.size_bytes());
  out.nonfinite_grads = kernels_.count_nonfinite(grads);
  detail::dense_inner_step(kernels_, rule_, layout_, params, 0, n_, m_.span(), v_.span(), grads, config_, out.lr, t_);
  const int inner_steps = outer_.inner_steps;
  const int fragments = static_cast<int>(bounds_.size()) - 1;
  const bool overlap = outer_.overlap_outer;
  const auto lo_of = [&](int f) { return bounds_[static_cast<std::size_t>(f)]; };
  const auto hi_of = [&](int f) { return bounds_[static_cast<std::size_t>(f) + 1]; };
  // The outer step started at the previous step arrives after this step's inner step.
  if (overlap && t_ > 1) {
    const int late = fragment_synced_at(t_ - 1, inner_steps, fragments);
    if (late >= 0) apply_delayed(params, lo_of(late), hi_of(late));
  }
  const int f = fragment_synced_at(t_, inner_steps, fragments);
  if (f < 0) return;
  const std::size_t lo = lo_of(f), hi = hi_of(f);
  kernels_.synchronize();
  const std::size_t first_record = comm_.ledger().pending_records();
  outer_step(params, lo, hi, out);
  // The last step delivers at once, so the run ends on theta_global.
  if (overlap && t_ < total_steps_) {
    comm_.ledger().mark_overlapped(first_record);
    kernels_.copy_bytes(params.data() + lo, snapshot_.data() + lo, (hi - lo) * sizeof(float));
  } else {
    kernels_.copy_bytes(global_.data() + lo, params.data() + lo, (hi - lo) * sizeof(float));
  }
}

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr OptimizerKeyRange kOuterRanges[] = {
    {"inner_steps", 1, 1e6, false, false, "must be in [1, 10^6]"},
    {"outer_lr", 0, kInf, true, true, "must be finite and > 0"},
    {"outer_momentum", 0, 1, false, true, "must be in [0, 1)"},
    {"streaming_fragments", 1, 1024, false, false, "must be in [1, 1024] and at most optimizer.inner_steps"},
    {"chunk", 1, 1 << 24, false, false, "must be in [1, 2^24] elements"},
    {"quant_bits", 0, 8, false, false, "must be 0 (off), 2 or 8"},
    {"ef_decay", 0, 1, false, false, "must be in [0, 1]"},
};
}  // namespace

std::span<const OptimizerKeyRange> outer_loop_key_ranges() { return kOuterRanges; }

void validate_outer_loop_switches(const OuterLoopSwitches& outer, double method_default_outer_lr) {
  check_key_range(kOuterRanges, "inner_steps", outer.inner_steps);
  check_key_range(kOuterRanges, "outer_lr", outer.resolved_outer_lr(method_default_outer_lr));
}

void validate_diloco_switches(const OuterLoopSwitches& outer, const DilocoSwitches& diloco) {
  check_key_range(kOuterRanges, "outer_momentum", diloco.outer_momentum);
  check_key_range(kOuterRanges, "streaming_fragments", diloco.streaming_fragments);
  if (diloco.streaming_fragments > outer.inner_steps) {
    reject_switch("streaming_fragments",
                  std::to_string(diloco.streaming_fragments) +
                      " is more than optimizer.inner_steps = " + std::to_string(outer.inner_steps) +
                      " (each fragment is synced at its own step of every inner_steps)");
  }
}

void validate_sparseloco_switches(const CommonOptimizerConfig& common, const SparselocoSwitches& sparseloco) {
  check_key_range(common_key_ranges(), "sparsity", common.sparsity);
  check_key_range(kOuterRanges, "chunk", static_cast<double>(sparseloco.chunk));
  check_key_range(kOuterRanges, "quant_bits", sparseloco.quant_bits);
  const int bits = sparseloco.quant_bits;
  if (bits != 0 && bits != 2 && bits != 8) reject_out_of_range("optimizer.quant_bits", bits, "must be 0 (off), 2 or 8");
  check_key_range(kOuterRanges, "ef_decay", sparseloco.ef_decay);
  if (common.mask_encoding != MaskEncoding::bitmap && common.mask_encoding != MaskEncoding::elias_fano) {
    reject_switch("mask_encoding", std::string(to_string(common.mask_encoding)) +
                                       " codes a mask against the previous step's; sparseloco sends its indices as "
                                       "bitmap (each within its chunk) or elias_fano");
  }
}

}  // namespace scape
