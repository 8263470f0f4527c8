// Cost of one SCAPE step on the CPU core (issue 56): N = 16M in 16 tensors, one rank (the
// emulated communicator, W = 1), sparsity 0.99 and 0.9, against the dense AdamS step of the
// same N and a one-pass yardstick (a triad over 12 B a parameter), all timed in every
// iteration so that the reported ratios compare figures measured side by side on a shared
// machine. Targets: SCAPE <= 3x dense AdamS and <= 8x the yardstick.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/optimizer.hpp"
#include "optimizers/make_optimizer.hpp"
#include "optimizers/optimizer_config.hpp"
#include "sim/emulated_comm.hpp"
#include "util/rng.hpp"

namespace {

constexpr std::size_t kTensors = 16;
constexpr std::size_t kTensorSize = std::size_t{1} << 20;
constexpr std::size_t kN = kTensors * kTensorSize;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

scape::ParamLayout sixteen_tensors() {
  scape::ParamLayout layout;
  for (std::size_t i = 0; i < kTensors; ++i) layout.add("w" + std::to_string(i), {kTensorSize}, true);
  return layout;
}

scape::OptimizerConfig config_for(scape::OptimizerType type, double sparsity) {
  scape::OptimizerConfig c;
  c.type = type;
  c.sparsity = sparsity;
  return c;
}

// One optimizer's parameters and gradient; the gradient is fixed, as a repeated step of the
// same data costs what a fresh one does (the selection does not depend on the values' order).
struct Problem {
  Problem() : params(kN), grads(kN) {
    const std::uint64_t key = scape::rng::derive(42, 7);
    for (std::size_t j = 0; j < kN; ++j) {
      params[j] = static_cast<float>(scape::rng::normal(key, j));
      grads[j] = static_cast<float>(scape::rng::normal(key, kN + j));
    }
  }
  std::vector<float> params, grads;
};

double seconds_of_step(scape::Optimizer& opt, Problem& p) {
  const auto start = Clock::now();
  benchmark::DoNotOptimize(opt.step(p.params, p.grads));
  return seconds_since(start);
}

// a = b + s*c over N floats: two reads and a write, 12 B a parameter.
double seconds_of_yardstick(std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
  const auto count = static_cast<std::int64_t>(a.size());
  float* __restrict out = a.data();
  const float* __restrict x = b.data();
  const float* __restrict y = c.data();
  const auto start = Clock::now();
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < count; ++i) out[i] = x[i] + 3.0f * y[i];
  benchmark::DoNotOptimize(a.data());
  return seconds_since(start);
}

void BM_ScapeStep(benchmark::State& state) {
  const double sparsity = static_cast<double>(state.range(0)) / 1000.0;
  const scape::ParamLayout layout = sixteen_tensors();
  Problem scape_problem, dense_problem;
  std::vector<float> a(kN, 0.0f), b(kN, 1.0f), c(kN, 2.0f);
  double scape_s = 0, dense_s = 0, yard_s = 0;
  scape::sim::run_ranks(1, scape::NetworkModel{}, [&](scape::Communicator& comm) {
    auto scape_opt = scape::make_optimizer(config_for(scape::OptimizerType::scape, sparsity), layout, comm, 1000000);
    auto dense_opt = scape::make_optimizer(config_for(scape::OptimizerType::adams, 0.0), layout, comm, 1000000);
    // Two warm-up steps: the first selects its mask within the step, later ones receive the
    // lagged mask (the steady state); page faults and thread start go with them.
    for (int t = 0; t < 2; ++t) {
      seconds_of_step(*scape_opt, scape_problem);
      seconds_of_step(*dense_opt, dense_problem);
      seconds_of_yardstick(a, b, c);
    }
    for (auto _ : state) {
      const double s = seconds_of_step(*scape_opt, scape_problem);
      const double d = seconds_of_step(*dense_opt, dense_problem);
      const double y = seconds_of_yardstick(a, b, c);
      scape_s += s;
      dense_s += d;
      yard_s += y;
      state.SetIterationTime(s);
    }
    scape_opt->finish();
  });
  const double iterations = static_cast<double>(state.iterations());
  state.counters["scape_ms"] = 1e3 * scape_s / iterations;
  state.counters["adams_ms"] = 1e3 * dense_s / iterations;
  state.counters["yardstick_ms"] = 1e3 * yard_s / iterations;
  state.counters["x_adams"] = scape_s / dense_s;
  state.counters["x_yardstick"] = scape_s / yard_s;
}

}  // namespace

BENCHMARK(BM_ScapeStep)
    ->Arg(990)
    ->Arg(900)
    ->ArgName("sparsity_permille")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
