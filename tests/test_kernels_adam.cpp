// Tests for the AdamW / AdamS kernels (kernels/cpu/adam.cpp): double-precision references of
// the formulas in kernels/kernel_list.inc on random data, a hand-computed AdamW trajectory with
// PyTorch semantics, non-finite counting in accumulate, SCAPE's one-pass carried statistic and
// its one-pass carry of q with m <- 0 off the mask against the passes they replace, and size
// checks.
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

// Tolerance: the kernels evaluate ~10 float operations per element, each with relative error
// <= 2^-24 ~ 6e-8, so the result is within ~6e-7 of the exact value *relative to the sum of
// the magnitudes of the terms* (|decayed theta| + |lr * update| with the momentum terms taken
// in absolute value, so a cancellation in m does not shrink the bound). 1e-6 of that sum
// covers rounding with margin, yet is far below the effect of any formula slip: a missing bias
// correction, decay or eps changes theta by >= 1e-5 relative on these inputs.
constexpr double kRelTol = 1e-6;

struct State {
  std::vector<float> theta, m, v, g;
};

// Gradient scales span 1e-9 .. 1, so eps (1e-8) matters for some entries and not for others.
// v >= m^2, as in a real Adam state, keeps |m| / sqrt(v) bounded.
State random_state(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-9.0f, 0.0f);
  State s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (std::size_t j = 0; j < n; ++j) {
    const float scale = std::pow(10.0f, log_scale(rng));
    s.theta[j] = normal(rng);
    s.g[j] = scale * normal(rng);
    s.m[j] = 0.5f * scale * normal(rng);
    const float spread = 0.5f * scale * normal(rng);
    s.v[j] = s.m[j] * s.m[j] + spread * spread;
  }
  return s;
}

sk::AdamScalars step_scalars(int t, bool decayed) {
  sk::AdamScalars s;
  s.lr = 1e-3;
  s.beta1 = 0.9;
  s.beta2 = 0.95;
  s.eps = 1e-8;
  s.decay = decayed ? 1.0 - 1e-3 * 0.1 : 1.0;
  s.bc1 = 1.0 - std::pow(0.9, t);
  s.bc2 = 1.0 - std::pow(0.95, t);
  return s;
}

// Counts entries outside |got - want| <= kRelTol * scale.
std::size_t count_off(const std::vector<float>& got, const std::vector<double>& want,
                      const std::vector<double>& scale) {
  std::size_t off = 0;
  for (std::size_t j = 0; j < got.size(); ++j) off += std::fabs(got[j] - want[j]) > kRelTol * scale[j] ? 1 : 0;
  return off;
}

// What AdamW and AdamS share on a dense step, in double: the new first moment and the decayed
// parameter moved by lr * m_hat / denom, each with the sum of its terms' magnitudes (the scale
// kRelTol is relative to). Only the denominator differs between the two rules.
struct DenseReference {
  std::vector<double> m, m_terms, theta, theta_terms;
};

DenseReference dense_reference(const State& before, const sk::AdamScalars& s, const std::vector<double>& denom) {
  const std::size_t n = denom.size();
  const double b1 = s.beta1;
  DenseReference r{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n), std::vector<double>(n)};
  for (std::size_t j = 0; j < n; ++j) {
    const double g = before.g[j];
    r.m[j] = b1 * before.m[j] + (1 - b1) * g;
    r.m_terms[j] = b1 * std::fabs(before.m[j]) + (1 - b1) * std::fabs(g);
    const double decayed = before.theta[j] * s.decay;
    r.theta[j] = decayed - s.lr * (r.m[j] / s.bc1) / denom[j];
    r.theta_terms[j] = std::fabs(decayed) + s.lr * (r.m_terms[j] / s.bc1) / denom[j];
  }
  return r;
}

