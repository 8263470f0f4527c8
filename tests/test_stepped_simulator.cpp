// The stepped runner of the Python package, in C++: the stepped simulator fed the noisy
// quadratic's gradients equals `run_simulated` on model.type "quadratic" bit for bit (parameters,
// every non-timing metric).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "run_file/hdf5.hpp"
#include "sim/sim_run.hpp"
#include "sim/stepped_simulator.hpp"
#include "test_support.hpp"
#include "train/noisy_quadratic.hpp"

namespace cfg = scape::config;
namespace tr = scape::train;
namespace fs = std::filesystem;
using scape::testing::TempDir;

namespace {

constexpr int kWorkers = 3;
constexpr int kSteps = 12;
constexpr std::int64_t kSize = 4096;

nlohmann::json quadratic_config(const nlohmann::json& optimizer) {
  return {{"name", "stepped"}, {"seed", 5}, {"workers", kWorkers}, {"steps", kSteps},
          {"model", {{"type", "quadratic"}, {"size", kSize}}}, {"optimizer", optimizer},
          {"log", {{"save_params", true}}}};
}

scape::train::NoisyQuadratic problem_of(const cfg::ExperimentConfig& c) {
  scape::train::QuadraticSpec spec;
  spec.seed = c.seed;
  spec.noise = c.model.noise;
  spec.curvature_tail = c.model.curvature_tail;
  return scape::train::NoisyQuadratic(static_cast<std::size_t>(c.model.size), spec);
}

// Every /metrics dataset that does not measure time on this machine.
std::map<std::string, std::vector<double>> deterministic_metrics(const fs::path& file) {
  auto f = scape::run_file::File::open(file, scape::run_file::Access::read);
  std::map<std::string, std::vector<double>> out;
  for (const std::string& name : f.child_names("metrics")) {
    if (name.find("time") != std::string::npos || name.find("_s") + 2 == name.size() ||
        name.find("wait") != std::string::npos || name.find("cost") != std::string::npos) {
      continue;
    }
    out[name] = f.open_dataset("metrics/" + name).read_all<double>();
  }
  return out;
}

// Every non-timing metric of `got` equals `want`'s, row by row (NaN equal to NaN).
void check_same_metrics(const fs::path& got_file, const fs::path& want_file) {
  const auto want = deterministic_metrics(want_file);
  const auto got = deterministic_metrics(got_file);
  REQUIRE(want.size() > 10);
  for (const auto& [name, values] : want) {
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    const auto& other = got.at(name);
    REQUIRE(other.size() == values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      CAPTURE(i);
      CHECK(((std::isnan(values[i]) && std::isnan(other[i])) || values[i] == other[i]));
    }
  }
}

std::vector<float> final_params(const fs::path& file) {
  return scape::run_file::File::open(file, scape::run_file::Access::read).open_dataset("final/params").read_all<float>();
}

// The quadratic's run, once through run_simulated and once stepped with the same gradients.
void check_stepped_equals_run(const nlohmann::json& optimizer) {
  TempDir dir;
  const cfg::ExperimentConfig run_config = cfg::parse_experiment(quadratic_config(optimizer), dir.path);
  tr::RunOptions run_options;
  run_options.out = dir.path / "run.h5";
  run_options.quiet = true;
  REQUIRE(scape::sim::run_simulated(run_config, run_options).status == tr::RunStatus::completed);

  nlohmann::json external = quadratic_config(optimizer);
  external["model"] = {{"type", "external"}};
  cfg::ExperimentConfig stepped_config = cfg::parse_experiment(external, dir.path);
  const auto problem = problem_of(run_config);
  scape::ParamLayout layout;
  layout.add("theta", {static_cast<std::size_t>(kSize)}, true);
  std::vector<float> init(static_cast<std::size_t>(kSize));
  problem.initial_params(init);
  tr::RunOptions options = run_options;
  options.out = dir.path / "stepped.h5";
  scape::sim::SteppedSimulator sim(stepped_config, std::make_unique<tr::ExternalData>(layout, init), options);
  std::vector<std::vector<float>> grads(kWorkers, std::vector<float>(static_cast<std::size_t>(kSize)));
  for (int t = 1; t <= kSteps; ++t) {
    std::vector<std::span<const float>> spans;
    std::vector<double> losses;
    for (int w = 0; w < kWorkers; ++w) {
      problem.gradient(sim.params(), t, w, grads[static_cast<std::size_t>(w)]);
      spans.emplace_back(grads[static_cast<std::size_t>(w)]);
      losses.push_back(problem.loss(sim.params()));
    }
    REQUIRE_FALSE(sim.step(spans, losses));
  }
  CHECK(sim.close().status == tr::RunStatus::completed);

  CHECK(final_params(dir.path / "stepped.h5") == final_params(dir.path / "run.h5"));
  check_same_metrics(dir.path / "stepped.h5", dir.path / "run.h5");
}

}  // namespace

