// Step metrics shared by all optimizers (docs/algorithms.md, "Metrics"): deterministic norms,
// mask density / Jaccard / fill-in, residual size, staleness and update statistics.
// Reductions use fixed blocks summed in order, so a metric does not depend on thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "core/state.hpp"

namespace scape::metrics {

double l2_norm(std::span<const float> x);

// Set bits of `words` in the bit range [begin, end).
std::size_t popcount_range(std::span<const std::uint64_t> words, std::size_t begin, std::size_t end);
std::size_t popcount_and_range(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b,
                               std::size_t begin, std::size_t end);
std::size_t popcount_or_range(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b,
                              std::size_t begin, std::size_t end);

// |a & b| / |a | b| over [begin, end); 1 when both are empty.
double jaccard_range(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b, std::size_t begin,
                     std::size_t end);

// Fills mask_size, mask_density, mask_jaccard (NaN without a previous mask), fill_in and the
// per-tensor mask density and Jaccard.
void fill_mask_metrics(const ParamLayout& layout, std::span<const std::uint64_t> mask,
                       std::span<const std::uint64_t> previous, std::size_t k_total, StepMetrics& out);
// sums[s] = sum of (double) x[j]^2 over tensor s, in fixed blocks from the tensor's start,
// each block summed in index order and the blocks added in order (docs/algorithms.md,
// "Metrics"); the reduction runs on backend k, where x lives, and k is synchronized on return.
// `partial` is k's scratch, grown as needed.
void tensor_sum_squares(kernels::KernelBackend& k, kernels::Buffer<double>& partial, const ParamLayout& layout,
                        std::span<const float> x, std::vector<double>& sums);
// Fills residual_norm, residual_max, residual_to_param (given ||theta||_2) and per-tensor
// residual norms. The reductions run on backend k where the residual lives (only the partial
// sums reach the host); `partial` is k's scratch, grown as needed.
void fill_residual_metrics(kernels::KernelBackend& k, kernels::Buffer<double>& partial, const ParamLayout& layout,
                           std::span<const float> residual, double theta_norm, StepMetrics& out);
// Sets every mask, residual and staleness metric to NaN (dense optimizers).
void mark_sparse_metrics_not_applicable(StepMetrics& out);

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
  explicit UpdateTracker(std::size_t n) : before_(n), previous_sign_(n, 0) {}
  void before(std::span<const float> theta);
  // Also measures ||theta||_2 after the step (theta_norm()), since it reads theta anyway.
  void after(std::span<const float> theta, StepMetrics& out);
  double theta_norm() const { return theta_norm_; }
  void save(StateMap& state, const std::string& prefix) const {
    put_state(state, prefix + "previous_sign", previous_sign_);
    put_state_value(state, prefix + "have_previous", static_cast<std::uint8_t>(have_previous_));
  }
  void load(const StateMap& state, const std::string& prefix) {
    get_state(state, prefix + "previous_sign", previous_sign_);
    have_previous_ = get_state_value<std::uint8_t>(state, prefix + "have_previous") != 0;
  }

 private:
  std::vector<float> before_;
  std::vector<double> partial_;
  std::vector<std::int8_t> previous_sign_;
  bool have_previous_ = false;
  double theta_norm_ = 0;
};

}  // namespace scape::metrics
