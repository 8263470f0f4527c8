// `scape run --backend nccl` in a build without MPI (runtime/nccl_single.hpp): one NCCL rank in
// this process. The refusals need no GPU and run in every CUDA build (ctest nccl_single_errors):
// workers other than 1, and no visible device, each exit before anything is written. With a GPU
// (ctest nccl_single_w1; exits 77, skipped, without one): 30 steps of SCAPE on a GPT as one NCCL
// rank match the one-GPU simulator at W = 1 within 1e-3 on every training and validation loss
// (at W = 1 NCCL moves the values unchanged; the bound is test_device_train's), and the run
// file holds the measured collective times a simulated run does not. Dense AdamS with its
// gradient reduced in buckets during the backward pass matches the simulator's whole reduction.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "kernels/backend.hpp"
#include "run_file/hdf5.hpp"
#include "runtime/nccl_single.hpp"
#include "sim/sim_run.hpp"
#include "tests/run_file_losses.hpp"
#include "tests/test_support.hpp"

namespace cfg = scape::config;
namespace fs = std::filesystem;
namespace tr = scape::train;

namespace {

cfg::ExperimentConfig run_config(int workers, const fs::path& dir, const std::string& set = "") {
  nlohmann::json j = {
      {"name", "nccl-single"},
      {"seed", 5},
      {"workers", workers},
      {"steps", 30},
      {"device", "cuda"},
      {"model",
       {{"type", "gpt"}, {"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"block_size", 32}, {"vocab_size", 128}}},
      {"data", {{"type", "synthetic"}, {"batch_size", 4}, {"tokens", 100000}}},
      {"optimizer", {{"type", "scape"}, {"sparsity", 0.9}, {"lr", 3e-3}, {"warmup_steps", 5}}},
      {"eval", {{"interval", 10}, {"batches", 2}}},
      {"log", {{"flush_interval", 10}}}};
  if (!set.empty()) cfg::apply_override(j, set);
  return cfg::parse_experiment(j, dir);
}

tr::RunOptions options_for(const fs::path& out) {
  tr::RunOptions o;
  o.out = out;
  o.quiet = true;
  return o;
}

// Runs `on_gpu` as one NCCL rank into `nccl` and `reference` in the simulator into `simulated`;
// both must complete with losses within 1e-3.
void nccl_matches_simulator(const cfg::ExperimentConfig& on_gpu, const cfg::ExperimentConfig& reference,
                            const fs::path& nccl, const fs::path& simulated) {
  const tr::RunOutcome ran = scape::runtime::run_nccl_single_process(on_gpu, options_for(nccl));
  INFO(ran.error);
  REQUIRE(ran.status == tr::RunStatus::completed);
  REQUIRE(scape::sim::run_simulated(reference, options_for(simulated)).status == tr::RunStatus::completed);
  scape::testing::losses_within(nccl, simulated, 1e-3);
}

}  // namespace

TEST_CASE("errors: workers other than 1, or no visible GPU, exit before anything is written") {
  scape::testing::TempDir dir;
  const fs::path out = dir / "run.h5";
  CHECK_THROWS_WITH_AS(scape::runtime::run_nccl_single_process(run_config(2, dir.path), options_for(out)),
                       doctest::Contains("workers: 2: --backend nccl in a scape built without MPI runs one rank"),
                       cfg::ConfigError);
  CHECK_FALSE(fs::exists(out));
  if (scape::kernels::cuda_device_count() == 0) {
    CHECK_THROWS_WITH_AS(scape::runtime::run_nccl_single_process(run_config(1, dir.path), options_for(out)),
                         doctest::Contains("--backend nccl: no CUDA device is visible"), cfg::ConfigError);
    CHECK_FALSE(fs::exists(out));
  }
}

TEST_CASE("gpu: 30 steps of SCAPE as one NCCL rank match the one-GPU simulator at W = 1 within 1e-3") {
  scape::testing::TempDir dir;
  const auto config = run_config(1, dir.path);
  const fs::path nccl = dir / "nccl.h5", simulated = dir / "sim.h5";
  nccl_matches_simulator(config, config, nccl, simulated);
  const auto f = scape::run_file::File::open(nccl, scape::run_file::Access::read);
  CHECK(f.has_link("/metrics/compute_wall_time"));
  CHECK(f.has_link("/metrics/mask_wait_exposed"));
  // Forward/backward timed on the model's stream: positive, and within the host's wall time
  // around the same pass (which also holds the launches before the first kernel).
  const auto device = scape::testing::read_series(nccl, "/metrics/compute_device_time");
  const auto wall = scape::testing::read_series(nccl, "/metrics/compute_wall_time");
  REQUIRE(device.size() == wall.size());
  for (std::size_t i = 0; i < device.size(); ++i) {
    CAPTURE(i);
    CHECK(device[i] > 0);
    CHECK(device[i] <= wall[i] * 1.001 + 1e-5);
  }
  const auto loss = scape::testing::read_series(nccl, "/metrics/train_loss");
  CHECK(loss.back() < loss.front() - 0.1);  // it trained
}

TEST_CASE("gpu: dense AdamS reducing its gradient in buckets during the backward pass matches the simulator") {
  // The buckets are reduced on NCCL's stream while the model's stream runs the rest of the
  // backward pass; a bucket started before its range was written would send stale values and
  // part from the simulator (which reduces the whole gradient at once) within a few steps.
  scape::testing::TempDir dir;
  const auto bucketed = run_config(1, dir.path, "optimizer={\"type\": \"adams\", \"lr\": 1e-3, \"overlap_grad_reduce\": true}");
  const auto whole = run_config(1, dir.path, "optimizer={\"type\": \"adams\", \"lr\": 1e-3}");
  const fs::path nccl = dir / "bucketed.h5", simulated = dir / "whole.h5";
  nccl_matches_simulator(bucketed, whole, nccl, simulated);
  for (const double wait : scape::testing::read_series(nccl, "/metrics/grad_wait_exposed")) CHECK(wait >= 0);
  for (const double t : scape::testing::read_series(nccl, "/metrics/comm_time_measured_async_reduce_scatter")) {
    CHECK(t > 0);
  }
}

// Without a device and without a test filter, only the refusals run, and the program then
// exits 77 so that the device check reports the GPU case as skipped.
int main(int argc, char** argv) {
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  bool filtered = false;
  for (int i = 1; i < argc; ++i) filtered = filtered || std::strncmp(argv[i], "-tc=", 4) == 0;
  if (scape::kernels::cuda_device_count() == 0 && !filtered) {
    std::puts("no CUDA device visible: the GPU run of the NCCL single-process check skipped (the refusals run)");
    std::fflush(stdout);
    context.addFilter("test-case", "errors*");
    const int result = context.run();
    return result != 0 ? result : 77;
  }
  return context.run();
}