TEST_CASE("stepped simulator: the quadratic's gradients handed in give run_simulated's run bit for bit") {
  SUBCASE("SCAPE 90%, paper formulation, sharded") {
    check_stepped_equals_run({{"type", "scape"}, {"sparsity", 0.9}, {"lr", 0.01}});
  }
  SUBCASE("SCAPE 99%, artifact formulation, replicated") {
    check_stepped_equals_run({{"type", "scape"}, {"sparsity", 0.99}, {"lr", 0.01}, {"formulation", "artifact"},
                              {"sharded", false}});
  }
  SUBCASE("dense AdamS") { check_stepped_equals_run({{"type", "adams"}, {"lr", 0.01}}); }
  SUBCASE("top-k EF") { check_stepped_equals_run({{"type", "topk_ef"}, {"sparsity", 0.9}, {"lr", 0.01}, {"sharded", false}}); }
}

TEST_CASE("stepped simulator: wrong gradients, steps past the end and an early close are errors, never lost rows") {
  TempDir dir;
  nlohmann::json j = quadratic_config({{"type", "scape"}, {"sparsity", 0.9}});
  j["model"] = {{"type", "external"}};
  j["steps"] = 2;
  scape::ParamLayout layout;
  layout.add("w", {64}, true);
  tr::RunOptions options;
  options.out = dir.path / "e.h5";
  options.quiet = true;
  scape::sim::SteppedSimulator sim(cfg::parse_experiment(j, dir.path),
                                   std::make_unique<tr::ExternalData>(layout, std::vector<float>(64, 0.5f)), options);
  std::vector<float> g(64, 0.1f), short_g(63, 0.1f);
  std::vector<std::span<const float>> two(2, std::span<const float>(g));
  CHECK(scape::testing::error_of([&] { (void)sim.step(two, {}); }) == "grads: 2 gradients for 3 workers");
  std::vector<std::span<const float>> bad{g, short_g, g};
  CHECK(scape::testing::error_of([&] { (void)sim.step(bad, {}); }) == "grads[1]: 63 values for a layout of 64");
  std::vector<std::span<const float>> good(3, std::span<const float>(g));
  CHECK_FALSE(sim.step(good, {}));
  CHECK(sim.steps_done() == 1);
  const auto outcome = sim.close();
  CHECK(outcome.status == tr::RunStatus::failed);
  CHECK(outcome.error == "closed after step 1 of 2");
  CHECK(scape::testing::error_of([&] { (void)sim.step(good, {}); }) == "step: the simulator is closed");
  CHECK(scape::run_file::File::open(options.out, scape::run_file::Access::read).open_dataset("metrics/bytes_sent").read_all<double>().size() == 1);
}

TEST_CASE("external model type: scape run's loader refuses it, naming the key") {
  TempDir dir;
  const auto config = cfg::parse_experiment({{"model", {{"type", "external"}}}}, dir.path);
  CHECK(scape::testing::error_of([&] { (void)tr::load_source_data(config); }).rfind("model.type: \"external\"", 0) == 0);
}
