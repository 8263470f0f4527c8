// Mask coding kernels (kernels/kernel_list.inc, "Elias-Fano coding" and the bit extraction the
// delta code uses). Serial on purpose: every output bit depends on the rank of its position
// among the set bits, and at 1% density these loops run at memory speed on one core.
#include <algorithm>
#include <bit>
#include <stdexcept>
#include <string>

#include "kernels/cpu/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

constexpr std::int64_t kParallelWords = 4096;

void set_bit(std::span<std::uint64_t> out, std::size_t bit) { out[bit / 64] |= std::uint64_t{1} << (bit % 64); }

bool get_bit(std::span<const std::uint64_t> in, std::size_t bit) { return ((in[bit / 64] >> (bit % 64)) & 1u) != 0; }

// The `width` (< 64) low bits of value at stream bits [offset, offset + width); out is zeroed.
void put_field(std::span<std::uint64_t> out, std::size_t offset, std::uint64_t value, unsigned width) {
  if (width == 0) return;
  value &= ~std::uint64_t{0} >> (64 - width);
  const std::size_t word = offset / 64;
  const unsigned shift = static_cast<unsigned>(offset % 64);
  out[word] |= value << shift;
  if (shift + width > 64) out[word + 1] |= value >> (64 - shift);
}

std::uint64_t get_field(std::span<const std::uint64_t> in, std::size_t offset, unsigned width) {
  if (width == 0) return 0;
  const std::size_t word = offset / 64;
  const unsigned shift = static_cast<unsigned>(offset % 64);
  std::uint64_t value = in[word] >> shift;
  if (shift + width > 64) value |= in[word + 1] << (64 - shift);
  return value & (~std::uint64_t{0} >> (64 - width));
}

// Calls visit(position, rank) for every set bit of words, ascending.
template <typename Visit>
void for_each_set_bit(std::span<const std::uint64_t> words, Visit visit) {
  std::size_t rank = 0;
  for (std::size_t w = 0; w < words.size(); ++w) {
    for (std::uint64_t word = words[w]; word != 0; word &= word - 1) {
      visit(64 * w + static_cast<std::size_t>(std::countr_zero(word)), rank++);
    }
  }
}

void require_code_of(std::span<const std::uint64_t> words, std::size_t n_bits, std::size_t k) {
  const std::size_t set = popcount(words);
  if (set != k) {
    throw std::invalid_argument("ef_encode: the mask has " + std::to_string(set) +
                                " bits set, k = " + std::to_string(k));
  }
  if (n_bits % 64 != 0 && !words.empty() && (words.back() >> (n_bits % 64)) != 0) {
    throw std::invalid_argument("ef_encode: bits are set at or past n = " + std::to_string(n_bits));
  }
}

}  // namespace

void and_not_bits(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b, std::span<std::uint64_t> out) {
  checks::and_not_bits_sizes(a.size(), b.size(), out.size());
  const auto nw = static_cast<std::int64_t>(a.size());
#pragma omp parallel for schedule(static) if (nw > kParallelWords)
  for (std::int64_t w = 0; w < nw; ++w) {
    const auto i = static_cast<std::size_t>(w);
    out[i] = a[i] & ~b[i];
  }
}

void or_bits(std::span<const std::uint64_t> src, std::span<std::uint64_t> dst) {
  checks::or_bits_sizes(src.size(), dst.size());
  for (std::size_t i = 0; i < src.size(); ++i) dst[i] |= src[i];
}

void extract_bits(std::span<const std::uint64_t> source, std::span<const std::uint64_t> positions,
                  std::span<std::uint64_t> out) {
  checks::packed_bits_sizes(source.size(), positions.size(), out.size(), popcount(positions), "extract_bits");
  std::fill(out.begin(), out.end(), 0);
  for_each_set_bit(positions, [&](std::size_t p, std::size_t r) {
    if (get_bit(source, p)) set_bit(out, r);
  });
}

void deposit_bits(std::span<const std::uint64_t> packed, std::span<const std::uint64_t> positions,
                  std::span<std::uint64_t> out) {
  checks::packed_bits_sizes(out.size(), positions.size(), packed.size(), popcount(positions), "deposit_bits");
  for_each_set_bit(positions, [&](std::size_t p, std::size_t r) {
    if (get_bit(packed, r)) set_bit(out, p);
  });
}

void ef_encode(std::span<const std::uint64_t> words, std::size_t n_bits, std::size_t k, std::span<std::uint64_t> out) {
  checks::ef_sizes(words.size(), n_bits, k, out.size(), "ef_encode");
  require_code_of(words, n_bits, k);
  std::fill(out.begin(), out.end(), 0);
  const unsigned low = ef_low_bits(n_bits, k);
  const std::size_t high_start = k * low;
  for_each_set_bit(words, [&](std::size_t p, std::size_t i) {
    put_field(out, i * low, p, low);
    set_bit(out, high_start + (p >> low) + i);
  });
}

namespace {

// Calls visit(i, p_i) for the k positions coded in `code`, ascending. Throws, before visiting
// the offending entry, on a position at or past n_bits or when fewer than k are coded.
template <typename Visit>
void for_each_coded_position(std::span<const std::uint64_t> code, std::size_t n_bits, std::size_t k, const char* what,
                             Visit visit) {
  if (k == 0) return;
  const unsigned low = ef_low_bits(n_bits, k);
  const std::size_t high_start = k * low;
  const std::size_t high_end = ef_bits(n_bits, k);
  std::size_t i = 0;
  for (std::size_t w = high_start / 64; w < code.size() && i < k; ++w) {
    std::uint64_t word = code[w];
    if (w == high_start / 64) word &= ~std::uint64_t{0} << (high_start % 64);
    for (; word != 0 && i < k; word &= word - 1) {
      const std::size_t bit = 64 * w + static_cast<std::size_t>(std::countr_zero(word));
      if (bit >= high_end) break;
      const std::size_t p = ((bit - high_start - i) << low) | get_field(code, i * low, low);
      if (p >= n_bits) {
        throw std::invalid_argument(std::string(what) + ": position " + std::to_string(p) + " of entry " +
                                    std::to_string(i) + " is at or past n = " + std::to_string(n_bits));
      }
      visit(i, p);
      ++i;
    }
  }
  if (i < k) {
    throw std::invalid_argument(std::string(what) + ": the code holds " + std::to_string(i) +
                                " positions, k = " + std::to_string(k));
  }
}

}  // namespace

void ef_decode(std::span<const std::uint64_t> code, std::size_t n_bits, std::size_t k, std::span<std::uint64_t> words) {
  checks::ef_sizes(words.size(), n_bits, k, code.size(), "ef_decode");
  for_each_coded_position(code, n_bits, k, "ef_decode", [&](std::size_t, std::size_t p) { set_bit(words, p); });
}

void ef_decode_indices(std::span<const std::uint64_t> code, std::size_t n_bits, std::size_t k,
                       std::span<std::uint32_t> indices) {
  checks::ef_indices_sizes(indices.size(), n_bits, k, code.size(), "ef_decode_indices");
  for_each_coded_position(code, n_bits, k, "ef_decode_indices",
                          [&](std::size_t i, std::size_t p) { indices[i] = static_cast<std::uint32_t>(p); });
}

}  // namespace scape::kernels
