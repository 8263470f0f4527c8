// The device memory formula of a run (train/device_memory.hpp) against what the CPU backends
// allocate in the same run: on the CPU every Buffer the model, the training loop and the
// optimizer allocate goes through a CPU backend's allocate(), which counts the bytes, and a
// device run allocates the same Buffers on the GPU. The estimate must be within 2% of the
// measured peak for dense AdamW and AdamS and SCAPE (with and without a density warm-up, resident
// and offloaded residual), for the GPT and the Llama, at W = 1 and 3, with a workspace per
// worker and with the shared one; it decides whether a run fits, as docs/runtime.md states for
// a 124M GPT at W = 8. The same holds for DiLoCo (counted although it runs on the host) and under
// optimizer.hierarchy = "node", where each rank holds its rail's method over the rail's part and
// the wrapper's buffers; the state alone follows its closed form over the rail's part. And the
// shared model trains bit-identically to a model per worker.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/model_shapes.hpp"
#include "kernels/backend.hpp"
#include "optimizers/device_state.hpp"
#include "optimizers/rail_partition.hpp"
#include "run_file/hdf5.hpp"
#include "sim/sim_run.hpp"
#include "tests/test_support.hpp"
#include "train/device_memory.hpp"

namespace cfg = scape::config;
namespace tr = scape::train;

namespace {

nlohmann::json small_run(const char* model, int workers, nlohmann::json optimizer) {
  return {{"name", "memory"},
          {"workers", workers},
          {"steps", 3},
          {"model",
           {{"type", model}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 32}, {"block_size", 16}, {"vocab_size", 64}}},
          {"data", {{"type", "synthetic"}, {"batch_size", 2}, {"tokens", 20000}}},
          {"optimizer", std::move(optimizer)},
          {"eval", {{"interval", 3}, {"batches", 1}}},
          {"log", {{"flush_interval", 3}}}};
}

