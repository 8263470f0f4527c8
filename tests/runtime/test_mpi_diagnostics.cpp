// The diagnostics of a multi-process run (docs/configuration.md, "Diagnostics on real ranks"):
// `mpirun -np 2 scape run --backend mpi` defaults to no oracle and grad_norm every 100 steps;
// what the diagnostics send to rank 0 is its own column (bytes_sent_diagnostics), equal to the
// closed form, and apart from the optimizer's bytes; step_wall_time covers the whole step.
// `scape validate --backend mpi` prints the defaults that such a run records.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "tests/test_support.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using scape::testing::run_command;
using Dir = scape::testing::TempDir;

namespace {

// No log.oracle, no log.gradient_metrics_interval: the backend's defaults apply.
const char* kGpt = R"({"name": "diag", "seed": 3, "workers": 2, "steps": 8,
  "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "vocab_size": 32},
  "data": {"type": "synthetic", "batch_size": 2, "tokens": 20000},
  "optimizer": {"type": "scape", "sparsity": 0.99, "lr": 0.003},
  "eval": {"interval": 4, "batches": 1},
  "log": {"flush_interval": 3, "save_params": true}})";

std::vector<double> metric(const fs::path& f, const std::string& name) {
  return scape::run_file::File::open(f, scape::run_file::Access::read).open_dataset("/metrics/" + name).read_all<double>();
}

std::size_t param_count(const fs::path& f) {
  return scape::run_file::File::open(f, scape::run_file::Access::read).open_dataset("/final/params").read_all<float>().size();
}

json recorded_log(const fs::path& f) { return json::parse(scape::run_file::read_run_summary(f).config_json)["log"]; }

// `scape validate ARGS`: its exit status, and the log section of the config it prints on stdout
// (its stderr, the "valid (run id ...)" line, left out).
std::pair<int, json> validated_log(const std::string& args) {
  const auto r = run_command("{ " + std::string(SCAPE_BINARY) + " validate " + args + " 2>/dev/null; }");
  return {r.code, r.code == 0 ? json::parse(r.output)["log"] : json()};
}

}  // namespace

TEST_CASE("scape validate --backend mpi prints the multi-process defaults; the simulator's stay") {
  Dir dir;
  std::ofstream(dir.path / "diag.json") << kGpt;
  const auto cfg = (dir.path / "diag.json").string();
  const auto [sim_code, sim_log] = validated_log(cfg);
  REQUIRE(sim_code == 0);
  CHECK(sim_log["oracle"] == true);
  CHECK_FALSE(sim_log.contains("gradient_metrics_interval"));  // 1, left out as before
  for (const char* backend : {"mpi", "nccl"}) {
    CAPTURE(std::string(backend));
    const auto [code, log] = validated_log(cfg + " --backend " + backend);
    REQUIRE(code == 0);
    CHECK(log["oracle"] == false);
    CHECK(log["gradient_metrics_interval"] == 100);
  }
  // What the config gives is kept on every backend.
  const auto [asked_code, asked_log] =
      validated_log(cfg + " --backend mpi --set log.oracle=true --set log.gradient_metrics_interval=1");
  REQUIRE(asked_code == 0);
  CHECK(asked_log == sim_log);
}

#ifdef MPIEXEC

namespace {

std::string mpirun(const std::string& args) {
  return "OMP_NUM_THREADS=1 " + std::string(MPIEXEC) + " --oversubscribe -np 2 -x OMP_NUM_THREADS " + SCAPE_BINARY +
         " run " + args;
}

}  // namespace

