// Tests for the bitmask kernels (kernels/cpu/bitmask.cpp) and the compaction kernels
// (kernels/cpu/compact.cpp) against naive bit-by-bit and element-by-element references.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include <omp.h>

#include "kernels/cpu/kernels.hpp"

namespace sk = scape::kernels;

namespace {

// Sizes around word boundaries, plus sizes large enough for the parallel paths.
const std::vector<std::size_t> kSizes{0, 1, 7, 63, 64, 65, 1000, 4096 * 64 + 1, (std::size_t{1} << 20) + 5};

// Flags are arbitrary bytes, not just 0/1: any nonzero byte means "set". 0x80, 0x7f and 0x01
// are the edge cases of the byte-parallel packing.
std::vector<std::uint8_t> random_flags(std::size_t n, std::uint32_t seed) {
  static const std::uint8_t kNonzero[] = {0x01, 0x7f, 0x80, 0xff, 0x42};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<std::uint8_t> flags(n);
  for (auto& f : flags) {
    const int p = pick(rng);
    f = p < 5 ? std::uint8_t{0} : kNonzero[p - 5];
  }
  return flags;
}

std::vector<std::uint64_t> naive_pack(const std::vector<std::uint8_t>& flags) {
  std::vector<std::uint64_t> words(sk::words_for(flags.size()), 0);
  for (std::size_t j = 0; j < flags.size(); ++j) {
    if (flags[j] != 0) words[j / 64] |= std::uint64_t{1} << (j % 64);
  }
  return words;
}

std::vector<std::uint64_t> random_words(std::size_t count, double density, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution bit(density);
  std::vector<std::uint64_t> words(count, 0);
  for (auto& w : words) {
    for (unsigned b = 0; b < 64; ++b) w |= std::uint64_t{bit(rng)} << b;
  }
  return words;
}

std::size_t naive_popcount(const std::vector<std::uint64_t>& words) {
  std::size_t count = 0;
  for (const std::uint64_t w : words) {
    for (unsigned b = 0; b < 64; ++b) count += (w >> b) & 1u;
  }
  return count;
}

std::vector<std::uint32_t> naive_indices(const std::vector<std::uint64_t>& words, std::uint32_t base) {
  std::vector<std::uint32_t> idx;
  for (std::size_t j = 0; j < 64 * words.size(); ++j) {
    if ((words[j / 64] >> (j % 64)) & 1u) idx.push_back(base + static_cast<std::uint32_t>(j));
  }
  return idx;
}

// Sorted distinct indices into [0, n) at roughly the given density.
std::vector<std::uint32_t> random_indices(std::size_t n, double density, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution keep(density);
  std::vector<std::uint32_t> idx;
  for (std::size_t j = 0; j < n; ++j) {
    if (keep(rng)) idx.push_back(static_cast<std::uint32_t>(j));
  }
  return idx;
}

std::vector<float> iota_floats(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t j = 0; j < n; ++j) x[j] = static_cast<float>(j) + 0.5f;
  return x;
}

template <typename Fn>
void with_threads(int threads, Fn fn) {
  const int previous = omp_get_max_threads();
  omp_set_num_threads(threads);
  fn();
  omp_set_num_threads(previous);
}

}  // namespace

TEST_CASE("pack_bits matches a naive packing and unpack_bits inverts it") {
  std::uint32_t seed = 1;
  for (const std::size_t n : kSizes) {
    CAPTURE(n);
    const std::vector<std::uint8_t> flags = random_flags(n, seed++);
    std::vector<std::uint64_t> words(sk::words_for(n), ~std::uint64_t{0});
    sk::pack_bits(flags, words);
    CHECK(words == naive_pack(flags));

    std::vector<std::uint8_t> unpacked(n, 0x55);
    sk::unpack_bits(words, unpacked);
    std::size_t mismatches = 0;
    for (std::size_t j = 0; j < n; ++j) mismatches += unpacked[j] != (flags[j] != 0 ? 1 : 0);
    CHECK(mismatches == 0);
  }
}

