// The bits of mask word w that lie in the coordinate range [begin, end), for the range counts of
// kernels/cpu/bitmask.cpp and kernels/cuda/bitmask.cu (one definition for both devices).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SCAPE_BIT_RANGES_HOST_DEVICE __host__ __device__
#else
#define SCAPE_BIT_RANGES_HOST_DEVICE
#endif

namespace scape::kernels {

SCAPE_BIT_RANGES_HOST_DEVICE inline std::uint64_t range_word_mask(std::uint64_t w, std::uint64_t begin,
                                                                  std::uint64_t end) {
  const std::uint64_t lo = w * 64;
  std::uint64_t m = ~std::uint64_t{0};
  if (begin > lo) m &= ~std::uint64_t{0} << (begin - lo);
  if (end < lo + 64) m &= (std::uint64_t{1} << (end - lo)) - 1;
  return m;
}

}  // namespace scape::kernels
