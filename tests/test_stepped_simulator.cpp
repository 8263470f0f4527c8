// The stepped runners of the Python package, in C++: the stepped simulator fed the noisy
// quadratic's gradients equals `run_simulated` on model.type "quadratic" bit for bit (parameters,
// every non-timing metric), and TransportComm over an in-process transport equals EmulatedComm.
#include <doctest/doctest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "experiments/config.hpp"
#include "experiments/hdf5.hpp"
#include "runtime/stepped_rank.hpp"
#include "runtime/transport_comm.hpp"
#include "sim/emulated_comm.hpp"
#include "sim/sim_run.hpp"
#include "sim/stepped_simulator.hpp"
#include "sim/synthetic_gradients.hpp"
#include "test_support.hpp"

namespace ex = scape::experiments;
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

scape::sim::NoisyQuadratic problem_of(const ex::ExperimentConfig& c) {
  scape::sim::QuadraticSpec spec;
  spec.seed = c.seed;
  spec.noise = c.model.noise;
  spec.curvature_tail = c.model.curvature_tail;
  return scape::sim::NoisyQuadratic(static_cast<std::size_t>(c.model.size), spec);
}

// Every /metrics dataset that does not measure time on this machine.
std::map<std::string, std::vector<double>> deterministic_metrics(const fs::path& file) {
  auto f = ex::File::open(file, ex::Access::read);
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
  return ex::File::open(file, ex::Access::read).open_dataset("final/params").read_all<float>();
}

// The quadratic's run, once through run_simulated and once stepped with the same gradients.
void check_stepped_equals_run(const nlohmann::json& optimizer) {
  TempDir dir;
  const ex::ExperimentConfig run_config = ex::parse_experiment(quadratic_config(optimizer), dir.path);
  tr::RunOptions run_options;
  run_options.out = dir.path / "run.h5";
  run_options.quiet = true;
  REQUIRE(scape::sim::run_simulated(run_config, run_options).status == tr::RunStatus::completed);

  nlohmann::json external = quadratic_config(optimizer);
  external["model"] = {{"type", "external"}};
  ex::ExperimentConfig stepped_config = ex::parse_experiment(external, dir.path);
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
  scape::sim::SteppedSimulator sim(ex::parse_experiment(j, dir.path),
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
  CHECK(ex::File::open(options.out, ex::Access::read).open_dataset("metrics/bytes_sent").read_all<double>().size() == 1);
}

TEST_CASE("external model type: scape run's loader refuses it, naming the key") {
  TempDir dir;
  const auto config = ex::parse_experiment({{"model", {{"type", "external"}}}}, dir.path);
  CHECK(scape::testing::error_of([&] { (void)tr::load_source_data(config); }).rfind("model.type: \"external\"", 0) == 0);
}

namespace {

// A process group of threads: each collective publishes its buffers, meets at a barrier, copies
// what it receives, and meets again.
struct ThreadHub {
  explicit ThreadHub(int w) : sync(w), send(static_cast<std::size_t>(w)), send_counts(static_cast<std::size_t>(w)) {}
  std::barrier<> sync;
  std::vector<const std::byte*> send;
  std::vector<std::vector<std::size_t>> send_counts;
};

class ThreadTransport final : public scape::runtime::CollectiveTransport {
 public:
  ThreadTransport(ThreadHub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(hub_.send.size()); }
  void all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                        std::span<const std::size_t> counts) override {
    hub_.send[static_cast<std::size_t>(rank_)] = send.data();
    hub_.sync.arrive_and_wait();
    std::size_t at = 0;
    for (std::size_t q = 0; q < counts.size(); at += counts[q], ++q) {
      if (counts[q] > 0) std::memcpy(recv.data() + at, hub_.send[q], counts[q]);
    }
    hub_.sync.arrive_and_wait();
  }
  void all_to_all_bytes(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                        std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    hub_.send[static_cast<std::size_t>(rank_)] = send.data();
    hub_.send_counts[static_cast<std::size_t>(rank_)].assign(send_counts.begin(), send_counts.end());
    hub_.sync.arrive_and_wait();
    std::size_t at = 0;
    for (std::size_t q = 0; q < recv_counts.size(); at += recv_counts[q], ++q) {
      const auto& theirs = hub_.send_counts[q];
      REQUIRE(theirs[static_cast<std::size_t>(rank_)] == recv_counts[q]);
      std::size_t offset = 0;
      for (int r = 0; r < rank_; ++r) offset += theirs[static_cast<std::size_t>(r)];
      if (recv_counts[q] > 0) std::memcpy(recv.data() + at, hub_.send[q] + offset, recv_counts[q]);
    }
    hub_.sync.arrive_and_wait();
  }
  void all_reduce_sum(std::span<float> data) override {
    hub_.send[static_cast<std::size_t>(rank_)] = reinterpret_cast<const std::byte*>(data.data());
    hub_.sync.arrive_and_wait();
    std::vector<float> sum(data.size(), 0.0f);
    for (const std::byte* p : hub_.send) {
      const float* f = reinterpret_cast<const float*>(p);
      for (std::size_t j = 0; j < sum.size(); ++j) sum[j] += f[j];
    }
    hub_.sync.arrive_and_wait();
    std::copy(sum.begin(), sum.end(), data.begin());
  }
  void barrier() override { hub_.sync.arrive_and_wait(); }

 private:
  ThreadHub& hub_;
  int rank_;
};

}  // namespace

