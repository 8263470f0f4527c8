// The honest mask metrics (docs/algorithms.md, "Metrics") against hand-worked cases: the
// same-statistic oracle overlap and the energy capture on tiny vectors with W = 2 (and the lag
// that takes them from the step that chose the mask), the sign-flip share counting only stepped
// coordinates, and whole runs where the answer is known (W = 1: the owner's view is the average).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "config/config.hpp"
#include "core/metrics.hpp"
#include "run_file/hdf5.hpp"
#include "sim/sim_run.hpp"
#include "test_support.hpp"
#include "tests/earlier_formulation.hpp"
#include "train/run_metrics.hpp"

using namespace scape;
namespace tr = scape::train;
namespace cfg = scape::config;

namespace {

constexpr std::size_t kN = 128;  // W = 2: shards [0, 64) and [64, 128)

std::vector<float> sparse_vector(const std::map<std::size_t, float>& entries) {
  std::vector<float> v(kN, 0.0f);
  for (const auto& [j, x] : entries) v[j] = x;
  return v;
}

std::vector<std::uint64_t> bits(std::initializer_list<std::size_t> indices) {
  std::vector<std::uint64_t> w(kernels::words_for(kN), 0);
  for (std::size_t j : indices) w[j / 64] |= std::uint64_t{1} << (j % 64);
  return w;
}

// The hand-worked case, beta1 = 0.5 and k_w = 2 per shard (every product below is exact):
//   shard 0: a_1 = (j1: 4, j2: 0, j3: 1, j4: -2), a_2 = (0, 3, 1, -2) -> abar = (2, 1.5, 1, -2);
//            m_prev = (0, 1, 2, 0) -> 0.5 m + 0.5 abar = (1, 1.25, 1.5, -1): O = {3, 2};
//            |abar| top-2 = {1, 4} (2 and 2), energy 8. Owner 0 ranks 0.5 m + 0.5 a_1 =
//            (2, 0.5, 1.5, -1): its bits {1, 3}.
//   shard 1: a_1 = (j64: 2, j65: -1, j66: 0), a_2 = (0, -1, 2) -> abar = (1, -1, 1);
//            m_prev = (0, 0, 2) -> (0.5, -0.5, 1.5): O = {66, 64} (the tie goes to the lower
//            index); |abar| top-2 = {64, 65}, energy 2. Owner 1 ranks 0.5 m + 0.5 a_2 =
//            (0, -0.5, 2): its bits {66, 65}.
//   M = {1, 3, 65, 66}: |M ∩ O| = |{3, 66}| = 2 of K = 4 -> 0.5; energy 4 + 1 + 1 + 1 = 7 of 10.
const std::vector<float> kA1 = sparse_vector({{1, 4}, {3, 1}, {4, -2}, {64, 2}, {65, -1}});
const std::vector<float> kA2 = sparse_vector({{2, 3}, {3, 1}, {4, -2}, {65, -1}, {66, 2}});
const std::vector<float> kMean = sparse_vector({{1, 2}, {2, 1.5f}, {3, 1}, {4, -2}, {64, 1}, {65, -1}, {66, 1}});
const std::vector<float> kMoment = sparse_vector({{2, 1}, {3, 2}, {66, 2}});
const std::vector<std::uint64_t> kMask = bits({1, 3, 65, 66});
const metrics::RankRange kShards[] = {{0, 64, 2}, {64, 128, 2}};

metrics::MaskOracle oracle_of(metrics::OracleStatistic statistic, std::span<const metrics::RankRange> ranges) {
  metrics::MaskOracle o;
  o.mean_acc = kMean;
  metrics::build_mask_oracle(statistic, kMoment, 0.5, ranges, o);
  return o;
}

// k_w = ceil(rho 64) = 2 per shard and K = 4 over the whole buffer at rho = 1/32.
OptimizerConfig scape_config(int lag) {
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.type = OptimizerType::scape;
  c.sparsity = 1.0 - 1.0 / 32;
  c.beta1 = 0.5;
  c.scape.mask_lag = lag;
  return c;
}

struct Worker {
  std::vector<float> grads = std::vector<float>(kN, 0.0f), acc, moment;
  tr::WorkerReport report;
  void set(int step, const std::vector<float>& a, std::span<const float> m) {
    acc = a;
    moment.assign(m.begin(), m.end());
    report.metrics.step = step;
    report.grads = grads;
    report.accumulated = acc;
    report.first_moment = moment;
  }
};

// One row of a W = 2 combiner: worker w reports a_w and m_prev over its shard.
void combine(tr::StepCombiner& combiner, Worker (&w)[2], int step, const std::vector<float>& a1,
             const std::vector<float>& a2, const std::vector<float>& m, std::span<const std::uint64_t> mask) {
  w[0].set(step, a1, std::span<const float>(m).first(64));
  w[1].set(step, a2, std::span<const float>(m).subspan(64));
  const tr::WorkerReport* all[] = {&w[0].report, &w[1].report};
  combiner.combine(all, mask);
}

}  // namespace

