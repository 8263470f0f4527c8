// The comparison baselines beyond raw top-k (docs/algorithms.md, "Random-k with a shared
// seed"): properties the invariant and reference tests do not already cover -- the mask every
// worker shares, its uniformity, the dense limit, and that no index is ever sent.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "core/schedule.hpp"
#include "quadratic_run.hpp"

using namespace scape;
using scape::testing::bit;
using scape::testing::mixed_layout;
using scape::testing::run_quadratic;

namespace {

OptimizerConfig randk_config(double density, std::uint64_t seed = 5) {
  OptimizerConfig c;
  c.type = OptimizerType::randk_ef;
  c.sharded = false;
  c.sparsity = 1.0 - density;
  c.lr = 1e-2;
  c.warmup_steps = 2;
  c.seed = seed;
  return c;
}

std::size_t popcount(const std::vector<std::uint64_t>& words) {
  std::size_t bits = 0;
  for (std::uint64_t w : words) bits += static_cast<std::size_t>(__builtin_popcountll(w));
  return bits;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("random-k: every worker uses the same K coordinates, new ones each step, set by the seed") {
  const ParamLayout layout = mixed_layout(4);
  const std::size_t n = layout.size();
  for (int w : {1, 2, 4, 7}) {
    CAPTURE(w);
    const auto run = run_quadratic(randk_config(0.05), layout, w, 8);
    for (std::size_t t = 0; t < 8; ++t) {
      CHECK(popcount(run.steps[0][t].mask) == k_for(0.05, n));
      for (int i = 1; i < w; ++i) CHECK(run.steps[static_cast<std::size_t>(i)][t].mask == run.steps[0][t].mask);
      // Every replica stays identical: the same g_bar reaches every worker.
      for (int i = 1; i < w; ++i) CHECK(same_bits(run.steps[static_cast<std::size_t>(i)][t].params_after, run.steps[0][t].params_after));
      if (t > 0) CHECK(run.steps[0][t].mask != run.steps[0][t - 1].mask);
      CHECK(run.steps[0][t].metrics.fill_in == 1.0);
    }
    // The mask does not depend on the gradients (another quadratic, same masks) but on the seed.
    const auto other_problem = run_quadratic(randk_config(0.05), layout, w, 8, 99);
    const auto other_seed = run_quadratic(randk_config(0.05, 6), layout, w, 8);
    CHECK(other_problem.steps[0][3].mask == run.steps[0][3].mask);
    CHECK(other_seed.steps[0][3].mask != run.steps[0][3].mask);
  }
}

TEST_CASE("random-k: each coordinate is picked with probability K / N") {
  // 300 steps at density 0.1: each coordinate's count is Binomial(300, ~0.1), mean 30, sd 5.2.
  // The mean over all coordinates is exactly 30 (K per step); a biased draw (say, towards low
  // indices, as a broken tie rule would give) shows in the halves and in the spread.
  ParamLayout layout;
  layout.add("w", {2000}, true);
  const int steps = 300;
  OptimizerConfig c = randk_config(0.1);
  c.lr = 1e-6;
  const auto run = run_quadratic(c, layout, 1, steps);
  std::vector<int> counts(layout.size(), 0);
  for (const auto& s : run.steps[0]) {
    for (std::size_t j = 0; j < layout.size(); ++j) counts[j] += bit(s.mask, j);
  }
  double first_half = 0, sum = 0, sum_sq = 0;
  for (std::size_t j = 0; j < counts.size(); ++j) {
    if (j < counts.size() / 2) first_half += counts[j];
    sum += counts[j];
    sum_sq += double(counts[j]) * counts[j];
  }
  const double mean = sum / counts.size();
  const double var = sum_sq / counts.size() - mean * mean;
  CHECK(mean == doctest::Approx(30.0));
  // Half the picks in each half: the sd of first_half is about sqrt(2000 * 27 / 2 / 2) ~ 82.
  CHECK(std::fabs(first_half - sum / 2) < 400);
  // Binomial variance n p (1 - p) = 27 (without replacement a little less); 3x off means a bug.
  CHECK(var > 27.0 / 2);
  CHECK(var < 27.0 * 1.5);
}

TEST_CASE("random-k at density 1 is dense replicated AdamS (AdamW with inner = adamw), bit for bit") {
  const ParamLayout layout = mixed_layout(2);
  for (int w : {1, 2, 4, 7}) {
    for (InnerRule inner : {InnerRule::adams, InnerRule::adamw}) {
      CAPTURE(w);
      CAPTURE(to_string(inner));
      OptimizerConfig sparse = randk_config(1.0);
      sparse.inner = inner;
      OptimizerConfig dense = sparse;
      dense.type = inner == InnerRule::adams ? OptimizerType::adams : OptimizerType::adamw;
      const auto a = run_quadratic(sparse, layout, w, 10);
      const auto b = run_quadratic(dense, layout, w, 10);
      for (std::size_t t = 0; t < 10; ++t) {
        CHECK(same_bits(a.steps[0][t].params_after, b.steps[0][t].params_after));
        CHECK(a.steps[0][t].metrics.residual_norm == 0.0);
      }
      // The same collective, of the same size: no index travels.
      CHECK(a.ledger_totals.at("grad_all_reduce").payload_bytes == b.ledger_totals.at("grad_all_reduce").payload_bytes);
    }
  }
}
