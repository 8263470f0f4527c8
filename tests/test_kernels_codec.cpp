// Tests for the mask coding kernels (kernels/cpu/codec.cpp): Elias-Fano sizes against their
// closed form and a hand-coded stream, round trips on empty, full, single, last-position,
// adversarial and random masks at sizes 0 to 2^26 (every boundary of the low-bit width), the
// bit extraction and deposit of the delta code against a naive reference, and the checks.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/kernels.hpp"

namespace sk = scape::kernels;

namespace {

using Words = std::vector<std::uint64_t>;

Words mask_of(std::size_t n, const std::vector<std::size_t>& positions) {
  Words words(sk::words_for(n));
  for (const std::size_t p : positions) words[p / 64] |= std::uint64_t{1} << (p % 64);
  return words;
}

// About density * n uniform positions (repeats merge), cheap at 2^26 under the sanitizers.
Words random_mask(std::size_t n, double density, std::uint32_t seed) {
  Words words(sk::words_for(n));
  if (n == 0) return words;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::size_t> position(0, n - 1);
  const auto draws = static_cast<std::size_t>(density * static_cast<double>(n));
  for (std::size_t i = 0; i < draws; ++i) {
    const std::size_t p = position(rng);
    words[p / 64] |= std::uint64_t{1} << (p % 64);
  }
  return words;
}

// Encodes, checks the size against the closed form, decodes into a dirty-free mask and compares.
void check_round_trip(const Words& mask, std::size_t n, const std::string& what) {
  CAPTURE(what);
  const std::size_t k = sk::popcount(mask);
  Words code(sk::ef_words(n, k), ~std::uint64_t{0});  // encode overwrites every word
  sk::ef_encode(mask, n, k, code);
  Words decoded(mask.size());
  sk::ef_decode(code, n, k, decoded);
  CHECK(decoded == mask);
  // The same positions as an ascending index list, against a naive walk over the mask.
  std::vector<std::uint32_t> want;
  for (std::size_t p = 0; p < n; ++p) {
    if ((mask[p / 64] >> (p % 64)) & 1u) want.push_back(static_cast<std::uint32_t>(p));
  }
  std::vector<std::uint32_t> indices(k, 0xdeadbeefu);
  sk::ef_decode_indices(code, n, k, indices);
  CHECK(indices == want);
  // Padding bits past ef_bits stay clear (the message is a function of the mask alone).
  const std::size_t bits = sk::ef_bits(n, k);
  if (bits % 64 != 0) CHECK((code.back() >> (bits % 64)) == 0);
}

}  // namespace

