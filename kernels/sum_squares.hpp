// Sums of squares over one block, written once for the CPU (kernels/cpu/reduce.cpp, the
// host-side metrics::l2_norm) and the GPU (kernels/cuda/reduce.cu), shared by block_sum_squares
// and update_statistics, so their double results are bit-identical on both (the CUDA library's
// --fmad=false keeps x*x and the add separately rounded, as -ffp-contract=off does on the CPU).
//
// The order is fixed (the "lane order" of docs/algorithms.md): eight running sums, element
// lo + 8q + l into lane l for every full group of eight, the lanes added in lane order, then the
// last (hi - lo) mod 8 elements in index order. One running sum would be a serial chain of
// dependent adds (about four cycles each); eight independent lanes let the compiler vectorize.
#pragma once

#include <cstddef>
#include <cstring>

#ifdef __CUDACC__
#define SCAPE_SUM_SQUARES_HOST_DEVICE __host__ __device__
#else
#define SCAPE_SUM_SQUARES_HOST_DEVICE
#endif

namespace scape::kernels {

constexpr std::size_t kSumSquaresLanes = 8;

// Adds `groups` groups of eight from j on into the running lanes: element j + 8q + l into lane
// l. A caller that walks a block piece by piece keeps the lanes between pieces.
template <typename Square>
SCAPE_SUM_SQUARES_HOST_DEVICE inline void add_lane_groups(double* running, std::size_t j, std::size_t groups,
                                                          Square square) {
  // The lanes in a local array for the loop: through the pointer GCC 12 keeps them in memory and
  // adds one scalar at a time.
  double lane[kSumSquaresLanes];
  for (std::size_t l = 0; l < kSumSquaresLanes; ++l) lane[l] = running[l];
  // Counted groups: GCC 12 vectorizes this form, not a `j + 8 <= hi` loop.
  for (std::size_t g = 0; g < groups; ++g, j += kSumSquaresLanes) {
    for (std::size_t l = 0; l < kSumSquaresLanes; ++l) lane[l] += square(j + l);
  }
  for (std::size_t l = 0; l < kSumSquaresLanes; ++l) running[l] = lane[l];
}

// The sum of square(j) over [lo, hi) in lane order; square(j) returns a double.
template <typename Square>
SCAPE_SUM_SQUARES_HOST_DEVICE inline double lane_order_sum(std::size_t lo, std::size_t hi, Square square) {
  double lane[kSumSquaresLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  const std::size_t groups = (hi - lo) / kSumSquaresLanes;
  add_lane_groups(lane, lo, groups, square);
  std::size_t j = lo + groups * kSumSquaresLanes;
  double s = 0;
  for (std::size_t l = 0; l < kSumSquaresLanes; ++l) s += lane[l];
  for (; j < hi; ++j) s += square(j);
  return s;
}

// Sum of (double) x[j] * (double) x[j] over [lo, hi).
SCAPE_SUM_SQUARES_HOST_DEVICE inline double block_sum_of_squares(const float* x, std::size_t lo, std::size_t hi) {
  return lane_order_sum(lo, hi, [x](std::size_t j) { return static_cast<double>(x[j]) * static_cast<double>(x[j]); });
}

// Sum of (double) d * (double) d with d = x[j] - y[j] in float, over [lo, hi).
SCAPE_SUM_SQUARES_HOST_DEVICE inline double block_sum_of_squared_differences(const float* x, const float* y,
                                                                             std::size_t lo, std::size_t hi) {
  return lane_order_sum(lo, hi, [x, y](std::size_t j) {
    const float d = x[j] - y[j];
    return static_cast<double>(d) * static_cast<double>(d);
  });
}

// max |x[j]| over [lo, hi) on the bit patterns with the sign cleared: for non-NaN floats their
// unsigned order is the order of |x|, and every NaN lies above +inf's 0x7f800000, so one
// unsigned maximum (which vectorizes) is the maximum magnitude, or a NaN when there is one. Beside
// the sums because block_sum_squares_max takes both from one read of the block.
SCAPE_SUM_SQUARES_HOST_DEVICE inline float block_max_magnitude(const float* x, std::size_t lo, std::size_t hi) {
  unsigned max_bits = 0;
  for (std::size_t j = lo; j < hi; ++j) {
    unsigned bits = 0;
    std::memcpy(&bits, &x[j], sizeof bits);
    bits &= 0x7fffffffu;
    max_bits = bits > max_bits ? bits : max_bits;
  }
  float max = 0;
  std::memcpy(&max, &max_bits, sizeof max);
  return max;
}

}  // namespace scape::kernels
