// Deterministic block reductions on the CPU (kernels/kernel_list.inc, "Reductions").
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/size_checks.hpp"
#include "kernels/sum_squares.hpp"
#include "kernels/update_stats.hpp"

namespace scape::kernels {

void block_sum_squares(std::span<const float> x, std::size_t block, std::span<double> partial) {
  checks::block_sum_squares_sizes(x.size(), block, partial.size());
  for_shares(static_cast<std::int64_t>(partial.size()), 8, [&](std::int64_t first, std::int64_t last) {
    for (auto b = static_cast<std::size_t>(first); b < static_cast<std::size_t>(last); ++b) {
      partial[b] = block_sum_of_squares(x.data(), b * block, std::min(x.size(), (b + 1) * block));
    }
  });
}

void block_sum_squares_max(std::span<const float> x, std::size_t block, std::span<double> partial,
                           std::span<float> peak) {
  checks::block_sum_squares_max_sizes(x.size(), block, partial.size(), peak.size());
  // The maximum walks the block again right after the sum, while it is still in L1/L2.
  for_shares(static_cast<std::int64_t>(partial.size()), 8, [&](std::int64_t first, std::int64_t last) {
    for (auto b = static_cast<std::size_t>(first); b < static_cast<std::size_t>(last); ++b) {
      const std::size_t lo = b * block, hi = std::min(x.size(), (b + 1) * block);
      partial[b] = block_sum_of_squares(x.data(), lo, hi);
      peak[b] = block_max_magnitude(x.data(), lo, hi);
    }
  });
}

// On the bit patterns with the sign cleared: for non-NaN floats the unsigned order is the order
// of |x|, and every NaN lies above +inf's 0x7f800000. So one unsigned max, which vectorizes
// (a float max with NaN checks does not), gives both the result and whether a NaN was seen.
float max_magnitude(std::span<const float> x) {
  constexpr std::uint32_t kMagnitude = 0x7fffffffu, kInfinity = 0x7f800000u;
  std::uint32_t m = 0;
  const auto n = static_cast<std::int64_t>(x.size());
#pragma omp parallel for schedule(static) reduction(max : m) if (n > 65536)
  for (std::int64_t j = 0; j < n; ++j) {
    m = std::max(m, std::bit_cast<std::uint32_t>(x[static_cast<std::size_t>(j)]) & kMagnitude);
  }
  return m > kInfinity ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(m);
}

std::size_t count_nonfinite(std::span<const float> x) {
  std::size_t count = 0;
  const auto n = static_cast<std::int64_t>(x.size());
#pragma omp parallel for schedule(static) reduction(+ : count) if (n > 65536)
  for (std::int64_t j = 0; j < n; ++j) count += !std::isfinite(x[static_cast<std::size_t>(j)]);
  return count;
}

void update_statistics(std::span<const float> theta, std::span<const float> before,
                       std::span<const std::uint64_t> stepped, bool have_previous, std::span<std::int8_t> sign,
                       std::size_t block, std::span<double> stats) {
  checks::update_statistics_sizes(theta.size(), before.size(), stepped.size(), sign.size(), block, stats.size());
  const std::size_t n = theta.size();
  for_shares(static_cast<std::int64_t>(stats.size() / kUpdateStats), 8, [&](std::int64_t first, std::int64_t last) {
    for (auto b = static_cast<std::size_t>(first); b < static_cast<std::size_t>(last); ++b) {
      update_statistics_block(theta.data(), before.data(), stepped.empty() ? nullptr : stepped.data(), have_previous,
                              sign.data(), b * block, std::min(n, (b + 1) * block), stats.data() + kUpdateStats * b);
    }
  });
}

void keep_and_decay_at(std::span<float> theta, std::span<const std::uint32_t> stepped,
                       std::span<const std::uint64_t> piece_ends, std::span<const float> piece_factors,
                       std::span<float> kept) {
  checks::decay_pieces_sizes("keep_and_decay_at", theta.size(), piece_ends.size(), piece_factors.size(), stepped.size(),
                             kept.size());
  checks::decay_pieces_values("keep_and_decay_at", theta.size(), piece_ends, stepped);
  for_shares(static_cast<std::int64_t>(stepped.size()), 65536, [&](std::int64_t first, std::int64_t last) {
    for (auto k = static_cast<std::size_t>(first); k < static_cast<std::size_t>(last); ++k) {
      keep_and_decay_one(theta.data(), stepped.data(), piece_ends.data(), piece_factors.data(), piece_ends.size(),
                         kept.data(), k);
    }
  });
}

void decay_update_statistics(std::span<float> theta, std::span<const std::uint64_t> piece_ends,
                             std::span<const float> piece_factors, std::span<const std::uint32_t> stepped,
                             std::span<const float> kept, bool have_previous, std::span<std::int8_t> sign,
                             std::size_t block, std::span<double> stats) {
  checks::decay_update_statistics_sizes(theta.size(), piece_ends.size(), piece_factors.size(), stepped.size(),
                                        kept.size(), sign.size(), block, stats.size());
  checks::decay_pieces_values("decay_update_statistics", theta.size(), piece_ends, stepped);
  const std::size_t n = theta.size();
  for_shares(static_cast<std::int64_t>(stats.size() / kUpdateStats), 8, [&](std::int64_t first, std::int64_t last) {
    for (auto b = static_cast<std::size_t>(first); b < static_cast<std::size_t>(last); ++b) {
      decay_update_statistics_block(theta.data(), piece_ends.data(), piece_factors.data(), piece_ends.size(),
                                    stepped.data(), kept.data(), stepped.size(), have_previous,
                                    sign.empty() ? nullptr : sign.data(), b * block, std::min(n, (b + 1) * block),
                                    stats.data() + kUpdateStats * b);
    }
  });
}

}  // namespace scape::kernels
