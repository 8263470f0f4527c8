// The coded sparse message's writer and reader (see coded_message.hpp).
#include "optimizers/baselines/coded_message.hpp"

#include <cstring>

#include "core/wire_values.hpp"

namespace scape {

void pack_coded_message(std::span<const std::uint64_t> code, std::span<const float> values, WireType wire,
                        std::byte* out) {
  std::memcpy(out, code.data(), code.size_bytes());
  const std::size_t value_bytes = wire_bytes(wire);
  for (std::size_t i = 0; i < values.size(); ++i) {
    write_wire_value(out + code.size_bytes() + i * value_bytes, values[i], wire);
  }
}

void unpack_coded_messages(kernels::KernelBackend& k, std::span<const std::byte> gathered, std::size_t workers,
                           std::size_t n, std::size_t entries, WireType wire, kernels::Buffer<std::uint64_t>& code,
                           std::span<std::uint32_t> idx, std::span<float> values) {
  const std::size_t code_bytes = code.bytes();
  const std::size_t value_bytes = wire_bytes(wire);
  const std::size_t message = code_bytes + entries * value_bytes;
  for (std::size_t r = 0; r < workers; ++r) {
    const std::byte* from = gathered.data() + r * message;
    std::memcpy(code.data(), from, code_bytes);
    k.ef_decode_indices(code.span(), n, entries, idx.subspan(r * entries, entries));
    for (std::size_t i = 0; i < entries; ++i) {
      values[r * entries + i] = read_wire_value(from + code_bytes + i * value_bytes, wire);
    }
  }
}

}  // namespace scape
