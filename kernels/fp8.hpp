// Rounding to fp8 e5m2 (1 sign, 5 exponent bits of bias 15, 2 mantissa bits; subnormals down
// to 2^-16; largest finite 57344), written once for the CPU and the GPU so both round alike:
// SCAPE's fp8 payload (docs/algorithms.md, "FP8 payload"; kernel quantize_e5m2).
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define SCAPE_FP8_HOST_DEVICE __host__ __device__
#else
#define SCAPE_FP8_HOST_DEVICE
#endif

namespace scape::kernels {

constexpr float kE5m2Max = 57344.0f;

// The e5m2 value nearest to x (ties to even), as a float. At or above 2^-14 the float keeps 2
// of its 23 mantissa bits, rounded on the bit pattern; below, the subnormal grid is multiples of
// 2^-16 (x * 2^16 is exact, rint rounds to even). A magnitude past 57344 rounds to 2^16 or above:
// callers keep their values in range.
SCAPE_FP8_HOST_DEVICE inline float round_to_e5m2(float x) {
  const float a = fabsf(x);
  float r;
  if (!(a >= 0x1p-14f)) {
    r = rintf(a * 65536.0f) * 0x1p-16f;
  } else {
#ifdef __CUDA_ARCH__
    std::uint32_t bits = __float_as_uint(a);
#else
    std::uint32_t bits;
    std::memcpy(&bits, &a, sizeof bits);
#endif
    bits += 0x000FFFFFu + ((bits >> 21) & 1u);
    bits &= 0xFFE00000u;
#ifdef __CUDA_ARCH__
    r = __uint_as_float(bits);
#else
    std::memcpy(&r, &bits, sizeof r);
#endif
  }
  return copysignf(r, x);
}

}  // namespace scape::kernels
