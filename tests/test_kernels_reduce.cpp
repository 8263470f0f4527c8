// The metrics reductions (kernels/cpu/reduce.*) on hand-computed inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/kernels.hpp"
#include "kernels/update_stats.hpp"

using namespace scape;

TEST_CASE("block_sum_squares sums each fixed block of squares") {
  const std::vector<float> x = {1, -2, 3, 4, 0.5f, -6, 7};
  std::vector<double> partial(3);
  kernels::block_sum_squares(x, 3, partial);
  CHECK(partial == std::vector<double>{1 + 4 + 9, 16 + 0.25 + 36, 49});
  std::vector<double> one(1);
  kernels::block_sum_squares(x, 8192, one);
  CHECK(one[0] == 1 + 4 + 9 + 16 + 0.25 + 36 + 49);
  std::vector<double> none;
  kernels::block_sum_squares(std::vector<float>{}, 4, none);
  // Squares are taken in double: 3e20^2 overflows float but not double.
  std::vector<double> big(1);
  kernels::block_sum_squares(std::vector<float>{3e20f}, 1, big);
  CHECK(big[0] == doctest::Approx(9e40));
  CHECK_THROWS_AS(kernels::block_sum_squares(x, 3, std::span<double>(partial.data(), 2)), std::invalid_argument);
  CHECK_THROWS_AS(kernels::block_sum_squares(x, 0, partial), std::invalid_argument);
}

TEST_CASE("block_sum_squares and update_statistics sum each block in lane order") {
  // 24 elements: 2^27 (square 2^54) then 23 ones. In index order every +1 is lost to rounding
  // (the spacing of doubles at 2^54 is 4): 2^54. In lane order lane 0 holds 2^54 (its two ones
  // lost), lanes 1..7 hold 3 each; adding the lanes in order, each +3 rounds to +4: 2^54 + 28.
  std::vector<float> x(24, 1.0f);
  x[0] = 0x1p27f;
  std::vector<double> partial(1);
  kernels::block_sum_squares(x, 24, partial);
  CHECK(partial[0] == 0x1p54 + 28);
  // A tail of len mod 8 elements is added after the lanes, in index order: 2^54 + 28 + 1 + 1
  // loses both ones (2^54 + 29 rounds to 2^54 + 28, and again).
  x.push_back(1.0f);
  x.push_back(1.0f);
  kernels::block_sum_squares(x, 26, partial);
  CHECK(partial[0] == 0x1p54 + 28);
  // update_statistics sums theta^2 and d^2 in the same order: with before = 0, d = theta.
  const std::vector<float> before(x.size(), 0.0f);
  std::vector<std::int8_t> sign(x.size(), 0);
  std::vector<double> stats(kernels::kUpdateStats);
  kernels::update_statistics(x, before, {}, false, sign, x.size(), stats);
  CHECK(stats[0] == 0x1p54 + 28);
  CHECK(stats[1] == 0x1p54 + 28);
  CHECK(stats[2] == 0x1p27);
}

TEST_CASE("max_magnitude: the largest |x|, NaN when any entry is NaN") {
  CHECK(kernels::max_magnitude(std::vector<float>{1, -7.5f, 3}) == 7.5f);
  CHECK(kernels::max_magnitude(std::vector<float>{}) == 0.0f);
  CHECK(kernels::max_magnitude(std::vector<float>{-std::numeric_limits<float>::infinity(), 2}) ==
        std::numeric_limits<float>::infinity());
  std::vector<float> x(100000, 1.0f);
  x[77777] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(kernels::max_magnitude(x)));
  x[77777] = -std::numeric_limits<float>::quiet_NaN();  // a NaN with its sign bit set
  CHECK(std::isnan(kernels::max_magnitude(x)));
  CHECK(std::isnan(kernels::max_magnitude(std::vector<float>{std::numeric_limits<float>::infinity(),
                                                             std::numeric_limits<float>::signaling_NaN()})));
  // Signed zeros and subnormals order as their magnitudes.
  CHECK(std::signbit(kernels::max_magnitude(std::vector<float>{-0.0f})) == false);
  const float tiny = std::numeric_limits<float>::denorm_min();
  CHECK(kernels::max_magnitude(std::vector<float>{-3 * tiny, 2 * tiny, -0.0f}) == 3 * tiny);
  // Against std::fabs and std::max on a long array of mixed signs and scales (the parallel path).
  std::vector<float> y(300001);
  float want = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    y[i] = static_cast<float>((i * 2654435761u) % 1000003) * std::ldexp(1.0f, static_cast<int>(i % 60) - 30) *
           (i % 3 == 0 ? -1.0f : 1.0f);
    want = std::max(want, std::fabs(y[i]));
  }
  CHECK(kernels::max_magnitude(y) == want);
}

