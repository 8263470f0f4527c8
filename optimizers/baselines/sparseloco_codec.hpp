// SparseLoCo's message (docs/algorithms.md, "SparseLoCo"): which entries of each tensor a worker
// sends (the top-k of every chunk), how their values are quantized (Templar's statistical
// quantizer, one codebook per tensor) and how indices and values are laid out in bytes. The
// optimizer, the byte ledger's closed form and the tests share these definitions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/layout.hpp"
#include "core/optimizer_config.hpp"
#include "optimizers/baselines/outer_loop_config.hpp"

namespace scape {

// The entries of one worker's message, tensor by tensor, and the message's bytes.
struct SparselocoPlan {
  std::size_t chunk = 0;           // C
  std::size_t k = 0;               // top-k per chunk: k_for(1 - sparsity, C); a short chunk keeps min(k, length)
  std::vector<std::size_t> entries;  // K_t per tensor, in layout order
  std::size_t total = 0;             // K = sum of K_t
  std::size_t quantized_tensors = 0;  // tensors with K_t > 0 (each sends a codebook when quantizing)
  unsigned index_bits = 0;         // bitmap: an index within its chunk, bit_width(C - 1) bits
  std::size_t index_bytes = 0;     // bitmap: 8 ceil(K b / 64); elias_fano: 8 ef_words(N, K)
  std::size_t codebook_bytes = 0;  // quant_bits q > 0: 4 (2^q + 1) per tensor with entries
  std::size_t value_bytes = 0;     // q > 0: 8 ceil(K q / 64); q = 0: K at the wire width
  std::size_t message_bytes() const { return index_bytes + codebook_bytes + value_bytes; }
};
SparselocoPlan sparseloco_plan(const ParamLayout& layout, const CommonOptimizerConfig& config,
                               const SparselocoSwitches& sparseloco);

// Templar's statistical quantizer of one tensor's selected values v_0 .. v_{K-1} with B = 2^bits
// bins: shift = mean v (summed in double), c = f32(v - shift), sigma = sqrt(sum c^2 / (K - 1)) (in
// double), scale = f32(6 sigma / B) (1 when that is 0 or not finite, or K < 2), code =
// clamp(rint(f32(f32(c / scale) + B / 2)), 0, B - 1); the codebook holds each bin's mean c
// (summed in double, 0 for an empty bin). The value delivered is f32(codebook[code] + shift).
struct QuantizedValues {
  float shift = 0;
  std::vector<float> codebook;
  std::vector<std::uint8_t> codes;
  float value(std::size_t i) const { return codebook[codes[i]] + shift; }
};
QuantizedValues quantize_statistical(std::span<const float> values, int bits);

// Fixed-width bit packing, least significant bit first: value i at bits [i w, (i + 1) w) of the
// words (words_for(n w) of them, zeroed first). Each value must fit in w bits (w <= 32).
void pack_fixed_width(std::span<const std::uint32_t> values, unsigned width, std::span<std::uint64_t> words);
void unpack_fixed_width(std::span<const std::uint64_t> words, unsigned width, std::span<std::uint32_t> values);

}  // namespace scape