// Sorted distinct indices, ~40% of [0, n).
std::vector<std::uint32_t> random_indices(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution keep(0.4);
  std::vector<std::uint32_t> idx;
  for (std::size_t j = 0; j < n; ++j) {
    if (keep(rng)) idx.push_back(static_cast<std::uint32_t>(j));
  }
  return idx;
}

}  // namespace

TEST_CASE("adamw_step matches a double-precision reference") {
  const std::size_t n = 100'003;  // above the parallel threshold, not a multiple of the SIMD width
  const State before = random_state(n, 1);
  const sk::AdamScalars s = step_scalars(3, true);
  State after = before;
  sk::adamw_step(after.theta, after.m, after.v, after.g, s);

  const double b2 = s.beta2;
  std::vector<double> v(n), denom(n);
  for (std::size_t j = 0; j < n; ++j) {
    const double g = before.g[j];
    v[j] = b2 * before.v[j] + (1 - b2) * g * g;
    denom[j] = std::sqrt(v[j] / s.bc2) + s.eps;
  }
  const DenseReference ref = dense_reference(before, s, denom);
  CHECK(count_off(after.m, ref.m, ref.m_terms) == 0);
  CHECK(count_off(after.v, v, v) == 0);
  CHECK(count_off(after.theta, ref.theta, ref.theta_terms) == 0);
  CHECK(after.g == before.g);
}

TEST_CASE("adams_step matches a double-precision reference") {
  const std::size_t n = 100'003;
  const State before = random_state(n, 2);
  const sk::AdamScalars s = step_scalars(5, true);
  State after = before;
  sk::adams_step(after.theta, after.m, after.g, s);

  const double b2 = s.beta2;
  std::vector<double> denom(n);
  for (std::size_t j = 0; j < n; ++j) {
    const double g = before.g[j];
    const double mhat_prev = before.m[j] / s.bc1;
    denom[j] = std::sqrt(b2 * mhat_prev * mhat_prev + (1 - b2) * g * g) + s.eps;
  }
  const DenseReference ref = dense_reference(before, s, denom);
  CHECK(count_off(after.m, ref.m, ref.m_terms) == 0);
  CHECK(count_off(after.theta, ref.theta, ref.theta_terms) == 0);
  CHECK(after.v == before.v);
}

TEST_CASE("adamw_step_masked updates only the listed entries, without decay") {
  const std::size_t n = 60'000;
  const State before = random_state(n, 3);
  const std::vector<std::uint32_t> idx = random_indices(n, 4);  // ~24k entries: the parallel path
  const State packed = random_state(idx.size(), 5);             // m_new = packed.m, g_bar = packed.g
  const sk::AdamScalars s = step_scalars(2, true);              // decay must be ignored here
  State after = before;
  sk::adamw_step_masked(after.theta, after.m, after.v, idx, packed.m, packed.g, s);

  State expected = before;
  std::vector<double> theta(before.theta.begin(), before.theta.end()), v(n), terms(n);
  for (std::size_t j = 0; j < n; ++j) {
    v[j] = before.v[j];
    terms[j] = std::fabs(before.theta[j]);
  }
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const std::size_t j = idx[k];
    const double g = packed.g[k];
    v[j] = s.beta2 * before.v[j] + (1 - s.beta2) * g * g;
    const double update = s.lr * (packed.m[k] / s.bc1) / (std::sqrt(v[j] / s.bc2) + s.eps);
    theta[j] = before.theta[j] - update;
    terms[j] = std::fabs(before.theta[j]) + std::fabs(update);
    expected.m[j] = packed.m[k];
  }
  CHECK(after.m == expected.m);  // copied, so exact; untouched entries stay exact too
  CHECK(count_off(after.v, v, v) == 0);
  CHECK(count_off(after.theta, theta, terms) == 0);
  std::vector<bool> listed(n, false);
  for (const std::uint32_t j : idx) listed[j] = true;
  std::size_t untouched_changed = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (!listed[j]) untouched_changed += (after.theta[j] != before.theta[j] || after.v[j] != before.v[j]) ? 1 : 0;
  }
  CHECK(untouched_changed == 0);
}

