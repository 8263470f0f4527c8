// One block of the update_statistics kernel (kernels/kernel_list.inc), written once for both
// devices (kernels/cpu/reduce.cpp, kernels/cuda/reduce.cu): one thread walks its block in index
// order, so the double sums, the maximum and the counts are bit-identical on the CPU and the GPU
// (with the CUDA library's --fmad=false).
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define SCAPE_UPDATE_STATS_HOST_DEVICE __host__ __device__
#else
#define SCAPE_UPDATE_STATS_HOST_DEVICE
#endif

namespace scape::kernels {

// Values per block in update_statistics' output: sum d^2, sum theta^2, max |d|, both, flipped.
constexpr std::size_t kUpdateStats = 5;

// Coordinates [lo, hi): out[0..4] as the kernel's contract states; sign[j] = the new sign.
SCAPE_UPDATE_STATS_HOST_DEVICE inline void update_statistics_block(const float* theta, const float* before,
                                                                   const std::uint64_t* stepped, bool have_previous,
                                                                   std::int8_t* sign, std::size_t lo, std::size_t hi,
                                                                   double* out) {
  double ss = 0, tt = 0;
  float max = 0;
  float nan = 0;  // a NaN |d| once one is seen (std::numeric_limits is host-only in device code)
  bool seen_nan = false;
  std::size_t both = 0, flipped = 0;
  const int previous = have_previous ? 1 : 0;
  for (std::size_t j = lo; j < hi; ++j) {
    const float d = theta[j] - before[j];
    ss += static_cast<double>(d) * d;
    tt += static_cast<double>(theta[j]) * theta[j];
    const float a = d < 0 ? -d : d;
    seen_nan = seen_nan || a != a;
    nan = a != a ? a : nan;
    max = a > max ? a : max;
    const int was_stepped = stepped == nullptr ? 1 : static_cast<int>((stepped[j / 64] >> (j % 64)) & 1u);
    const int s = ((d > 0) - (d < 0)) * was_stepped;
    const int p = sign[j];
    const int counted = previous & (s != 0) & (p != 0);
    both += static_cast<std::size_t>(counted);
    flipped += static_cast<std::size_t>(counted & (s != p));
    sign[j] = static_cast<std::int8_t>(s);
  }
  out[0] = ss;
  out[1] = tt;
  out[2] = static_cast<double>(seen_nan ? nan : max);
  out[3] = static_cast<double>(both);
  out[4] = static_cast<double>(flipped);
}

}  // namespace scape::kernels