TEST_CASE("same-statistic oracle and energy capture on the hand-worked W = 2 case") {
  ParamLayout layout;
  layout.add("w", {kN}, true);
  std::vector<float> check(kN);
  for (std::size_t j = 0; j < kN; ++j) check[j] = (kA1[j] + kA2[j]) / 2;
  REQUIRE(check == kMean);

  const auto first = oracle_of(metrics::OracleStatistic::first_moment, kShards);
  CHECK(first.same_statistic == bits({2, 3, 64, 66}));
  CHECK(first.top_mean == bits({1, 4, 64, 65}));
  CHECK(first.k_total == 4);
  CHECK(first.top_mean_energy == 10.0);
  CHECK(metrics::oracle_overlap(first, kMask) == 0.5);
  CHECK(metrics::energy_capture(first, kMask) == 0.7);
  // The oracle's own sets score 1; the same-statistic O holds 1.5^2 + 1 + 1 + 1 = 5.25 of 10.
  CHECK(metrics::oracle_overlap(first, first.same_statistic) == 1.0);
  CHECK(metrics::energy_capture(first, first.top_mean) == 1.0);
  CHECK(metrics::energy_capture(first, first.same_statistic) == 0.525);

  // The gradient statistic (and top-k EF) ranks |abar| itself: O = O' = {1, 4, 64, 65}.
  const auto gradient = oracle_of(metrics::OracleStatistic::mean_gradient, kShards);
  CHECK(gradient.same_statistic == bits({1, 4, 64, 65}));
  CHECK(metrics::oracle_overlap(gradient, kMask) == 0.5);  // {1, 65}
  // momentum_only ranks |m_prev|: {3, 2} and {66, 64}.
  const auto momentum = oracle_of(metrics::OracleStatistic::momentum, kShards);
  CHECK(momentum.same_statistic == bits({2, 3, 64, 66}));
  // Random masks have no statistic to average: no overlap, but the energy is still measured.
  const auto random = oracle_of(metrics::OracleStatistic::none, kShards);
  CHECK(std::isnan(metrics::oracle_overlap(random, kMask)));
  CHECK(metrics::energy_capture(random, kMask) == 0.7);
  // One range over the buffer (local_union, top-k EF), K = 4: |abar| top-4 = {1, 4, 2, 3}
  // (2, 2, 1.5, then 1 at the lowest index of the four ties), energy 4 + 4 + 2.25 + 1.
  const metrics::RankRange whole[] = {{0, kN, 4}};
  const auto global = oracle_of(metrics::OracleStatistic::mean_gradient, whole);
  CHECK(global.same_statistic == bits({1, 2, 3, 4}));
  CHECK(metrics::oracle_overlap(global, kMask) == 0.5);
  CHECK(metrics::energy_capture(global, kMask) == doctest::Approx(7.0 / 11.25).epsilon(1e-15));
  // No energy in abar: NaN rather than 0/0.
  metrics::MaskOracle zero;
  zero.mean_acc.assign(kN, 0.0f);
  metrics::build_mask_oracle(metrics::OracleStatistic::first_moment, kMoment, 0.5, kShards, zero);
  CHECK(std::isnan(metrics::energy_capture(zero, kMask)));
}

