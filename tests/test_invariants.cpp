// The seven invariants of docs/algorithms.md ("Invariants"), each at W in {1, 2, 4, 7}
// (7 gives uneven shards) and densities 1, 0.1 and 0.01, on the noisy quadratic; then
// invariant 1 under residual_decay and the properties of residual_clip.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "core/ledger.hpp"
#include "core/schedule.hpp"
#include "optimizers/make_optimizer.hpp"
#include "quadratic_run.hpp"
#include "tests/earlier_formulation.hpp"

using namespace scape;
using namespace scape::testing;  // the quadratic harness: run_quadratic, mixed_layout, bit, ...

namespace {

const int kWorkers[] = {1, 2, 4, 7};
const double kDensities[] = {1.0, 0.1, 0.01};
constexpr int kSteps = 12;
constexpr double kLr = 1e-2;
// Parameters that must agree "to rounding error" differ by at most this much per step. SCAPE
// reconstructs g_bar = (b_bar - b1 m_prev) / (1 - b1); where the workers' gradients cancel, the
// relative error of g_bar grows like sum|a_i| / |sum a_i| times fp32 epsilon, and Adam's
// normalisation maps it to at most lr times that relative error. We measured up to 4e-4 lr;
// a real defect (a wrong term, a missing decay) moves parameters by order lr per step.
constexpr double kRoundingPerStep = 1e-3 * kLr;

OptimizerConfig scape_config(double density) {
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.type = OptimizerType::scape;
  c.sparsity = 1.0 - density;
  c.lr = kLr;
  c.warmup_steps = 2;
  return c;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t j = 0; j < a.size(); ++j) d = std::max(d, std::fabs(static_cast<double>(a[j]) - b[j]));
  return d;
}

// Invariant 1 for one worker: the sum of its gradients, and what it kept of them (its residual
// after the last step plus every contribution a_i = e_i + g_i it delivered on the mask, fp32 sum
// as sent).
struct GradientAccount {
  std::vector<double> grad_sum;
  std::vector<double> kept;
};

GradientAccount account_gradients(const std::vector<scape::testing::StepRecord>& steps, std::size_t n) {
  GradientAccount acc{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  std::vector<double> delivered(n, 0.0);
  for (const auto& s : steps) {
    for (std::size_t j = 0; j < n; ++j) {
      acc.grad_sum[j] += s.grad[j];
      if (bit(s.mask, j)) delivered[j] += static_cast<double>(s.residual_before[j] + s.grad[j]);
    }
  }
  // Residual after the last step = residual before it + its gradient, off its mask.
  const auto& last = steps.back();
  for (std::size_t j = 0; j < n; ++j) {
    const double residual = bit(last.mask, j) ? 0.0 : static_cast<double>(last.residual_before[j] + last.grad[j]);
    acc.kept[j] = residual + delivered[j];
  }
  return acc;
}

// Runs check at every point of the grid the invariants hold on, naming the point on failure.
void for_each_grid_point(const std::function<void(int w, double rho)>& check) {
  for (int w : kWorkers) {
    for (double rho : kDensities) {
      CAPTURE(w);
      CAPTURE(rho);
      check(w, rho);
    }
  }
}

}  // namespace

TEST_CASE("invariant 1: residual plus delivered equals the sum of gradients") {
  const ParamLayout layout = mixed_layout(4);
  for_each_grid_point([&](int w, double rho) {
    const auto run = run_quadratic(scape_config(rho), layout, w, kSteps);
    std::vector<double> all_grads(layout.size(), 0.0), all_kept(layout.size(), 0.0);
    for (int i = 0; i < w; ++i) {
      const GradientAccount acc = account_gradients(run.steps[static_cast<std::size_t>(i)], layout.size());
      double worst = 0, scale = 0;
      for (std::size_t j = 0; j < layout.size(); ++j) {
        worst = std::max(worst, std::fabs(acc.kept[j] - acc.grad_sum[j]));
        scale = std::max(scale, std::fabs(acc.grad_sum[j]));
        all_grads[j] += acc.grad_sum[j];
        all_kept[j] += acc.kept[j];
      }
      // Each step rounds a_i = e_i + g_i once in fp32: at most kSteps half-ulps of the running sum.
      CHECK(worst <= kSteps * 1.2e-7 * (scale + 1.0));
    }
    double total_worst = 0;
    for (std::size_t j = 0; j < layout.size(); ++j) total_worst = std::max(total_worst, std::fabs(all_grads[j] - all_kept[j]));
    CHECK(total_worst <= w * kSteps * 1.2e-7 * 100.0);
  });
}