TEST_CASE("count_nonfinite counts NaN and both infinities, nothing else") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(kernels::count_nonfinite(std::vector<float>{}) == 0);
  CHECK(kernels::count_nonfinite(std::vector<float>{1, -inf, nan, 0, inf, std::numeric_limits<float>::max(),
                                                     std::numeric_limits<float>::denorm_min()}) == 3);
  std::vector<float> x(200000, 1.0f);  // the parallel path
  for (std::size_t j = 0; j < x.size(); j += 1000) x[j] = (j / 1000) % 2 ? nan : -inf;
  CHECK(kernels::count_nonfinite(x) == 200);
}

TEST_CASE("update_statistics: sums, maximum, sign flips and new signs on a hand-worked case") {
  // d = theta - before = {+1, -2, 0, +3, -0.5}; coordinate 3 is not stepped.
  const std::vector<float> theta = {2, -1, 5, 4, 0.5f}, before = {1, 1, 5, 1, 1};
  const std::vector<std::uint64_t> stepped = {0b10111};
  std::vector<std::int8_t> sign = {1, 1, -1, 1, 0};  // the previous step's signs
  std::vector<double> stats(2 * kernels::kUpdateStats);
  kernels::update_statistics(theta, before, stepped, true, sign, 3, stats);
  // Block 0 = coordinates 0..2: d^2 1 + 4 + 0, theta^2 4 + 1 + 25, max |d| 2; stepped with a
  // previous sign: 0 (same sign) and 1 (flipped); 2 has d = 0 and counts nowhere.
  CHECK(stats[0] == 5.0);
  CHECK(stats[1] == 30.0);
  CHECK(stats[2] == 2.0);
  CHECK(stats[3] == 2.0);
  CHECK(stats[4] == 1.0);
  // Block 1 = coordinates 3, 4: coordinate 3 is not stepped (sign 0); 4 had sign 0 before.
  CHECK(stats[5] == 9.25);
  CHECK(stats[6] == 16.25);
  CHECK(stats[7] == 3.0);
  CHECK(stats[8] == 0.0);
  CHECK(stats[9] == 0.0);
  CHECK(sign == std::vector<std::int8_t>{1, -1, 0, 0, -1});
  // Without a previous step nothing is counted; with every coordinate stepped 3 gets its sign.
  kernels::update_statistics(theta, before, {}, false, sign, 3, stats);
  CHECK(stats[3] == 0.0);
  CHECK(stats[4] == 0.0);
  CHECK(sign == std::vector<std::int8_t>{1, -1, 0, 1, -1});
  // NaN in d makes its block's maximum NaN.
  std::vector<float> bad = theta;
  bad[4] = std::numeric_limits<float>::quiet_NaN();
  kernels::update_statistics(bad, before, {}, true, sign, 3, stats);
  CHECK(stats[2] == 2.0);
  CHECK(std::isnan(stats[7]));
  std::vector<double> wrong(3);
  CHECK_THROWS_AS(kernels::update_statistics(theta, before, {}, true, sign, 3, wrong), std::invalid_argument);
}