TEST_CASE("stepped ranks over a transport: the same parameters and run file as the stepped simulator") {
  for (const nlohmann::json& optimizer :
       {nlohmann::json{{"type", "scape"}, {"sparsity", 0.9}, {"lr", 0.01}},
        nlohmann::json{{"type", "adamw"}, {"lr", 0.01}, {"sharded", true}}}) {
    CAPTURE(optimizer.dump());
    TempDir dir;
    nlohmann::json j = quadratic_config(optimizer);
    const ex::ExperimentConfig quadratic = ex::parse_experiment(j, dir.path);
    const auto problem = problem_of(quadratic);
    j["model"] = {{"type", "external"}};
    const ex::ExperimentConfig config = ex::parse_experiment(j, dir.path);
    scape::ParamLayout layout;
    layout.add("theta", {static_cast<std::size_t>(kSize)}, true);
    std::vector<float> init(static_cast<std::size_t>(kSize));
    problem.initial_params(init);
    tr::RunOptions options;
    options.quiet = true;
    options.out = dir.path / "sim.h5";
    scape::sim::SteppedSimulator sim(config, std::make_unique<tr::ExternalData>(layout, init), options);
    std::vector<std::vector<float>> grads(kWorkers, std::vector<float>(static_cast<std::size_t>(kSize)));
    for (int t = 1; t <= kSteps; ++t) {
      std::vector<std::span<const float>> spans;
      for (int w = 0; w < kWorkers; ++w) {
        problem.gradient(sim.params(), t, w, grads[static_cast<std::size_t>(w)]);
        spans.emplace_back(grads[static_cast<std::size_t>(w)]);
      }
      REQUIRE_FALSE(sim.step(spans, {}));
    }
    sim.close();

    ThreadHub hub(kWorkers);
    tr::RunOptions rank_options = options;
    rank_options.out = dir.path / "ranks.h5";
    std::vector<std::vector<float>> params(kWorkers);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorkers; ++r) {
      threads.emplace_back([&, r] {
        ThreadTransport transport(hub, r);
        scape::runtime::SteppedRank rank(config, std::make_unique<tr::ExternalData>(layout, init), rank_options,
                                         transport, true);
        std::vector<float> g(static_cast<std::size_t>(kSize));
        for (int t = 1; t <= kSteps; ++t) {
          problem.gradient(rank.params(), t, r, g);
          (void)rank.step(g, std::numeric_limits<double>::quiet_NaN());
        }
        rank.close();
        params[static_cast<std::size_t>(r)].assign(rank.params().begin(), rank.params().end());
      });
    }
    for (auto& t : threads) t.join();
    const auto want = final_params(dir.path / "sim.h5");
    for (const auto& p : params) CHECK(p == want);
    CHECK(final_params(dir.path / "ranks.h5") == want);
    check_same_metrics(dir.path / "ranks.h5", dir.path / "sim.h5");
  }
}
