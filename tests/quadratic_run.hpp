// Test helper: runs one optimizer configuration on W emulated workers over the noisy
// quadratic and records, per worker and step, the parameters, the mask used, the residual
// before the step, the gradient and the step metrics, so tests can check the invariants.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "core/optimizer.hpp"
#include "core/scape_optimizer.hpp"
#include "sim/emulated_comm.hpp"
#include "sim/synthetic_gradients.hpp"

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
  sim::QuadraticSpec spec;
  spec.seed = seed;
  spec.noise = noise;
  const sim::NoisyQuadratic problem(layout.size(), spec);
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

inline bool bit(std::span<const std::uint64_t> words, std::size_t j) { return (words[j / 64] >> (j % 64)) & 1u; }

}  // namespace scape::testing
