// Bad input, non-finite gradients, determinism and the meaning of the step metrics.
#include <functional>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "core/metrics.hpp"
#include "optimizers/make_optimizer.hpp"
#include "quadratic_run.hpp"
#include "tests/earlier_formulation.hpp"

using namespace scape;
using scape::testing::mixed_layout;
using scape::testing::run_quadratic;

namespace {

void expect_invalid(const OptimizerConfig& c, const char* needle) {
  CAPTURE(needle);
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains(needle), std::invalid_argument);
}

}  // namespace

TEST_CASE("bad configurations name the parameter and the value") {
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.sparsity = 1.5;
  expect_invalid(c, "optimizer.sparsity: 1.5");
  c.sparsity = 1.0;  // density 0
  expect_invalid(c, "optimizer.sparsity: 1");
  c.sparsity = -0.1;  // density 1.1
  expect_invalid(c, "optimizer.sparsity: -0.1");
  c = scape::testing::earlier_formulation();
  c.lr = -1;
  expect_invalid(c, "optimizer.lr: -1");
  c = scape::testing::earlier_formulation();
  c.beta2 = 1.0;
  expect_invalid(c, "optimizer.betas[1]: 1");
  c = scape::testing::earlier_formulation();
  c.scape.mask_lag = 2;
  expect_invalid(c, "optimizer.mask_lag: 2");
  c = scape::testing::earlier_formulation();
  c.scape.mask_partition = MaskPartition::local_union;
  expect_invalid(c, "set optimizer.sharded = false");
  // Every baseline keeps replicated state; then each of its own keys out of range.
  struct BaselineCase {
    OptimizerType type;
    std::function<void(OptimizerConfig&)> break_key;  // empty: the baseline has no key of its own
    const char* key_message;
  };
  const BaselineCase baselines[] = {
      {OptimizerType::topk_ef, {}, ""},
      {OptimizerType::randk_ef, {}, ""},
      {OptimizerType::onebit_adam, [](OptimizerConfig& b) { b.onebit.freeze_step = 0; }, "optimizer.freeze_step: 0"},
      {OptimizerType::onebit_adam, [](OptimizerConfig& b) { b.onebit.sign_chunk = 0; }, "optimizer.sign_chunk: 0"},
      {OptimizerType::powersgd, [](OptimizerConfig& b) { b.powersgd.rank = 0; }, "optimizer.powersgd_rank: 0"},
      {OptimizerType::demo, [](OptimizerConfig& b) { b.demo.chunk = 0; }, "optimizer.demo_chunk: 0"},
      {OptimizerType::demo, [](OptimizerConfig& b) {
         b.demo.chunk = 8;
         b.demo.topk = 9;
       },
       "optimizer.demo_topk: 9 is out of range (must be in [1, demo_chunk])"},
  };
  for (const auto& b : baselines) {
    CAPTURE(to_string(b.type));
    c = scape::testing::earlier_formulation();
    c.type = b.type;
    const std::string replicated = std::string("optimizer.sharded: ") + to_string(b.type) + " keeps replicated optimizer state";
    expect_invalid(c, replicated.c_str());
    if (!b.break_key) continue;
    c.sharded = false;
    b.break_key(c);
    expect_invalid(c, b.key_message);
  }
  CHECK_THROWS_WITH_AS(parse_mask_statistic("first-moment"),
                       doctest::Contains("optimizer.mask_statistic: unknown value 'first-moment' (expected one of "
                                         "first_moment, gradient, momentum_only, random)"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_optimizer_type("sgd"), doctest::Contains("'sgd'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_update_mode("sparse"), doctest::Contains("optimizer.update"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_second_moment("one"), doctest::Contains("optimizer.second_moment"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_inner_rule("sgd"), doctest::Contains("optimizer.inner"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_mask_partition("union"), doctest::Contains("optimizer.mask_partition"), std::invalid_argument);
  CHECK(parse_mask_statistic("momentum_only") == MaskStatistic::momentum_only);
}

TEST_CASE("mismatched buffers and zero workers are rejected") {
  const ParamLayout layout = mixed_layout();
  CHECK_THROWS_WITH_AS(sim::run_ranks(0, NetworkModel{}, [](Communicator&) {}), doctest::Contains("workers must be >= 1"),
                       std::invalid_argument);
  for (OptimizerType type : {OptimizerType::adams, OptimizerType::scape, OptimizerType::topk_ef, OptimizerType::randk_ef,
                             OptimizerType::onebit_adam, OptimizerType::powersgd, OptimizerType::demo}) {
    sim::run_ranks(1, NetworkModel{}, [&](Communicator& comm) {
      OptimizerConfig c = scape::testing::earlier_formulation();
      c.type = type;
      c.sharded = !replicated_only(type);
      auto opt = make_optimizer(c, layout, comm, 10);
      std::vector<float> theta(layout.size()), g(layout.size() - 1);
      CHECK_THROWS_WITH_AS(opt->step(theta, g), doctest::Contains("layout size"), std::invalid_argument);
      CHECK_THROWS_WITH_AS(make_optimizer(c, layout, comm, 0), doctest::Contains("steps"), std::invalid_argument);
    });
  }
}

TEST_CASE("non-finite gradients are counted and reported, and stay visible in the residual") {
  const ParamLayout layout = mixed_layout();
  sim::run_ranks(2, NetworkModel{}, [&](Communicator& comm) {
    OptimizerConfig c = scape::testing::earlier_formulation();
    c.sparsity = 0.99;
    auto opt = make_optimizer(c, layout, comm, 5);
    std::vector<float> theta(layout.size(), 0.0f), g(layout.size(), 0.01f);
    auto m = opt->step(theta, g);
    CHECK(m.nonfinite_grads == 0);
    if (comm.rank() == 1) {
      g[5] = std::numeric_limits<float>::quiet_NaN();
      g[6] = std::numeric_limits<float>::infinity();
    }
    m = opt->step(theta, g);
    CHECK(m.nonfinite_grads == (comm.rank() == 1 ? 2u : 0u));
    // Not silently repaired: the contribution sits in the residual (or was delivered) as NaN / inf.
    if (comm.rank() == 1) {
      const bool in_residual = std::isnan(opt->residual()[5]) || std::isinf(opt->residual()[6]);
      const bool delivered = !std::isfinite(theta[5]) || !std::isfinite(theta[6]);
      CHECK((in_residual || delivered));
    }
  });
}

TEST_CASE("determinism: the same configuration and seed give bit-identical parameters") {
  const ParamLayout layout = mixed_layout(4);
  for (OptimizerType type : {OptimizerType::adamw, OptimizerType::scape, OptimizerType::topk_ef,
                             OptimizerType::randk_ef, OptimizerType::onebit_adam, OptimizerType::powersgd,
                             OptimizerType::demo}) {
    OptimizerConfig c = scape::testing::earlier_formulation();
    c.type = type;
    c.sharded = !replicated_only(type);
    c.onebit.freeze_step = 3;
    c.sparsity = 0.95;
    c.lr = 1e-2;
    const auto a = run_quadratic(c, layout, 4, 8, 21);
    const auto b = run_quadratic(c, layout, 4, 8, 21);
    const auto& pa = a.steps[0].back().params_after;
    const auto& pb = b.steps[0].back().params_after;
    CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0);
    const auto d = run_quadratic(c, layout, 4, 8, 22);  // another seed really changes the run
    CHECK(d.steps[0].back().params_after != pa);
  }
}

TEST_CASE("metrics: staleness, Jaccard, residual and update statistics mean what they say") {
  const ParamLayout layout = mixed_layout(4);
  OptimizerConfig c = scape::testing::earlier_formulation();
  c.sparsity = 0.99;
  c.lr = 1e-2;
  const auto run = run_quadratic(c, layout, 2, 10);
  const auto& steps = run.steps[0];
  // Step 1 delivers 1% of the coordinates; the rest have waited one step.
  CHECK(steps[0].metrics.staleness_max == 1.0);
  CHECK(steps[0].metrics.staleness_mean == doctest::Approx(1.0 - steps[0].metrics.mask_density));
  CHECK(std::isnan(steps[0].metrics.mask_jaccard));
  // Under lag 1, M_2 is computed from the same statistic as M_1, so they are identical.
  CHECK(steps[1].metrics.mask_jaccard == 1.0);
  for (const auto& s : steps) {
    CHECK(s.metrics.mask_density == doctest::Approx(static_cast<double>(s.metrics.k_total) / layout.size()));
    CHECK(s.metrics.staleness_max <= s.metrics.step);
    CHECK(s.metrics.staleness_p99 <= s.metrics.staleness_max);
    CHECK(s.metrics.residual_norm > 0);
    CHECK(s.metrics.residual_max <= s.metrics.residual_norm);
    CHECK(s.metrics.update_norm > 0);
    CHECK(s.metrics.update_max <= s.metrics.update_norm);
    CHECK(s.metrics.tensor_residual_norm.size() == layout.slots().size());
    double sq = 0;
    for (double r : s.metrics.tensor_residual_norm) sq += r * r;
    CHECK(std::sqrt(sq) == doctest::Approx(s.metrics.residual_norm));
  }
  // Residual off: nothing is kept.
  c.residual = false;
  const auto off = run_quadratic(c, layout, 2, 4);
  for (const auto& s : off.steps[0]) CHECK(s.metrics.residual_norm == 0.0);
  // Dense optimizers report sparse metrics as not applicable.
  c = scape::testing::earlier_formulation();
  c.type = OptimizerType::adams;
  const auto dense = run_quadratic(c, layout, 2, 2);
  CHECK(std::isnan(dense.steps[0][1].metrics.mask_density));
  CHECK(std::isnan(dense.steps[0][1].metrics.residual_norm));
  CHECK(dense.steps[0][1].metrics.update_norm > 0);
}

TEST_CASE("SCAPE's masked update measures itself: theta and the statistics equal the copy-and-pass route") {
  // Both workers decay off the mask inside the pass that measures the update (worker 0's
  // statistics, decay_rest_and_measure; worker 1's ||theta|| alone, decay_rest_and_norm). Replicas
  // stay equal bit for bit, worker 0's statistics equal an UpdateTracker's before()/after() on the
  // same parameters, and worker 1's ||theta|| (in residual_to_param) is metrics::l2_norm's.
  const ParamLayout layout = mixed_layout(40);
  for (const auto& variant : scape::testing::scape_variants()) {
    CAPTURE(variant.name);
    OptimizerConfig c = scape::testing::earlier_formulation();
    c.sparsity = 0.95;
    c.lr = 1e-2;
    c.weight_decay = 0.1;
    variant.apply(c);
    const auto run = run_quadratic(c, layout, 2, 5);
    scape::train::QuadraticSpec spec;
    spec.seed = 7;
    spec.noise = 0.5;
    std::vector<float> before(layout.size());
    scape::train::NoisyQuadratic(layout.size(), spec).initial_params(before);
    metrics::UpdateTracker reference(kernels::cpu_backend(), layout.size());
    for (std::size_t t = 0; t < run.steps[0].size(); ++t) {
      CAPTURE(t);
      const scape::testing::StepRecord& r = run.steps[0][t];
      CHECK(std::memcmp(r.params_after.data(), run.steps[1][t].params_after.data(), before.size() * sizeof(float)) ==
            0);
      StepMetrics want;
      reference.before(before);
      const bool masked = c.scape.update == UpdateMode::masked;
      reference.after(r.params_after, want,
                      masked ? std::span<const std::uint64_t>(r.mask) : std::span<const std::uint64_t>{});
      CHECK(std::memcmp(&r.metrics.update_norm, &want.update_norm, sizeof(double)) == 0);
      CHECK(std::memcmp(&r.metrics.update_max, &want.update_max, sizeof(double)) == 0);
      CHECK(std::memcmp(&r.metrics.update_sign_flip, &want.update_sign_flip, sizeof(double)) == 0);
      double sq = 0;
      for (std::size_t j = 0; j < before.size(); ++j) {
        const double d = static_cast<double>(r.params_after[j] - before[j]);
        sq += d * d;
      }
      CHECK(r.metrics.update_norm == doctest::Approx(std::sqrt(sq)).epsilon(1e-12));
      const StepMetrics& other = run.steps[1][t].metrics;
      if (c.residual) {
        const double ratio = metrics::residual_to_param(other.residual_norm, metrics::l2_norm(r.params_after));
        CHECK(std::memcmp(&other.residual_to_param, &ratio, sizeof(double)) == 0);
      }
      before = r.params_after;
    }
  }
}

TEST_CASE("residual metrics describe the residual each error-feedback policy leaves after the step") {
  // The policies take these metrics right after their residual pass, before the collectives:
  // they must equal the residual the step ends with (the next step's residual before).
  const ParamLayout layout = mixed_layout(4);
  for (const OptimizerType type : {OptimizerType::scape, OptimizerType::topk_ef, OptimizerType::randk_ef}) {
    OptimizerConfig c = scape::testing::earlier_formulation();
    c.type = type;
    c.sharded = type == OptimizerType::scape;
    c.sparsity = 0.9;
    c.lr = 1e-2;
    const auto run = run_quadratic(c, layout, 3, 5);
    for (const auto& steps : run.steps) {
      for (std::size_t t = 0; t + 1 < steps.size(); ++t) {
        CAPTURE(static_cast<int>(type));
        CAPTURE(t);
        const std::vector<float>& after = steps[t + 1].residual_before;
        const StepMetrics& m = steps[t].metrics;
        float max = 0;
        for (float e : after) max = std::max(max, std::fabs(e));
        CHECK(m.residual_max == static_cast<double>(max));
        // Per-tensor blocks against whole-buffer blocks: the same sum, grouped differently.
        CHECK(m.residual_norm == doctest::Approx(metrics::l2_norm(after)).epsilon(1e-12));
        CHECK(m.residual_norm > 0);
        CHECK(m.residual_to_param ==
              doctest::Approx(m.residual_norm / metrics::l2_norm(steps[t].params_after)).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("SCAPE trains the noisy quadratic about as well as dense AdamS") {
  const ParamLayout layout = mixed_layout(8);
  scape::train::QuadraticSpec spec;
  spec.seed = 7;
  spec.noise = 0.5;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  std::vector<float> zero(layout.size(), 0.0f);
  const double initial = problem.loss(zero);
  OptimizerConfig dense = scape::testing::earlier_formulation();
  dense.type = OptimizerType::adams;
  dense.lr = 5e-2;
  dense.weight_decay = 0;
  OptimizerConfig sparse = dense;
  sparse.type = OptimizerType::scape;
  sparse.sparsity = 0.9;
  const double dense_loss = problem.loss(run_quadratic(dense, layout, 4, 150).steps[0].back().params_after);
  const double sparse_loss = problem.loss(run_quadratic(sparse, layout, 4, 150).steps[0].back().params_after);
  MESSAGE("quadratic loss: initial " << initial << ", dense AdamS " << dense_loss << ", SCAPE 0.9 " << sparse_loss);
  CHECK(dense_loss < 0.1 * initial);
  CHECK(sparse_loss < 0.3 * initial);
}

TEST_CASE("save_state / load_state resume every optimizer bit for bit") {
  const ParamLayout layout = mixed_layout(2);
  scape::train::QuadraticSpec spec;
  spec.seed = 5;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  std::vector<OptimizerConfig> configs(12);
  configs[0].type = OptimizerType::adamw;
  configs[1].sparsity = 0.9;  // SCAPE, sharded, lag 1
  configs[2].sparsity = 0.9;
  configs[2].sharded = false;
  configs[2].scape.mask_partition = MaskPartition::local_union;
  configs[3].type = OptimizerType::topk_ef;
  configs[3].sharded = false;
  configs[4].sparsity = 0.9;
  configs[4].inner = InnerRule::adamw;
  configs[5].type = OptimizerType::randk_ef;
  configs[5].sharded = false;
  configs[5].sparsity = 0.9;
  configs[6].type = OptimizerType::onebit_adam;  // frozen before the split: both errors resume
  configs[6].sharded = false;
  configs[6].onebit.freeze_step = 2;
  configs[6].onebit.sign_chunk = 100;
  configs[7].type = OptimizerType::powersgd;  // the residual and the warm-started Q resume
  configs[7].sharded = false;
  configs[7].powersgd.rank = 2;
  configs[8].type = OptimizerType::demo;  // the momentum is the whole state
  configs[8].sharded = false;
  configs[8].demo.chunk = 50;
  configs[9].sparsity = 0.9;  // the artifact's sharded path, with the momentum the owner carries
  configs[9].scape.formulation = Formulation::artifact;
  configs[10].sparsity = 0.9;  // the fp8 payload's shared exponent resumes
  configs[10].sharded = false;
  configs[10].wire_dtype = WireType::fp8_e5m2;
  configs[11] = scape::testing::earlier_formulation();
  configs[11].sparsity = 0.9;
  for (const auto& c : configs) {
    CAPTURE(to_string(c.type));
    CAPTURE(to_string(c.scape.formulation));
    CAPTURE(to_string(c.wire_dtype));
    const int steps = 8, split = 3, workers = 3;
    std::vector<std::vector<float>> straight(workers), resumed(workers);
    std::vector<StateMap> saved(workers);
    std::vector<std::vector<float>> saved_params(workers);
    auto train = [&](Communicator& comm, Optimizer& opt, std::vector<float>& theta, int from, int to) {
      std::vector<float> g(layout.size());
      for (int t = from; t <= to; ++t) {
        problem.gradient(theta, t, comm.rank(), g);
        opt.step(theta, g);
      }
    };
    sim::run_ranks(workers, NetworkModel{}, [&](Communicator& comm) {
      auto opt = make_optimizer(c, layout, comm, steps);
      std::vector<float> theta(layout.size(), 0.0f);
      train(comm, *opt, theta, 1, split);
      opt->save_state(saved[static_cast<std::size_t>(comm.rank())]);
      saved_params[static_cast<std::size_t>(comm.rank())] = theta;
      train(comm, *opt, theta, split + 1, steps);
      opt->finish();
      straight[static_cast<std::size_t>(comm.rank())] = theta;
    });
    sim::run_ranks(workers, NetworkModel{}, [&](Communicator& comm) {
      auto opt = make_optimizer(c, layout, comm, steps);
      opt->load_state(saved[static_cast<std::size_t>(comm.rank())]);
      CHECK(opt->steps_done() == split);
      std::vector<float> theta = saved_params[static_cast<std::size_t>(comm.rank())];
      train(comm, *opt, theta, split + 1, steps);
      opt->finish();
      resumed[static_cast<std::size_t>(comm.rank())] = theta;
    });
    for (int r = 0; r < workers; ++r) {
      const auto& a = straight[static_cast<std::size_t>(r)];
      const auto& b = resumed[static_cast<std::size_t>(r)];
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
  }
  StateMap broken;
  sim::run_ranks(1, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(scape::testing::earlier_formulation(), layout, comm, 4);
    CHECK_THROWS_WITH_AS(opt->load_state(broken), doctest::Contains("missing optimizer state"), std::runtime_error);
  });
}

TEST_CASE("collective_purposes lists exactly what each configuration records") {
  const ParamLayout layout = mixed_layout();
  std::vector<OptimizerConfig> configs(10, scape::testing::earlier_formulation());
  configs[0].type = OptimizerType::adams;
  configs[1].type = OptimizerType::adamw;
  configs[1].sharded = false;
  configs[2].scape.second_moment = SecondMoment::two_collectives;
  configs[3].sharded = false;
  configs[3].scape.mask_partition = MaskPartition::local_union;
  configs[4].type = OptimizerType::topk_ef;
  configs[4].sharded = false;
  configs[5].sharded = false;
  configs[5].scape.second_moment = SecondMoment::two_collectives;
  configs[6].type = OptimizerType::randk_ef;
  configs[6].sharded = false;
  configs[7].type = OptimizerType::onebit_adam;
  configs[7].sharded = false;
  configs[7].onebit.freeze_step = 1;
  configs[8].type = OptimizerType::powersgd;
  configs[8].sharded = false;
  configs[9].type = OptimizerType::demo;
  configs[9].sharded = false;
  for (const auto& c : configs) {
    const auto run = run_quadratic(c, layout, 2, 3);
    std::set<std::string> seen;
    for (const auto& s : run.steps[0]) {
      for (const auto& r : s.metrics.comm) seen.insert(r.purpose);
    }
    const auto listed = collective_purposes(c);
    CHECK(seen == std::set<std::string>(listed.begin(), listed.end()));
  }
}

TEST_CASE("staleness statistics equal a brute-force count, also after save and load") {
  const std::size_t n = 1000;
  metrics::StalenessTracker tracker(n);
  std::vector<int> last(n, 0);
  std::uint64_t x = 12345;
  for (int t = 1; t <= 40; ++t) {
    std::vector<std::uint32_t> delivered;
    for (std::uint32_t j = 0; j < n; ++j) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      if ((x >> 33) % 7 == 0) delivered.push_back(j);
    }
    tracker.deliver(delivered, t);
    for (std::uint32_t j : delivered) last[j] = t;
    if (t == 20) {  // a tracker rebuilt from a checkpoint continues identically
      StateMap state;
      tracker.save(state, "s.");
      metrics::StalenessTracker restored(n);
      restored.load(state, "s.");
      tracker = restored;
    }
    std::vector<int> stale(n);
    double sum = 0;
    for (std::size_t j = 0; j < n; ++j) {
      stale[j] = t - last[j];
      sum += stale[j];
    }
    std::sort(stale.begin(), stale.end());
    StepMetrics m;
    tracker.fill(t, m);
    CHECK(m.staleness_mean == doctest::Approx(sum / n));
    CHECK(m.staleness_max == stale.back());
    CHECK(m.staleness_p99 == stale[static_cast<std::size_t>(std::ceil(0.99 * n)) - 1]);
  }
}

TEST_CASE("l2_norm: exact on hand cases, within double rounding of a long sum, any length") {
  CHECK(metrics::l2_norm(std::vector<float>{}) == 0.0);
  CHECK(metrics::l2_norm(std::vector<float>{3, -4}) == 5.0);
  CHECK(metrics::l2_norm(std::vector<float>(9, 2.0f)) == 6.0);  // one full lane group and a tail
  // Lengths around the lane width and the block size, against a long-double reference.
  for (const std::size_t n : {std::size_t{7}, std::size_t{8}, std::size_t{17}, std::size_t{8191}, std::size_t{8192},
                              std::size_t{8193}, std::size_t{100003}}) {
    CAPTURE(n);
    std::vector<float> x(n);
    long double want = 0;
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>(static_cast<double>((i * 40503u) % 977) - 488.0) * 1e-3f;
      want += static_cast<long double>(x[i]) * x[i];
    }
    CHECK(metrics::l2_norm(x) == doctest::Approx(static_cast<double>(std::sqrt(want))).epsilon(1e-13));
  }
  CHECK(std::isnan(metrics::l2_norm(std::vector<float>{1, std::numeric_limits<float>::quiet_NaN(), 2})));
  CHECK(std::isinf(metrics::l2_norm(std::vector<float>{1, std::numeric_limits<float>::infinity()})));
}
