// Step metrics (docs/algorithms.md, "Metrics").
#include "core/metrics.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/bit_ranges.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/sum_squares.hpp"
#include "kernels/update_stats.hpp"

namespace scape::metrics {
namespace {

constexpr std::size_t kBlock = 8192;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using Index = std::int64_t;

// Partial sums per fixed block (parallel), added in block order (serial): deterministic.
template <typename BlockFn>
double blocked_sum(std::size_t n, BlockFn block_fn) {
  const std::size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
#pragma omp parallel for schedule(static) if (blocks > 8)
  for (Index b = 0; b < static_cast<Index>(blocks); ++b) {
    const std::size_t lo = static_cast<std::size_t>(b) * kBlock;
    partial[static_cast<std::size_t>(b)] = block_fn(lo, std::min(n, lo + kBlock));
  }
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

}  // namespace

double l2_norm(std::span<const float> x) {
  // Each block in the fixed lane order of kernels/sum_squares.hpp, as block_sum_squares.
  return std::sqrt(blocked_sum(x.size(), [&](std::size_t lo, std::size_t hi) {
    return kernels::block_sum_of_squares(x.data(), lo, hi);
  }));
}

double device_sum_squares(kernels::KernelBackend& k, kernels::Buffer<double>& partial, std::span<const float> x) {
  partial.resize((x.size() + kBlock - 1) / kBlock);
  k.block_sum_squares(x, kBlock, partial.span());
  k.synchronize();
  double total = 0;
  for (const double p : partial.span()) total += p;
  return total;
}

double device_l2_norm(kernels::KernelBackend& k, kernels::Buffer<double>& partial, std::span<const float> x) {
  return std::sqrt(device_sum_squares(k, partial, x));
}

std::size_t popcount_and_range(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b, std::size_t begin,
                               std::size_t end) {
  std::size_t count = 0;
  for (std::size_t w = begin / 64; begin < end && w <= (end - 1) / 64; ++w) {
    count += static_cast<std::size_t>(std::popcount(a[w] & b[w] & kernels::range_word_mask(w, begin, end)));
  }
  return count;
}

RangeCounter::RangeCounter(kernels::KernelBackend& k, const std::vector<std::pair<std::size_t, std::size_t>>& ranges)
    : kernels_(k) {
  std::vector<std::uint64_t> flat;
  for (const auto& [begin, end] : ranges) {
    flat.push_back(begin);
    flat.push_back(end);
  }
  ranges_.resize(flat.size());
  counts_.resize(3 * ranges.size());
  kernels_.copy_bytes(flat.data(), ranges_.data(), flat.size() * sizeof(std::uint64_t));
  kernels_.synchronize();
}

void RangeCounter::count(std::span<const std::uint64_t> mask, std::span<const std::uint64_t> previous) {
  kernels_.mask_range_counts(mask, previous, ranges_.span(), counts_.span());
  kernels_.synchronize();
}

std::vector<std::pair<std::size_t, std::size_t>> tensor_ranges(const ParamLayout& layout) {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (const auto& slot : layout.slots()) ranges.emplace_back(slot.offset, slot.end());
  ranges.emplace_back(0, layout.size());
  return ranges;
}

std::vector<std::pair<std::size_t, std::size_t>> shard_ranges(const Sharding& shards) {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (int w = 0; w < shards.workers(); ++w) ranges.emplace_back(shards.begin(w), shards.end(w));
  return ranges;
}

void fill_mask_metrics(const RangeCounter& counted, const ParamLayout& layout, bool have_previous,
                       std::size_t k_total, StepMetrics& out) {
  const std::size_t n = layout.size(), all = counted.ranges() - 1;
  // As jaccard_range: |M & P| / |M | P|, and 1 for two empty masks.
  const auto jaccard = [&](std::size_t r) {
    if (!have_previous) return kNaN;
    return counted.either(r) == 0 ? 1.0 : static_cast<double>(counted.both(r)) / static_cast<double>(counted.either(r));
  };
  out.k_total = k_total;
  out.mask_size = counted.set(all);
  out.mask_density = n ? static_cast<double>(out.mask_size) / static_cast<double>(n) : kNaN;
  out.fill_in = k_total ? static_cast<double>(out.mask_size) / static_cast<double>(k_total) : kNaN;
  out.mask_jaccard = jaccard(all);
  const auto& slots = layout.slots();
  out.tensor_mask_density.resize(slots.size());
  out.tensor_mask_jaccard.resize(slots.size());
  for (std::size_t s = 0; s < slots.size(); ++s) {
    out.tensor_mask_density[s] = static_cast<double>(counted.set(s)) / static_cast<double>(slots[s].numel());
    out.tensor_mask_jaccard[s] = jaccard(s);
  }
}

namespace {

std::size_t blocks_of(std::size_t n) { return (n + kBlock - 1) / kBlock; }

std::size_t tensor_blocks(const ParamLayout& layout) {
  std::size_t total = 0;
  for (const auto& slot : layout.slots()) total += blocks_of(slot.numel());
  return total;
}

// Queues launch(tensor's values, its blocks' first index) for every tensor, the tensors' blocks
// laid out one after another; then, k synchronized, adds each tensor's block sums in order.
template <typename Launch>
void tensor_block_sums(kernels::KernelBackend& k, const kernels::Buffer<double>& partial, const ParamLayout& layout,
                       std::span<const float> x, std::vector<double>& out, Launch launch) {
  // Per tensor, the same fixed blocks as blocked_sum, each summed in order on the device; the
  // host adds the block sums in order, so the sums equal a host computation bit for bit.
  const auto& slots = layout.slots();
  std::size_t at = 0;
  for (const auto& slot : slots) {
    launch(x.subspan(slot.offset, slot.numel()), at);
    at += blocks_of(slot.numel());
  }
  k.synchronize();
  out.assign(slots.size(), 0.0);
  at = 0;
  for (std::size_t s = 0; s < slots.size(); ++s) {
    double ss = 0;
    for (std::size_t b = 0; b < blocks_of(slots[s].numel()); ++b) ss += partial.data()[at + b];
    at += blocks_of(slots[s].numel());
    out[s] = ss;
  }
}

}  // namespace

void tensor_sum_squares(kernels::KernelBackend& k, kernels::Buffer<double>& partial, const ParamLayout& layout,
                        std::span<const float> x, std::vector<double>& out) {
  const std::size_t total = tensor_blocks(layout);
  if (partial.size() < total) partial.resize(total);
  tensor_block_sums(k, partial, layout, x, out, [&](std::span<const float> tensor, std::size_t at) {
    k.block_sum_squares(tensor, kBlock, partial.span().subspan(at, blocks_of(tensor.size())));
  });
}

float tensor_sum_squares_max(kernels::KernelBackend& k, kernels::Buffer<double>& partial, kernels::Buffer<float>& peak,
                             const ParamLayout& layout, std::span<const float> x, std::vector<double>& out) {
  const std::size_t total = tensor_blocks(layout);
  if (partial.size() < total) partial.resize(total);
  if (peak.size() < total) peak.resize(total);
  tensor_block_sums(k, partial, layout, x, out, [&](std::span<const float> tensor, std::size_t at) {
    const std::size_t nb = blocks_of(tensor.size());
    k.block_sum_squares_max(tensor, kBlock, partial.span().subspan(at, nb), peak.span().subspan(at, nb));
  });
  // The tensors tile x, so the largest block maximum is max_magnitude(x), NaN when one is NaN.
  float max = 0;
  for (const float p : peak.span().first(total)) {
    if (std::isnan(p)) return std::numeric_limits<float>::quiet_NaN();
    max = std::max(max, p);
  }
  return max;
}

void fill_residual_metrics(kernels::KernelBackend& k, kernels::Buffer<double>& partial, kernels::Buffer<float>& peak,
                           const ParamLayout& layout, std::span<const float> residual, StepMetrics& out) {
  std::vector<double> sums;
  const float max = tensor_sum_squares_max(k, partial, peak, layout, residual, sums);
  out.tensor_residual_norm.resize(sums.size());
  double total = 0;
  for (std::size_t s = 0; s < sums.size(); ++s) {
    out.tensor_residual_norm[s] = std::sqrt(sums[s]);
    total += sums[s];
  }
  out.residual_norm = std::sqrt(total);
  out.residual_max = std::isnan(max) ? kNaN : static_cast<double>(max);
}

double residual_to_param(double residual_norm, double theta_norm) {
  return theta_norm > 0 ? residual_norm / theta_norm : kNaN;
}

void mark_sparse_metrics_not_applicable(StepMetrics& out) {
  out.target_density = kNaN;
  out.mask_density = out.mask_jaccard = out.fill_in = kNaN;
  out.residual_norm = out.residual_max = out.residual_to_param = out.residual_clipped_norm = kNaN;
  out.staleness_mean = out.staleness_p99 = out.staleness_max = kNaN;
}

namespace {

// Sum of (double) x[j]^2 over the set bits of `words`, in index order.
double masked_sum_squares(std::span<const float> x, std::span<const std::uint64_t> words) {
  double s = 0;
  for (std::size_t w = 0; w < words.size(); ++w) {
    for (std::uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
      const std::size_t j = w * 64 + static_cast<std::size_t>(std::countr_zero(bits));
      s += static_cast<double>(x[j]) * x[j];
    }
  }
  return s;
}

void topk_per_range(std::span<const float> values, std::span<const RankRange> ranges,
                    std::vector<std::uint64_t>& words) {
  words.assign(kernels::words_for(values.size()), 0);
  for (const RankRange& r : ranges) {
    if (r.end <= r.begin) continue;
    kernels::topk_abs_mask(values.subspan(r.begin, r.end - r.begin), r.k,
                           std::span<std::uint64_t>(words).subspan(r.begin / 64, kernels::words_for(r.end - r.begin)));
  }
}

}  // namespace

void build_mask_oracle(OracleStatistic statistic, std::span<const float> m_prev, double beta1,
                       std::span<const RankRange> ranges, MaskOracle& oracle) {
  const std::span<const float> mean = oracle.mean_acc;
  oracle.k_total = 0;
  for (const RankRange& r : ranges) oracle.k_total += r.k;
  topk_per_range(mean, ranges, oracle.top_mean);
  oracle.top_mean_energy = masked_sum_squares(mean, oracle.top_mean);
  switch (statistic) {
    case OracleStatistic::first_moment:
      // The owner's arithmetic (kernels' first_moment_statistic), on the mean instead of a_w.
      oracle.statistic.resize(mean.size());
      kernels::first_moment_statistic(m_prev, mean, static_cast<float>(beta1), static_cast<float>(1.0 - beta1),
                                      oracle.statistic);
      topk_per_range(oracle.statistic, ranges, oracle.same_statistic);
      break;
    case OracleStatistic::mean_gradient:
      oracle.same_statistic = oracle.top_mean;
      break;
    case OracleStatistic::momentum:
      topk_per_range(m_prev, ranges, oracle.same_statistic);
      break;
    case OracleStatistic::none:
      oracle.same_statistic.clear();
      break;
  }
}

double oracle_overlap(const MaskOracle& oracle, std::span<const std::uint64_t> mask) {
  if (oracle.same_statistic.empty() || oracle.k_total == 0) return kNaN;
  return static_cast<double>(popcount_and_range(mask, oracle.same_statistic, 0, oracle.mean_acc.size())) /
         static_cast<double>(oracle.k_total);
}

double energy_capture(const MaskOracle& oracle, std::span<const std::uint64_t> mask) {
  if (!(oracle.top_mean_energy > 0)) return kNaN;
  return masked_sum_squares(oracle.mean_acc, mask.first(oracle.top_mean.size())) / oracle.top_mean_energy;
}

void StalenessTracker::deliver(std::span<const std::uint32_t> indices, int t) {
  if (count_by_last_.size() < static_cast<std::size_t>(t) + 1)
    count_by_last_.resize(static_cast<std::size_t>(t) + 1, 0);
  // The count at t gains every index at once: incremented in the loop, that one counter made
  // each iteration wait for the previous one's store (1.6M indices a step at N = 16M, 10%).
  for (std::uint32_t j : indices) {
    --count_by_last_[static_cast<std::size_t>(last_[j])];
    last_[j] = t;
  }
  count_by_last_[static_cast<std::size_t>(t)] += indices.size();
}

void StalenessTracker::load(const StateMap& state, const std::string& prefix) {
  get_state(state, prefix + "last_delivery", last_);
  count_by_last_.assign(1, 0);
  for (std::int32_t l : last_) {
    if (count_by_last_.size() <= static_cast<std::size_t>(l)) count_by_last_.resize(static_cast<std::size_t>(l) + 1, 0);
    ++count_by_last_[static_cast<std::size_t>(l)];
  }
}

void StalenessTracker::fill(int t, StepMetrics& out) const {
  const std::size_t n = last_.size();
  if (n == 0) {
    out.staleness_mean = out.staleness_p99 = out.staleness_max = kNaN;
    return;
  }
  // Staleness t - l ascending is l descending: walk the counts from the newest delivery back.
  const std::size_t rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(n)));
  double sum = 0;
  std::size_t seen = 0;
  bool have_p99 = false;
  for (std::size_t l = count_by_last_.size(); l-- > 0;) {
    const std::size_t c = count_by_last_[l];
    if (c == 0) continue;
    const double s = static_cast<double>(t) - static_cast<double>(l);
    sum += s * static_cast<double>(c);
    seen += c;
    if (!have_p99 && seen >= rank) {
      out.staleness_p99 = s;
      have_p99 = true;
    }
    out.staleness_max = s;
  }
  out.staleness_mean = sum / static_cast<double>(n);
}