TEST_CASE("invariant 1 also holds for raw-gradient top-k and shared-seed random-k with error feedback") {
  const ParamLayout layout = mixed_layout(2);
  for (OptimizerType type : {OptimizerType::topk_ef, OptimizerType::randk_ef}) {
    for (int w : {1, 4, 7}) {
      CAPTURE(to_string(type));
      CAPTURE(w);
      OptimizerConfig c = scape::testing::earlier_formulation();
      c.type = type;
      c.sharded = false;
      c.sparsity = 0.9;
      c.lr = 1e-2;
      const auto run = run_quadratic(c, layout, w, kSteps);
      for (const auto& steps : run.steps) {
        const GradientAccount acc = account_gradients(steps, layout.size());
        double worst = 0;
        for (std::size_t j = 0; j < layout.size(); ++j) worst = std::max(worst, std::fabs(acc.kept[j] - acc.grad_sum[j]));
        CHECK(worst < 1e-4);
      }
    }
  }
}

TEST_CASE("invariant 2: at density 1 SCAPE equals dense AdamS, and dense AdamW with inner=adamw") {
  const std::vector<int> workers(std::begin(kWorkers), std::end(kWorkers));
  for_each_dense_twin(scape_config(1.0), mixed_layout(2), workers, kSteps, [](const RunRecord& a, const RunRecord& b) {
    for (std::size_t t = 0; t < static_cast<std::size_t>(kSteps); ++t) {
      CHECK(max_abs_diff(a.steps[0][t].params_after, b.steps[0][t].params_after) <=
            kRoundingPerStep * static_cast<double>(t + 1));
      CHECK(a.steps[0][t].metrics.mask_density == 1.0);
      CHECK(a.steps[0][t].metrics.residual_norm == 0.0);
    }
  });
}

TEST_CASE("invariant 3: single_buffer and two_collectives give the same parameters") {
  const ParamLayout layout = mixed_layout(4);
  for_each_grid_point([&](int w, double rho) {
    for (bool sharded : {true, false}) {
      CAPTURE(sharded);
      OptimizerConfig one = scape_config(rho);
      one.sharded = sharded;
      OptimizerConfig two = one;
      two.scape.second_moment = SecondMoment::two_collectives;
      const auto a = run_quadratic(one, layout, w, kSteps);
      const auto b = run_quadratic(two, layout, w, kSteps);
      for (int t = 0; t < kSteps; ++t) {
        const auto& sa = a.steps[0][static_cast<std::size_t>(t)];
        const auto& sb = b.steps[0][static_cast<std::size_t>(t)];
        // m <- b_bar is the same bits in both, so the masks agree exactly; only g_bar differs by rounding.
        CHECK(sa.mask == sb.mask);
        CHECK(max_abs_diff(sa.params_after, sb.params_after) <= kRoundingPerStep * (t + 1));
      }
      // And the second collective is really there.
      CHECK(b.ledger_totals.count(sharded ? "accum_reduce_scatter" : "accum_all_reduce") == 1);
      CHECK(a.ledger_totals.count(sharded ? "accum_reduce_scatter" : "accum_all_reduce") == 0);
    }
  });
}

