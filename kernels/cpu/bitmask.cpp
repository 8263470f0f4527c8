// Bitmask kernels over 64-bit words: byte-flag packing, popcounts, index-list conversions.
#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>

#include "kernels/bit_ranges.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/size_checks.hpp"

namespace scape::kernels {
namespace {

// The byte tricks below read 8 flags as one little-endian word (flag j in byte j).
static_assert(std::endian::native == std::endian::little, "bitmask SWAR packing assumes little endian");

// Below this many words a parallel region costs more than the loop it splits.
constexpr std::int64_t kParallelWords = 4096;

std::string size_text(std::size_t value) { return std::to_string(value); }

using checks::require_same_words;
using checks::require_words;

// Eight byte flags (loaded as one word) -> 8 bits, bit i = (byte i != 0). Adding 0x7f to the
// low 7 bits of a byte carries into its top bit exactly when they are nonzero; OR-ing the byte
// back covers a lone top bit. The multiply then gathers the eight top bits into the high byte
// (the partial products land on distinct bit positions, so nothing carries).
std::uint64_t pack_eight(std::uint64_t bytes) {
  constexpr std::uint64_t low7 = 0x7f7f7f7f7f7f7f7full;
  const std::uint64_t nonzero_high = (((bytes & low7) + low7) | bytes) & ~low7;
  return ((nonzero_high >> 7) * 0x0102040810204080ull) >> 56;
}

std::uint64_t pack_word(const std::uint8_t* flags, std::size_t len) {
  std::uint64_t word = 0;
  if (len == 64) {
    for (unsigned group = 0; group < 8; ++group) {
      std::uint64_t bytes = 0;
      std::memcpy(&bytes, flags + 8 * group, sizeof bytes);
      word |= pack_eight(bytes) << (8 * group);
    }
    return word;
  }
  for (std::size_t b = 0; b < len; ++b) word |= std::uint64_t{flags[b] != 0} << b;
  return word;
}

// spread_byte[b] holds bit i of b in byte i, so one lookup unpacks eight flags.
constexpr std::array<std::uint64_t, 256> make_spread_table() {
  std::array<std::uint64_t, 256> table{};
  for (unsigned b = 0; b < 256; ++b) {
    for (unsigned i = 0; i < 8; ++i) table[b] |= std::uint64_t{(b >> i) & 1u} << (8 * i);
  }
  return table;
}
constexpr std::array<std::uint64_t, 256> kSpreadByte = make_spread_table();

void unpack_word(std::uint64_t word, std::uint8_t* flags, std::size_t len) {
  if (len == 64) {
    for (unsigned group = 0; group < 8; ++group) {
      std::memcpy(flags + 8 * group, &kSpreadByte[(word >> (8 * group)) & 0xffu], sizeof(std::uint64_t));
    }
    return;
  }
  for (std::size_t b = 0; b < len; ++b) flags[b] = static_cast<std::uint8_t>((word >> b) & 1u);
}

std::uint32_t* write_word_indices(std::uint64_t word, std::uint32_t first, std::uint32_t* out) {
  while (word != 0) {
    *out++ = first + static_cast<std::uint32_t>(std::countr_zero(word));
    word &= word - 1;
  }
  return out;
}

// Ascending indices need each chunk's output offset: count its bits first, then prefix-sum.
std::size_t write_indices_parallel(std::span<const std::uint64_t> words, std::uint32_t base, std::uint32_t* out,
                                   std::size_t capacity) {
  const auto chunks = static_cast<std::int64_t>(std::max(1, omp_get_max_threads()));
  const std::size_t nw = words.size();
  auto first_word = [&](std::int64_t c) { return nw * static_cast<std::size_t>(c) / static_cast<std::size_t>(chunks); };
  std::vector<std::size_t> offset(static_cast<std::size_t>(chunks) + 1, 0);  // offset[c + 1]: bits in chunk c
#pragma omp parallel for schedule(static, 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::size_t count = 0;
    for (std::size_t w = first_word(c); w < first_word(c + 1); ++w) {
      count += static_cast<std::size_t>(std::popcount(words[w]));
    }
    offset[static_cast<std::size_t>(c) + 1] = count;
  }
  for (std::size_t c = 1; c < offset.size(); ++c) offset[c] += offset[c - 1];
  if (offset.back() > capacity) {
    throw std::invalid_argument("bits_to_indices: " + size_text(offset.back()) + " bits set, out holds " +
                                size_text(capacity));
  }
#pragma omp parallel for schedule(static, 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::uint32_t* dst = out + offset[static_cast<std::size_t>(c)];
    for (std::size_t w = first_word(c); w < first_word(c + 1); ++w)
      dst = write_word_indices(words[w], base + static_cast<std::uint32_t>(64 * w), dst);
  }
  return offset.back();
}