TEST_CASE("update_statistics equals its definition on every block size and alignment") {
  // The kernel reads each block once, 64 coordinates at a time; its contract is three walks of
  // the block: the two sums in lane order (kernels/sum_squares.hpp), the maximum of |d| (NaN
  // when a d is NaN), then the signs word by word. Blocks of 1, 7, 100 (starts not on a word:
  // pieces straddle two words of `stepped`), 64, 8192 and 8200, on values whose squares round
  // differently in another order, with NaN, signed zeros and unstepped coordinates.
  const std::size_t n = 20000;
  std::vector<float> theta(n), before(n);
  std::vector<std::uint64_t> stepped(kernels::words_for(n));
  std::vector<std::int8_t> previous_sign(n);
  for (std::size_t j = 0; j < n; ++j) {
    const auto h = static_cast<std::uint32_t>(j * 2654435761u);
    theta[j] = std::ldexp(static_cast<float>(h % 1000003) - 500000.0f, static_cast<int>(h % 40) - 20);
    before[j] =
        j % 5 == 0 ? theta[j] : std::ldexp(static_cast<float>((h >> 7) % 999) - 499.0f, -static_cast<int>(j % 9));
    previous_sign[j] = static_cast<std::int8_t>(static_cast<int>((h >> 3) % 3) - 1);
    stepped[j / 64] |= static_cast<std::uint64_t>((h >> 11) % 4 != 0) << (j % 64);
  }
  theta[12345] = std::numeric_limits<float>::quiet_NaN();
  theta[777] = -0.0f;
  before[777] = 0.0f;
  for (const std::size_t block :
       {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{100}, std::size_t{8192}, std::size_t{8200}}) {
    const std::size_t blocks = (n + block - 1) / block;
    std::vector<double> got(kernels::kUpdateStats * blocks);
    std::vector<std::int8_t> sign = previous_sign;
    kernels::update_statistics(theta, before, stepped, true, sign, block, got);
    for (std::size_t b = 0; b < blocks; ++b) {
      const std::size_t lo = b * block, hi = std::min(n, lo + block);
      double max = 0;
      bool nan = false;
      double both = 0, flipped = 0;
      for (std::size_t j = lo; j < hi; ++j) {
        const float d = theta[j] - before[j];
        nan = nan || std::isnan(d);
        max = std::max(max, static_cast<double>(std::fabs(d)));
        const int s = (stepped[j / 64] >> (j % 64)) & 1u ? (d > 0) - (d < 0) : 0;
        if (s != 0 && previous_sign[j] != 0) {
          both += 1;
          flipped += s != previous_sign[j] ? 1 : 0;
        }
        REQUIRE(sign[j] == s);
      }
      const double* s = got.data() + kernels::kUpdateStats * b;
      const auto same = [](double x, double y) { return x == y || (std::isnan(x) && std::isnan(y)); };
      CHECK(same(s[0], kernels::block_sum_of_squared_differences(theta.data(), before.data(), lo, hi)));
      CHECK(same(s[1], kernels::block_sum_of_squares(theta.data(), lo, hi)));
      if (nan) {
        CHECK(std::isnan(s[2]));
      } else {
        CHECK(s[2] == max);
      }
      CHECK(s[3] == both);
      CHECK(s[4] == flipped);
    }
  }
}

TEST_CASE("block_sum_squares_max: block_sum_squares' sums and each block's largest |x|") {
  const std::vector<float> x = {1, -2, 3, 4, 0.5f, -6, 7};
  std::vector<double> partial(3);
  std::vector<float> peak(3);
  kernels::block_sum_squares_max(x, 3, partial, peak);
  CHECK(partial == std::vector<double>{1 + 4 + 9, 16 + 0.25 + 36, 49});
  CHECK(peak == std::vector<float>{3, 6, 7});
  // The lane order of block_sum_squares (2^54 + 28, see above), and a NaN only in its own block.
  std::vector<float> y(24, 1.0f);
  y[0] = 0x1p27f;
  y.push_back(-0.0f);
  y.push_back(std::numeric_limits<float>::quiet_NaN());
  partial.assign(2, 0);
  peak.assign(2, 0);
  kernels::block_sum_squares_max(y, 24, partial, peak);
  CHECK(partial[0] == 0x1p54 + 28);
  CHECK(peak[0] == 0x1p27f);
  CHECK(std::isnan(partial[1]));
  CHECK(std::isnan(peak[1]));
  // -0 alone is +0, as max_magnitude gives it.
  kernels::block_sum_squares_max(std::vector<float>{-0.0f}, 1, std::span<double>(partial).first(1),
                                 std::span<float>(peak).first(1));
  CHECK(peak[0] == 0.0f);
  CHECK(!std::signbit(peak[0]));
  std::vector<double> three(3);
  std::vector<float> short_peak(2);
  CHECK_THROWS_AS(kernels::block_sum_squares_max(x, 3, three, short_peak), std::invalid_argument);
  CHECK_THROWS_AS(kernels::block_sum_squares_max(x, 0, three, short_peak), std::invalid_argument);
}

