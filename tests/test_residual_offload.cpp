// The offloaded residual (pinned host memory streamed through two device chunks) against the
// resident one. On the CPU backend the chunk copies are plain memcpy, so the chunking and
// double-buffering order of ResidualStore and the chunked SCAPE passes are checked here on
// every machine; test_device_optimizer repeats the comparison on a GPU.
#include <doctest/doctest.h>

#include <numeric>
#include <vector>

#include "kernels/backend.hpp"
#include "optimizers/feedback/residual_store.hpp"
#include "tests/earlier_formulation.hpp"
#include "tests/quadratic_run.hpp"

using namespace scape;

TEST_CASE("ResidualStore visits chunks in order, covering [0, N), and keeps only written-back changes") {
  auto backend = kernels::make_backend(kernels::DeviceKind::cpu);
  const std::size_t n = 2500;
  ResidualStore store(*backend, n, true, 1024);
  CHECK(store.offloaded());
  CHECK(store.device_bytes() == 2 * 1024 * sizeof(float));

  std::vector<std::size_t> begins, sizes;
  store.for_each_chunk(true, [&](std::size_t begin, std::span<float> chunk) {
    begins.push_back(begin);
    sizes.push_back(chunk.size());
    for (std::size_t j = 0; j < chunk.size(); ++j) chunk[j] = static_cast<float>(begin + j);
  });
  CHECK(begins == std::vector<std::size_t>{0, 1024, 2048});
  CHECK(sizes == std::vector<std::size_t>{1024, 1024, 452});
  const auto host = store.host_view();
  for (std::size_t j = 0; j < n; ++j) REQUIRE(host[j] == static_cast<float>(j));

  // Each chunk arrives with the values written back before it, also through the reused slots.
  double seen = 0;
  store.for_each_chunk(false, [&](std::size_t, std::span<float> chunk) {
    for (float& x : chunk) {
      seen += x;
      x = -1.0f;  // discarded: a read-only pass copies nothing back
    }
  });
  CHECK(seen == static_cast<double>(n) * static_cast<double>(n - 1) / 2);
  for (std::size_t j = 0; j < n; ++j) REQUIRE(host[j] == static_cast<float>(j));

  ResidualStore resident(*backend, n, false, 1024);
  CHECK_FALSE(resident.offloaded());
  CHECK(resident.device_bytes() == n * sizeof(float));
  int calls = 0;
  resident.for_each_chunk(true, [&](std::size_t begin, std::span<float> chunk) {
    ++calls;
    CHECK(begin == 0);
    CHECK(chunk.size() == n);
  });
  CHECK(calls == 1);
}

namespace {

// The earlier formulation (every variant applies) or the paper's (the default).
OptimizerConfig scape_config(bool paper = false) {
  OptimizerConfig c = paper ? OptimizerConfig{} : scape::testing::earlier_formulation();
  c.type = OptimizerType::scape;
  c.lr = 0.05;
  c.sparsity = 0.9;
  c.offload_chunk = 1024;
  return c;
}

}  // namespace

TEST_CASE("SCAPE with an offloaded residual equals the resident residual, bit for bit") {
  // N = 4 * 1315 + ... (not a multiple of the chunk or of 64), so shards, chunks and words all
  // cut each other at different places.
  const ParamLayout layout = testing::mixed_layout(4);
  REQUIRE(layout.size() > 3 * 1024);
  int compared = 0;
  for (const int workers : {1, 3}) {
    for (const bool paper : {false, true}) {
     for (const auto& v : testing::scape_variants()) {
      CAPTURE(workers);
      CAPTURE(paper);
      CAPTURE(v.name);
      OptimizerConfig resident = scape_config(paper);
      v.apply(resident);
      OptimizerConfig offloaded = resident;
      offloaded.residual_offload = true;
      if (!testing::accepted(offloaded)) continue;  // fp8, and the variants paper rejects
      ++compared;
      const auto a = testing::run_quadratic(resident, layout, workers, 12);
      const auto b = testing::run_quadratic(offloaded, layout, workers, 12);
      testing::require_identical_runs(a, b);
      // The residual really carries undelivered gradient, so the comparison is not vacuous.
      if (resident.residual) CHECK(a.steps[0].back().metrics.residual_norm > 0);
     }
    }
  }
  CHECK(compared == 2 * (14 + 10));  // every variant but fp8 earlier; paper also drops four
}

TEST_CASE("The offloaded residual reports the device memory it saves") {
  const ParamLayout layout = testing::mixed_layout(4);
  OptimizerConfig c = scape_config();
  c.residual_offload = true;
  sim::run_ranks(1, NetworkModel{}, [&](Communicator& comm) {
    ScapeOptimizer opt(c, c.scape, layout, comm, 3);
    CHECK(opt.residual_device_bytes() == 2 * 1024 * sizeof(float));
    const std::string summary = opt.device_summary();
    CHECK(summary.find("residual offloaded") != std::string::npos);
    CHECK(summary.find("saves") != std::string::npos);
  });
}

TEST_CASE("Bad device settings are rejected naming the field") {
  OptimizerConfig c = scape_config();
  c.type = OptimizerType::topk_ef;  // the baselines have no CUDA path
  c.device = kernels::DeviceKind::cuda;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("optimizer.device"), std::invalid_argument);
  c.type = OptimizerType::adamw;
  c.sharded = true;
  CHECK_NOTHROW(c.validate());
  c.device = kernels::DeviceKind::cpu;
  c.residual_offload = true;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("optimizer.residual_offload"), std::invalid_argument);
  c = scape_config();
  c.offload_chunk = 10;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("optimizer.offload_chunk"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(kernels::parse_device_kind("gpu", "optimizer.device"), doctest::Contains("cpu or cuda"),
                       std::invalid_argument);
  if (!kernels::cuda_built()) {
    CHECK_THROWS_WITH_AS(kernels::make_backend(kernels::DeviceKind::cuda), doctest::Contains("without CUDA"),
                         std::runtime_error);
  } else if (kernels::cuda_device_count() == 0) {
    CHECK_THROWS_WITH_AS(kernels::make_backend(kernels::DeviceKind::cuda), doctest::Contains("no CUDA device"),
                         std::runtime_error);
  }
}
