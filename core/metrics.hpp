// Step metrics shared by all optimizers (docs/algorithms.md, "Metrics"): deterministic norms,
// mask density / Jaccard / fill-in, residual size, staleness and update statistics.
// Reductions use fixed blocks summed in order, so a metric does not depend on thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "core/state.hpp"
#include "kernels/backend.hpp"

namespace scape::metrics {

double l2_norm(std::span<const float> x);

// ||x||_2 of memory backend k can read, from its block_sum_squares over fixed blocks added in
// block order (deterministic on any device); `partial` is k's scratch, grown as needed.
double device_l2_norm(kernels::KernelBackend& k, kernels::Buffer<double>& partial, std::span<const float> x);
// The same sum of squares before the square root.
double device_sum_squares(kernels::KernelBackend& k, kernels::Buffer<double>& partial, std::span<const float> x);

// Set bits of a & b in the bit range [begin, end) (host memory).
std::size_t popcount_and_range(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b,
                               std::size_t begin, std::size_t end);

// Set-bit counts of a mask, and of it with a previous mask, over fixed coordinate ranges: one
// mask_range_counts kernel on backend k, where the masks live (on a GPU only the counts reach
// the host). The ranges are uploaded once.
class RangeCounter {
 public:
  RangeCounter(kernels::KernelBackend& k, const std::vector<std::pair<std::size_t, std::size_t>>& ranges);
  // Counts every range; previous may be empty (then both() and either() are 0).
  void count(std::span<const std::uint64_t> mask, std::span<const std::uint64_t> previous);
  std::size_t ranges() const { return counts_.size() / 3; }
  std::size_t set(std::size_t r) const { return counts_.data()[3 * r]; }
  std::size_t both(std::size_t r) const { return counts_.data()[3 * r + 1]; }
  std::size_t either(std::size_t r) const { return counts_.data()[3 * r + 2]; }

 private:
  kernels::KernelBackend& kernels_;
  kernels::Buffer<std::uint64_t> ranges_{kernels_}, counts_{kernels_};
};

// The ranges fill_mask_metrics reads: every tensor of the layout, then [0, N).
std::vector<std::pair<std::size_t, std::size_t>> tensor_ranges(const ParamLayout& layout);
// Every shard's [begin, end), in rank order.
std::vector<std::pair<std::size_t, std::size_t>> shard_ranges(const Sharding& shards);

// Fills mask_size, mask_density, mask_jaccard (NaN without a previous mask), fill_in and the
// per-tensor mask density and Jaccard from `counted`, a RangeCounter over tensor_ranges(layout)
// that has just counted the mask (and the previous one when have_previous).
void fill_mask_metrics(const RangeCounter& counted, const ParamLayout& layout, bool have_previous,
                       std::size_t k_total, StepMetrics& out);
// sums[s] = sum of (double) x[j]^2 over tensor s, in fixed blocks from the tensor's start,
// each block summed in lane order and the blocks added in order (docs/algorithms.md,
// "Metrics"); the reduction runs on backend k, where x lives, and k is synchronized on return.
// `partial` is k's scratch, grown as needed.
void tensor_sum_squares(kernels::KernelBackend& k, kernels::Buffer<double>& partial, const ParamLayout& layout,
                        std::span<const float> x, std::vector<double>& sums);
// tensor_sum_squares, and max |x[j]| over all of x (NaN when an x[j] is NaN) from the same
// read of x; `peak` is k's scratch for the block maxima, grown as needed.
float tensor_sum_squares_max(kernels::KernelBackend& k, kernels::Buffer<double>& partial, kernels::Buffer<float>& peak,
                             const ParamLayout& layout, std::span<const float> x, std::vector<double>& sums);
// Fills residual_norm, residual_max and per-tensor residual norms, in one pass over the
// residual. The reductions run on backend k where the residual lives (only the block sums and
// maxima reach the host); `partial` and `peak` are k's scratch, grown as needed.
void fill_residual_metrics(kernels::KernelBackend& k, kernels::Buffer<double>& partial, kernels::Buffer<float>& peak,
                           const ParamLayout& layout, std::span<const float> residual, StepMetrics& out);
// residual_norm / ||theta||_2 (NaN when theta_norm is not positive).
double residual_to_param(double residual_norm, double theta_norm);
// Sets every mask, residual and staleness metric to NaN (dense optimizers).
void mark_sparse_metrics_not_applicable(StepMetrics& out);

// ---- The mask oracles (docs/algorithms.md, "Metrics"), computed on rank 0 from every worker's
// accumulated gradient a_i = e_i + g_i at the step the mask is chosen.

// One ranking range of a mask: a shard and its k_w (partitioned SCAPE), or [0, N) and K
// (local_union SCAPE, top-k EF). Ranges begin at multiples of 64 and do not overlap.
struct RankRange {
  std::size_t begin, end, k;
};

// What the optimizer ranks, computed from the mean over workers: first_moment
// |b1 m_prev + (1-b1) mean_i a_i|, mean_gradient |mean_i a_i| (the gradient statistic and top-k
// EF), momentum |m_prev| (momentum_only, which does not read a_i), none (random masks).
enum class OracleStatistic { first_moment, mean_gradient, momentum, none };

struct MaskOracle {
  std::vector<float> mean_acc;                 // mean_i a_i of the choosing step (the caller fills it)
  std::vector<float> statistic;                // scratch
  std::vector<std::uint64_t> same_statistic;   // O, top-k of the statistic per range (empty for none)
  std::vector<std::uint64_t> top_mean;         // O', top-k of |mean_i a_i| per range
  std::size_t k_total = 0;                     // sum of the ranges' k
  double top_mean_energy = 0;                  // sum over O' of (mean_i a_i)^2
};

// Fills O, O', K and the energy of O' from oracle.mean_acc; m_prev (N values, the first moment
// before the choosing step) is read by first_moment and momentum only.
void build_mask_oracle(OracleStatistic statistic, std::span<const float> m_prev, double beta1,
                       std::span<const RankRange> ranges, MaskOracle& oracle);
// |M ∩ O| / K: NaN without O (random masks) or when K = 0.
double oracle_overlap(const MaskOracle& oracle, std::span<const std::uint64_t> mask);
// sum over M of (mean_i a_i)^2 / sum over O' of it, each summed in index order: NaN when O'
// holds no energy.
double energy_capture(const MaskOracle& oracle, std::span<const std::uint64_t> mask);

// Steps since each coordinate was last delivered (t - last delivery; t when never delivered).
// A count of coordinates per last-delivery step is kept up to date on delivery, so the
// statistics cost O(t) per step instead of a pass over all N coordinates.
class StalenessTracker {
 public:
  explicit StalenessTracker(std::size_t n) : last_(n, 0), count_by_last_(1, n) {}
  void deliver(std::span<const std::uint32_t> indices, int t);
  // Mean, p99 (nearest rank) and max at step t, written into out.
  void fill(int t, StepMetrics& out) const;
  void save(StateMap& state, const std::string& prefix) const { put_state(state, prefix + "last_delivery", last_); }
  void load(const StateMap& state, const std::string& prefix);

