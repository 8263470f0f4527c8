// PowerSGD's and DeMo's kernels against hand-computed values and their defining identities
// (kernels/kernel_list.inc, "Low-rank and chunked-DCT compression"; docs/algorithms.md
// "PowerSGD" and "DeMo").
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "kernels/compressor_math.hpp"
#include "kernels/cpu/kernels.hpp"
#include "optimizers/baselines/deco_momentum.hpp"

namespace sk = scape::kernels;

TEST_CASE("lowrank_project, lowrank_project_t and lowrank_residual: M Q, M^T P and P Q^T by hand") {
  // M = [[1, 2, 3], [4, 5, 6]] (2 x 3), Q = [[1, 0], [0, 1], [1, 1]] (3 x 2).
  const std::vector<float> m = {1, 2, 3, 4, 5, 6};
  const std::vector<float> q = {1, 0, 0, 1, 1, 1};
  std::vector<float> p(4);
  sk::lowrank_project(m, 2, 3, q, p);
  CHECK(p == std::vector<float>{4, 5, 10, 11});
  std::vector<float> qt(6);
  sk::lowrank_project_t(m, 2, 3, p, qt);  // M^T P: [[44, 49], [58, 65], [72, 81]]
  CHECK(qt == std::vector<float>{44, 49, 58, 65, 72, 81});
  // P Q^T with P = [[1, 0], [0, 2]], Q = [[1, 0], [0, 1], [1, 1]]: [[1, 0, 1], [0, 2, 2]].
  std::vector<float> e = m, approx(6);
  sk::lowrank_residual(e, 2, 3, std::vector<float>{1, 0, 0, 2}, q, approx);
  CHECK(approx == std::vector<float>{1, 0, 1, 0, 2, 2});
  CHECK(e == std::vector<float>{0, 2, 2, 4, 3, 4});
  const std::vector<float> five(5);
  CHECK_THROWS_WITH_AS(sk::lowrank_project(m, 2, 3, five, p), doctest::Contains("lowrank_project"),
                       std::invalid_argument);
  CHECK_THROWS_AS(sk::lowrank_project_t(m, 3, 3, p, qt), std::invalid_argument);
}

TEST_CASE("lowrank_project_t's blocked row walk adds each entry's terms in row order, as the shared formula") {
  // The CPU kernel walks blocks of columns row by row; the CUDA twin evaluates
  // compressor::transposed_product_entry per entry. Both must round the same sums.
  const std::size_t rows = 300, cols = 700, rank = 3;
  std::vector<float> m(rows * cols), p(rows * rank), q(cols * rank);
  for (std::size_t j = 0; j < m.size(); ++j) m[j] = std::sin(0.37f * static_cast<float>(j)) * (1.0f + static_cast<float>(j % 7));
  for (std::size_t j = 0; j < p.size(); ++j) p[j] = std::cos(0.11f * static_cast<float>(j));
  sk::lowrank_project_t(m, rows, cols, p, q);
  for (std::size_t j = 0; j < cols; ++j) {
    for (std::size_t c = 0; c < rank; ++c) {
      CHECK(q[j * rank + c] == sk::compressor::transposed_product_entry(m.data(), p.data(), rows, cols, rank, j, c));
    }
  }
}

TEST_CASE("orthonormalize_columns: Gram-Schmidt in column order, a zero column stays zero") {
  // Columns (3, 4, 0) and (1, 0, 0), then a zero column: (0.6, 0.8, 0); (1,0,0) - 0.6 (0.6, 0.8, 0)
  // = (0.64, -0.48, 0), norm 0.8: (0.8, -0.6, 0).
  std::vector<float> p = {3, 1, 0, 4, 0, 0, 0, 0, 0};
  sk::orthonormalize_columns(p, 3);
  const std::vector<float> want = {0.6f, 0.8f, 0, 0.8f, -0.6f, 0, 0, 0, 0};
  for (std::size_t i = 0; i < p.size(); ++i) CHECK(p[i] == doctest::Approx(want[i]).epsilon(1e-6));
  CHECK_THROWS_AS(sk::orthonormalize_columns(p, 4), std::invalid_argument);
}

