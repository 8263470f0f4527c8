// scape-quadratic-study: the optimizer core on its own. W emulated workers train the noisy
// quadratic (train/noisy_quadratic.hpp) with dense AdamS, SCAPE and raw-gradient top-k, and
// a table compares final loss, bytes sent per step against dense, mask stability and the
// modelled communication time on a chosen link.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "core/ledger.hpp"
#include "core/optimizer.hpp"
#include "optimizers/make_optimizer.hpp"
#include "sim/emulated_comm.hpp"
#include "train/noisy_quadratic.hpp"

namespace {

struct Row {
  std::string name;
  double loss = 0;
  double bytes_per_step = 0;
  double exposed_s_per_step = 0;
  double jaccard_sum = 0;
  int jaccard_count = 0;
};

scape::ParamLayout study_layout(std::size_t n) {
  // Two decayed matrices and an undecayed vector, like a small network.
  scape::ParamLayout layout;
  layout.add("w1", {n / 2 / 256, 256}, true);
  layout.add("w2", {n / 2 / 256, 256}, true);
  layout.add("bias", {1000}, false);
  return layout;
}

Row run(const std::string& name, const scape::OptimizerConfig& config, const scape::ParamLayout& layout, int workers,
        int steps, const scape::NetworkModel& net, const scape::train::NoisyQuadratic& problem) {
  Row row;
  row.name = name;
  std::mutex mu;
  scape::sim::run_ranks(workers, net, [&](scape::Communicator& comm) {
    auto opt = scape::make_optimizer(config, layout, comm, steps);
    std::vector<float> theta(layout.size()), g(layout.size());
    problem.initial_params(theta);
    double bytes = 0, exposed = 0, jaccard = 0;
    int jn = 0;
    for (int t = 1; t <= steps; ++t) {
      problem.gradient(theta, t, comm.rank(), g);
      const auto m = opt->step(theta, g);
      const auto s = scape::summarize(m.comm);
      bytes += s.bytes_sent_per_worker;
      exposed += s.exposed_time_s;
      if (m.mask_jaccard == m.mask_jaccard) {
        jaccard += m.mask_jaccard;
        ++jn;
      }
    }
    opt->finish();
    if (comm.rank() == 0) {
      std::lock_guard lock(mu);
      row.loss = problem.loss(theta);
      row.bytes_per_step = bytes / steps;
      row.exposed_s_per_step = exposed / steps;
      row.jaccard_sum = jaccard;
      row.jaccard_count = jn;
    }
  });
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trains a noisy quadratic with W emulated workers and compares dense AdamS, SCAPE and "
               "raw-gradient top-k: final loss, bytes per step against dense, mask Jaccard, modelled "
               "exposed communication time."};
  int workers = 4;
  int steps = 200;
  std::size_t params = 1 << 18;
  double alpha_us = 5.0;
  double bandwidth_GBps = 50.0;
  std::uint64_t seed = 1;
  app.add_option("--workers", workers, "number of emulated workers")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--params", params, "number of parameters")->check(CLI::Range(4096, 1 << 28))->capture_default_str();
  app.add_option("--alpha-us", alpha_us, "link latency per message step, microseconds (InfiniBand NDR ~5)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--bandwidth-GBps", bandwidth_GBps, "per-worker link bandwidth, GB/s (NDR 400 Gb/s = 50)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seed", seed, "seed of the quadratic and its noise")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const scape::ParamLayout layout = study_layout(params);
  scape::train::QuadraticSpec spec;
  spec.seed = seed;
  spec.noise = 0.5;
  const scape::train::NoisyQuadratic problem(layout.size(), spec);
  const scape::NetworkModel net{alpha_us * 1e-6, bandwidth_GBps * 1e9};

  scape::OptimizerConfig base;
  base.lr = 5e-2;
  base.weight_decay = 0;
  std::vector<std::pair<std::string, scape::OptimizerConfig>> runs;
  auto dense = base;
  dense.type = scape::OptimizerType::adams;
  runs.emplace_back("dense AdamS (sharded)", dense);
  for (double sparsity : {0.9, 0.99}) {
    auto c = base;
    c.sparsity = sparsity;
    runs.emplace_back("SCAPE " + std::to_string(sparsity).substr(0, 4), c);
  }
  auto topk = base;
  topk.type = scape::OptimizerType::topk_ef;
  topk.sharded = false;
  topk.sparsity = 0.99;
  runs.emplace_back("top-k EF 0.99 (AdamS)", topk);

  std::vector<float> zero(layout.size(), 0.0f);
  std::fprintf(stderr, "noisy quadratic: N = %zu, W = %d, %d steps, initial loss %.4g\n", layout.size(), workers, steps,
               problem.loss(zero));
  std::vector<Row> rows;
  for (const auto& [name, config] : runs) {
    const auto start = std::chrono::steady_clock::now();
    rows.push_back(run(name, config, layout, workers, steps, net, problem));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "  %-24s done in %.1f s\n", name.c_str(), secs);
  }
  std::printf("\n| optimizer | final loss | bytes/step vs dense | mean mask Jaccard | exposed comm ms/step |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const auto& r : rows) {
    const std::string jac = r.jaccard_count ? std::to_string(r.jaccard_sum / r.jaccard_count).substr(0, 5) : "n/a";
    std::printf("| %s | %.4g | %.4f | %s | %.3f |\n", r.name.c_str(), r.loss, r.bytes_per_step / rows[0].bytes_per_step,
                jac.c_str(), r.exposed_s_per_step * 1e3);
  }
  return 0;
}