TEST_CASE("Elias-Fano sizes: the low-bit width and the bit count follow the closed form") {
  CHECK(sk::ef_low_bits(128, 3) == 5);  // 3 * 32 = 96 <= 128 < 192
  CHECK(sk::ef_bits(128, 3) == 3 * 5 + 3 + (127 >> 5));
  CHECK(sk::ef_low_bits(100, 1) == 6);
  CHECK(sk::ef_bits(100, 1) == 6 + 1 + 1);
  CHECK(sk::ef_low_bits(100, 100) == 0);
  CHECK(sk::ef_bits(100, 100) == 100 + 99);
  CHECK(sk::ef_bits(100, 0) == 0);
  CHECK(sk::ef_words(0, 0) == 0);
  // k (2 + L) + 1 bounds the size, with L = floor(log2(n / k)); at 99% sparsity L = 6.
  for (std::size_t n : {std::size_t{1000}, std::size_t{1} << 20, std::size_t{12345677}}) {
    for (std::size_t k : {std::size_t{1}, n / 1000, n / 100, n / 10, n / 2, n}) {
      const unsigned low = sk::ef_low_bits(n, k);
      CHECK((k << low) <= n);
      CHECK(n < (k << (low + 1)));
      CHECK(sk::ef_bits(n, k) <= k * (3 + low));
    }
  }
  CHECK(sk::ef_low_bits(1'000'000, 10'000) == 6);
}

TEST_CASE("Elias-Fano encodes a hand-worked mask bit for bit") {
  // n = 16, positions {1, 5, 6, 15}: L = 2, low parts 1, 1, 2, 3 at bits 0..7 (0xe5); high
  // parts 0, 1, 1, 3 set bits 8 + h + i = 8, 10, 11, 14; 8 + 4 + 3 = 15 bits in all.
  const Words mask = mask_of(16, {1, 5, 6, 15});
  REQUIRE(sk::ef_bits(16, 4) == 15);
  Words code(1);
  sk::ef_encode(mask, 16, 4, code);
  CHECK(code[0] == 0x4de5u);
  Words decoded(1);
  sk::ef_decode(code, 16, 4, decoded);
  CHECK(decoded == mask);
  std::vector<std::uint32_t> indices(4);
  sk::ef_decode_indices(code, 16, 4, indices);
  CHECK(indices == std::vector<std::uint32_t>{1, 5, 6, 15});
}

TEST_CASE("Elias-Fano round trips empty, full, single, last-position and adversarial masks") {
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{63}, std::size_t{64}, std::size_t{65},
        std::size_t{127}, std::size_t{128}, std::size_t{1000}, std::size_t{4097}}) {
    const std::string at = " n=" + std::to_string(n);
    check_round_trip(Words(sk::words_for(n)), n, "empty" + at);
    if (n == 0) continue;
    std::vector<std::size_t> all(n);
    for (std::size_t p = 0; p < n; ++p) all[p] = p;
    check_round_trip(mask_of(n, all), n, "full" + at);
    check_round_trip(mask_of(n, {0}), n, "first" + at);
    check_round_trip(mask_of(n, {n - 1}), n, "last" + at);
    check_round_trip(mask_of(n, {0, n - 1}), n, "first and last" + at);
    // Clustered at the end (high parts all maximal), every other, and bursts of 64.
    std::vector<std::size_t> tail, alternate, bursts;
    for (std::size_t p = n - std::min<std::size_t>(n, 37); p < n; ++p) tail.push_back(p);
    for (std::size_t p = 0; p < n; p += 2) alternate.push_back(p);
    for (std::size_t p = 0; p < n; ++p) {
      if ((p / 64) % 3 == 1) bursts.push_back(p);
    }
    check_round_trip(mask_of(n, tail), n, "tail" + at);
    check_round_trip(mask_of(n, alternate), n, "alternate" + at);
    check_round_trip(mask_of(n, bursts), n, "bursts" + at);
  }
}

TEST_CASE("Elias-Fano round trips at every boundary of its low-bit width") {
  // For each k, the sizes n = k 2^L - 1, k 2^L, k 2^L + 1 where L steps; positions spaced
  // evenly (the high parts then use every bucket) and packed at the top (the largest values of
  // the low parts), and a mask whose gaps are exactly 2^L.
  std::uint32_t seed = 10;
  for (const std::size_t k : {std::size_t{1}, std::size_t{3}, std::size_t{64}, std::size_t{1000}}) {
    for (unsigned low = 0; low <= 16; ++low) {
      const std::size_t edge = k << low;
      for (const std::size_t n : {edge - 1, edge, edge + 1}) {
        if (n < k) continue;
        const std::string what = "k=" + std::to_string(k) + " n=" + std::to_string(n);
        CHECK(sk::ef_low_bits(n, k) == (n >= 2 * edge ? low + 1 : (n >= edge ? low : low - 1)));
        std::vector<std::size_t> even, top;
        for (std::size_t i = 0; i < k; ++i) {
          even.push_back(i * n / k);
          top.push_back(n - k + i);
        }
        check_round_trip(mask_of(n, even), n, "even " + what);
        check_round_trip(mask_of(n, top), n, "top " + what);
        Words random = random_mask(n, static_cast<double>(k) / static_cast<double>(n), ++seed);
        check_round_trip(random, n, "random " + what);
      }
    }
  }
}

