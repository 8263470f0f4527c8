// Tests for SCAPE's one-pass owner kernel candidate_statistic_carry (kernels/cpu/scape_ops.cpp):
// hand-computed values across a mask-word boundary, the one pass against the three passes it
// replaces (candidate_momentum, carried_first_moment_statistic, carry_momentum_off_mask) bit for
// bit with NaN, infinities and -0, and size checks.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/kernels.hpp"

namespace sk = scape::kernels;

namespace {

std::size_t bits_differ(const std::vector<float>& x, const std::vector<float>& y) {
  std::size_t differ = 0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    differ += std::bit_cast<std::uint32_t>(x[j]) != std::bit_cast<std::uint32_t>(y[j]) ? 1 : 0;
  }
  return differ;
}

}  // namespace

TEST_CASE("candidate_statistic_carry: e, the statistic, q and m by hand") {
  // Bits 62..65 straddle two mask words: j = 1 and 2 are on the mask. b1 = 0.5, omb1 = 0.25,
  // gamma = 0.5; g[3] is infinite, so one entry is counted and e[3] becomes inf.
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> e = {1, 2, 3, 4}, g = {4, 8, 12, inf}, q = {1, 2, 3, 4}, m = {10, 20, 30, 40}, s(4);
  const std::vector<std::uint64_t> mask = {std::uint64_t{1} << 63, 1};
  CHECK(sk::candidate_statistic_carry(e, g, q, m, mask, 62, 0.5f, 0.25f, 0.5f, s) == 1);
  CHECK(e == std::vector<float>{2, 4, 6, inf});
  CHECK(s == std::vector<float>{1 + (5 + 2.0f), 2 + (10 + 4.0f), 3 + (15 + 6.0f), inf});
  // Off the mask q is carried and m cleared; on it both are kept (step 3 still reads them).
  CHECK(q == std::vector<float>{(5 + 1) * 0.5f, 2, 3, (20 + 4) * 0.5f});
  CHECK(m == std::vector<float>{0, 20, 30, 0});
}

// The one pass must leave e, the statistic, q and m bit for bit as the passes it replaces, with
// q restored on the mask (the caller zeroes it there after step 3), on the serial and the
// parallel path, from bit 0 and from bit 37, with gamma 1 (no multiplication) and 0.7.
TEST_CASE("candidate_statistic_carry equals the passes it fuses") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{200'003}}) {
    for (const std::size_t first_bit : {std::size_t{0}, std::size_t{37}}) {
      for (const float gamma : {1.0f, 0.7f}) {
        CAPTURE(n);
        CAPTURE(first_bit);
        CAPTURE(gamma);
        std::mt19937 rng(static_cast<std::uint32_t>(n + first_bit + 3));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> e(n), g(n), q(n), m(n);
        for (std::size_t j = 0; j < n; ++j) {
          e[j] = normal(rng) * 1e-3f;
          g[j] = normal(rng);
          q[j] = normal(rng) * 1e-2f;
          m[j] = normal(rng);
        }
        if (n > 6) {
          g[1] = nan;
          g[2] = -inf;
          m[3] = inf;
          q[4] = -0.0f;
          e[5] = nan;
          m[6] = 3.0e38f;  // overflows to inf in b1 m + q
          q[6] = 3.0e38f;
        }
        std::vector<std::uint64_t> mask(sk::words_for(first_bit + n));
        for (std::size_t j = 0; j < n; ++j) {
          if (rng() % 10 == 0 || j == 2 || j == 4)
            mask[(first_bit + j) / 64] |= std::uint64_t{1} << ((first_bit + j) % 64);
        }
        const float b1 = 0.9f, omb1 = static_cast<float>(1.0 - 0.9);

        std::vector<float> e_passes = e, s_passes(n), q_passes = q, m_passes = m;
        const std::size_t bad_passes = sk::candidate_momentum(e_passes, {}, g, b1, omb1);
        sk::carried_first_moment_statistic(m_passes, e_passes, q_passes, b1, s_passes);
        sk::carry_momentum_off_mask(q_passes, m_passes, mask, first_bit, b1, gamma);
        for (std::size_t j = 0; j < n; ++j) {
          if ((mask[(first_bit + j) / 64] >> ((first_bit + j) % 64)) & 1u) q_passes[j] = q[j];
        }

        std::vector<float> e_fused = e, s_fused(n, -1.0f), q_fused = q, m_fused = m;
        const std::size_t bad_fused =
            sk::candidate_statistic_carry(e_fused, g, q_fused, m_fused, mask, first_bit, b1, omb1, gamma, s_fused);
        CHECK(bad_fused == bad_passes);
        CHECK(bits_differ(e_fused, e_passes) == 0);
        CHECK(bits_differ(s_fused, s_passes) == 0);
        CHECK(bits_differ(q_fused, q_passes) == 0);
        CHECK(bits_differ(m_fused, m_passes) == 0);
        if (n > 6) {
          CHECK(bad_fused >= 2);
          CHECK(std::bit_cast<std::uint32_t>(q_fused[4]) == std::bit_cast<std::uint32_t>(-0.0f));  // kept on the mask
        }
      }
    }
  }
}