UpdateTracker::UpdateTracker(kernels::KernelBackend& k, std::size_t n) : kernels_(k), n_(n) {}

void UpdateTracker::before(std::span<const float> theta) {
  // The copy and the signs live only on the worker that records the statistics (worker 0).
  before_.resize(n_);
  previous_sign_.resize(n_);  // zero-filled on first use: no previous signs
  kernels_.copy_bytes(theta.data(), before_.data(), theta.size_bytes());
}

void UpdateTracker::norm_only(std::span<const float> theta) {
  theta_norm_ = device_l2_norm(kernels_, partial_, theta);  // the blocks and order of after()
}

void UpdateTracker::after(std::span<const float> theta, StepMetrics& out, std::span<const std::uint64_t> stepped) {
  // One fused pass on the device (kernels: update_statistics): squared norms of the update and of
  // theta per fixed block, summed here in block order (deterministic), max |delta|, sign flips,
  // and the new signs. A coordinate not stepped keeps sign 0, so it counts neither now nor at
  // the next step.
  const std::size_t blocks = (theta.size() + kBlock - 1) / kBlock;
  stats_.resize(kernels::kUpdateStats * blocks);
  kernels_.update_statistics(theta, before_.span().first(theta.size()), stepped, have_previous_,
                       previous_sign_.span().first(theta.size()), kBlock, stats_.span());
  sum_blocks(blocks, out);
}