namespace {

// A step as SCAPE's masked update makes it: every coordinate times its piece's factor, then the
// stepped coordinates moved from their decayed value (by an update that depends on it).
float stepped_value(float decayed, std::size_t j) { return decayed * 0.75f - 0.001f * static_cast<float>(j % 7); }

struct DecayCase {
  std::vector<float> theta;
  std::vector<std::uint64_t> ends;
  std::vector<float> factors;
  std::vector<std::uint32_t> stepped;
  std::vector<std::int8_t> sign;
};

DecayCase decay_case(std::size_t n, std::uint32_t seed) {
  DecayCase c;
  std::uint32_t x = seed;
  const auto next = [&x] { return x = x * 1664525u + 1013904223u; };
  for (std::size_t j = 0; j < n; ++j) {
    c.theta.push_back(static_cast<float>(static_cast<int>(next() % 20001) - 10000) * 1e-4f);
    c.sign.push_back(static_cast<std::int8_t>(static_cast<int>(next() % 3) - 1));
    if (next() % 10 == 0) c.stepped.push_back(static_cast<std::uint32_t>(j));
  }
  if (n > 3) c.theta[3] = std::numeric_limits<float>::quiet_NaN();
  if (n > 70) c.theta[70] = -0.0f;
  // Pieces of uneven lengths that straddle the kernels' 64-coordinate pieces and blocks, some
  // decayed and some not, the last ending at n.
  for (std::size_t end = 0; end < n;) {
    end = std::min(n, end + 1 + next() % 300);
    c.ends.push_back(end);
    c.factors.push_back(next() % 2 == 0 ? 0.999f : 1.0f);
  }
  return c;
}

}  // namespace

TEST_CASE("keep_and_decay_at + decay_update_statistics equal the decay, the step and update_statistics bit for bit") {
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{65}, std::size_t{1000},
                              std::size_t{8193}, std::size_t{100'003}}) {
    for (const std::size_t block : {std::size_t{1}, std::size_t{64}, std::size_t{100}, std::size_t{8192}}) {
      for (const bool previous : {false, true}) {
        CAPTURE(n);
        CAPTURE(block);
        CAPTURE(previous);
        const DecayCase c = decay_case(n, static_cast<std::uint32_t>(n * 7 + block));
        // The reference: decay every piece, step the stepped coordinates, update_statistics.
        std::vector<float> want = c.theta;
        for (std::size_t p = 0, lo = 0; p < c.ends.size(); lo = c.ends[p], ++p) {
          kernels::scale(std::span<float>(want).subspan(lo, c.ends[p] - lo), c.factors[p]);
        }
        std::vector<std::uint64_t> bits(kernels::words_for(n), 0);
        for (const std::uint32_t j : c.stepped) {
          want[j] = stepped_value(want[j], j);
          bits[j / 64] |= std::uint64_t{1} << (j % 64);
        }
        const std::size_t blocks = (n + block - 1) / block;
        std::vector<double> want_stats(kernels::kUpdateStats * blocks);
        std::vector<std::int8_t> want_sign = c.sign;
        kernels::update_statistics(want, c.theta, bits, previous, want_sign, block, want_stats);

        std::vector<float> got = c.theta;
        std::vector<float> kept(c.stepped.size());
        kernels::keep_and_decay_at(got, c.stepped, c.ends, c.factors, kept);
        for (std::size_t k = 0; k < c.stepped.size(); ++k) {
          CHECK(std::memcmp(&kept[k], &c.theta[c.stepped[k]], sizeof(float)) == 0);
          got[c.stepped[k]] = stepped_value(got[c.stepped[k]], c.stepped[k]);
        }
        std::vector<double> got_stats(kernels::kUpdateStats * blocks);
        std::vector<std::int8_t> got_sign = c.sign;
        kernels::decay_update_statistics(got, c.ends, c.factors, c.stepped, kept, previous, got_sign, block, got_stats);
        // memcmp's pointers must not be null, as an empty vector's data() may be.
        CHECK((n == 0 || std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0));
        CHECK(
            (blocks == 0 || std::memcmp(got_stats.data(), want_stats.data(), got_stats.size() * sizeof(double)) == 0));
        CHECK(got_sign == want_sign);
      }
    }
  }
}

