// bfloat16 rounding for wire payloads: payloads sent at bf16 are really rounded, so the
// effect of the wire precision on quality is part of what a study measures.
#pragma once

#include <bit>
#include <cstdint>

namespace scape::kernels {

// Round-to-nearest-even to bf16, returned as the 16 stored bits. NaN stays a quiet NaN.
inline std::uint16_t float_to_bf16_bits(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  }
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

inline float bf16_bits_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// The float nearest to x that bf16 can represent (ties to even).
inline float round_to_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

}  // namespace scape::kernels
