// 1-bit Adam's sign compression kernels against hand-computed values (kernels/kernel_list.inc,
// docs/algorithms.md "1-bit Adam").
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/kernels.hpp"

namespace sk = scape::kernels;

TEST_CASE("sign_compress: bits of the negative entries, per-chunk scales, the error left in x") {
  // Two chunks of 3 and a short last chunk of 1.
  std::vector<float> x = {1.5f, -0.5f, 0.0f, -2.0f, 4.0f, -0.0f, 3.0f};
  const std::vector<float> scales = {1.0f, 2.0f, 0.25f};
  std::vector<std::uint64_t> words(1, ~std::uint64_t{0});
  sk::sign_compress(x, 3, scales, words);
  CHECK(words[0] == 0b0001010u);  // entries 1 and 3; +0 and -0 count as non-negative
  const std::vector<float> error = {0.5f, 0.5f, -1.0f, 0.0f, 2.0f, -2.0f, 2.75f};
  CHECK(x == error);
  // Expanding the bits adds C(x) = x_before - error back.
  std::vector<float> acc(7, 0.0f);
  sk::sign_expand_add(words, 3, scales, acc);
  CHECK(acc == std::vector<float>{1.0f, -1.0f, 1.0f, -2.0f, 2.0f, 2.0f, 0.25f});
  sk::sign_expand_add(words, 3, scales, acc);  // adds, does not overwrite
  CHECK(acc[6] == 0.5f);
}

TEST_CASE("sign_compress over several words: bit j of word j/64, the tail cleared") {
  const std::size_t n = 130;
  std::vector<float> x(n);
  for (std::size_t j = 0; j < n; ++j) x[j] = (j % 3 == 0) ? -1.0f - static_cast<float>(j) : 1.0f;
  const std::vector<float> scales(2, 0.5f);  // chunk 65: two chunks
  std::vector<std::uint64_t> words(3, ~std::uint64_t{0});
  sk::sign_compress(x, 65, scales, words);
  for (std::size_t j = 0; j < n; ++j) {
    CHECK(((words[j / 64] >> (j % 64)) & 1u) == (j % 3 == 0 ? 1u : 0u));
    CHECK(x[j] == (j % 3 == 0 ? -0.5f - static_cast<float>(j) : 0.5f));
  }
  CHECK((words[2] >> 2) == 0);  // bits past n are clear
}

TEST_CASE("sign kernels check their sizes and the chunk") {
  std::vector<float> x(10);
  std::vector<std::uint64_t> words(1);
  std::vector<float> two(2), three(3);
  CHECK_THROWS_AS(sk::sign_compress(x, 0, two, words), std::invalid_argument);
  CHECK_THROWS_WITH_AS(sk::sign_compress(x, 4, two, words), doctest::Contains("sign_compress"), std::invalid_argument);
  CHECK_NOTHROW(sk::sign_compress(x, 4, three, words));
  std::vector<std::uint64_t> none;
  CHECK_THROWS_AS(sk::sign_expand_add(none, 4, three, x), std::invalid_argument);
}