// The peak of the CPU backends' allocations during one run, above what was held before it.
std::size_t measured_peak(const cfg::ExperimentConfig& config, bool share_model) {
  scape::testing::TempDir dir;
  tr::RunOptions options;
  options.out = dir.path / "run.h5";
  options.quiet = true;
  options.share_model = share_model;
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
    for (const int workers : {1, 3}) {
      for (const auto& optimizer : optimizers) {
        for (const bool shared : {false, true}) {
          if (shared && workers == 1) continue;  // one worker: the same allocations
          const auto config = cfg::parse_experiment(small_run(model, workers, optimizer), ".");
          const tr::DeviceMemory estimate = tr::device_memory_estimate(config, workers, shared);
          const std::size_t peak = measured_peak(config, shared);
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
}

// W = 4 as 2 nodes x 2: every method with a hierarchy, both rail splits, against the flat run.
TEST_CASE("under hierarchy = node the estimate is within 2% of what the run allocates") {
  const nlohmann::json optimizers[] = {
      {{"type", "adams"}},
      {{"type", "scape"}, {"sparsity", 0.9}},
      {{"type", "scape"}, {"sparsity", 0.99}, {"rail_split", "rows"}},
      {{"type", "scape"}, {"sparsity", 0.9}, {"residual_offload", true}, {"offload_chunk", 4096}},
      {{"type", "diloco"}, {"inner_steps", 2}},
  };
  for (const char* model : {"gpt", "llama"}) {
    for (const auto& optimizer : optimizers) {
      for (const bool node : {false, true}) {
        nlohmann::json run = small_run(model, 4, optimizer);
        if (node) {
          run["topology"] = {{"ranks_per_node", 2}};
          run["optimizer"]["hierarchy"] = "node";
        } else {
          run["optimizer"].erase("rail_split");
        }
        const auto config = cfg::parse_experiment(run, ".");
        const tr::DeviceMemory estimate = tr::device_memory_estimate(config, 4, true);
        const std::size_t peak = measured_peak(config, true);
        CAPTURE(model);
        CAPTURE(run["optimizer"].dump());
        CAPTURE(tr::describe(estimate));
        CAPTURE(peak);
        CHECK(std::abs(static_cast<double>(estimate.total()) - static_cast<double>(peak)) <= 0.02 * peak);
      }
    }
  }
}

// Dense AdamS (replicated) on a layout of four tensors of 30, 20, 10 and 4 floats, W = 4 as
// 2 x 2. Tensors: rail 0 gets 30 + 4, rail 1 gets 20 + 10. Each rank holds m and g_bar over its
// part (8 bytes a float), one block sum of ||theta|| (8 bytes), the wrapper's N + 2 part floats.
// Rows (dim 0 of each [d0, 1] tensor halved): 15 + 10 + 5 + 2 = 32 floats a rail.
TEST_CASE("hierarchy = node: the device and state bytes of a rank, by hand") {
  scape::ParamLayout layout;
  const std::pair<const char*, std::size_t> tensors[] = {{"a", 30}, {"b", 20}, {"c", 10}, {"d", 4}};
  for (const auto& [name, rows] : tensors) layout.add(name, {rows, 1}, true);
  scape::OptimizerConfig c;
  c.type = scape::OptimizerType::adams;
  c.sharded = false;
  const std::size_t n = 64;
  CHECK(scape::optimizer_device_bytes(c, layout, 4) == 4 * 2 * n + 8);
  CHECK(scape::optimizer_state_bytes(c, layout, 4) == 4 * n);
  c.hierarchy = scape::Hierarchy::node;
  c.ranks_per_node = 2;
  const auto rank = [&](std::size_t part) { return 4 * 2 * part + 8 + 4 * (n + 2 * part); };
  CHECK(scape::optimizer_device_bytes(c, layout, 4) == rank(34));
  CHECK(scape::optimizer_device_bytes_all(c, layout, 4) == 2 * (rank(34) + rank(30)));
  CHECK(scape::optimizer_state_bytes(c, layout, 4) == 4 * 34);
  c.rail_split = scape::RailSplit::rows;
  CHECK(scape::optimizer_device_bytes_all(c, layout, 4) == 4 * rank(32));
  CHECK(scape::optimizer_state_bytes(c, layout, 4) == 4 * 32);
}

// SCAPE's state (paper formulation, sharded): m and the owner's carried momentum over the owned
// shard, the residual over all it steps. Flat on W = 8: 2 N / 8 + N; as 2 nodes x 4 (rows split,
// every tensor of GPT-2 small cut in four equal slices), 2 (N / 4) / 2 + N / 4: 5/4 N against
// 1/2 N floats. The sharded moments stay N / W a rank; the residual falls by G.
TEST_CASE("hierarchy = node: SCAPE's state on GPT-2 small falls from 5/4 N to 1/2 N floats") {
  nlohmann::json run = small_run("gpt", 8, {{"type", "scape"}, {"sparsity", 0.99}});
  run["model"] = {{"type", "gpt"}, {"n_layer", 12},      {"n_head", 12},
                  {"n_embd", 768}, {"block_size", 1024}, {"vocab_size", 50304}};
  const auto config = cfg::parse_experiment(run, ".");
  const scape::ParamLayout layout = cfg::language_model_spec(config.model).layout();
  const std::size_t n = layout.size();
  REQUIRE(n == 124475904);
  scape::OptimizerConfig o = config.optimizer;
  REQUIRE(o.carries_owner_momentum());
  CHECK(scape::optimizer_state_bytes(o, layout, 8) == 4 * (2 * (n / 8) + n));
  o.hierarchy = scape::Hierarchy::node;
  o.ranks_per_node = 4;
  o.rail_split = scape::RailSplit::rows;
  const auto parts = scape::split_into_rails(layout, 4, scape::RailSplit::rows);
  const std::size_t part = parts[scape::largest_rail(parts)].size();
  CHECK(part == n / 4);  // every dim 0 (768, 2304, 3072, 50304, 1024) divides by 4
  CHECK(scape::optimizer_state_bytes(o, layout, 8) == 4 * (2 * (part / 2) + part));
}

// GPT-2 small (124M with the padded vocabulary 50304) at T = 1024 on one 80 GB GPU with W = 8
// simulated workers. With a workspace per worker, 4 sequences per worker fit and 8 do not (the
// [B H T T] attention probabilities of every layer dominate: 0.6 GiB per sequence); with the
// simulator's shared workspace, 8 per worker take 24.8 GiB.
TEST_CASE("a 124M GPT at W = 8 fits in 80 GB: 8 sequences per worker with the shared workspace") {
  constexpr double k80GB = 80e9;
  nlohmann::json run = small_run("gpt", 8, {{"type", "scape"}, {"sparsity", 0.99}});
  run["model"] = {{"type", "gpt"}, {"n_layer", 12}, {"n_head", 12}, {"n_embd", 768}, {"block_size", 1024},
                  {"vocab_size", 50304}};
  for (const char* type : {"scape", "adams"}) {
    run["optimizer"]["type"] = type;
    if (std::string(type) == "adams") run["optimizer"].erase("sparsity");
    const auto at = [&](int batch, bool shared) {
      run["data"]["batch_size"] = batch;
      return tr::device_memory_estimate(cfg::parse_experiment(run, "."), 8, shared);
    };
    CAPTURE(tr::describe(at(4, false)));
    CAPTURE(tr::describe(at(8, false)));
    CAPTURE(tr::describe(at(8, true)));
    CHECK(at(4, false).params == 124475904 * sizeof(float));
    CHECK(static_cast<double>(at(4, false).total()) < k80GB);
    CHECK(static_cast<double>(at(8, false).total()) > k80GB);
    CHECK(static_cast<double>(at(8, true).total()) < 0.4 * k80GB);
    CHECK(at(8, true).activations > 10 * at(8, true).params);  // the activations decide
  }
}

// Invariant 4 (replicas identical) is what lets one model serve every worker; the workspace
// holds nothing from one pass to the next. So the run with one shared model equals the run with
// a model per worker bit for bit: every loss and the final parameters.
TEST_CASE("workers sharing one model and workspace train bit-identically to a model each") {
  for (const char* model : {"gpt", "llama"}) {
    CAPTURE(model);
    nlohmann::json run = small_run(model, 3, {{"type", "scape"}, {"sparsity", 0.9}, {"lr", 1e-2}});
    run["steps"] = 6;
    run["log"]["save_params"] = true;
    const auto config = cfg::parse_experiment(run, ".");
    scape::testing::TempDir dir;
    std::vector<std::filesystem::path> files;
    for (const bool shared : {false, true}) {
      tr::RunOptions options;
      options.out = dir.path / (shared ? "shared.h5" : "own.h5");
      options.quiet = true;
      options.share_model = shared;
      REQUIRE(scape::sim::run_simulated(config, options).status == tr::RunStatus::completed);
      files.push_back(options.out);
    }
    auto own = scape::run_file::File::open(files[0], scape::run_file::Access::read), shared = scape::run_file::File::open(files[1], scape::run_file::Access::read);
    for (const char* dataset : {"/metrics/train_loss", "/eval/val_loss", "/metrics/grad_norm"}) {
      CAPTURE(dataset);
      CHECK(own.open_dataset(dataset).read_all<double>() == shared.open_dataset(dataset).read_all<double>());
    }
    const auto params = own.open_dataset("/final/params").read_all<float>();
    CHECK(params.size() > 5000);
    CHECK(params == shared.open_dataset("/final/params").read_all<float>());
  }
}
