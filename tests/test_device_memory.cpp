// The device memory formula of a run (train/device_memory.hpp) against what the CPU backends
// allocate in the same run: on the CPU every Buffer the model, the training loop and the
// optimizer allocate goes through a CPU backend's allocate(), which counts the bytes, and a
// device run allocates the same Buffers on the GPU. The estimate must be within 2% of the
// measured peak for dense AdamW and AdamS and SCAPE (with and without a density warm-up, resident
// and offloaded residual), for the GPT and the Llama, at W = 1, 2 and 3; and it decides whether
// a run fits, as docs/runtime.md states for a 124M GPT at W = 8.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "experiments/config.hpp"
#include "kernels/backend.hpp"
#include "sim/sim_run.hpp"
#include "tests/test_support.hpp"
#include "train/device_memory.hpp"

namespace ex = scape::experiments;
namespace tr = scape::train;

namespace {

nlohmann::json small_run(const char* model, int workers, nlohmann::json optimizer) {
  return {{"name", "memory"},
          {"workers", workers},
          {"steps", 6},
          {"model",
           {{"type", model}, {"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"block_size", 32}, {"vocab_size", 128}}},
          {"data", {{"type", "synthetic"}, {"batch_size", 4}, {"tokens", 50000}}},
          {"optimizer", std::move(optimizer)},
          {"eval", {{"interval", 3}, {"batches", 1}}},
          {"log", {{"flush_interval", 3}}}};
}

// The peak of the CPU backends' allocations during one run, above what was held before it.
std::size_t measured_peak(const ex::ExperimentConfig& config) {
  scape::testing::TempDir dir;
  tr::RunOptions options;
  options.out = dir.path / "run.h5";
  options.quiet = true;
  const std::size_t before = scape::kernels::cpu_allocations().live;
  scape::kernels::reset_cpu_allocation_peak();
  const auto outcome = scape::sim::run_simulated(config, options);
  REQUIRE(outcome.status == tr::RunStatus::completed);
  return scape::kernels::cpu_allocations().peak - before;
}

}  // namespace

TEST_CASE("the device memory estimate is within 2% of what the run allocates") {
  const nlohmann::json optimizers[] = {
      {{"type", "adamw"}},
      {{"type", "adams"}},
      {{"type", "scape"}, {"sparsity", 0.9}},
      {{"type", "scape"}, {"sparsity", 0.99}, {"density_warmup", 3}},
      {{"type", "scape"}, {"sparsity", 0.9}, {"residual_offload", true}, {"offload_chunk", 4096}},
  };
  for (const char* model : {"gpt", "llama"}) {
    for (const int workers : {1, 2, 3}) {
      for (const auto& optimizer : optimizers) {
        const auto config = ex::parse_experiment(small_run(model, workers, optimizer), ".");
        const tr::DeviceMemory estimate = tr::device_memory_estimate(config);
        const std::size_t peak = measured_peak(config);
        CAPTURE(model);
        CAPTURE(workers);
        CAPTURE(optimizer.dump());
        CAPTURE(tr::describe(estimate));
        CAPTURE(peak);
        CHECK(std::abs(static_cast<double>(estimate.total()) - static_cast<double>(peak)) <= 0.02 * peak);
      }
    }
  }
}

// GPT-2 small (124M with the padded vocabulary 50304) at T = 1024 on one 80 GB GPU with W = 8
// simulated workers: 4 sequences per worker fit, 8 do not (the [B H T T] attention
// probabilities of every layer dominate: 0.6 GiB per sequence).
TEST_CASE("a 124M GPT at W = 8 fits in 80 GB with 4 sequences per worker, not with 8") {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0, k80GB = 80e9;
  nlohmann::json run = small_run("gpt", 8, {{"type", "scape"}, {"sparsity", 0.99}});
  run["model"] = {{"type", "gpt"}, {"n_layer", 12}, {"n_head", 12}, {"n_embd", 768}, {"block_size", 1024},
                  {"vocab_size", 50304}};
  for (const char* type : {"scape", "adams"}) {
    run["optimizer"]["type"] = type;
    if (std::string(type) == "adams") run["optimizer"].erase("sparsity");
    run["data"]["batch_size"] = 4;
    const tr::DeviceMemory four = tr::device_memory_estimate(ex::parse_experiment(run, "."));
    run["data"]["batch_size"] = 8;
    const tr::DeviceMemory eight = tr::device_memory_estimate(ex::parse_experiment(run, "."));
    CAPTURE(tr::describe(four));
    CAPTURE(tr::describe(eight));
    CHECK(four.params == 124475904 * sizeof(float));
    CHECK(static_cast<double>(four.total()) < k80GB);
    CHECK(static_cast<double>(eight.total()) > k80GB);
    CHECK(four.activations / kGiB > 4 * 1.0);  // activations, not the 0.46 GiB of parameters, decide
  }
}