TEST_CASE("invariant 4: sharded equals replicated, and every replica is identical after every step") {
  const ParamLayout layout = mixed_layout(4);
  for_each_grid_point([&](int w, double rho) {
    OptimizerConfig sharded = scape_config(rho);
    OptimizerConfig replicated = sharded;
    replicated.sharded = false;
    const auto a = run_quadratic(sharded, layout, w, kSteps);
    const auto b = run_quadratic(replicated, layout, w, kSteps);
    for (int t = 0; t < kSteps; ++t) {
      const auto st = static_cast<std::size_t>(t);
      for (int i = 1; i < w; ++i) {
        CHECK(a.steps[static_cast<std::size_t>(i)][st].params_after == a.steps[0][st].params_after);
        CHECK(b.steps[static_cast<std::size_t>(i)][st].params_after == b.steps[0][st].params_after);
      }
      CHECK(a.steps[0][st].mask == b.steps[0][st].mask);
      CHECK(max_abs_diff(a.steps[0][st].params_after, b.steps[0][st].params_after) <= kRoundingPerStep * (t + 1));
    }
  });
}

TEST_CASE("invariant 5: partitioned masks have k_w bits per shard; local_union between K and min(N, W K)") {
  for (std::size_t scale : {std::size_t{1}, std::size_t{4}}) {
    const ParamLayout layout = mixed_layout(scale);
    const std::size_t n = layout.size();
    for_each_grid_point([&](int w, double rho) {
      CAPTURE(n);
      const Sharding sh(n, w);
      const auto part = run_quadratic(scape_config(rho), layout, w, 6);
      for (const auto& s : part.steps[0]) {
        std::size_t total = 0;
        for (int o = 0; o < w; ++o) {
          std::size_t bits = 0;
          for (std::size_t j = sh.begin(o); j < sh.end(o); ++j) bits += bit(s.mask, j);
          CHECK(bits == k_for(1.0 - (1.0 - rho), sh.size(o)));
          total += bits;
        }
        CHECK(s.metrics.k_total == total);
        CHECK(s.metrics.fill_in == 1.0);
      }
      OptimizerConfig lu = scape_config(rho);
      lu.sharded = false;
      lu.scape.mask_partition = MaskPartition::local_union;
      const auto uni = run_quadratic(lu, layout, w, 6);
      const std::size_t k = k_for(rho, n);
      for (const auto& s : uni.steps[0]) {
        CHECK(s.metrics.mask_size >= k);
        CHECK(s.metrics.mask_size <= std::min(n, static_cast<std::size_t>(w) * k));
        CHECK(s.metrics.fill_in == doctest::Approx(static_cast<double>(s.metrics.mask_size) / k));
      }
    });
  }
}

TEST_CASE("invariant 5 with empty shards: N smaller than W * 64") {
  ParamLayout layout;
  layout.add("tiny", {100}, true);
  const Sharding sh(100, 4);
  CHECK(sh.size(0) == 64);
  CHECK(sh.size(1) == 36);
  CHECK(sh.size(2) == 0);
  CHECK(sh.size(3) == 0);
  const auto run = run_quadratic(scape_config(0.1), layout, 4, 5);
  for (const auto& s : run.steps[0]) CHECK(s.metrics.mask_size == k_for(0.1, 64) + k_for(0.1, 36));
}

TEST_CASE("invariant 6: under lag 1 the mask used at t is the one computed at t-1") {
  const ParamLayout layout = mixed_layout(4);
  for_each_grid_point([&](int w, double rho) {
    const Sharding sh(layout.size(), w);
    const auto run = run_quadratic(scape_config(rho), layout, w, kSteps);
    for (int t = 1; t < kSteps; ++t) {
      for (int o = 0; o < w; ++o) {
        const auto& computed = run.steps[static_cast<std::size_t>(o)][static_cast<std::size_t>(t - 1)].next_local_bits;
        const auto& used = run.steps[0][static_cast<std::size_t>(t)].mask;
        const std::size_t first_word = sh.begin(o) / 64;
        for (std::size_t k = 0; k < computed.size(); ++k) CHECK(used[first_word + k] == computed[k]);
      }
    }
  });
}