TEST_CASE("the combiner takes the oracle from the step that chose the mask: t-1 under lag 1, t under lag 0") {
  ParamLayout layout;
  layout.add("w", {kN}, true);
  // Step 2's reports: abar = e_3, m_prev = 0. Chosen from them (lag 0), O' = {0, 3} and
  // {64, 65} (ties to the lower index), energy 1, all of it on M: capture 1.
  const std::vector<float> e3 = sparse_vector({{3, 1}});
  const std::vector<float> zero(kN, 0.0f);
  for (int lag : {1, 0}) {
    CAPTURE(lag);
    const OptimizerConfig c = scape_config(lag);
    tr::StepCombiner combiner(c, true, layout, tr::metric_columns(c, false));
    Worker w[2];
    combine(combiner, w, 1, kA1, kA2, kMoment, kMask);
    CHECK(combiner.value("mask_oracle_overlap") == 0.5);  // M_1 is chosen at step 1 under either lag
    CHECK(combiner.value("mask_energy_capture") == 0.7);
    combine(combiner, w, 2, e3, e3, zero, kMask);
    if (lag == 1) {  // M_2 was chosen at the end of step 1, from step 1's reports
      CHECK(combiner.value("mask_oracle_overlap") == 0.5);
      CHECK(combiner.value("mask_energy_capture") == 0.7);
    } else {  // statistic 0.5 e_3: O = {3, 0} and {64, 65}; M holds 3 and 65
      CHECK(combiner.value("mask_oracle_overlap") == 0.5);
      CHECK(combiner.value("mask_energy_capture") == 1.0);
    }
  }
  // A run resumed at step 2 under lag 1 has not seen step 1: no oracle for that row.
  const OptimizerConfig lagged = scape_config(1);
  tr::StepCombiner resumed(lagged, true, layout, tr::metric_columns(lagged, false));
  Worker w[2];
  combine(resumed, w, 2, kA1, kA2, kMoment, kMask);
  CHECK(std::isnan(resumed.value("mask_oracle_overlap")));
  CHECK(std::isnan(resumed.value("mask_energy_capture")));
  combine(resumed, w, 3, e3, e3, zero, kMask);
  CHECK(resumed.value("mask_energy_capture") == 0.7);  // from step 2's reports
  // Top-k EF ranks |a_i| over the whole buffer at its own step: K = 4, O = O' = {1, 2, 3, 4}.
  OptimizerConfig topk = scape_config(1);
  topk.type = OptimizerType::topk_ef;
  topk.sharded = false;
  tr::StepCombiner topk_combiner(topk, true, layout, tr::metric_columns(topk, false));
  combine(topk_combiner, w, 1, kA1, kA2, kMoment, kMask);
  CHECK(topk_combiner.value("mask_oracle_overlap") == 0.5);
  CHECK(topk_combiner.value("mask_energy_capture") == doctest::Approx(7.0 / 11.25).epsilon(1e-15));
  // log.oracle off: both NaN.
  tr::StepCombiner off(lagged, false, layout, tr::metric_columns(lagged, false));
  combine(off, w, 1, kA1, kA2, kMoment, kMask);
  CHECK(std::isnan(off.value("mask_oracle_overlap")));
  CHECK(std::isnan(off.value("mask_energy_capture")));
}

TEST_CASE("update_sign_flip counts only the coordinates the optimizer stepped in both steps") {
  // Step 1 steps {0, 1}; coordinates 2 and 3 move by decay alone.
  // Step 2 steps {0, 1, 2}: deltas (-1, -1, -1, +0.1). Stepped in both: {0, 1}; 0 flipped -> 1/2.
  //   (Counting every moved coordinate, as before, gave 0, 2 and 3 flipped of 4: 0.75.)
  // Step 3 steps every coordinate: deltas (+1, -1, +1, +1). Stepped at 2 and 3: {0, 1, 2};
  //   0 and 2 flipped -> 2/3.
  metrics::UpdateTracker tracker(kernels::cpu_backend(), 4);
  StepMetrics out;
  std::vector<float> theta = {0, 0, 0, 0};
  auto step = [&](std::vector<float> delta, std::vector<std::uint64_t> stepped) {
    tracker.before(theta);
    for (std::size_t j = 0; j < 4; ++j) theta[j] += delta[j];
    tracker.after(theta, out, stepped);
  };
  step({1, -1, 1, -0.1f}, {0b0011});
  CHECK(std::isnan(out.update_sign_flip));  // no previous step
  step({-1, -1, -1, 0.1f}, {0b0111});
  CHECK(out.update_sign_flip == 0.5);
  step({1, -1, 1, 1}, {});
  CHECK(out.update_sign_flip == doctest::Approx(2.0 / 3.0).epsilon(1e-15));
  // A mask of the wrong size is refused.
  metrics::UpdateTracker big(kernels::cpu_backend(), 200);
  std::vector<float> t200(200, 0.0f);
  big.before(t200);
  CHECK_THROWS_AS(big.after(t200, out, std::vector<std::uint64_t>{1}), std::invalid_argument);
}