TEST_CASE("W = 2: the default run sends diagnostics only at step 1; asked-for ones equal the closed form") {
  Dir dir;
  std::ofstream(dir.path / "diag.json") << kGpt;
  const auto cfg = (dir.path / "diag.json").string();
  const auto run = [&](const std::string& name, const std::string& set) {
    const fs::path out = dir.path / (name + ".h5");
    const auto r = run_command(mpirun(cfg + " --backend mpi --quiet --out " + out.string() + " " + set));
    CAPTURE(r.output);
    REQUIRE(r.code == 0);
    CHECK(r.output.find("completed after 8/8 steps in ") != std::string::npos);
    return out;
  };
  constexpr double kW = 2;

  // Defaults: no oracle; grad_norm at steps 1, 101, ...: of these 8 steps, step 1 only.
  const fs::path plain = run("default", "");
  const double n = static_cast<double>(param_count(plain));
  CHECK(recorded_log(plain)["oracle"] == false);
  CHECK(recorded_log(plain)["gradient_metrics_interval"] == 100);
  const auto bytes = metric(plain, "bytes_sent_diagnostics");
  const auto grad_norm = metric(plain, "grad_norm");
  REQUIRE(bytes.size() == 8);
  CHECK(bytes[0] == 4 * kW * n);  // the gradients of grad_norm, W N floats
  CHECK(std::isfinite(grad_norm[0]));
  for (std::size_t i = 1; i < bytes.size(); ++i) {
    CAPTURE(i);
    CHECK(bytes[i] == 0);
    CHECK(std::isnan(grad_norm[i]));
  }
  for (const double o : metric(plain, "mask_oracle_overlap")) CHECK(std::isnan(o));
  // Every step's wall time from its start to the next one's, the last one's too, and the
  // diagnostics' time inside it.
  const auto wall = metric(plain, "step_wall_time");
  const auto diag_time = metric(plain, "diagnostics_time");
  const auto compute = metric(plain, "compute_wall_time");
  const auto optimizer = metric(plain, "optimizer_wall_time");
  for (std::size_t i = 0; i < wall.size(); ++i) {
    CAPTURE(i);
    REQUIRE(std::isfinite(wall[i]));
    CHECK(diag_time[i] >= 0);
    CHECK(wall[i] >= diag_time[i]);  // rank 0's step holds its diagnostics' gathers
    CHECK(wall[i] > 0);
    CHECK(compute[i] > 0);
    CHECK(optimizer[i] > 0);
  }

  // Asked for, under SCAPE's frozen_momentum (whose mask the oracles score) every 2 steps: at
  // steps 1, 3, 5, 7 the gradients (W N floats), the a_i (W N) and the first moment's shards (N).
  const fs::path asked = run("oracle", "--set optimizer.formulation=frozen_momentum --set optimizer.mask_scope=shard "
                                       "--set log.oracle=true --set log.gradient_metrics_interval=2");
  const auto asked_bytes = metric(asked, "bytes_sent_diagnostics");
  REQUIRE(asked_bytes.size() == 8);
  for (std::size_t i = 0; i < asked_bytes.size(); ++i) {
    CAPTURE(i);
    CHECK(asked_bytes[i] == (i % 2 == 0 ? 4 * (kW * n + kW * n + n) : 0.0));
  }
  CHECK(std::isfinite(metric(asked, "mask_oracle_overlap")[0]));
  // The oracle of the paper formulation is not defined: no a_i travels for it, only grad_norm's.
  const fs::path paper = run("paper", "--set log.oracle=true --set log.gradient_metrics_interval=1");
  for (const double b : metric(paper, "bytes_sent_diagnostics")) CHECK(b == 4 * kW * n);
  // The optimizer's own bytes do not count the diagnostics: the same as the default run's.
  CHECK(metric(paper, "bytes_sent") == metric(plain, "bytes_sent"));

  // Dense AdamS with grad_norm every step: W N floats a step, no oracle to send for.
  const fs::path dense = run("dense", "--set optimizer.type=adams --set log.oracle=true --set log.gradient_metrics_interval=1");
  for (const double b : metric(dense, "bytes_sent_diagnostics")) CHECK(b == 4 * kW * n);
  for (const double g : metric(dense, "grad_norm")) CHECK(std::isfinite(g));
}

TEST_CASE("step_wall_time: its sum is the run's steps, within the start-up of the whole command") {
  Dir dir;
  std::ofstream(dir.path / "diag.json") << kGpt;
  const fs::path out = dir.path / "long.h5";
  const auto r = run_command(mpirun((dir.path / "diag.json").string() + " --backend mpi --quiet --set steps=40 --out " +
                                    out.string()));
  CAPTURE(r.output);
  REQUIRE(r.code == 0);
  const auto wall = metric(out, "step_wall_time");
  REQUIRE(wall.size() == 40);
  const double sum = std::accumulate(wall.begin(), wall.end(), 0.0);
  // The rows tile rank 0's time from the start of step 1 to the end of step 40; mpirun's own
  // start-up and the run's setup come on top.
  CHECK(sum > 0);
  CHECK(sum <= r.seconds);
}

#else

TEST_CASE("MPI diagnostics") { MESSAGE("skipped: scape was built without MPI"); }

#endif
