// Sweep expansion (config/sweep.cpp): repeat and lr_search give the points, in the order
// and with the configs that an explicit grid over seed and optimizer.lr gives (so the run ids,
// and the files a re-run skips, are the same), and bad values are errors naming the key; the
// run-file lock that keeps two sweeps into one folder from running a point twice.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <set>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/sweep_plan.hpp"
#include "run_file/run_lock.hpp"
#include "test_support.hpp"

namespace cfg = scape::config;
using nlohmann::json;
using scape::testing::error_of;

namespace {

const json kBase = json::parse(R"({
  "name": "sw", "workers": 2, "steps": 3,
  "model": {"type": "quadratic", "size": 300},
  "optimizer": {"type": "scape", "sparsity": 0.9, "lr": 0.01}
})");

std::vector<cfg::SweepPoint> expand(const json& sweep) { return cfg::expand_sweep(sweep, "."); }

// The run id of every point, in expansion order.
std::vector<std::string> run_ids(const std::vector<cfg::SweepPoint>& points) {
  std::vector<std::string> ids;
  for (const auto& p : points) ids.push_back(cfg::run_id(cfg::parse_experiment(p.config, ".").to_json()));
  return ids;
}

std::string label(const cfg::SweepPoint& p) {
  std::string s;
  for (const auto& [k, v] : p.assignment) s += (s.empty() ? "" : " ") + k + "=" + v.dump();
  return s;
}

}  // namespace

TEST_CASE("repeat and lr_search: every point/grid combination at each lr and each seed, in that order") {
  json sweep = {{"base", kBase},
                {"points", json::parse(R"([{"optimizer.type": "adams"}, {"optimizer.type": "scape"}])")},
                {"grid", {{"workers", {2, 4}}}},
                {"lr_search", {0.001, 0.003, 0.01}},
                {"repeat", 2}};
  sweep["base"]["seed"] = 5;
  const auto points = expand(sweep);
  REQUIRE(points.size() == 2u * 2u * 3u * 2u);
  CHECK(label(points[0]) == R"(optimizer.type="adams" workers=2 optimizer.lr=0.001 seed=5)");
  CHECK(label(points[1]) == R"(optimizer.type="adams" workers=2 optimizer.lr=0.001 seed=6)");
  CHECK(label(points[2]) == R"(optimizer.type="adams" workers=2 optimizer.lr=0.003 seed=5)");
  CHECK(label(points[6]) == R"(optimizer.type="adams" workers=4 optimizer.lr=0.001 seed=5)");
  CHECK(label(points[23]) == R"(optimizer.type="scape" workers=4 optimizer.lr=0.01 seed=6)");
  for (const auto& p : points) {
    const auto c = cfg::parse_experiment(p.config, ".");
    CHECK((c.seed == 5 || c.seed == 6));
    CHECK((c.optimizer.lr == 0.001 || c.optimizer.lr == 0.003 || c.optimizer.lr == 0.01));
    CHECK(c.optimizer.sparsity == 0.9);  // the base's other settings stay
  }
  // 24 distinct configs: no two points collapse.
  const auto ids = run_ids(points);
  CHECK(std::set<std::string>(ids.begin(), ids.end()).size() == 24u);
}

TEST_CASE("repeat and lr_search give the run ids of the explicit grid over seed and optimizer.lr") {
  const json points = json::parse(R"([{"optimizer.type": "adamw"}, {"optimizer.type": "scape"}])");
  const json shorthand = {{"base", kBase}, {"points", points}, {"lr_search", {0.002, 0.02}}, {"repeat", 3}};
  const json explicit_grid = {{"base", kBase}, {"points", points},
                              {"grid", {{"seed", {1, 2, 3}}, {"optimizer.lr", {0.002, 0.02}}}}};
  auto a = run_ids(expand(shorthand));
  auto b = run_ids(expand(explicit_grid));
  REQUIRE(a.size() == 12u);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  CHECK(a == b);
  // Without a seed anywhere, repeat counts from the default seed 1.
  CHECK(!kBase.contains("seed"));
  const auto p = expand(json{{"base", kBase}, {"repeat", 3}});
  REQUIRE(p.size() == 3u);
  for (std::size_t i = 0; i < 3; ++i) CHECK(cfg::parse_experiment(p[i].config, ".").seed == 1 + i);
}