 private:
  std::vector<std::int32_t> last_;
  std::vector<std::size_t> count_by_last_;  // [l] = coordinates last delivered at step l
};

// Update statistics: call before() with theta before the step and after() with theta after.
class UpdateTracker {
 public:
  // theta spans given to the methods must be memory k's kernels can read (the statistics are
  // kernels of k: on a GPU only the per-block sums reach the host).
  UpdateTracker(kernels::KernelBackend& k, std::size_t n);
  void before(std::span<const float> theta);
  // Also measures ||theta||_2 after the step (theta_norm()), since it reads theta anyway.
  // `stepped`: the coordinates the optimizer stepped (mask words covering N bits in memory k
  // can read; empty = all). The sign-flip share counts only coordinates stepped in this and the
  // previous step, so the weight decay that moves every flagged coordinate off a masked update
  // is no update.
  void after(std::span<const float> theta, StepMetrics& out, std::span<const std::uint64_t> stepped = {});
  // Only ||theta||_2 (bit-identical to after()'s), for a worker whose update statistics nobody
  // reads: replicas are identical, so the run records worker 0's.
  void norm_only(std::span<const float> theta);
  // In place of before() and after() for a step that decays every coordinate by its piece's
  // factor (detail::weight_decay_pieces) and then changes only the ascending coordinates
  // `stepped` (SCAPE's masked update): decay_stepped() before it keeps and decays those
  // coordinates; decay_rest_and_measure() after it decays the others and measures, in one pass
  // over theta instead of the decay, the copy and after()'s pass. The statistics are after()'s
  // bit for bit. piece_ends and piece_factors are host memory, read by decay_stepped().
  void decay_stepped(std::span<float> theta, std::span<const std::uint32_t> stepped,
                     std::span<const std::uint64_t> piece_ends, std::span<const float> piece_factors);
  void decay_rest_and_measure(std::span<float> theta, std::span<const std::uint32_t> stepped, StepMetrics& out);
  // decay_rest_and_measure() on a worker that measures only ||theta|| (norm_only()'s, bit for bit).
  void decay_rest_and_norm(std::span<float> theta, std::span<const std::uint32_t> stepped);
  double theta_norm() const { return theta_norm_; }
  void save(StateMap& state, const std::string& prefix);
  void load(const StateMap& state, const std::string& prefix);

 private:
  kernels::KernelBackend& kernels_;
  std::size_t n_;
  kernels::Buffer<float> before_{kernels_};
  kernels::Buffer<std::int8_t> previous_sign_{kernels_};
  kernels::Buffer<double> stats_{kernels_}, partial_{kernels_};
  kernels::Buffer<float> kept_{kernels_}, piece_factors_{kernels_};
  kernels::Buffer<std::uint64_t> piece_ends_{kernels_};
  bool have_previous_ = false;
  double theta_norm_ = 0;
  // Adds up the blocks' statistics in block order into out (after() and decay_rest_and_measure()).
  void sum_blocks(std::size_t blocks, StepMetrics& out);
};

}  // namespace scape::metrics