TEST_CASE("unpack_bits ignores bits past the flag count") {
  const std::vector<std::uint64_t> words{~std::uint64_t{0}, 0b1010};
  std::vector<std::uint8_t> flags(68);
  sk::unpack_bits(words, flags);
  CHECK(std::all_of(flags.begin(), flags.begin() + 64, [](std::uint8_t f) { return f == 1; }));
  CHECK(std::vector<std::uint8_t>(flags.begin() + 64, flags.end()) == std::vector<std::uint8_t>{0, 1, 0, 1});
}

TEST_CASE("pack_bits and unpack_bits check the word count") {
  std::vector<std::uint8_t> flags(65);
  std::vector<std::uint64_t> one(1);
  std::vector<std::uint64_t> three(3);
  CHECK_THROWS_AS(sk::pack_bits(flags, one), std::invalid_argument);
  CHECK_THROWS_AS(sk::pack_bits(flags, three), std::invalid_argument);
  CHECK_THROWS_AS(sk::unpack_bits(one, flags), std::invalid_argument);
}

TEST_CASE("popcount, popcount_and and popcount_or match naive counts") {
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{5000}, std::size_t{1} << 16}) {
    CAPTURE(count);
    const auto a = random_words(count, 0.3, 5);
    const auto b = random_words(count, 0.6, 6);
    std::vector<std::uint64_t> both(count);
    std::vector<std::uint64_t> either(count);
    for (std::size_t w = 0; w < count; ++w) {
      both[w] = a[w] & b[w];
      either[w] = a[w] | b[w];
    }
    CHECK(sk::popcount(a) == naive_popcount(a));
    CHECK(sk::popcount_and(a, b) == naive_popcount(both));
    CHECK(sk::popcount_or(a, b) == naive_popcount(either));
  }
  const std::vector<std::uint64_t> a(3);
  const std::vector<std::uint64_t> b(4);
  CHECK_THROWS_AS(sk::popcount_and(a, b), std::invalid_argument);
  CHECK_THROWS_AS(sk::popcount_or(a, b), std::invalid_argument);
}

TEST_CASE("bits_to_indices lists set bits ascending with the base offset") {
  for (const int threads : {1, 2, 3}) {
    with_threads(threads, [&] {
      for (const std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{5000}, std::size_t{1} << 16}) {
        for (const std::uint32_t base : {0u, 1000u}) {
          CAPTURE(threads);
          CAPTURE(count);
          CAPTURE(base);
          const auto words = random_words(count, 0.05, static_cast<std::uint32_t>(count) + base);
          const auto expected = naive_indices(words, base);
          std::vector<std::uint32_t> out(expected.size() + 2, 7u);
          CHECK(sk::bits_to_indices(words, base, out) == expected.size());
          out.resize(expected.size());
          CHECK(out == expected);
        }
      }
    });
  }
}

TEST_CASE("bits_to_indices rejects a short output and an overflowing base") {
  for (const std::size_t count : {std::size_t{2}, std::size_t{5000}}) {
    const auto words = random_words(count, 0.5, 9);
    std::vector<std::uint32_t> out(naive_popcount(words) - 1);
    CHECK_THROWS_AS(sk::bits_to_indices(words, 0, out), std::invalid_argument);
  }
  std::vector<std::uint64_t> high_bit{0, std::uint64_t{1} << 63};
  std::vector<std::uint32_t> out(1);
  const std::uint32_t max = std::numeric_limits<std::uint32_t>::max();
  CHECK_THROWS_AS(sk::bits_to_indices(high_bit, max - 126, out), std::invalid_argument);
  CHECK(sk::bits_to_indices(high_bit, max - 127, out) == 1);
  CHECK(out[0] == max);
}

TEST_CASE("indices_to_bits sets bits on top of the existing words") {
  for (const std::size_t n : {std::size_t{100}, std::size_t{1} << 22}) {
    CAPTURE(n);
    const std::uint32_t base = 64 * 3 + 5;
    const auto words_in = random_words(sk::words_for(n), 0.01, 17);
    const auto extra = random_words(sk::words_for(n), 0.05, 18);
    std::vector<std::uint32_t> idx = naive_indices(extra, base);
    std::shuffle(idx.begin(), idx.end(), std::mt19937(3));  // order must not matter

    std::vector<std::uint64_t> words = words_in;
    sk::indices_to_bits(idx, base, words);
    std::vector<std::uint64_t> expected(words_in.size());
    for (std::size_t w = 0; w < expected.size(); ++w) expected[w] = words_in[w] | extra[w];
    CHECK(words == expected);
  }
}