std::size_t write_indices_serial(std::span<const std::uint64_t> words, std::uint32_t base, std::uint32_t* out,
                                 std::size_t capacity) {
  std::size_t written = 0;
  for (std::size_t w = 0; w < words.size(); ++w) {
    const auto count = static_cast<std::size_t>(std::popcount(words[w]));
    if (written + count > capacity) {
      throw std::invalid_argument("bits_to_indices: more bits set than the " + size_text(capacity) +
                                  " entries out holds");
    }
    write_word_indices(words[w], base + static_cast<std::uint32_t>(64 * w), out + written);
    written += count;
  }
  return written;
}

// base + (highest set bit) must be a valid uint32 index.
void require_indices_fit(std::span<const std::uint64_t> words, std::uint32_t base) {
  const auto last = std::find_if(words.rbegin(), words.rend(), [](std::uint64_t w) { return w != 0; });
  if (last == words.rend()) return;
  const std::size_t word_index = static_cast<std::size_t>(words.rend() - last) - 1;
  const std::uint64_t highest = 64 * word_index + 63 - static_cast<std::uint64_t>(std::countl_zero(*last));
  if (base + highest > std::numeric_limits<std::uint32_t>::max()) {
    throw std::invalid_argument("bits_to_indices: base " + size_text(base) + " + bit " + size_text(highest) +
                                " overflows a uint32 index");
  }
}

template <typename Combine>
std::size_t popcount_combined(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b, Combine combine) {
  const auto nw = static_cast<std::int64_t>(a.size());
  std::size_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (nw > kParallelWords)
  for (std::int64_t w = 0; w < nw; ++w) {
    const auto i = static_cast<std::size_t>(w);
    total += static_cast<std::size_t>(std::popcount(combine(a[i], b[i])));
  }
  return total;
}

// f(w, first, len) for word w of a bitmask over n flags: flags [first, first + len) of it, len 64
// but in a partial last word. Words are independent, so large masks split them across threads.
template <class F>
void for_each_word(std::size_t n_words, std::size_t n, F f) {
  const auto nw = static_cast<std::int64_t>(n_words);
#pragma omp parallel for schedule(static) if (nw > kParallelWords)
  for (std::int64_t w = 0; w < nw; ++w) {
    const std::size_t first = 64 * static_cast<std::size_t>(w);
    f(static_cast<std::size_t>(w), first, std::min<std::size_t>(64, n - first));
  }
}

}  // namespace

void pack_bits(std::span<const std::uint8_t> flags, std::span<std::uint64_t> words) {
  require_words(words.size(), flags.size(), "pack_bits");
  for_each_word(words.size(), flags.size(), [&](std::size_t w, std::size_t first, std::size_t len) {
    words[w] = pack_word(flags.data() + first, len);
  });
}

void unpack_bits(std::span<const std::uint64_t> words, std::span<std::uint8_t> flags) {
  require_words(words.size(), flags.size(), "unpack_bits");
  for_each_word(words.size(), flags.size(), [&](std::size_t w, std::size_t first, std::size_t len) {
    unpack_word(words[w], flags.data() + first, len);
  });
}

