// Harness overhead: for the quickstart model at W = 8, the CPU time of the optimizer step
// with its emulated collectives (metrics included), rank 0's combining of the reports (the
// oracle top-k and gradient norm) and its HDF5 writes, as fractions of the forward/backward
// time of the same run (targets: at most 15% overall, 2% for HDF5 logging alone).
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <numeric>

#include "config/config.hpp"
#include "run_file/hdf5.hpp"
#include "sim/sim_run.hpp"

namespace {

namespace cfg = scape::config;

double sum_metric(const std::filesystem::path& file, const char* name) {
  auto f = scape::run_file::File::open(file, scape::run_file::Access::read);
  const auto v = f.open_dataset(std::string("/metrics/") + name).read_all<double>();
  return std::accumulate(v.begin() + 1, v.end(), 0.0);  // step 1 carries one-off warm-up costs
}

cfg::ExperimentConfig quickstart_model(const char* optimizer, int workers) {
  const nlohmann::json j = {
      {"name", "bench"},
      {"workers", workers},
      {"steps", 40},
      {"model",
       {{"type", "gpt"}, {"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"block_size", 64}, {"vocab_size", 64}}},
      {"data", {{"type", "synthetic"}, {"batch_size", 4}, {"tokens", 200000}}},
      {"optimizer", {{"type", optimizer}, {"sparsity", 0.99}}},
      {"eval", {{"interval", 1000}, {"batches", 1}}},
      {"log", {{"flush_interval", 10}}}};
  return cfg::parse_experiment(j, std::filesystem::current_path());
}

void BM_HarnessOverhead(benchmark::State& state, const char* optimizer) {
  const int workers = static_cast<int>(state.range(0));
  const auto config = quickstart_model(optimizer, workers);
  const auto out =
      std::filesystem::temp_directory_path() / ("scape-bench-harness-" + std::to_string(::getpid()) + ".h5");
  scape::train::RunOptions options;
  options.out = out;
  options.quiet = true;
  double compute = 0, optimizer_s = 0, aggregate = 0, record = 0;
  for (auto _ : state) {
    const auto outcome = scape::sim::run_simulated(config, options);
    if (outcome.status != scape::train::RunStatus::completed) state.SkipWithError(outcome.error.c_str());
    // Per-worker means times W: the total CPU time the W workers spent.
    compute += workers * sum_metric(out, "compute_time");
    optimizer_s += workers * sum_metric(out, "optimizer_time");
    aggregate += sum_metric(out, "aggregate_time");
    record += sum_metric(out, "record_time");
  }
  std::filesystem::remove(out);
  state.counters["overhead_vs_fwd_bwd"] = (optimizer_s + aggregate + record) / compute;
  state.counters["optimizer_vs_fwd_bwd"] = optimizer_s / compute;
  state.counters["aggregate_vs_fwd_bwd"] = aggregate / compute;
  state.counters["hdf5_logging_vs_fwd_bwd"] = record / compute;
}

}  // namespace

BENCHMARK_CAPTURE(BM_HarnessOverhead, scape_0_99, "scape")->Arg(8)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_HarnessOverhead, adams_dense, "adams")->Arg(8)->Unit(benchmark::kMillisecond)->Iterations(2);
BENCHMARK_CAPTURE(BM_HarnessOverhead, topk_ef_0_99, "topk_ef")->Arg(8)->Unit(benchmark::kMillisecond)->Iterations(2);

BENCHMARK_MAIN();