TEST_CASE("invariant 6 has teeth: lag 0 uses a different mask sequence than lag 1") {
  const ParamLayout layout = mixed_layout(4);
  OptimizerConfig lag1 = scape_config(0.01);
  OptimizerConfig lag0 = lag1;
  lag0.scape.mask_lag = 0;
  const auto a = run_quadratic(lag1, layout, 2, kSteps);
  const auto b = run_quadratic(lag0, layout, 2, kSteps);
  CHECK(a.steps[0][0].mask == b.steps[0][0].mask);  // M_1 is computed at lag 0 in both
  bool differs = false;
  for (int t = 2; t < kSteps; ++t) differs = differs || a.steps[0][static_cast<std::size_t>(t)].mask != b.steps[0][static_cast<std::size_t>(t)].mask;
  CHECK(differs);
}

namespace {

OptimizerConfig topk_config() {
  OptimizerConfig c = scape::testing::earlier_replicated(OptimizerType::topk_ef);
  c.sparsity = 0.9;
  c.lr = kLr;
  return c;
}

// Invariant 1 with residual_decay gamma: g_s counts with weight gamma^u, u = the steps from s
// to its delivery (or to the end) at which the coordinate was not delivered; delivered plus
// the final residual equals that weighted sum of gradients.
void check_weighted_conservation(const testing::RunRecord& run, std::size_t n, double gamma) {
  for (const auto& steps : run.steps) {
    const std::size_t T = steps.size();
    double worst = 0;
    for (std::size_t j = 0; j < n; ++j) {
      double weighted = 0, delivered = 0, scale = 1;
      for (std::size_t s = 0; s < T; ++s) {
        std::size_t u = 0;
        for (std::size_t t = s; t < T && !bit(steps[t].mask, j); ++t) ++u;
        weighted += std::pow(gamma, static_cast<double>(u)) * steps[s].grad[j];
        scale = std::max(scale, std::fabs(static_cast<double>(steps[s].grad[j])));
        if (bit(steps[s].mask, j)) delivered += static_cast<double>(steps[s].residual_before[j] + steps[s].grad[j]);
      }
      const auto& last = steps.back();
      const double a = static_cast<double>(last.residual_before[j] + last.grad[j]);
      const double residual = bit(last.mask, j) ? 0.0 : static_cast<double>(static_cast<float>(gamma) * static_cast<float>(a));
      worst = std::max(worst, std::fabs(residual + delivered - weighted) / scale);
    }
    // Two fp32 roundings per step (e + g, then gamma a), relative to the largest gradient.
    CHECK(worst <= 2.0 * static_cast<double>(T) * 1.2e-7 * 4.0);
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("invariant 1 with residual_decay < 1: the gamma-weighted conservation law") {
  const ParamLayout layout = mixed_layout(2);
  for (double gamma : {0.9, 0.5}) {
    CAPTURE(gamma);
    for (int w : {1, 2, 7}) {
      CAPTURE(w);
      auto c = scape_config(0.1);
      c.residual_decay = gamma;
      check_weighted_conservation(run_quadratic(c, layout, w, kSteps), layout.size(), gamma);
    }
    auto t = topk_config();
    t.residual_decay = gamma;
    check_weighted_conservation(run_quadratic(t, layout, 4, kSteps), layout.size(), gamma);
  }
}

TEST_CASE("residual_decay 0 equals residual = false, and gamma 1 with clip 0 equals the default, bit for bit") {
  const ParamLayout layout = mixed_layout(2);
  std::vector<OptimizerConfig> bases;
  for (const auto& v : testing::scape_variants()) {
    auto c = scape_config(0.1);
    v.apply(c);
    if (c.residual_decay == 1 && c.residual_clip == 0 && c.residual) bases.push_back(c);
  }
  bases.push_back(topk_config());
  for (const auto& base : bases) {
    auto off = base, zero = base, explicit_default = base;
    off.residual = false;
    zero.residual_decay = 0;
    explicit_default.residual_decay = 1.0;
    explicit_default.residual_clip = 0.0;
    testing::require_identical_runs(run_quadratic(off, layout, 3, 6), run_quadratic(zero, layout, 3, 6));
    testing::require_identical_runs(run_quadratic(base, layout, 3, 6), run_quadratic(explicit_default, layout, 3, 6));
  }
  // -0, NaN and inf in the gradient: the kept residual is +0 everywhere either way.
  for (OptimizerType type : {OptimizerType::scape, OptimizerType::topk_ef}) {
    std::vector<std::vector<float>> residuals;
    for (bool use_decay : {false, true}) {
      auto c = type == OptimizerType::scape ? scape_config(0.1) : topk_config();
      c.sharded = false;
      if (use_decay) {
        c.residual_decay = 0.0;
      } else {
        c.residual = false;
      }
      sim::run_ranks(1, NetworkModel{}, [&](Communicator& comm) {
        auto opt = make_optimizer(c, layout, comm, 2);
        std::vector<float> theta(layout.size(), 0.5f), g(layout.size(), -1.0f);
        g[0] = -0.0f;
        g[1] = std::nanf("");
        g[2] = -INFINITY;
        opt->step(theta, g);
        residuals.emplace_back(opt->residual().begin(), opt->residual().end());
      });
    }
    CHECK(same_bits(residuals[0], residuals[1]));
    CHECK(same_bits(residuals[1], std::vector<float>(layout.size(), 0.0f)));
  }
}

TEST_CASE("residual_clip never increases a tensor's residual norm and the metric is what it removed") {
  const ParamLayout layout = mixed_layout(2);
  auto scape = scape_config(0.1);
  scape.residual_clip = 0.5;
  auto topk = topk_config();
  topk.residual_clip = 0.5;
  for (const auto& c : {scape, topk}) {
    const auto run = run_quadratic(c, layout, 2, kSteps);
    double clipped_total = 0;
    for (const auto& steps : run.steps) {
      for (std::size_t t = 0; t + 1 < steps.size(); ++t) {
        const auto& s = steps[t];
        // With gamma = 1 the residual after step t is clip(e) + g off the mask, so clip(e) is
        // visible there; on the mask it is recomputed from the tensor's factor.
        double removed = 0;
        for (const auto& slot : layout.slots()) {
          double ee = 0, gg = 0, cc = 0, cut = 0;
          for (std::size_t j = slot.offset; j < slot.end(); ++j) {
            ee += static_cast<double>(s.residual_before[j]) * s.residual_before[j];
            gg += static_cast<double>(s.grad[j]) * s.grad[j];
          }
          const double norm = std::sqrt(ee), bound = c.residual_clip * std::sqrt(gg);
          const float f = norm > bound ? static_cast<float>(bound / norm) : 1.0f;
          for (std::size_t j = slot.offset; j < slot.end(); ++j) {
            const float clipped = f == 1.0f ? s.residual_before[j] : s.residual_before[j] * f;
            if (!bit(s.mask, j)) CHECK(steps[t + 1].residual_before[j] == clipped + s.grad[j]);
            cc += static_cast<double>(clipped) * clipped;
            const double d = static_cast<double>(s.residual_before[j]) - clipped;
            cut += d * d;
          }
          CHECK(std::sqrt(cc) <= norm);
          if (f != 1.0f) CHECK(std::sqrt(cc) <= bound * (1 + 1e-6));
          removed += cut;
        }
        CHECK(s.metrics.residual_clipped_norm == doctest::Approx(std::sqrt(removed)).epsilon(1e-5));
        clipped_total += s.metrics.residual_clipped_norm;
      }
    }
    CHECK(clipped_total > 0);  // the bound did bind at some steps
  }
}
