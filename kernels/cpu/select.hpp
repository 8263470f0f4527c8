// Exact top-k selection by magnitude in O(N): radix/histogram select on the bit pattern of
// |x|, then one ordered pass that keeps ties at the lower index (docs/algorithms.md, "Masks").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace scape::kernels {

// Sets exactly k bits of `mask_words` (ceil(n/64) words, n = values.size(); bits at or past
// n are cleared): the k entries with the largest |values[j]|. Among equal magnitudes the lower
// index wins (a stable descending order). NaN ranks above +inf. k = 0 clears the mask;
// k > n throws std::invalid_argument naming k and n. OpenMP-parallel, deterministic.
void topk_abs_mask(std::span<const float> values, std::size_t k, std::span<std::uint64_t> mask_words);

// Same selection, written as ascending indices (relative to values.data()) into
// out[0..k). out.size() must be >= k. Returns k.
std::size_t topk_abs_indices(std::span<const float> values, std::size_t k, std::span<std::uint32_t> out);

}  // namespace scape::kernels