TEST_CASE("whole runs: the owner's view is the average at W = 1, and the sign flips ignore decay") {
  scape::testing::TempDir dir;
  auto run = [&](const std::string& name, int workers, const std::string& statistic, const std::string& update) {
    const auto config = cfg::parse_experiment(nlohmann::json::parse(R"({
      "name": ")" + name + R"(", "workers": )" + std::to_string(workers) +
                                                                    R"(, "steps": 8,
      "model": {"type": "quadratic", "size": 3000},
      "optimizer": {"type": "scape", "formulation": "frozen_momentum", "mask_scope": "shard", "sparsity": 0.9, "lr": 0.01, "mask_statistic": ")" +
                                                                    statistic + R"(", "update": ")" + update + R"(",
                    "density_warmup": 3},
      "log": {"flush_interval": 4}})"),
                                              dir.path);
    train::RunOptions o;
    o.out = dir.path / (name + ".h5");
    o.quiet = true;
    REQUIRE(sim::run_simulated(config, o).status == train::RunStatus::completed);
    auto f = scape::run_file::File::open(o.out, scape::run_file::Access::read);
    return std::map<std::string, std::vector<double>>{
        {"overlap", f.open_dataset("/metrics/mask_oracle_overlap").read_all<double>()},
        {"energy", f.open_dataset("/metrics/mask_energy_capture").read_all<double>()},
        {"flip", f.open_dataset("/metrics/update_sign_flip").read_all<double>()}};
  };
  // W = 1: the oracle ranks exactly the owner's statistic, with the k of the mask's own step
  // (the density warm-up changes k every step until step 4): overlap 1 and, for the gradient
  // statistic, energy capture 1, at every step.
  for (const char* statistic : {"first_moment", "gradient"}) {
    CAPTURE(statistic);
    const auto m = run(std::string("one-") + statistic, 1, statistic, "masked");
    for (std::size_t t = 0; t < 8; ++t) {
      CHECK(m.at("overlap")[t] == 1.0);
      CHECK(m.at("energy")[t] <= 1.0);
      if (std::string(statistic) == "gradient") CHECK(m.at("energy")[t] == 1.0);
    }
  }
  // W = 3, momentum_only: m_prev is global, so every owner's view is the oracle's.
  const auto momentum = run("momentum", 3, "momentum_only", "masked");
  for (double x : momentum.at("overlap")) CHECK(x == 1.0);
  // W = 3, first moment: the local view costs something, and a partitioned mask never
  // captures more energy than the best mask of its size.
  const auto three = run("three", 3, "first_moment", "masked");
  double mean_overlap = 0;
  for (std::size_t t = 0; t < 8; ++t) {
    CHECK(three.at("overlap")[t] > 0.0);
    CHECK(three.at("overlap")[t] <= 1.0);
    CHECK(three.at("energy")[t] > 0.0);
    CHECK(three.at("energy")[t] <= 1.0);
    mean_overlap += three.at("overlap")[t] / 8;
  }
  CHECK(mean_overlap < 1.0);
  // Sign flips: share of a subset, NaN at step 1; with a dense update every coordinate counts.
  for (const auto* m : {&three, &momentum}) {
    CHECK(std::isnan(m->at("flip")[0]));
    for (std::size_t t = 1; t < 8; ++t) CHECK((m->at("flip")[t] >= 0.0 && m->at("flip")[t] <= 1.0));
  }
  const auto dense_update = run("dense-update", 3, "first_moment", "dense");
  for (std::size_t t = 1; t < 8; ++t) CHECK((dense_update.at("flip")[t] >= 0.0 && dense_update.at("flip")[t] <= 1.0));
}
