// The coded sparse message of raw-gradient top-k (mask_encoding other than bitmap) and DeMo: the
// Elias-Fano code of k ascending positions among N, then the k values in that order at the wire
// width (docs/algorithms.md, "Raw-gradient top-k" and "DeMo"). One writer and one reader, so
// the two methods' bytes on the wire are the same format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/communicator.hpp"
#include "kernels/backend.hpp"

namespace scape {

// Writes `code` (the positions' Elias-Fano words, host-readable) and then `values` at `wire`
// into `out`, which holds code.size_bytes() + values.size() * wire_bytes(wire) bytes.
void pack_coded_message(std::span<const std::uint64_t> code, std::span<const float> values, WireType wire,
                        std::byte* out);

// Reads the messages of `workers` workers from `gathered` (equal messages of `entries` values among `n`
// positions, in rank order): worker r's positions into idx[r * entries, ...) and its values into
// values[r * entries, ...). `code` is the scratch the decoder reads, sized to one message's code.
void unpack_coded_messages(kernels::KernelBackend& k, std::span<const std::byte> gathered, std::size_t workers,
                           std::size_t n, std::size_t entries, WireType wire, kernels::Buffer<std::uint64_t>& code,
                           std::span<std::uint32_t> idx, std::span<float> values);

}  // namespace scape