TEST_CASE("Elias-Fano round trips random masks up to 2^26 coordinates") {
  std::uint32_t seed = 100;
  for (const std::size_t n : {std::size_t{70'001}, std::size_t{1} << 20, std::size_t{1} << 26}) {
    for (const double density : {0.001, 0.01, 0.1, 0.5}) {
      if (n == (std::size_t{1} << 26) && density > 0.01) continue;  // the big size at SCAPE's densities
      check_round_trip(random_mask(n, density, ++seed), n,
                       "n=" + std::to_string(n) + " rho=" + std::to_string(density));
    }
  }
}

TEST_CASE("Elias-Fano checks its arguments and its input") {
  const Words mask = mask_of(128, {3, 70});
  Words code(sk::ef_words(128, 2)), code3(sk::ef_words(128, 3)), longer(code.size() + 1);
  CHECK_THROWS_WITH_AS(sk::ef_encode(mask, 128, 3, code3), "ef_encode: the mask has 2 bits set, k = 3",
                       std::invalid_argument);
  CHECK_THROWS_AS(sk::ef_encode(mask, 128, 2, longer), std::invalid_argument);
  CHECK_THROWS_AS(sk::ef_encode(mask, 200, 2, code), std::invalid_argument);  // 2 words, 200 bits need 4
  CHECK_THROWS_AS(sk::ef_encode(mask, 128, 200, code), std::invalid_argument);
  // A bit at or past n.
  const Words past = mask_of(128, {3, 110});
  Words code100(sk::ef_words(100, 2));
  CHECK_THROWS_WITH_AS(sk::ef_encode(past, 100, 2, code100), "ef_encode: bits are set at or past n = 100",
                       std::invalid_argument);
  // A corrupted code: no high bits means fewer than k positions.
  Words empty_code(code.size());
  Words out(2);
  CHECK_THROWS_WITH_AS(sk::ef_decode(empty_code, 128, 2, out), "ef_decode: the code holds 0 positions, k = 2",
                       std::invalid_argument);
  std::vector<std::uint32_t> two(2, 7), three(3);
  CHECK_THROWS_WITH_AS(sk::ef_decode_indices(empty_code, 128, 2, two),
                       "ef_decode_indices: the code holds 0 positions, k = 2", std::invalid_argument);
  CHECK_THROWS_AS(sk::ef_decode_indices(code, 128, 2, three), std::invalid_argument);  // k entries, not 3
  // A position past n: the code of {3, 70} among 128 read as a code among 64 (same size).
  REQUIRE(sk::ef_words(64, 2) == code.size());
  sk::ef_encode(mask, 128, 2, code);
  CHECK_THROWS_WITH_AS(sk::ef_decode_indices(code, 64, 2, two), "ef_decode_indices: position 67 of entry 0 is at or past n = 64",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(sk::ef_decode_indices(Words{}, (std::size_t{1} << 32) + 1, 0, std::span<std::uint32_t>{}),
                       "ef_decode_indices: n = 4294967297 positions do not fit uint32 indices", std::invalid_argument);
}

TEST_CASE("and_not, extract and deposit bits against a naive reference") {
  const Words a = mask_of(130, {0, 5, 64, 100, 129});
  const Words b = mask_of(130, {5, 6, 100, 128});
  Words out(a.size());
  sk::and_not_bits(a, b, out);
  CHECK(out == mask_of(130, {0, 64, 129}));
  // Positions of b are 5, 6, 100, 128: a holds 5 and 100, so the packed bits are 0b0101.
  Words packed(1, ~std::uint64_t{0});
  sk::extract_bits(a, b, packed);
  CHECK(packed[0] == 0b0101u);
  Words restored = out;
  sk::deposit_bits(packed, b, restored);
  CHECK(restored == a);
  Words two(2);
  CHECK_THROWS_AS(sk::extract_bits(a, b, two), std::invalid_argument);
  CHECK_THROWS_AS(sk::deposit_bits(two, b, restored), std::invalid_argument);
  CHECK_THROWS_AS(sk::and_not_bits(a, Words(1), out), std::invalid_argument);

  std::uint32_t seed = 200;
  for (const std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{64}, std::size_t{1000}, std::size_t{1} << 20}) {
    const Words x = random_mask(n, 0.3, ++seed), positions = random_mask(n, 0.05, ++seed);
    Words kept(sk::words_for(sk::popcount(positions)));
    sk::extract_bits(x, positions, kept);
    std::size_t r = 0;
    bool same = true;
    for (std::size_t p = 0; p < n; ++p) {
      if (((positions[p / 64] >> (p % 64)) & 1u) == 0) continue;
      same = same && (((kept[r / 64] >> (r % 64)) & 1u) == ((x[p / 64] >> (p % 64)) & 1u));
      ++r;
    }
    CHECK_MESSAGE(same, "extract_bits n=" << n);
    Words fresh(x.size());
    sk::and_not_bits(x, positions, fresh);
    sk::deposit_bits(kept, positions, fresh);
    CHECK_MESSAGE(fresh == x, "deposit_bits restores x, n=" << n);
  }
}