TEST_CASE("repeat counts from each point's own seed; a point's lr_search replaces the sweep's") {
  const json sweep = json::parse(R"({
    "points": [{"optimizer.type": "adamw", "lr_search": [0.0001, 0.0003]},
               {"optimizer.type": "scape", "seed": 10}],
    "lr_search": [0.01],
    "repeat": 2
  })");
  json s = sweep;
  s["base"] = kBase;
  const auto points = expand(s);
  std::vector<std::string> labels;
  for (const auto& p : points) labels.push_back(label(p));
  CHECK(labels == std::vector<std::string>{
                      R"(optimizer.type="adamw" optimizer.lr=0.0001 seed=1)",
                      R"(optimizer.type="adamw" optimizer.lr=0.0001 seed=2)",
                      R"(optimizer.type="adamw" optimizer.lr=0.0003 seed=1)",
                      R"(optimizer.type="adamw" optimizer.lr=0.0003 seed=2)",
                      R"(optimizer.type="scape" optimizer.lr=0.01 seed=10)",
                      R"(optimizer.type="scape" optimizer.lr=0.01 seed=11)"});
  CHECK(cfg::parse_experiment(points[5].config, ".").seed == 11);
  // A point's lr_search is not a config key: it is never written into the config.
  CHECK(!points[0].config.contains("lr_search"));
}

TEST_CASE("bad repeat and lr_search values are errors naming the key and the entry") {
  auto error = [](json extra) {
    json s = {{"base", kBase}};
    s.update(extra);
    return error_of([&] { expand(s); });
  };
  CHECK(error({{"lr_search", json::array()}}) ==
        "sweep.lr_search: expected a non-empty array of learning rates, e.g. [1e-3, 3e-3]");
  CHECK(error({{"lr_search", 0.001}}).rfind("sweep.lr_search: expected a non-empty array", 0) == 0);
  CHECK(error({{"lr_search", {0.001, 0.002, -0.1}}}) == "sweep.lr_search[2]: -0.1 must be finite and > 0");
  CHECK(error({{"lr_search", {0.0}}}) == "sweep.lr_search[0]: 0.0 must be finite and > 0");
  CHECK(error({{"lr_search", {0.001, "fast"}}}) == "sweep.lr_search[1]: expected a number, got \"fast\"");
  CHECK(error({{"lr_search", {0.001, true}}}) == "sweep.lr_search[1]: expected a number, got true");
  CHECK(error({{"lr_search", {0.001, 0.001}}}) == "sweep.lr_search[1]: 0.001 repeats sweep.lr_search[0]");
  CHECK(error({{"repeat", 0}}) == "sweep.repeat: 0 is out of range [1, 1000]");
  CHECK(error({{"repeat", -2}}) == "sweep.repeat: -2 is out of range [1, 1000]");
  CHECK(error({{"repeat", 1001}}) == "sweep.repeat: 1001 is out of range [1, 1000]");
  CHECK(error({{"repeat", 2.5}}) == "sweep.repeat: expected an integer number of seeds, got 2.5");
  CHECK(error({{"repeat", "3"}}) == "sweep.repeat: expected an integer number of seeds, got \"3\"");
  CHECK(error({{"repeat", 2}, {"grid", {{"seed", {1, 2}}}}}) ==
        "sweep.repeat: cannot be combined with grid.seed: give the seeds in one place");
  CHECK(error({{"lr_search", {0.1}}, {"grid", {{"optimizer.lr", {0.1}}}}}) ==
        "sweep.grid.optimizer.lr: cannot be combined with lr_search: give the rates in one place");
  CHECK(error({{"lr_search", {0.1}}, {"points", json::parse(R"([{"optimizer.lr": 0.2}])")}}) ==
        "sweep.points[0]: sets optimizer.lr, and lr_search applies to it: give the rates in one place");
  CHECK(error({{"points", json::parse(R"([{"optimizer.type": "adams"}, {"lr_search": [1, -1]}])")}}) ==
        "sweep.points[1].lr_search[1]: -1 must be finite and > 0");
  CHECK(error({{"repeat", 2}, {"points", json::parse(R"([{"seed": "one"}])")}}) ==
        "seed: expected a non-negative integer (sweep.repeat counts seeds from it), got \"one\"");
  CHECK(error({{"repeats", 2}}).rfind("sweep.repeats: unknown key; valid keys: ", 0) == 0);
  // Without any of grid, points, repeat and lr_search there is nothing to sweep.
  CHECK(error(json::object()).rfind("sweep: give a grid", 0) == 0);
}