void UpdateTracker::decay_stepped(std::span<float> theta, std::span<const std::uint32_t> stepped,
                                  std::span<const std::uint64_t> piece_ends, std::span<const float> piece_factors) {
  piece_ends_.resize(piece_ends.size());
  piece_factors_.resize(piece_factors.size());
  kernels_.copy_bytes(piece_ends.data(), piece_ends_.data(), piece_ends.size_bytes());
  kernels_.copy_bytes(piece_factors.data(), piece_factors_.data(), piece_factors.size_bytes());
  kept_.resize(stepped.size());
  kernels_.keep_and_decay_at(theta, stepped, piece_ends_.span(), piece_factors_.span(), kept_.span());
}

void UpdateTracker::decay_rest_and_measure(std::span<float> theta, std::span<const std::uint32_t> stepped,
                                           StepMetrics& out) {
  previous_sign_.resize(n_);  // zero-filled on first use: no previous signs
  const std::size_t blocks = (theta.size() + kBlock - 1) / kBlock;
  stats_.resize(kernels::kUpdateStats * blocks);
  kernels_.decay_update_statistics(theta, piece_ends_.span(), piece_factors_.span(), stepped,
                                   kept_.span().first(stepped.size()), have_previous_,
                                   previous_sign_.span().first(theta.size()), kBlock, stats_.span());
  sum_blocks(blocks, out);
}

