// End-to-end tests of `scape sweep` (every point run, completed points skipped on a re-run, a
// failing or diverged point, shared runs, repeat and lr_search) and of the replay source
// driving `scape run` from a recorded gradient trace. `scape run` itself: tests/test_harness.cpp.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "harness_fixtures.hpp"
#include "run_file/run_summary.hpp"

namespace fs = std::filesystem;

using scape::testing::run_scape;
using scape::testing::TempDir;
using namespace scape::testing::harness;

TEST_CASE("scape sweep runs every point, skips completed ones on a re-run, and survives a failing point") {
  TempDir dir;
  const std::string sweep = R"({
    "base": {"name": "sw", "workers": 2, "steps": 5, "model": {"type": "quadratic", "size": 3000},
             "optimizer": {"type": "scape", "lr": 0.01}},
    "grid": {"optimizer.sparsity": [0.9, 0.99]},
    "points": [{"optimizer.mask_lag": 0}, {"optimizer.mask_lag": 1}, {"optimizer.mask_lag": 7}]
  })";
  write_file(dir.path / "s.json", sweep);
  const auto checked = run_scape("validate " + (dir.path / "s.json").string());
  CHECK(checked.code == 2);  // validate checks every point of a sweep without running it
  CHECK(checked.output.find("sweep of 6 points, 2 invalid") != std::string::npos);
  auto r = run_scape("sweep " + (dir.path / "s.json").string() + " --out " + (dir.path / "out").string() +
                     " --jobs 2 --quiet");
  CAPTURE(r.output);
  CHECK(r.code == 1);  // the mask_lag 7 points are invalid; the others still ran
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path / "out")) files += e.path().extension() == ".h5";
  CHECK(files == 4);
  CHECK(r.output.find("optimizer.mask_lag: 7 is out of range") != std::string::npos);
  r = run_scape("sweep " + (dir.path / "s.json").string() + " --out " + (dir.path / "out").string() + " --quiet");
  std::size_t skipped = 0;
  for (std::size_t pos = 0; (pos = r.output.find("skipped (completed)", pos)) != std::string::npos; ++pos) ++skipped;
  CHECK(skipped == 4);
  // Skipped points still report their figures, read back from their files.
  CHECK(r.output.find("skipped (completed) | n/a | ") != std::string::npos);
  CHECK(r.output.find("skipped (completed) | | ") == std::string::npos);
}

TEST_CASE("a sweep re-run keeps a diverged point as its result and still exits 3") {
  TempDir dir;
  const std::string gpt = std::string(kTinyGpt);
  write_file(dir.path / "s.json", R"({"base": )" + gpt + R"(,
    "points": [{"optimizer.type": "adamw", "optimizer.lr": 1e3, "steps": 40}, {"optimizer.type": "adams"}]})");
  const std::string cmd =
      "sweep " + (dir.path / "s.json").string() + " --out " + (dir.path / "out").string() + " --quiet";
  auto r = run_scape(cmd);
  CAPTURE(r.output);
  REQUIRE(r.code == 3);
  fs::path diverged;
  for (const auto& e : fs::directory_iterator(dir.path / "out")) {
    if (e.path().extension() == ".h5" && scape::run_file::read_run_summary(e.path()).status == "diverged")
      diverged = e.path();
  }
  REQUIRE(!diverged.empty());
  const auto written = fs::last_write_time(diverged);
  r = run_scape(cmd);
  CAPTURE(r.output);
  CHECK(r.code == 3);
  CHECK(r.output.find("skipped (diverged)") != std::string::npos);
  CHECK(r.output.find("skipped (completed)") != std::string::npos);
  CHECK(r.output.find("running the point again") == std::string::npos);
  CHECK(fs::last_write_time(diverged) == written);  // not run again
}

TEST_CASE("sweep points that train identically share one run: a dense optimizer ignores sparsity") {
  TempDir dir;
  write_file(dir.path / "s.json", R"({
    "base": {"name": "d", "workers": 2, "steps": 3, "model": {"type": "quadratic", "size": 3000},
             "optimizer": {"lr": 0.01}},
    "grid": {"optimizer.type": ["adams", "scape"], "optimizer.sparsity": [0.9, 0.99]}
  })");
  const auto r =
      run_scape("sweep " + (dir.path / "s.json").string() + " --out " + (dir.path / "out").string() + " --quiet");
  CAPTURE(r.output);
  CHECK(r.code == 0);
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path / "out")) files += e.path().extension() == ".h5";
  CHECK(files == 3);
  CHECK(r.output.find("4 points, 3 to run, 1 the same run as another point") != std::string::npos);
  CHECK(r.output.find("optimizer.sparsity=0.99 optimizer.type=adams: the same run as optimizer.sparsity=0.9 "
                      "optimizer.type=adams") != std::string::npos);
  // Both dense rows report the one run's figures.
  CHECK(r.output.find("| optimizer.sparsity=0.99 optimizer.type=adams | completed | n/a |") != std::string::npos);
  // The resolved config of a dense optimizer carries no sparse-only switch.
  write_file(dir.path / "a.json", R"({"model": {"type": "quadratic", "size": 100}, "optimizer": {"type": "adams"}})");
  const auto v = run_scape("validate " + (dir.path / "a.json").string());
  CHECK(v.output.find("\"sparsity\"") == std::string::npos);
  CHECK(v.output.find("\"residual_offload\"") == std::string::npos);
}

