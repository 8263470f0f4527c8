// The metrics reductions (kernels/cpu/reduce.*) on hand-computed inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/kernels.hpp"

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
