// Bitmasks as 64-bit words (bit j of word j/64 is element j): pack/unpack from byte flags,
// popcount, conversion to and from index lists, and set algebra for mask Jaccard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace scape::kernels {

constexpr std::size_t words_for(std::size_t n) { return (n + 63) / 64; }

// words[j/64] bit j%64 = (flags[j] != 0); bits at or past flags.size() are cleared.
// words.size() must equal words_for(flags.size()).
void pack_bits(std::span<const std::uint8_t> flags, std::span<std::uint64_t> words);
// flags[j] = bit j (0 or 1) for j < flags.size().
void unpack_bits(std::span<const std::uint64_t> words, std::span<std::uint8_t> flags);

std::size_t popcount(std::span<const std::uint64_t> words);
std::size_t popcount_and(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b);
std::size_t popcount_or(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b);

// Writes base + j for every set bit j, ascending, into out; returns how many. out must hold
// popcount(words) entries.
std::size_t bits_to_indices(std::span<const std::uint64_t> words, std::uint32_t base,
                            std::span<std::uint32_t> out);
// Sets bit (idx[k] - base) for every k; the words are not cleared first.
void indices_to_bits(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint64_t> words);

}  // namespace scape::kernels
