// Tests for the exact top-k-by-magnitude kernels (kernels/cpu/select.cpp) against a stable-sort
// reference and an O(N) order-statistic check, including ties, signed zeros, NaN/inf and
// determinism across OpenMP thread counts.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>

#include "kernels/cpu/kernels.hpp"
#include "util/rng.hpp"

namespace sk = scape::kernels;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Magnitude order written from the spec, not from the kernel's bit trick: NaN ranks above
// everything (all NaNs equal), otherwise |x|; -0 equals +0.
bool ranks_above(float a, float b) {
  if (std::isnan(b)) return false;
  if (std::isnan(a)) return true;
  return std::fabs(a) > std::fabs(b);
}

bool ranks_equal(float a, float b) { return !ranks_above(a, b) && !ranks_above(b, a); }

// Stable descending sort of indices: among equal magnitudes the lower index comes first.
std::vector<std::uint32_t> reference_order(const std::vector<float>& x) {
  std::vector<std::uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint32_t a, std::uint32_t b) { return ranks_above(x[a], x[b]); });
  return order;
}

// The first k of the reference order, ascending.
std::vector<std::uint32_t> reference_topk(const std::vector<std::uint32_t>& order, std::size_t k) {
  std::vector<std::uint32_t> top(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  std::sort(top.begin(), top.end());
  return top;
}

// Reads the mask bit by bit, independent of bits_to_indices.
std::vector<std::uint32_t> mask_indices(const std::vector<std::uint64_t>& words, std::size_t n) {
  std::vector<std::uint32_t> idx;
  for (std::size_t j = 0; j < n; ++j) {
    if ((words[j / 64] >> (j % 64)) & 1u) idx.push_back(static_cast<std::uint32_t>(j));
  }
  return idx;
}

bool padding_clear(const std::vector<std::uint64_t>& words, std::size_t n) {
  if (n % 64 == 0) return true;
  return (words.back() >> (n % 64)) == 0;
}

// The mask starts as all ones so that bits the kernel forgets to clear show up.
std::vector<std::uint64_t> run_mask(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint64_t> words(sk::words_for(x.size()), ~std::uint64_t{0});
  sk::topk_abs_mask(x, k, words);
  return words;
}

void check_against_reference(const std::vector<float>& x, const std::vector<std::uint32_t>& order, std::size_t k) {
  CAPTURE(x.size());
  CAPTURE(k);
  const std::vector<std::uint64_t> words = run_mask(x, k);
  const std::vector<std::uint32_t> expected = reference_topk(order, k);
  CHECK(padding_clear(words, x.size()));
  CHECK(mask_indices(words, x.size()) == expected);

  std::vector<std::uint32_t> out(k + 3, 0xdeadbeefu);
  CHECK(sk::topk_abs_indices(x, k, out) == k);
  CHECK(std::vector<std::uint32_t>(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k)) == expected);
  CHECK(out[k] == 0xdeadbeefu);  // nothing written past k
}

// N(0, 1) values, element i from the counter-based stream of `seed` (util/rng.hpp).
std::vector<float> normal_values(std::size_t n, std::uint32_t seed) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(scape::rng::normal(seed, i));
  return x;
}

std::vector<float> values_from(std::size_t n, const std::vector<float>& choices, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, choices.size() - 1);
  std::vector<float> x(n);
  for (float& v : x) v = choices[pick(rng)];
  return x;
}

// O(N) check for sizes where a full sort is slow: the selection must be every entry ranked
// above the k-th largest magnitude plus the lowest-indexed entries equal to it.
void check_order_statistic(const std::vector<float>& x, std::size_t k, const std::vector<std::uint64_t>& words) {
  std::vector<float> ranked(x);
  std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(k - 1), ranked.end(), ranks_above);
  const float kth = ranked[k - 1];
  std::size_t above = 0;
  for (const float v : x) above += ranks_above(v, kth) ? 1 : 0;
  std::size_t ties_wanted = k - above;

  std::size_t wrong = 0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    bool expected = ranks_above(x[j], kth);
    if (!expected && ranks_equal(x[j], kth) && ties_wanted > 0) {
      expected = true;
      --ties_wanted;
    }
    const bool got = (words[j / 64] >> (j % 64)) & 1u;
    wrong += (got != expected) ? 1 : 0;
  }
  CHECK(wrong == 0);
  CHECK(sk::popcount(words) == k);
  CHECK(padding_clear(words, x.size()));
}

