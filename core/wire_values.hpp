// One value of a byte-packed wire message at the configured wire width (fp32, or bf16 rounded
// to nearest even): shared by the optimizers that pack their own messages (top-k EF, DeMo).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/communicator.hpp"
#include "kernels/cpu/bf16.hpp"

namespace scape {

inline void write_wire_value(std::byte* p, float value, WireType wire) {
  if (wire == WireType::bf16) {
    const std::uint16_t bits = kernels::float_to_bf16_bits(value);
    std::memcpy(p, &bits, sizeof bits);
  } else {
    std::memcpy(p, &value, sizeof value);
  }
}

inline float read_wire_value(const std::byte* p, WireType wire) {
  if (wire == WireType::bf16) {
    std::uint16_t bits;
    std::memcpy(&bits, p, sizeof bits);
    return kernels::bf16_bits_to_float(bits);
  }
  float value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

}  // namespace scape