TEST_CASE("candidate_statistic_carry rejects mismatched sizes and a short mask") {
  std::vector<float> a(4), shorter(3);
  const std::vector<std::uint64_t> mask = {0, 0};
  CHECK_THROWS_AS(sk::candidate_statistic_carry(a, shorter, a, a, mask, 0, 0.9f, 0.1f, 1.0f, a), std::invalid_argument);
  CHECK_THROWS_AS(sk::candidate_statistic_carry(a, a, shorter, a, mask, 0, 0.9f, 0.1f, 1.0f, a), std::invalid_argument);
  CHECK_THROWS_AS(sk::candidate_statistic_carry(a, a, a, shorter, mask, 0, 0.9f, 0.1f, 1.0f, a), std::invalid_argument);
  CHECK_THROWS_AS(sk::candidate_statistic_carry(a, a, a, a, mask, 0, 0.9f, 0.1f, 1.0f, shorter), std::invalid_argument);
  // Bits 62..65 need two words.
  CHECK_THROWS_AS(
      sk::candidate_statistic_carry(a, a, a, a, std::span<const std::uint64_t>(mask).first(1), 62, 0.9f, 0.1f, 1.0f, a),
      std::invalid_argument);
  CHECK(sk::candidate_statistic_carry({}, {}, {}, {}, {}, 0, 0.9f, 0.1f, 1.0f, {}) == 0);
}

TEST_CASE("owner_payload_gradient: b_bar and g_bar by hand") {
  // b1 = 0.5, omb1 = 0.25; positions 2 and 0 of m and q: b = 1 + 0.5 * 8 + 2 = 7 and
  // 3 + 0.5 * 2 + 1 = 5, g = (7 - 4) / 0.25 = 12 and (5 - 1) / 0.25 = 16.
  const std::vector<float> m = {2, 99, 8};
  std::vector<float> q = {1, 99, 2};
  const std::vector<std::uint32_t> idx = {2, 0};
  std::vector<float> b_bar = {1, 3}, g(2);
  sk::owner_payload_gradient(b_bar, m, q, idx, 0.5f, 0.25f, g);
  CHECK(b_bar == std::vector<float>{7, 5});
  CHECK(g == std::vector<float>{12, 16});
  CHECK(q == std::vector<float>{0, 99, 0});  // read, then zeroed on the mask
  // Without q (no carried momentum): b = 1 + 4 = 5 and 3 + 1 = 4, g = 1 / 0.25 and 3 / 0.25.
  b_bar = {1, 3};
  sk::owner_payload_gradient(b_bar, m, {}, idx, 0.5f, 0.25f, g);
  CHECK(b_bar == std::vector<float>{5, 4});
  CHECK(g == std::vector<float>{4, 12});
}

// The one pass must give b_bar and g_bar bit for bit as add_momentum (m, then q with b1 = 1) and
// reconstruct_gradient, and q as zero_at leaves it, with and without q, on the serial and the
// parallel path (k > 16384), NaN and infinities included.
TEST_CASE("owner_payload_gradient equals the passes it fuses") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::size_t n : {std::size_t{0}, std::size_t{9}, std::size_t{300'007}}) {
    for (const bool with_q : {true, false}) {
      CAPTURE(n);
      CAPTURE(with_q);
      std::mt19937 rng(static_cast<std::uint32_t>(n + 11));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> m(n), q(n);
      for (std::size_t j = 0; j < n; ++j) {
        m[j] = normal(rng);
        q[j] = normal(rng) * 1e-3f;
      }
      std::vector<std::uint32_t> idx;
      for (std::size_t j = 0; j < n; ++j) {
        if (j % 3 != 1) idx.push_back(static_cast<std::uint32_t>(j));
      }
      const std::size_t k = idx.size();
      std::vector<float> b_bar(k);
      for (float& b : b_bar) b = normal(rng);
      if (k > 4) {
        b_bar[1] = nan;
        b_bar[2] = inf;
        m[idx[3]] = -inf;
      }
      std::vector<float> b_separate = b_bar, g_separate(k), b_fused = b_bar, g_fused(k);
      sk::add_momentum(b_separate, m, idx, 0.9f);
      if (with_q) sk::add_momentum(b_separate, q, idx, 1.0f);
      sk::reconstruct_gradient(b_separate, m, idx, 0.9f, static_cast<float>(1.0 - 0.9), g_separate);
      std::vector<float> q_separate = q, q_fused = q;
      if (with_q) sk::zero_at(q_separate, idx);
      const std::span<float> q_given = with_q ? std::span<float>(q_fused) : std::span<float>{};
      sk::owner_payload_gradient(b_fused, m, q_given, idx, 0.9f, static_cast<float>(1.0 - 0.9), g_fused);
      CHECK(bits_differ(b_fused, b_separate) == 0);
      CHECK(bits_differ(g_fused, g_separate) == 0);
      CHECK(bits_differ(q_fused, q_separate) == 0);
    }
  }
}

TEST_CASE("owner_payload_gradient rejects mismatched sizes") {
  std::vector<float> a(4), shorter(3);
  const std::vector<std::uint32_t> idx = {0, 1, 2, 3};
  CHECK_THROWS_AS(sk::owner_payload_gradient(shorter, a, a, idx, 0.9f, 0.1f, a), std::invalid_argument);
  CHECK_THROWS_AS(sk::owner_payload_gradient(a, a, a, idx, 0.9f, 0.1f, shorter), std::invalid_argument);
  CHECK_THROWS_AS(sk::owner_payload_gradient(a, a, shorter, idx, 0.9f, 0.1f, a), std::invalid_argument);
}