TEST_CASE("a run file's lock: one holder at a time, the lock file gone on release, a waiter let in after") {
  scape::testing::TempDir dir;
  const auto run_file = dir / "p-0123.h5";
  auto first = scape::run_file::RunFileLock::try_acquire(run_file);
  REQUIRE(first.has_value());
  CHECK(first->lock_file() == dir / "p-0123.h5.lock");
  CHECK(std::filesystem::exists(first->lock_file()));
  // flock conflicts between open file descriptions, so a second lock in this process stands
  // for another sweep's.
  CHECK_FALSE(scape::run_file::RunFileLock::try_acquire(run_file).has_value());
  CHECK(scape::run_file::RunFileLock::try_acquire(dir / "p-4567.h5").has_value());  // other files are free

  std::atomic<bool> waiter_has_it{false};
  std::thread waiter([&] {
    auto lock = scape::run_file::RunFileLock::acquire(run_file);
    waiter_has_it = true;
    CHECK(std::filesystem::exists(lock.lock_file()));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(waiter_has_it.load());
  first.reset();  // unlinks, then unlocks: the waiter must re-open the name's new file
  waiter.join();
  CHECK(waiter_has_it.load());
  CHECK_FALSE(std::filesystem::exists(dir / "p-0123.h5.lock"));
  CHECK(scape::run_file::RunFileLock::try_acquire(run_file).has_value());

  const auto missing = dir / "no-such-folder" / "p.h5";
  const auto error = error_of([&] { (void)scape::run_file::RunFileLock::try_acquire(missing); });
  CHECK(error.find("no-such-folder/p.h5.lock: cannot create the lock file") != std::string::npos);
}

TEST_CASE("the sweep plan: equal resolved configs share one run, bad points are invalid, finished files answer") {
  scape::testing::TempDir dir;
  const auto sweep_file = dir / "s.json";
  {
    std::ofstream out(sweep_file);
    out << json{{"name", "plan"},
                {"base", {{"name", "plan"}, {"workers", 2}, {"steps", 2}, {"model", {{"type", "quadratic"}, {"size", 256}}}}},
                {"points",
                 {{{"optimizer.type", "adams"}, {"optimizer.sparsity", 0.9}},
                  {{"optimizer.type", "adams"}, {"optimizer.sparsity", 0.99}},  // sparsity: not an adams key
                  {{"optimizer.type", "scape"}, {"optimizer.mask_lag", 7}},
                  {{"optimizer.type", "scape"}}}}}
               .dump();
  }
  const auto out_dir = dir / "runs";
  const cfg::SweepPlan plan = cfg::plan_sweep(sweep_file, out_dir, {"steps=3"});
  REQUIRE(plan.points.size() == 4);
  CHECK(plan.points[0].label == "optimizer.sparsity=0.9 optimizer.type=adams");  // keys in sorted order
  CHECK(plan.points[0].config->steps == 3);  // the --set override reaches every point
  CHECK(plan.points[1].same_as == std::optional<std::size_t>(0));
  CHECK(plan.points[1].file == plan.points[0].file);
  CHECK_FALSE(plan.points[2].config.has_value());
  CHECK(plan.points[2].invalid.find("optimizer.mask_lag: 7") != std::string::npos);
  CHECK(plan.to_run == std::vector<std::size_t>{0, 3});
  CHECK(plan.points[3].file.parent_path() == out_dir);
  CHECK(plan.points[3].file.filename().string().starts_with("plan-"));

  // A file that is not a run file there runs again, saying why.
  std::filesystem::create_directories(out_dir);
  std::ofstream(plan.points[3].file) << "not hdf5";
  const cfg::SweepPlan again = cfg::plan_sweep(sweep_file, out_dir, {"steps=3"});
  CHECK(again.to_run == std::vector<std::size_t>{0, 3});
  CHECK(again.points[3].finished.empty());
  CHECK_FALSE(again.points[3].rerun_reason.empty());
}

TEST_CASE("the locked schedule runs every point once, defers a point another sweep holds, then waits for it") {
  scape::testing::TempDir dir;
  const std::vector<std::filesystem::path> files = {dir / "a.h5", dir / "b.h5", dir / "c.h5"};
  auto held = scape::run_file::RunFileLock::try_acquire(files[1]);  // "another sweep" runs b
  REQUIRE(held.has_value());
  std::mutex mu;
  std::vector<std::pair<std::size_t, bool>> ran;
  std::vector<std::size_t> deferred, waited;
  cfg::ScheduleHooks hooks;
  hooks.run = [&](std::size_t k, bool after_wait) {
    std::lock_guard guard(mu);
    ran.emplace_back(k, after_wait);
  };
  hooks.held_elsewhere = [&](std::size_t k) {
    std::lock_guard guard(mu);
    deferred.push_back(k);
  };
  hooks.waiting = [&](std::size_t k) {
    std::lock_guard guard(mu);
    waited.push_back(k);
    held.reset();  // the other sweep finishes while this one waits
  };
  hooks.unlocked = [](const std::filesystem::path&) {};
  cfg::run_planned(files, 2, hooks);
  CHECK(deferred == std::vector<std::size_t>{1});
  CHECK(waited == std::vector<std::size_t>{1});
  std::sort(ran.begin(), ran.end());
  CHECK(ran == std::vector<std::pair<std::size_t, bool>>{{0, false}, {1, true}, {2, false}});

  cfg::ScheduleHooks failing = hooks;
  failing.run = [](std::size_t k, bool) {
    if (k == 2) throw std::runtime_error("point 2 broke");
  };
  CHECK(error_of([&] { cfg::run_planned(files, 1, failing); }) == "point 2 broke");
}