TEST_CASE("dct_basis is orthonormal; chunk_transform and its transpose round-trip to rounding") {
  for (std::size_t len : {std::size_t{1}, std::size_t{3}, std::size_t{8}, std::size_t{64}}) {
    CAPTURE(len);
    const auto b = scape::dct_basis(len);
    for (std::size_t f = 0; f < len; ++f) {
      for (std::size_t g = 0; g < len; ++g) {
        double dot = 0;
        for (std::size_t j = 0; j < len; ++j) dot += double(b[f * len + j]) * b[g * len + j];
        CHECK(dot == doctest::Approx(f == g ? 1.0 : 0.0).epsilon(1e-6));
      }
    }
    std::vector<float> x(3 * len), y(3 * len), back(3 * len);
    for (std::size_t j = 0; j < x.size(); ++j) x[j] = std::sin(0.7f * static_cast<float>(j)) + 0.1f * static_cast<float>(j);
    sk::chunk_transform(x, len, b, false, y);
    sk::chunk_transform(y, len, b, true, back);
    for (std::size_t j = 0; j < x.size(); ++j) CHECK(back[j] == doctest::Approx(x[j]).epsilon(1e-5));
  }
  // Length 2 by hand: [[1, 1], [1, -1]] / sqrt(2).
  const auto b2 = scape::dct_basis(2);
  std::vector<float> y(2);
  sk::chunk_transform(std::vector<float>{1, 3}, 2, b2, false, y);
  CHECK(y[0] == doctest::Approx(4 / std::sqrt(2.0)));
  CHECK(y[1] == doctest::Approx(-2 / std::sqrt(2.0)));
  std::vector<float> five(5);
  CHECK_THROWS_WITH_AS(sk::chunk_transform(five, 2, b2, false, five), doctest::Contains("whole chunks"),
                       std::invalid_argument);
}

TEST_CASE("chunk_topk: per chunk the k largest magnitudes, ties to the lower index, ascending; short tail") {
  // Chunks of 4: {1, -5, 5, 2} keeps indices 1, 2 (|5| tie: both); {0, 3, -3, 3} keeps 1 and 2
  // (three tied at 3: the two lowest); the tail {7} keeps its only entry.
  const std::vector<float> y = {1, -5, 5, 2, 0, 3, -3, 3, 7};
  CHECK(sk::chunk_topk_count(9, 4, 2) == 5);
  std::vector<std::uint32_t> idx(5);
  std::vector<float> values(5);
  sk::chunk_topk(y, 4, 2, idx, values);
  CHECK(idx == std::vector<std::uint32_t>{1, 2, 5, 6, 8});
  CHECK(values == std::vector<float>{-5, 5, 3, -3, 7});
  // k = chunk keeps everything.
  std::vector<std::uint32_t> all(9);
  std::vector<float> all_values(9);
  sk::chunk_topk(y, 4, 4, all, all_values);
  CHECK(all_values == y);
  std::vector<std::uint32_t> short_idx(4);
  CHECK_THROWS_WITH_AS(sk::chunk_topk(y, 4, 2, short_idx, values), doctest::Contains("chunk_topk"),
                       std::invalid_argument);
}

TEST_CASE("sign_descent: theta - lr sign(u), zero leaves theta, NaN propagates") {
  std::vector<float> theta = {1, 1, 1, 1, 1};
  sk::sign_descent(theta, std::vector<float>{2, -3, 0, -0.0f, NAN}, 0.25f);
  CHECK(theta[0] == 0.75f);
  CHECK(theta[1] == 1.25f);
  CHECK(theta[2] == 1.0f);
  CHECK(theta[3] == 1.0f);
  CHECK(std::isnan(theta[4]));
}