TEST_CASE("decay_update_statistics by hand, and its errors name the buffer") {
  // Pieces [0, 2) decayed by 1/2 and [2, 4) not; coordinate 1 stepped from 4 (kept) to 5.
  std::vector<float> theta = {2, 5, 3, -1};
  const std::vector<std::uint64_t> ends = {2, 4};
  const std::vector<float> factors = {0.5f, 1.0f};
  const std::vector<std::uint32_t> stepped = {1};
  const std::vector<float> kept = {4};
  std::vector<std::int8_t> sign = {1, -1, 0, 1};
  std::vector<double> stats(kernels::kUpdateStats);
  kernels::decay_update_statistics(theta, ends, factors, stepped, kept, true, sign, 4, stats);
  CHECK(theta == std::vector<float>{1, 5, 3, -1});
  CHECK(stats[0] == 1 + 1);           // d = -1 (decay of 2), +1 (the step); 0, 0
  CHECK(stats[1] == 1 + 25 + 9 + 1);  // ||theta after||^2
  CHECK(stats[2] == 1);
  CHECK(stats[3] == 1);  // only the stepped coordinate has a sign, and its previous one was -1
  CHECK(stats[4] == 1);
  CHECK(sign == std::vector<std::int8_t>{0, 1, 0, 0});
  // Without signs (a worker that measures only ||theta||): the same sums, no counts.
  std::vector<float> again = {2, 5, 3, -1};
  std::vector<double> norm_only(kernels::kUpdateStats);
  kernels::decay_update_statistics(again, ends, factors, stepped, kept, true, {}, 4, norm_only);
  CHECK(again == theta);
  CHECK(norm_only == std::vector<double>{2, 36, 1, 0, 0});

  std::vector<float> four(4, 1.0f), one_kept(1), two_kept(2), no_kept;
  CHECK_THROWS_WITH_AS(
      kernels::keep_and_decay_at(four, stepped, std::vector<std::uint64_t>{3}, std::vector<float>{1}, one_kept),
      "keep_and_decay_at: the pieces end at 3, before N = 4", std::invalid_argument);
  CHECK_THROWS_WITH_AS(kernels::keep_and_decay_at(four, std::vector<std::uint32_t>{2, 1}, ends, factors, two_kept),
                       "keep_and_decay_at: stepped[1] = 1 is not ascending below N = 4", std::invalid_argument);
  CHECK_THROWS_WITH_AS(
      kernels::decay_update_statistics(four, ends, std::vector<float>{1}, stepped, kept, false, sign, 4, stats),
      "decay_update_statistics: piece_factors: buffer holds 1 entries, expected 2", std::invalid_argument);
  CHECK_THROWS_WITH_AS(kernels::decay_update_statistics(four, {}, {}, {}, {}, false, sign, 4, stats),
                       "decay_update_statistics: no pieces for 4 coordinates", std::invalid_argument);
  CHECK_THROWS_AS(kernels::decay_update_statistics(four, ends, factors, stepped, no_kept, false, sign, 4, stats),
                  std::invalid_argument);
}
