// Splitting a CPU kernel's loop across the OpenMP threads only when it pays. A parallel region
// whose `if` clause is false still costs libgomp a team allocation and release (about half a
// microsecond, with a malloc_consolidate now and then), and the simulator's ranks, one thread
// each, call some sixty kernels per step on spans of a few thousand elements. So these helpers
// branch around the region: a short loop runs as a plain call on this thread.
//
// A kernel writes its loop once, as a function of a range [lo, hi) that takes its pointers and
// scalars as parameters (restrict pointers and by-value scalars let the compiler vectorize it),
// and hands that range function to one of the helpers below.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <omp.h>

namespace scape::kernels {

// Whether a loop over n elements should fork: more than `threshold` of them, and more than one
// thread to run them.
inline bool worth_forking(std::int64_t n, std::int64_t threshold) {
  return n > threshold && omp_get_max_threads() > 1;
}

// Inside a parallel region: this thread's static share [lo, hi) of [0, n), contiguous and in
// thread order.
inline void this_thread_share(std::int64_t n, std::int64_t& lo, std::int64_t& hi) {
  const std::int64_t threads = omp_get_num_threads();
  const std::int64_t t = omp_get_thread_num();
  lo = n * t / threads;
  hi = n * (t + 1) / threads;
}

// range(lo, hi) over the whole of [0, n): once on this thread when the loop is not worth
// forking, else once per thread on its share. For element-wise bodies, whose results do not
// depend on the split.
template <typename Range>
void for_shares(std::int64_t n, std::int64_t threshold, const Range& range) {
  if (!worth_forking(n, threshold)) {
    range(std::int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    std::int64_t lo = 0, hi = 0;
    this_thread_share(n, lo, hi);
    range(lo, hi);
  }
}

// The sum of count(lo, hi) (a std::size_t) over the shares of [0, n), split as for_shares does.
template <typename Count>
std::size_t sum_over_shares(std::int64_t n, std::int64_t threshold, const Count& count) {
  if (!worth_forking(n, threshold)) return count(std::int64_t{0}, n);
  std::size_t total = 0;
#pragma omp parallel reduction(+ : total)
  {
    std::int64_t lo = 0, hi = 0;
    this_thread_share(n, lo, hi);
    total += count(lo, hi);
  }
  return total;
}

// The maximum of highest(lo, hi) (a std::uint32_t, 0 for an empty range) over the shares of
// [0, n).
template <typename Highest>
std::uint32_t max_over_shares(std::int64_t n, std::int64_t threshold, const Highest& highest) {
  if (!worth_forking(n, threshold)) return highest(std::int64_t{0}, n);
  std::uint32_t result = 0;
#pragma omp parallel reduction(max : result)
  {
    std::int64_t lo = 0, hi = 0;
    this_thread_share(n, lo, hi);
    result = std::max(result, highest(lo, hi));
  }
  return result;
}

}  // namespace scape::kernels
