// Test helper: runs one optimizer configuration on W emulated workers over the noisy
// quadratic and records, per worker and step, the parameters, the mask used, the residual
// before the step, the gradient and the step metrics, so tests can check the invariants.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "core/optimizer.hpp"
#include "optimizers/make_optimizer.hpp"
#include "optimizers/scape/scape_optimizer.hpp"
#include "sim/emulated_comm.hpp"
#include "train/noisy_quadratic.hpp"

namespace scape::testing {

// A layout with mixed weight-decay flags whose size is not a multiple of 64.
inline ParamLayout mixed_layout(std::size_t scale = 1) {
  ParamLayout layout;
  layout.add("w1", {13 * scale, 31}, true);
  layout.add("b1", {31}, false);
  layout.add("w2", {7 * scale, 50}, true);
  layout.add("ln", {97}, false);
  return layout;
}

struct StepRecord {
  std::vector<float> params_after;
  std::vector<float> residual_before;
  std::vector<float> grad;
  std::vector<std::uint64_t> mask;             // mask used by the step
  std::vector<std::uint64_t> next_local_bits;  // SCAPE: bits computed for the next mask
  StepMetrics metrics;
};

struct RunRecord {
  std::vector<std::vector<StepRecord>> steps;  // [worker][step]
  std::map<std::string, CommTotals> ledger_totals;  // worker 0's ledger
};

inline RunRecord run_quadratic(const OptimizerConfig& config, const ParamLayout& layout, int workers, int steps,
                               std::uint64_t seed = 7, double noise = 0.5) {
  scape::train::QuadraticSpec spec;
  spec.seed = seed;
  spec.noise = noise;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  RunRecord record;
  record.steps.resize(static_cast<std::size_t>(workers));
  std::mutex ledger_mutex;
  sim::run_ranks(workers, NetworkModel{}, [&](Communicator& comm) {
    auto opt = make_optimizer(config, layout, comm, steps);
    std::vector<float> theta(layout.size()), g(layout.size());
    problem.initial_params(theta);
    auto& mine = record.steps[static_cast<std::size_t>(comm.rank())];
    for (int t = 1; t <= steps; ++t) {
      problem.gradient(theta, t, comm.rank(), g);
      StepRecord r;
      auto res = opt->residual();
      r.residual_before.assign(res.begin(), res.end());
      r.grad = g;
      r.metrics = opt->step(theta, g);
      r.params_after = theta;
      auto mask = opt->mask();
      r.mask.assign(mask.begin(), mask.end());
      if (auto* s = dynamic_cast<ScapeOptimizer*>(opt.get())) {
        auto bits = s->next_mask_local_bits();
        r.next_local_bits.assign(bits.begin(), bits.end());
      }
      mine.push_back(std::move(r));
    }
    opt->finish();
    if (comm.rank() == 0) {
      std::lock_guard lock(ledger_mutex);
      record.ledger_totals = comm.ledger().totals();
    }
  });
  return record;
}

// SCAPE switch combinations that exercise every path of the step (lag, sharding, partition,
// residual, its decay and clip, second moment and inner rule, update mode, statistic, wire
// precision); tests that
// compare two implementations of the same step (backends, residual stores) run them all.
struct ScapeVariant {
  const char* name;
  void (*apply)(OptimizerConfig&);
};

inline const std::vector<ScapeVariant>& scape_variants() {
  static const std::vector<ScapeVariant> variants = {
      {"default (sharded, lag 1)", [](OptimizerConfig&) {}},
      {"lag 0", [](OptimizerConfig& c) { c.scape.mask_lag = 0; }},
      {"replicated", [](OptimizerConfig& c) { c.sharded = false; }},
      {"local_union", [](OptimizerConfig& c) {
         c.sharded = false;
         c.scape.mask_partition = MaskPartition::local_union;
       }},
      {"no residual", [](OptimizerConfig& c) { c.residual = false; }},
      {"two collectives, adamw", [](OptimizerConfig& c) {
         c.scape.second_moment = SecondMoment::two_collectives;
         c.inner = InnerRule::adamw;
       }},
      {"dense update", [](OptimizerConfig& c) { c.scape.update = UpdateMode::dense; }},
      {"gradient statistic", [](OptimizerConfig& c) { c.scape.mask_statistic = MaskStatistic::gradient; }},
      {"random statistic", [](OptimizerConfig& c) { c.scape.mask_statistic = MaskStatistic::random; }},
      {"momentum statistic", [](OptimizerConfig& c) { c.scape.mask_statistic = MaskStatistic::momentum_only; }},
      {"bf16 wire", [](OptimizerConfig& c) {
         c.wire_dtype = WireType::bf16;
         c.param_dtype = WireType::bf16;
       }},
      {"residual decay", [](OptimizerConfig& c) { c.residual_decay = 0.7; }},
      {"residual clip and decay, lag 0", [](OptimizerConfig& c) {
         c.residual_clip = 0.5;
         c.residual_decay = 0.9;
         c.scape.mask_lag = 0;
       }},
      {"clip_grad", [](OptimizerConfig& c) { c.clip_grad = 0.05; }},
      {"fp8 payload, replicated", [](OptimizerConfig& c) {
         c.sharded = false;
         c.wire_dtype = WireType::fp8_e5m2;
       }},
  };
  return variants;
}

// Whether the optimizer accepts `c`: a variant that has no meaning under a formulation (or with
// an offloaded residual) is skipped by the tests that loop over both.
inline bool accepted(const OptimizerConfig& c) {
  try {
    c.validate();
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

// Runs `sparse` at W = each of `workers` under each inner rule, and beside it the dense optimizer
// it must equal at density 1 (AdamS, or AdamW under inner = adamw), for `check` to compare.
// (doctest must be included by the test file.)
#ifdef DOCTEST_VERSION_STR
inline void for_each_dense_twin(OptimizerConfig sparse, const ParamLayout& layout, std::vector<int> workers,
                                int steps, const std::function<void(const RunRecord&, const RunRecord&)>& check) {
  for (const int w : workers) {
    for (const InnerRule inner : {InnerRule::adams, InnerRule::adamw}) {
      CAPTURE(w);
      CAPTURE(to_string(inner));
      sparse.inner = inner;
      OptimizerConfig dense = sparse;
      dense.type = inner == InnerRule::adams ? OptimizerType::adams : OptimizerType::adamw;
      check(run_quadratic(sparse, layout, w, steps), run_quadratic(dense, layout, w, steps));
    }
  }
}
#endif

// Two runs of the same configuration on different backends or residual stores: every
// parameter, residual and mask bit-identical on every worker and step, and the same bytes.
// (doctest must be included by the test file.)
#ifdef DOCTEST_VERSION_STR
inline void require_identical_runs(const RunRecord& a, const RunRecord& b) {
  REQUIRE(a.steps.size() == b.steps.size());
  for (std::size_t w = 0; w < a.steps.size(); ++w) {
    REQUIRE(a.steps[w].size() == b.steps[w].size());
    for (std::size_t t = 0; t < a.steps[w].size(); ++t) {
      CAPTURE(w);
      CAPTURE(t + 1);
      const StepRecord& x = a.steps[w][t];
      const StepRecord& y = b.steps[w][t];
      REQUIRE(x.mask == y.mask);
      REQUIRE(x.next_local_bits == y.next_local_bits);
      REQUIRE(x.residual_before == y.residual_before);
      REQUIRE(x.params_after == y.params_after);
      CHECK(x.metrics.residual_norm == y.metrics.residual_norm);
      CHECK(x.metrics.nonfinite_grads == y.metrics.nonfinite_grads);
      CHECK(x.metrics.mask_size == y.metrics.mask_size);
    }
  }
  for (const auto& [purpose, totals] : a.ledger_totals) {
    CAPTURE(purpose);
    REQUIRE(b.ledger_totals.count(purpose) == 1);
    CHECK(b.ledger_totals.at(purpose).payload_bytes == totals.payload_bytes);
    CHECK(b.ledger_totals.at(purpose).calls == totals.calls);
  }
}
#endif

inline bool bit(std::span<const std::uint64_t> words, std::size_t j) { return (words[j / 64] >> (j % 64)) & 1u; }

}  // namespace scape::testing