void UpdateTracker::decay_rest_and_norm(std::span<float> theta, std::span<const std::uint32_t> stepped) {
  const std::size_t blocks = (theta.size() + kBlock - 1) / kBlock;
  stats_.resize(kernels::kUpdateStats * blocks);
  kernels_.decay_update_statistics(theta, piece_ends_.span(), piece_factors_.span(), stepped,
                                   kept_.span().first(stepped.size()), false, {}, kBlock, stats_.span());
  kernels_.synchronize();
  double theta_total = 0;  // block sums in block order, as device_l2_norm adds them
  for (std::size_t b = 0; b < blocks; ++b) theta_total += stats_.data()[kernels::kUpdateStats * b + 1];
  theta_norm_ = std::sqrt(theta_total);
}

void UpdateTracker::sum_blocks(std::size_t blocks, StepMetrics& out) {
  kernels_.synchronize();
  double total = 0, theta_total = 0, both = 0, flipped = 0;
  float max = 0;
  bool nan = false;
  const double* s = stats_.data();
  for (std::size_t b = 0; b < blocks; ++b, s += kernels::kUpdateStats) {
    total += s[0];
    theta_total += s[1];
    nan = nan || std::isnan(s[2]);
    max = std::max(max, static_cast<float>(std::isnan(s[2]) ? 0.0 : s[2]));
    both += s[3];
    flipped += s[4];
  }
  have_previous_ = true;
  theta_norm_ = std::sqrt(theta_total);
  out.update_norm = std::sqrt(total);
  out.update_max = nan ? kNaN : max;
  out.update_sign_flip = both > 0 ? flipped / both : kNaN;
}

void UpdateTracker::save(StateMap& state, const std::string& prefix) {
  kernels_.synchronize();
  previous_sign_.resize(n_);  // a worker that never tracked saves zeros, as it always has
  put_state(state, prefix + "previous_sign", previous_sign_.span());
  put_state_value(state, prefix + "have_previous", static_cast<std::uint8_t>(have_previous_));
}

void UpdateTracker::load(const StateMap& state, const std::string& prefix) {
  std::vector<std::int8_t> sign;
  get_state(state, prefix + "previous_sign", sign);
  if (sign.size() != n_) {
    throw std::invalid_argument("checkpoint: " + prefix + "previous_sign has " + std::to_string(sign.size()) +
                                " entries, expected " + std::to_string(n_));
  }
  have_previous_ = get_state_value<std::uint8_t>(state, prefix + "have_previous") != 0;
  if (!have_previous_) return;  // signs are set only with have_previous: all zero, as before() starts
  previous_sign_.resize(n_);
  kernels_.copy_bytes(sign.data(), previous_sign_.data(), sign.size());
  kernels_.synchronize();
}

}  // namespace scape::metrics