// Runs fn with a given OpenMP thread count and restores the previous one.
template <typename Fn>
auto with_threads(int threads, Fn fn) {
  const int previous = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto result = fn();
  omp_set_num_threads(previous);
  return result;
}

}  // namespace

TEST_CASE("topk matches the stable-sort reference on random data") {
  std::uint32_t seed = 1;
  for (const std::size_t n :
       {std::size_t{1000}, std::size_t{4097}, std::size_t{100'003}, (std::size_t{1} << 20) + 37}) {
    const std::vector<float> x = normal_values(n, seed++);
    const auto order = reference_order(x);
    for (const std::size_t k : {std::size_t{1}, n / 100, n / 2, n - 1}) check_against_reference(x, order, k);
  }
}

TEST_CASE("topk with all values equal takes the lowest indices") {
  for (const std::size_t n : {std::size_t{1000}, (std::size_t{1} << 20) + 5}) {
    const std::vector<float> x(n, -0.75f);
    for (const std::size_t k : {std::size_t{1}, std::size_t{63}, std::size_t{64}, std::size_t{65}, n / 2, n - 1}) {
      CAPTURE(n);
      CAPTURE(k);
      std::vector<std::uint32_t> expected(k);
      std::iota(expected.begin(), expected.end(), 0u);
      CHECK(mask_indices(run_mask(x, k), n) == expected);
    }
  }
}

TEST_CASE("topk with many ties from {0, +-1, +-2}") {
  const std::vector<float> choices{0.0f, 1.0f, -1.0f, 2.0f, -2.0f};
  for (const std::size_t n : {std::size_t{777}, (std::size_t{1} << 20) + 13}) {
    const std::vector<float> x = values_from(n, choices, 7);
    const auto order = reference_order(x);
    for (const std::size_t k : {std::size_t{1}, n / 5, n / 3, n / 2, 4 * n / 5, n - 1}) {
      check_against_reference(x, order, k);
    }
  }
}

// Keeps `bits` significant bits of the mantissa (8 = bfloat16): many exact ties, and with 8
// bits every value of a threshold bucket (high 15 bits of |x|) is the same value.
std::vector<float> rounded_normals(std::size_t n, int bits, std::uint32_t seed) {
  std::vector<float> x = normal_values(n, seed);
  for (float& v : x) {
    int exponent = 0;
    const float mantissa = std::frexp(v, &exponent);
    v = std::ldexp(std::round(std::ldexp(mantissa, bits)), exponent - bits);
  }
  return x;
}

TEST_CASE("topk with ties inside the threshold bucket") {
  for (const int bits : {8, 9}) {
    const std::vector<float> x = rounded_normals((std::size_t{1} << 20) + 7, bits, 31);
    const auto order = reference_order(x);
    for (const std::size_t k : {std::size_t{1}, std::size_t{1000}, x.size() / 100, x.size() / 3}) {
      CAPTURE(bits);
      check_against_reference(x, order, k);
    }
  }
}

// The sparse path estimates its threshold from every (n / 2048)-th value. Values planted at
// exactly those positions make the estimate wrong both ways: too high (the sample holds only
// huge values, so fewer than k keys reach it) and too low (only tiny ones, so nearly every key
// does); the selection must stay exact either way, with ties at the threshold included.
TEST_CASE("topk with a misleading sample: the sparse path's estimate fails and the result stays exact") {
  for (const std::size_t n : {std::size_t{13'579}, std::size_t{100'003}, std::size_t{300'007}}) {
    const std::size_t stride = n / std::min<std::size_t>(n, 2048);
    for (const float planted : {1e6f, 1e-6f, 0.5f}) {
      CAPTURE(planted);
      std::vector<float> x = values_from(n, {0.25f, -0.5f, 0.5f, 1.0f, -2.0f, 0.125f}, 51);
      for (std::size_t j = 0; j < n; j += stride) x[j] = planted;
      const auto order = reference_order(x);
      for (const std::size_t k : {std::size_t{1}, n / 100, n / 10}) check_against_reference(x, order, k);
    }
    const std::vector<float> normal = normal_values(n, 52);
    const auto order = reference_order(normal);
    for (const std::size_t k : {std::size_t{7}, n / 100, n / 8}) check_against_reference(normal, order, k);
  }
}

// Sparse selections of a large input take the sampled path with its chunks in parallel: the
// threshold's ties, NaN and inf must still go to the lowest indices across chunk boundaries.
TEST_CASE("topk on the sampled path across chunks matches the reference") {
  const std::size_t n = (std::size_t{1} << 20) + 7;
  std::vector<float> x = rounded_normals(n, 6, 61);
  for (std::size_t j = 3; j < n; j += n / 5) x[j] = kNaN;
  for (std::size_t j = 5; j < n; j += n / 7) x[j] = -kInf;
  const auto order = reference_order(x);
  for (const int threads : {2, 4}) {
    CAPTURE(threads);
    for (const std::size_t k : {std::size_t{0}, std::size_t{3}, n / 1000, n / 100, n / 8}) {
      with_threads(threads, [&] {
        check_against_reference(x, order, k);
        return 0;
      });
    }
  }
}

// Sparse selections with many marked keys find the k-th among them by a radix select (from
// 2^15 keys): with k = n/8 the k-th magnitude is the planted 1.5 (about 12% of |x| lie above
// it, as many equal it), and its ties, one block of them straddling the chunks' boundary, must
// go to the lowest indices as the reference's do, whatever the thread count; n/20 and n/10
// take the radix path with the k-th above the ties.
TEST_CASE("topk on the sampled path with many marked keys and ties at the threshold") {
  const std::size_t n = std::size_t{1} << 20;
  std::vector<float> x = normal_values(n, 71);
  for (std::size_t j = 0; j < n; j += 9) x[j] = (j % 2 == 0) ? 1.5f : -1.5f;
  for (std::size_t j = n / 2 - 5000; j < n / 2 + 5000; ++j) x[j] = 1.5f;
  const auto order = reference_order(x);
  for (const int threads : {1, 2, 3}) {
    CAPTURE(threads);
    for (const std::size_t k : {n / 20, n / 10, n / 8}) {
      CAPTURE(k);
      with_threads(threads, [&] {
        check_against_reference(x, order, k);
        return 0;
      });
    }
  }
}

TEST_CASE("topk with NaN, inf and signed zeros in a large input") {
  const std::size_t n = 100'000;
  std::vector<float> x = normal_values(n, 41);
  std::mt19937 rng(42);
  std::uniform_int_distribution<std::size_t> position(0, n - 1);
  for (int i = 0; i < 50; ++i) x[position(rng)] = i % 2 == 0 ? kNaN : -kNaN;
  for (int i = 0; i < 70; ++i) x[position(rng)] = i % 2 == 0 ? kInf : -kInf;
  for (int i = 0; i < 60'000; ++i) x[position(rng)] = i % 2 == 0 ? 0.0f : -0.0f;
  // k = 30 and 45 end among the NaNs, 100 among the infs, 60'000 among the zeros.
  const auto order = reference_order(x);
  for (const std::size_t k : {30, 45, 100, 1000, 60'000}) check_against_reference(x, order, k);
}

TEST_CASE("topk on tiny inputs, every k") {
  const std::vector<float> choices{0.0f, -0.0f, 0.5f, -0.5f, 3.0f, -7.25f, 1e-30f};
  for (std::size_t n = 1; n <= 130; ++n) {
    const std::vector<float> x = values_from(n, choices, static_cast<std::uint32_t>(n));
    const auto order = reference_order(x);
    for (std::size_t k = 0; k <= n; ++k) check_against_reference(x, order, k);
  }
}

TEST_CASE("topk on N = 1") {
  const std::vector<float> x{-3.0f};
  CHECK(mask_indices(run_mask(x, 1), 1) == std::vector<std::uint32_t>{0});
  CHECK(run_mask(x, 1) == std::vector<std::uint64_t>{1});
  CHECK(run_mask(x, 0) == std::vector<std::uint64_t>{0});
}

TEST_CASE("topk k = 0 clears and k = n sets exactly the first n bits") {
  const std::vector<float> x = normal_values(200, 3);  // 200 = 3 * 64 + 8: a partial last word
  CHECK(run_mask(x, 0) == std::vector<std::uint64_t>(4, 0));
  const std::vector<std::uint64_t> all = run_mask(x, 200);
  CHECK(all[0] == ~std::uint64_t{0});
  CHECK(all[2] == ~std::uint64_t{0});
  CHECK(all[3] == 0xffu);
}

TEST_CASE("topk treats -0 and +0 as equal magnitudes") {
  const std::vector<float> x{0.0f, -0.0f, 0.0f, -0.0f, 1.0f};
  CHECK(mask_indices(run_mask(x, 3), x.size()) == std::vector<std::uint32_t>{0, 1, 4});
  const std::vector<float> y{-0.0f, 0.0f, -0.0f};
  CHECK(mask_indices(run_mask(y, 2), y.size()) == std::vector<std::uint32_t>{0, 1});
}

TEST_CASE("topk ranks NaN above inf above finite values") {
  const std::vector<float> x{1.0f, kInf, kNaN, -kInf, 3.0f, -kNaN, -1e38f};
  CHECK(mask_indices(run_mask(x, 1), x.size()) == std::vector<std::uint32_t>{2});
  CHECK(mask_indices(run_mask(x, 2), x.size()) == std::vector<std::uint32_t>{2, 5});
  CHECK(mask_indices(run_mask(x, 3), x.size()) == std::vector<std::uint32_t>{1, 2, 5});
  CHECK(mask_indices(run_mask(x, 4), x.size()) == std::vector<std::uint32_t>{1, 2, 3, 5});
  CHECK(mask_indices(run_mask(x, 5), x.size()) == std::vector<std::uint32_t>{1, 2, 3, 5, 6});
  const auto order = reference_order(x);
  for (std::size_t k = 0; k <= x.size(); ++k) check_against_reference(x, order, k);
}

TEST_CASE("topk on 2^24 entries with k = 1%") {
  const std::size_t n = std::size_t{1} << 24;
  const std::size_t k = n / 100;
  SUBCASE("normal values") {
    const std::vector<float> x = normal_values(n, 11);
    check_order_statistic(x, k, run_mask(x, k));
  }
  SUBCASE("few distinct values, so the threshold is tied across chunks") {
    std::vector<float> x = normal_values(n, 12);
    for (float& v : x) v = std::round(v * 4.0f) / 4.0f;
    check_order_statistic(x, k, run_mask(x, k));
  }
}

TEST_CASE("topk is identical across OpenMP thread counts") {
  // Ties at the threshold span every chunk boundary: few distinct values, and bf16 values.
  const std::size_t n = (std::size_t{1} << 21) + 3;
  const std::vector<float> few_values = values_from(n, {0.0f, 1.0f, -1.0f, 2.0f, -2.0f, 0.5f}, 21);
  const std::vector<float> bf16_values = rounded_normals(n, 8, 22);
  for (const auto* x : {&few_values, &bf16_values}) {
    for (const std::size_t k : {n / 3, n / 50}) {
      const auto one = with_threads(1, [&] { return run_mask(*x, k); });
      const auto two = with_threads(2, [&] { return run_mask(*x, k); });
      const auto five = with_threads(5, [&] { return run_mask(*x, k); });
      CHECK(one == two);
      CHECK(one == five);
      check_order_statistic(*x, k, one);
    }
  }
}

TEST_CASE("topk rejects bad arguments") {
  const std::vector<float> x(10, 1.0f);
  std::vector<std::uint64_t> words(1);
  try {
    sk::topk_abs_mask(x, 11, words);
    FAIL("k > n did not throw");
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    CHECK(message.find("k = 11") != std::string::npos);
    CHECK(message.find("n = 10") != std::string::npos);
  }
  std::vector<std::uint64_t> too_many(2);
  CHECK_THROWS_AS(sk::topk_abs_mask(x, 3, too_many), std::invalid_argument);
  std::vector<std::uint64_t> none;
  CHECK_THROWS_AS(sk::topk_abs_mask(x, 3, none), std::invalid_argument);
  std::vector<std::uint32_t> out(2);
  CHECK_THROWS_AS(sk::topk_abs_indices(x, 3, out), std::invalid_argument);
  CHECK_THROWS_AS(sk::topk_abs_indices(x, 11, std::span<std::uint32_t>(out.data(), 0)), std::invalid_argument);
}

TEST_CASE("topk on empty input") {
  std::vector<std::uint64_t> words;
  sk::topk_abs_mask(std::span<const float>(), 0, words);
  std::vector<std::uint32_t> out;
  CHECK(sk::topk_abs_indices(std::span<const float>(), 0, out) == 0);
  CHECK_THROWS_AS(sk::topk_abs_mask(std::span<const float>(), 1, words), std::invalid_argument);
}
