// One 64-element word of 1-bit Adam's sign compression, written once for both devices (the
// CPU kernels in kernels/cpu/sign_ops.cpp and the CUDA ones in kernels/cuda/sign_ops.cu), so
// the two compute the same expressions in the same order.
#pragma once

#include <cstddef>
#include <cstdint>

#ifdef __CUDACC__
#define SCAPE_SIGN_HOST_DEVICE __host__ __device__
#else
#define SCAPE_SIGN_HOST_DEVICE
#endif

namespace scape::kernels::sign {

// Elements [lo, hi) of x (hi - lo <= 64): returns their sign bits (bit j - lo set when
// x[j] < 0) and leaves x[j] - C(x)[j] in x, C(x)[j] = -+scales[j / chunk].
SCAPE_SIGN_HOST_DEVICE inline std::uint64_t compress_word(float* x, std::size_t lo, std::size_t hi, std::size_t chunk,
                                                          const float* scales) {
  // The chunk index advances at chunk boundaries instead of a division per element.
  std::size_t c = lo / chunk;
  std::size_t next = (c + 1) * chunk;
  std::uint64_t bits = 0;
  for (std::size_t j = lo; j < hi; ++j) {
    if (j == next) {
      ++c;
      next += chunk;
    }
    const float s = scales[c];
    const bool negative = x[j] < 0.0f;
    bits |= static_cast<std::uint64_t>(negative) << (j - lo);
    x[j] = x[j] - (negative ? -s : s);
  }
  return bits;
}

// acc[j] += C[j] for j in [lo, hi), the decompressed values of `bits`.
SCAPE_SIGN_HOST_DEVICE inline void expand_word(std::uint64_t bits, std::size_t lo, std::size_t hi, std::size_t chunk,
                                               const float* scales, float* acc) {
  std::size_t c = lo / chunk;
  std::size_t next = (c + 1) * chunk;
  for (std::size_t j = lo; j < hi; ++j) {
    if (j == next) {
      ++c;
      next += chunk;
    }
    const float s = scales[c];
    acc[j] = acc[j] + (((bits >> (j - lo)) & 1u) != 0 ? -s : s);
  }
}

}  // namespace scape::kernels::sign

#undef SCAPE_SIGN_HOST_DEVICE
