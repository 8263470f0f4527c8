// Deterministic block reductions on the CPU (kernels/kernel_list.inc, "Reductions").
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {

void block_sum_squares(std::span<const float> x, std::size_t block, std::span<double> partial) {
  checks::block_sum_squares_sizes(x.size(), block, partial.size());
  const auto blocks = static_cast<std::int64_t>(partial.size());
#pragma omp parallel for schedule(static) if (blocks > 8)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::size_t lo = static_cast<std::size_t>(b) * block;
    const std::size_t hi = std::min(x.size(), lo + block);
    double s = 0;
    for (std::size_t j = lo; j < hi; ++j) s += static_cast<double>(x[j]) * x[j];
    partial[static_cast<std::size_t>(b)] = s;
  }
}

float max_magnitude(std::span<const float> x) {
  float m = 0;
  bool nan = false;
  const auto n = static_cast<std::int64_t>(x.size());
#pragma omp parallel for schedule(static) reduction(max : m) reduction(|| : nan) if (n > 65536)
  for (std::int64_t j = 0; j < n; ++j) {
    const float v = std::fabs(x[static_cast<std::size_t>(j)]);
    nan = nan || std::isnan(v);
    m = std::max(m, v);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

}  // namespace scape::kernels