TEST_CASE("indices_to_bits rejects out-of-range indices without writing") {
  std::vector<std::uint64_t> words(2, 0);
  const std::vector<std::uint32_t> past_end{10, 10 + 128};
  const std::vector<std::uint32_t> below_base{9, 20};
  CHECK_THROWS_AS(sk::indices_to_bits(past_end, 10, words), std::invalid_argument);
  CHECK_THROWS_AS(sk::indices_to_bits(below_base, 10, words), std::invalid_argument);
  CHECK(words == std::vector<std::uint64_t>(2, 0));
  const std::vector<std::uint32_t> last_bit{10 + 127};
  sk::indices_to_bits(last_bit, 10, words);
  CHECK(words[1] == std::uint64_t{1} << 63);
}

TEST_CASE("compact gathers, expand scatters back, zero_at clears") {
  for (const std::size_t n : {std::size_t{10}, std::size_t{1000}, std::size_t{1} << 22}) {
    CAPTURE(n);
    const std::vector<float> dense = iota_floats(n);
    const std::vector<std::uint32_t> idx = random_indices(n, 0.1, static_cast<std::uint32_t>(n));

    std::vector<float> packed(idx.size(), -1.0f);
    sk::compact(dense, idx, packed);
    std::size_t gather_errors = 0;
    for (std::size_t k = 0; k < idx.size(); ++k) gather_errors += packed[k] != dense[idx[k]];
    CHECK(gather_errors == 0);

    // Expanding into a buffer of -1 restores exactly the masked entries and leaves the rest.
    std::vector<float> restored(n, -1.0f);
    sk::expand(packed, idx, restored);
    std::vector<float> expected(n, -1.0f);
    for (const std::uint32_t j : idx) expected[j] = dense[j];
    CHECK(restored == expected);

    std::vector<float> cleared = dense;
    sk::zero_at(cleared, idx);
    std::vector<float> expected_cleared = dense;
    for (const std::uint32_t j : idx) expected_cleared[j] = 0.0f;
    CHECK(cleared == expected_cleared);
  }
}

