// Gather (compact), scatter (expand), scatter-add and zeroing at an index list, with the index
// bounds checked up front so a bad list throws before any buffer is touched.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

using checks::require_compacted;

// Below this many indices a parallel region costs more than the gather it splits.
constexpr std::int64_t kParallelIndices = std::int64_t{1} << 15;

// One read of idx (a small fraction of the traffic of the gather or scatter that follows).
std::uint32_t highest_in(const std::uint32_t* __restrict idx, std::int64_t lo, std::int64_t hi) {
  std::uint32_t highest = 0;
#pragma omp simd reduction(max : highest)
  for (std::int64_t i = lo; i < hi; ++i) highest = std::max(highest, idx[i]);
  return highest;
}

void require_in_bounds(std::span<const std::uint32_t> idx, std::size_t dense_size, const char* what) {
  const std::uint32_t highest =
      max_over_shares(static_cast<std::int64_t>(idx.size()), kParallelIndices,
                      [&](std::int64_t lo, std::int64_t hi) { return highest_in(idx.data(), lo, hi); });
  if (!idx.empty() && highest >= dense_size) {
    throw std::invalid_argument(std::string(what) + ": index " + std::to_string(highest) +
                                " out of range for a dense buffer of " + std::to_string(dense_size));
  }
}

// Calls body(k) for every position k < count; in parallel when the list is long enough. The
// scatters (expand, scatter_add, zero_at) may split their list because its indices are
// distinct: parallel writers never share an element.
template <typename Body>
void for_each_position(std::size_t count, Body body) {
  for_shares(static_cast<std::int64_t>(count), kParallelIndices, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) body(static_cast<std::size_t>(i));
  });
}

}  // namespace

void compact(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst) {
  require_compacted(idx.size(), dst.size(), "compact");
  require_in_bounds(idx, src.size(), "compact");
  for_each_position(idx.size(), [&](std::size_t k) { dst[k] = src[idx[k]]; });
}

void expand(std::span<const float> src, std::span<const std::uint32_t> idx, std::span<float> dst) {
  require_compacted(idx.size(), src.size(), "expand");
  require_in_bounds(idx, dst.size(), "expand");
  for_each_position(idx.size(), [&](std::size_t k) { dst[idx[k]] = src[k]; });
}

void scatter_add(std::span<float> dst, std::span<const std::uint32_t> idx, std::span<const float> src) {
  require_compacted(idx.size(), src.size(), "scatter_add");
  require_in_bounds(idx, dst.size(), "scatter_add");
  // One addition per element per call, so the schedule cannot change a sum.
  for_each_position(idx.size(), [&](std::size_t k) { dst[idx[k]] += src[k]; });
}

void zero_at(std::span<float> dst, std::span<const std::uint32_t> idx) {
  require_in_bounds(idx, dst.size(), "zero_at");
  for_each_position(idx.size(), [&](std::size_t k) { dst[idx[k]] = 0.0f; });
}

}  // namespace scape::kernels