std::size_t popcount(std::span<const std::uint64_t> words) {
  const auto nw = static_cast<std::int64_t>(words.size());
  std::size_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (nw > kParallelWords)
  for (std::int64_t w = 0; w < nw; ++w) {
    total += static_cast<std::size_t>(std::popcount(words[static_cast<std::size_t>(w)]));
  }
  return total;
}

std::size_t popcount_and(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b) {
  require_same_words(a.size(), b.size(), "popcount_and");
  return popcount_combined(a, b, [](std::uint64_t x, std::uint64_t y) { return x & y; });
}

std::size_t popcount_or(std::span<const std::uint64_t> a, std::span<const std::uint64_t> b) {
  require_same_words(a.size(), b.size(), "popcount_or");
  return popcount_combined(a, b, [](std::uint64_t x, std::uint64_t y) { return x | y; });
}

void mask_range_counts(std::span<const std::uint64_t> mask, std::span<const std::uint64_t> previous,
                       std::span<const std::uint64_t> ranges, std::span<std::uint64_t> counts) {
  checks::mask_range_counts_sizes(mask.size(), previous.size(), ranges.size(), counts.size(), ranges.data());
  const auto n_ranges = static_cast<std::int64_t>(ranges.size() / 2);
#pragma omp parallel for schedule(dynamic) if (n_ranges > 8)
  for (std::int64_t r = 0; r < n_ranges; ++r) {
    const std::uint64_t begin = ranges[2 * static_cast<std::size_t>(r)],
                        end = ranges[2 * static_cast<std::size_t>(r) + 1];
    std::uint64_t set = 0, both = 0, either = 0;
    for (std::uint64_t w = begin / 64; begin < end && w <= (end - 1) / 64; ++w) {
      const std::uint64_t keep = range_word_mask(w, begin, end), m = mask[w] & keep;
      set += static_cast<std::uint64_t>(std::popcount(m));
      if (previous.empty()) continue;
      const std::uint64_t p = previous[w] & keep;
      both += static_cast<std::uint64_t>(std::popcount(m & p));
      either += static_cast<std::uint64_t>(std::popcount(m | p));
    }
    counts[3 * static_cast<std::size_t>(r)] = set;
    counts[3 * static_cast<std::size_t>(r) + 1] = both;
    counts[3 * static_cast<std::size_t>(r) + 2] = either;
  }
}

std::size_t bits_to_indices(std::span<const std::uint64_t> words, std::uint32_t base, std::span<std::uint32_t> out) {
  require_indices_fit(words, base);
  if (words.size() > static_cast<std::size_t>(kParallelWords) && omp_get_max_threads() > 1) {
    return write_indices_parallel(words, base, out.data(), out.size());
  }
  return write_indices_serial(words, base, out.data(), out.size());
}

// Serial on purpose: neighbouring indices share words, and atomic ORs from two threads measured
// 2-5x slower than one thread's plain ORs (2^24 bits at 1-50% density).
void indices_to_bits(std::span<const std::uint32_t> idx, std::uint32_t base, std::span<std::uint64_t> words) {
  if (idx.empty()) return;
  // Validate before writing anything, so a bad list leaves the mask untouched.
  const auto [lowest, highest] = std::minmax_element(idx.begin(), idx.end());
  const std::uint64_t capacity = 64 * static_cast<std::uint64_t>(words.size());
  if (*lowest < base || *highest - base >= capacity) {
    throw std::invalid_argument("indices_to_bits: indices span [" + size_text(*lowest) + ", " + size_text(*highest) +
                                "], base " + size_text(base) + " with " + size_text(words.size()) +
                                " words covers [" + size_text(base) + ", " + size_text(base + capacity) + ")");
  }
  for (const std::uint32_t i : idx) words[(i - base) / 64] |= std::uint64_t{1} << ((i - base) % 64);
}

}  // namespace scape::kernels