TEST_CASE("scatter_add adds each value at its index, one list after another") {
  std::vector<float> dst{1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  const std::vector<std::uint32_t> first{4, 0, 2};  // distinct, in any order
  const std::vector<float> first_values{0.5f, -1.0f, 0.25f};
  sk::scatter_add(dst, first, first_values);
  CHECK(dst == std::vector<float>{0.0f, 2.0f, 3.25f, 4.0f, 5.5f});
  // A second list repeats index 2: its addition comes after the first one's.
  const std::vector<std::uint32_t> second{2, 3};
  const std::vector<float> second_values{-3.25f, 1.0f};
  sk::scatter_add(dst, second, second_values);
  CHECK(dst == std::vector<float>{0.0f, 2.0f, 0.0f, 5.0f, 5.5f});
  // The order of the lists decides the rounding: (1 + 2^-24) + 2^-24 rounds twice to 1, while
  // 1 + (2^-24 + 2^-24) is 1 + 2^-23.
  const float half_ulp = std::ldexp(1.0f, -24);
  std::vector<float> one{1.0f};
  const std::vector<std::uint32_t> at0{0};
  const std::vector<float> tiny{half_ulp};
  sk::scatter_add(one, at0, tiny);
  sk::scatter_add(one, at0, tiny);
  CHECK(one[0] == 1.0f);
  // Large lists (the parallel path) add exactly once per index.
  const std::size_t n = std::size_t{1} << 20;
  const std::vector<std::uint32_t> idx = random_indices(n, 0.1, 7);
  std::vector<float> dense = iota_floats(n);
  const std::vector<float> values(idx.size(), 0.5f);
  sk::scatter_add(dense, idx, values);
  std::vector<float> expected = iota_floats(n);
  for (const std::uint32_t j : idx) expected[j] += 0.5f;
  CHECK(dense == expected);
}

TEST_CASE("compaction kernels reject bad sizes and indices without writing") {
  const std::vector<float> dense = iota_floats(8);
  const std::vector<std::uint32_t> idx{1, 8};  // 8 is one past the end
  const std::vector<std::uint32_t> good{1, 7};
  std::vector<float> packed(2, -1.0f);
  CHECK_THROWS_AS(sk::compact(dense, idx, packed), std::invalid_argument);
  CHECK(packed == std::vector<float>(2, -1.0f));
  std::vector<float> short_packed(1);
  CHECK_THROWS_AS(sk::compact(dense, good, short_packed), std::invalid_argument);

  std::vector<float> target(8, 3.0f);
  CHECK_THROWS_AS(sk::expand(packed, idx, target), std::invalid_argument);
  CHECK_THROWS_AS(sk::expand(short_packed, good, target), std::invalid_argument);
  CHECK_THROWS_AS(sk::zero_at(target, idx), std::invalid_argument);
  CHECK_THROWS_AS(sk::scatter_add(target, idx, packed), std::invalid_argument);
  CHECK_THROWS_AS(sk::scatter_add(target, good, short_packed), std::invalid_argument);
  CHECK(target == std::vector<float>(8, 3.0f));
}

TEST_CASE("mask_range_counts: per range, the set bits of the mask, of mask & previous and of mask | previous") {
  // Hand case over 130 bits: mask bits {0, 63, 64, 100, 129}, previous bits {63, 100, 101}.
  std::vector<std::uint64_t> mask(3, 0), previous(3, 0);
  for (const int j : {0, 63, 64, 100, 129}) mask[j / 64] |= std::uint64_t{1} << (j % 64);
  for (const int j : {63, 100, 101}) previous[j / 64] |= std::uint64_t{1} << (j % 64);
  // [0, 130), [63, 65) straddling a word edge, [1, 63) with no bit, [100, 101), the empty [5, 5).
  const std::vector<std::uint64_t> ranges = {0, 130, 63, 65, 1, 63, 100, 101, 5, 5};
  std::vector<std::uint64_t> counts(15, 99);
  sk::mask_range_counts(mask, previous, ranges, counts);
  CHECK(counts == std::vector<std::uint64_t>{5, 2, 6, 2, 1, 2, 0, 0, 0, 1, 1, 1, 0, 0, 0});
  sk::mask_range_counts(mask, {}, ranges, counts);
  CHECK(counts == std::vector<std::uint64_t>{5, 0, 0, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0});
  // Against popcounts of bit-by-bit loops on random masks and ranges.
  std::mt19937_64 rng(17);
  const std::size_t n = 5000, words = sk::words_for(n);
  for (auto& w : mask = std::vector<std::uint64_t>(words)) w = rng() & rng();
  for (auto& w : previous = std::vector<std::uint64_t>(words)) w = rng();
  std::vector<std::uint64_t> random_ranges;
  for (int r = 0; r < 40; ++r) {
    std::uint64_t a = rng() % (n + 1), b = rng() % (n + 1);
    random_ranges.push_back(std::min(a, b));
    random_ranges.push_back(std::max(a, b));
  }
  counts.assign(3 * 40, 0);
  sk::mask_range_counts(mask, previous, random_ranges, counts);
  const auto bit = [](const std::vector<std::uint64_t>& v, std::uint64_t j) { return (v[j / 64] >> (j % 64)) & 1u; };
  for (std::size_t r = 0; r < 40; ++r) {
    std::uint64_t set = 0, both = 0, either = 0;
    for (std::uint64_t j = random_ranges[2 * r]; j < random_ranges[2 * r + 1]; ++j) {
      set += bit(mask, j);
      both += bit(mask, j) & bit(previous, j);
      either += bit(mask, j) | bit(previous, j);
    }
    CAPTURE(r);
    CHECK(counts[3 * r] == set);
    CHECK(counts[3 * r + 1] == both);
    CHECK(counts[3 * r + 2] == either);
  }
  // A range past the mask's bits, a reversed range and an odd ranges array are refused.
  std::vector<std::uint64_t> one(3);
  CHECK_THROWS_AS(sk::mask_range_counts(mask, {}, std::vector<std::uint64_t>{0, 64 * words + 1}, one),
                  std::invalid_argument);
  CHECK_THROWS_AS(sk::mask_range_counts(mask, {}, std::vector<std::uint64_t>{9, 3}, one), std::invalid_argument);
  CHECK_THROWS_AS(sk::mask_range_counts(mask, {}, std::vector<std::uint64_t>{1, 2, 3}, one), std::invalid_argument);
}