TEST_CASE("repeat and lr_search: a sweep made with an explicit grid over seed and lr is recognised as done") {
  TempDir dir;
  const std::string base =
      R"("base": {"name": "rl", "workers": 2, "steps": 3, "model": {"type": "quadratic", "size": 2000},
             "optimizer": {"type": "scape", "sparsity": 0.9}})";
  write_file(dir.path / "grid.json", "{" + base + R"(, "grid": {"seed": [1, 2], "optimizer.lr": [0.01, 0.02]}})");
  write_file(dir.path / "short.json", "{" + base + R"(, "repeat": 2, "lr_search": [0.01, 0.02]})");
  const std::string out = " --out " + (dir.path / "out").string() + " --quiet";
  auto r = run_scape("sweep " + (dir.path / "grid.json").string() + out);
  CAPTURE(r.output);
  REQUIRE(r.code == 0);
  r = run_scape("sweep " + (dir.path / "short.json").string() + out);
  CHECK(r.code == 0);
  CHECK(r.output.find("4 points, 0 to run") != std::string::npos);
  CHECK(r.output.find("| optimizer.lr=0.02 seed=2 | skipped (completed) |") != std::string::npos);
  // A bad entry exits 2 naming it, in validate and in sweep alike, before anything runs.
  write_file(dir.path / "bad.json", "{" + base + R"(, "repeat": 2, "lr_search": [0.01, 0.02, -0.5]})");
  for (const std::string cmd : {"validate ", "sweep "}) {
    r = run_scape(cmd + (dir.path / "bad.json").string() + (cmd == "sweep " ? out : ""));
    CHECK(r.code == 2);
    CHECK(r.output.find("error: sweep.lr_search[2]: -0.5 must be finite and > 0") != std::string::npos);
  }
  write_file(dir.path / "zero.json", "{" + base + R"(, "repeat": 0})");
  r = run_scape("validate " + (dir.path / "zero.json").string());
  CHECK(r.code == 2);
  CHECK(r.output.find("error: sweep.repeat: 0 is out of range [1, 1000]") != std::string::npos);
}

TEST_CASE("replay: a recorded gradient trace drives the optimizer; workers and steps are checked against it") {
  TempDir dir;
  const fs::path trace = dir.path / "trace.h5";
  const std::string py = "cd " + std::string(SCAPE_SOURCE_DIR) +
                         " && PYTHONPATH=python /usr/bin/python3 -m scape.trace --demo " + trace.string() +
                         " --steps 6 --workers 3 > /dev/null 2>&1";
  if (std::system(py.c_str()) != 0) {
    MESSAGE("skipped: /usr/bin/python3 with h5py and numpy is needed to write the trace");
    return;
  }
  const std::string cfg = R"({"name": "rep", "workers": 3, "steps": 6,
    "model": {"type": "replay", "path": "trace.h5"},
    "optimizer": {"type": "scape", "sparsity": 0.9, "lr": 0.01}, "log": {"save_params": true}})";
  auto r = run_config(dir, "r", cfg);
  CAPTURE(r.output);
  CHECK(r.code == 0);
  const auto loss = read_metric(dir.path / "r.h5", "train_loss");
  REQUIRE(loss.size() == 6);
  CHECK(std::isnan(loss[0]));  // a trace has no loss
  CHECK(read_metric(dir.path / "r.h5", "grad_norm")[0] > 0);
  r = run_scape("run " + (dir.path / "r.json").string() + " --out " + (dir.path / "x.h5").string() +
                " --quiet --set workers=2");
  CHECK(r.code == 2);
  CHECK(r.output.find("holds gradients of 3 workers") != std::string::npos);
  r = run_scape("run " + (dir.path / "r.json").string() + " --out " + (dir.path / "x.h5").string() +
                " --quiet --set steps=7");
  CHECK(r.code == 2);
  CHECK(r.output.find("exceeds the 6 steps") != std::string::npos);
  r = run_scape("run " + (dir.path / "r.json").string() + " --out " + (dir.path / "x.h5").string() +
                " --quiet --set model.path=nothere.h5");
  CHECK(r.code == 2);
  CHECK(r.output.find("nothere.h5") != std::string::npos);
}
