// One block of the update_statistics kernel (kernels/kernel_list.inc), written once for both
// devices (kernels/cpu/reduce.cpp, kernels/cuda/reduce.cu): one thread walks its block in a fixed
// order, so the double sums, the maximum and the counts are bit-identical on the CPU and the GPU
// (with the CUDA library's --fmad=false).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/sum_squares.hpp"

#ifdef __CUDACC__
#define SCAPE_UPDATE_STATS_HOST_DEVICE __host__ __device__
#else
#define SCAPE_UPDATE_STATS_HOST_DEVICE
#endif

namespace scape::kernels {

// Values per block in update_statistics' output: sum d^2, sum theta^2, max |d|, both, flipped.
constexpr std::size_t kUpdateStats = 5;

// Coordinates [lo, hi): out[0..4] as the kernel's contract states; sign[j] = the new sign. The
// two double sums are in the lane order of kernels/sum_squares.hpp. Three passes over the block
// (the sums, the maximum, the signs), each of which the compiler vectorizes, where one loop
// doing all three did not.
SCAPE_UPDATE_STATS_HOST_DEVICE inline void update_statistics_block(const float* theta, const float* before,
                                                                   const std::uint64_t* stepped, bool have_previous,
                                                                   std::int8_t* sign, std::size_t lo, std::size_t hi,
                                                                   double* out) {
  out[0] = block_sum_of_squared_differences(theta, before, lo, hi);
  out[1] = block_sum_of_squares(theta, lo, hi);
  // max |d| on the bit patterns with the sign cleared: for non-NaN floats their unsigned order is
  // the order of |d|, and every NaN lies above +inf, so the maximum is NaN when a d is NaN.
  std::uint32_t max_bits = 0;
  for (std::size_t j = lo; j < hi; ++j) {
    const float d = theta[j] - before[j];
    std::uint32_t bits = 0;
    std::memcpy(&bits, &d, sizeof bits);
    bits &= 0x7fffffffu;
    max_bits = bits > max_bits ? bits : max_bits;
  }
  float max = 0;
  std::memcpy(&max, &max_bits, sizeof max);
  out[2] = static_cast<double>(max);
  std::size_t both = 0, flipped = 0;
  const int previous = have_previous ? 1 : 0;
  for (std::size_t j = lo; j < hi;) {  // one word of `stepped` at a time
    const std::uint64_t word = stepped == nullptr ? ~std::uint64_t{0} : stepped[j / 64];
    const std::size_t word_end = (j / 64 + 1) * 64 < hi ? (j / 64 + 1) * 64 : hi;
    for (; j < word_end; ++j) {
      const float d = theta[j] - before[j];
      const int s = ((d > 0) - (d < 0)) * static_cast<int>((word >> (j % 64)) & 1u);
      const int p = sign[j];
      const int counted = previous & (s != 0) & (p != 0);
      both += static_cast<std::size_t>(counted);
      flipped += static_cast<std::size_t>(counted & (s != p));
      sign[j] = static_cast<std::int8_t>(s);
    }
  }
  out[3] = static_cast<double>(both);
  out[4] = static_cast<double>(flipped);
}

}  // namespace scape::kernels