TEST_CASE("adams_step_masked updates only the listed entries, without decay") {
  const std::size_t n = 60'000;
  const State before = random_state(n, 6);
  const std::vector<std::uint32_t> idx = random_indices(n, 7);
  const State packed = random_state(idx.size(), 8);
  const sk::AdamScalars s = step_scalars(4, true);
  State after = before;
  sk::adams_step_masked(after.theta, after.m, idx, packed.m, packed.g, s);

  State expected = before;
  std::vector<double> theta(before.theta.begin(), before.theta.end()), terms(n);
  for (std::size_t j = 0; j < n; ++j) terms[j] = std::fabs(before.theta[j]);
  const double b2 = s.beta2;
  for (std::size_t k = 0; k < idx.size(); ++k) {
    const std::size_t j = idx[k];
    const double g = packed.g[k];
    const double mhat_prev = before.m[j] / s.bc1;  // the stored m, before overwrite
    const double d = std::sqrt(b2 * mhat_prev * mhat_prev + (1 - b2) * g * g) + s.eps;
    const double update = s.lr * (packed.m[k] / s.bc1) / d;
    theta[j] = before.theta[j] - update;
    terms[j] += std::fabs(update);
    expected.m[j] = packed.m[k];
  }
  CHECK(after.m == expected.m);
  CHECK(count_off(after.theta, theta, terms) == 0);
  std::size_t untouched_changed = 0;
  std::size_t k = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (k < idx.size() && idx[k] == j) {
      ++k;
      continue;
    }
    untouched_changed += after.theta[j] != before.theta[j] ? 1 : 0;
  }
  CHECK(untouched_changed == 0);
}

// One element, PyTorch AdamW: lr = 0.1, betas = (0.9, 0.99), eps = 1e-8, weight_decay = 0.1,
// theta0 = 1, m0 = v0 = 0, gradients 0.5, -0.25, 1.0. Each step: theta *= 1 - lr*wd = 0.99;
// m = 0.9 m + 0.1 g; v = 0.99 v + 0.01 g^2; c1 = 1 - 0.9^t; c2 = 1 - 0.99^t;
// theta -= lr * (m/c1) / (sqrt(v/c2) + eps).
//   t=1: theta = 0.99; m = 0.05; v = 0.0025; c1 = 0.1; c2 = 0.01;
//        m/c1 = 0.5; sqrt(v/c2) = sqrt(0.25) = 0.5; step = 0.1 * 0.5 / (0.5 + 1e-8) = 0.099999998
//        theta = 0.99 - 0.099999998 = 0.890000002
//   t=2: theta = 0.890000002 * 0.99 = 0.88110000198; m = 0.045 - 0.025 = 0.02;
//        v = 0.002475 + 0.000625 = 0.0031; c1 = 0.19; c2 = 0.0199;
//        m/c1 = 0.1052631579; v/c2 = 0.1557788945, sqrt = 0.3946883511;
//        step = 0.1 * 0.1052631579 / 0.3946883611 = 0.0266699422
//        theta = 0.88110000198 - 0.0266699422 = 0.8544300597
//   t=3: theta = 0.8544300597 * 0.99 = 0.8458857592; m = 0.018 + 0.1 = 0.118;
//        v = 0.003069 + 0.01 = 0.013069; c1 = 0.271; c2 = 0.029701;
//        m/c1 = 0.4354243542; v/c2 = 0.4400188546, sqrt = 0.6633391701;
//        step = 0.1 * 0.4354243542 / 0.6633391801 = 0.0656412839
//        theta = 0.8458857592 - 0.0656412839 = 0.7802444753
TEST_CASE("adamw_step reproduces a hand-computed PyTorch AdamW trajectory") {
  const double lr = 0.1, b1 = 0.9, b2 = 0.99, wd = 0.1;
  const double grads[] = {0.5, -0.25, 1.0};
  const double expected_theta[] = {0.890000002, 0.8544300597, 0.7802444753};
  std::vector<float> theta{1.0f}, m{0.0f}, v{0.0f}, g{0.0f};
  for (int t = 1; t <= 3; ++t) {
    CAPTURE(t);
    sk::AdamScalars s;  // in double, as the optimizer computes them
    s.lr = lr;
    s.beta1 = b1;
    s.beta2 = b2;
    s.eps = 1e-8;
    s.decay = 1.0 - lr * wd;
    s.bc1 = 1.0 - std::pow(b1, t);
    s.bc2 = 1.0 - std::pow(b2, t);
    g[0] = static_cast<float>(grads[t - 1]);
    sk::adamw_step(theta, m, v, g, s);
    // A few float roundings per step on values ~1: well inside 1e-6 absolute.
    CHECK(std::fabs(theta[0] - expected_theta[t - 1]) < 1e-6);
  }
  // The kernels take 1 - beta from the double scalars, so m and v are within a few fp32
  // roundings (~1e-7 relative) of the exact values. (Had 1 - beta2 been formed from an fp32
  // beta2 = 0.99, v would be off by 1e-6 relative and fail this bound.)
  CHECK(std::fabs(m[0] - 0.118) < 0.118 * 5e-7);
  CHECK(std::fabs(v[0] - 0.013069) < 0.013069 * 5e-7);
}

TEST_CASE("accumulate adds and counts NaN, +inf and -inf") {
  for (const std::size_t n : {std::size_t{10}, std::size_t{200'000}}) {
    CAPTURE(n);
    std::vector<float> acc(n), g(n);
    for (std::size_t j = 0; j < n; ++j) {
      acc[j] = 0.25f * static_cast<float>(j % 97);
      g[j] = 1.0f - 0.125f * static_cast<float>(j % 13);
    }
    const std::vector<float> acc_before = acc;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    g[1] = nan;
    g[n - 1] = -nan;
    g[3] = inf;
    g[n - 3] = -inf;
    g[5] = -inf;
    CHECK(sk::accumulate(acc, g) == 5);
    CHECK(std::isnan(acc[1]));
    CHECK(std::isnan(acc[n - 1]));
    CHECK(acc[3] == inf);
    CHECK(acc[n - 3] == -inf);
    CHECK(acc[5] == -inf);
    std::size_t wrong = 0;
    for (std::size_t j = 0; j < n; ++j) {
      if (std::isfinite(g[j])) wrong += acc[j] != acc_before[j] + g[j] ? 1 : 0;
    }
    CHECK(wrong == 0);
  }
  std::vector<float> acc(4, 0.0f);
  const std::vector<float> finite{1.0f, -2.0f, 3.0e38f, -3.0e38f};
  CHECK(sk::accumulate(acc, finite) == 0);  // large but finite gradients are not counted
}

TEST_CASE("scale multiplies every entry") {
  std::vector<float> x{1.0f, -2.0f, 0.5f, 0.0f};
  sk::scale(x, 0.5f);
  CHECK(x == std::vector<float>{0.5f, -1.0f, 0.25f, 0.0f});
  sk::scale(x, 1.0f);
  CHECK(x == std::vector<float>{0.5f, -1.0f, 0.25f, 0.0f});
}

TEST_CASE("divide divides every entry, IEEE-rounded") {
  // 1/3 is not representable: x / 3 rounds once, x * (1/3) twice, and for x = 5 the two
  // disagree in the last bit (0x3fd55555 vs 0x3fd55556).
  std::vector<float> x{3.0f, -1.5f, 0.0f, -0.0f, 1.0f, 5.0f};
  sk::divide(x, 3.0f);
  CHECK(x[0] == 1.0f);
  CHECK(x[1] == -0.5f);
  CHECK(x[2] == 0.0f);
  CHECK_FALSE(std::signbit(x[2]));  // +0 / 3 stays +0
  CHECK(std::signbit(x[3]));        // -0 / 3 stays -0
  CHECK(x[4] == 1.0f / 3.0f);
  CHECK(std::bit_cast<std::uint32_t>(x[5]) == 0x3fd55555u);
  CHECK(x[5] != 5.0f * (1.0f / 3.0f));
  std::vector<float> big(200'000, 6.0f);  // the parallel path
  sk::divide(big, 4.0f);
  CHECK(big == std::vector<float>(200'000, 1.5f));
}

// The owner's statistic q + (b1 m + a) in one pass must round exactly as the two passes it
// replaced (first_moment_statistic with omb1 = 1, then candidate_momentum adding q), NaN and
// infinities included, on the serial and the parallel path.
TEST_CASE("carried_first_moment_statistic equals the two passes it fuses") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{200'003}}) {
    CAPTURE(n);
    std::mt19937 rng(static_cast<std::uint32_t>(n + 5));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> m(n), a(n), q(n);
    for (std::size_t j = 0; j < n; ++j) {
      m[j] = normal(rng);
      a[j] = normal(rng) * 1e-3f;
      q[j] = normal(rng);
    }
    if (n > 6) {
      a[1] = nan;
      q[2] = -inf;
      m[3] = inf;
      a[3] = -inf;  // inf - inf: NaN
      q[4] = nan;
      m[5] = 3.0e38f;  // overflows to inf in b1 m + a + q
      q[5] = 3.0e38f;
    }
    const float b1 = 0.9f;
    std::vector<float> two_pass(n), fused(n, -1.0f);
    sk::first_moment_statistic(m, a, b1, 1.0f, two_pass);
    CHECK(sk::candidate_momentum(two_pass, q, {}, 1.0f, 0.0f) == 0);
    sk::carried_first_moment_statistic(m, a, q, b1, fused);
    std::size_t differ = 0, off_formula = 0;
    for (std::size_t j = 0; j < n; ++j) {
      differ += std::bit_cast<std::uint32_t>(fused[j]) != std::bit_cast<std::uint32_t>(two_pass[j]) ? 1 : 0;
      const float expected = q[j] + (b1 * m[j] + a[j]);
      const bool same = std::isnan(expected) ? std::isnan(fused[j]) : fused[j] == expected;
      off_formula += same ? 0 : 1;
    }
    CHECK(differ == 0);
    CHECK(off_formula == 0);
    if (n > 6) {
      CHECK(std::isnan(fused[1]));
      CHECK(fused[2] == -inf);
      CHECK(std::isnan(fused[3]));
      CHECK(std::isnan(fused[4]));
      CHECK(fused[5] == inf);
    }
  }
  std::vector<float> a(4), shorter(3);
  CHECK_THROWS_AS(sk::carried_first_moment_statistic(shorter, a, a, 0.9f, a), std::invalid_argument);
  CHECK_THROWS_AS(sk::carried_first_moment_statistic(a, shorter, a, 0.9f, a), std::invalid_argument);
  CHECK_THROWS_AS(sk::carried_first_moment_statistic(a, a, shorter, 0.9f, a), std::invalid_argument);
}

TEST_CASE("adam kernels reject mismatched sizes") {
  std::vector<float> a(4), b(4), c(4), d(4), shorter(3);
  const std::vector<std::uint32_t> idx{0, 2};
  std::vector<float> two(2), one(1);
  sk::AdamScalars s;
  CHECK_THROWS_AS(sk::adamw_step(a, b, c, shorter, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adamw_step(a, shorter, c, d, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adamw_step(a, b, shorter, d, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adams_step(a, shorter, d, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adams_step(a, b, shorter, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adamw_step_masked(a, b, shorter, idx, two, two, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adamw_step_masked(a, b, c, idx, one, two, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adamw_step_masked(a, b, c, idx, two, one, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adams_step_masked(a, shorter, idx, two, two, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adams_step_masked(a, b, idx, one, two, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::adams_step_masked(a, b, idx, two, one, s), std::invalid_argument);
  CHECK_THROWS_AS(sk::accumulate(a, shorter), std::invalid_argument);
}

TEST_CASE("carry_momentum_off_mask: q carried and m cleared off the mask, q cleared on it") {
  // Bits 62..65 straddle two mask words: j = 1 and 2 are on the mask. b1 = 0.5, gamma = 0.5.
  std::vector<float> q = {1, 2, 3, 4}, m = {10, 20, 30, 40};
  const std::vector<std::uint64_t> mask = {std::uint64_t{1} << 63, 1};
  sk::carry_momentum_off_mask(q, m, mask, 62, 0.5f, 0.5f);
  CHECK(q == std::vector<float>{(0.5f * 10 + 1) * 0.5f, 0, 0, (0.5f * 40 + 4) * 0.5f});
  CHECK(m == std::vector<float>{0, 20, 30, 0});
  CHECK_THROWS_AS(sk::carry_momentum_off_mask(q, m, std::span<const std::uint64_t>(mask).first(1), 62, 0.5f, 1.0f),
                  std::invalid_argument);
  std::vector<float> short_m(3);
  CHECK_THROWS_AS(sk::carry_momentum_off_mask(q, short_m, mask, 0, 0.5f, 1.0f), std::invalid_argument);
}

// The one pass must leave q and m bit for bit as the passes it replaced: candidate_momentum
// (g empty), scale by gamma, zero_at on the mask for q; fill(m, 0) then m kept on the mask.
TEST_CASE("carry_momentum_off_mask equals the passes it fuses") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::size_t n : {std::size_t{7}, std::size_t{200'003}}) {
    for (const std::size_t first_bit : {std::size_t{0}, std::size_t{37}}) {
      for (const float gamma : {1.0f, 0.7f}) {
        CAPTURE(n);
        CAPTURE(first_bit);
        CAPTURE(gamma);
        std::mt19937 rng(static_cast<std::uint32_t>(n + first_bit));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> m(n), q(n);
        for (std::size_t j = 0; j < n; ++j) {
          m[j] = normal(rng);
          q[j] = normal(rng);
        }
        m[n / 2] = nan;
        q[n / 3] = -0.0f;
        std::vector<std::uint64_t> mask(sk::words_for(first_bit + n));
        std::vector<std::uint32_t> on;
        for (std::size_t j = 0; j < n; ++j) {
          if (rng() % 10 != 0) continue;
          mask[(first_bit + j) / 64] |= std::uint64_t{1} << ((first_bit + j) % 64);
          on.push_back(static_cast<std::uint32_t>(j));
        }
        std::vector<float> q_passes = q, m_passes = m, q_fused = q, m_fused = m;
        sk::candidate_momentum(q_passes, m, {}, 0.9f, 0.0f);
        sk::scale(q_passes, gamma);
        sk::zero_at(q_passes, on);
        std::vector<float> on_values(on.size());
        sk::compact(m, on, on_values);
        sk::fill(m_passes, 0.0f);
        sk::expand(on_values, on, m_passes);
        sk::carry_momentum_off_mask(q_fused, m_fused, mask, first_bit, 0.9f, gamma);
        std::size_t differ = 0;
        for (std::size_t j = 0; j < n; ++j) {
          differ += std::bit_cast<std::uint32_t>(q_fused[j]) != std::bit_cast<std::uint32_t>(q_passes[j]) ? 1 : 0;
          differ += std::bit_cast<std::uint32_t>(m_fused[j]) != std::bit_cast<std::uint32_t>(m_passes[j]) ? 1 : 0;
        }
        CHECK(differ == 0);
        CHECK(!on.empty());
      }
    }
  }
}
