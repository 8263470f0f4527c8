// End-to-end runs of `mpirun -np W scape run --backend mpi`: bit-identical to the simulator in
// deterministic mode, equal to rounding in the default mode, the same byte counts, measured
// times recorded, and failures (a throwing rank, a hung rank) ending the job within 30 s with
// the failing rank's message and the run file closed as failed.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "run_file/run_lock.hpp"
#include "run_file/run_summary.hpp"
#include "tests/test_support.hpp"

namespace fs = std::filesystem;

#ifdef MPIEXEC

namespace {

using scape::testing::run_command;
using Dir = scape::testing::TempDir;

// One thread per process, as each simulated worker has on this machine, so that both run
// the same forward/backward arithmetic.
std::string mpirun(int np, const std::string& args, const std::string& env = "") {
  return env + " OMP_NUM_THREADS=1 " + MPIEXEC + " --oversubscribe -np " + std::to_string(np) +
         " -x OMP_NUM_THREADS" + (env.empty() ? "" : " -x SCAPE_INJECT_FAILURE") + " " + SCAPE_BINARY + " run " + args;
}

std::vector<float> params(const fs::path& f) {
  return scape::run_file::File::open(f, scape::run_file::Access::read).open_dataset("/final/params").read_all<float>();
}

std::vector<double> metric(const fs::path& f, const std::string& name) {
  return scape::run_file::File::open(f, scape::run_file::Access::read).open_dataset("/metrics/" + name).read_all<double>();
}

// The simulator's diagnostics, asked for (a multi-process run's defaults differ), so that both
// sides take grad_norm and the oracle metrics at every step and record the same config.
const char* kGpt = R"({"name": "eq", "seed": 2, "workers": 4, "steps": 8,
  "model": {"type": "gpt", "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16, "vocab_size": 32},
  "data": {"type": "synthetic", "batch_size": 2, "tokens": 20000},
  "optimizer": {"type": "scape", "sparsity": 0.99, "lr": 0.003},
  "eval": {"interval": 4, "batches": 1},
  "log": {"flush_interval": 2, "save_params": true, "oracle": true, "gradient_metrics_interval": 1}})";

}  // namespace

TEST_CASE("deterministic mode: mpirun -np 4 is bit-identical to the simulator with 4 workers, bytes included") {
  Dir dir;
  std::ofstream(dir.path / "eq.json") << kGpt;
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"dense AdamS", "--set optimizer.type=adams"},
      {"dense AdamS, reduce-scatter in buckets during the backward pass",
       "--set optimizer.type=adams --set optimizer.overlap_grad_reduce=true"},
      {"SCAPE 0.99 lag 1 partitioned sharded", ""},
      {"SCAPE 0.99 lag 1 partitioned replicated", "--set optimizer.sharded=false"},
      {"SCAPE 0.99 replicated, residual_decay 0.8, residual_clip 0.05",
       "--set optimizer.sharded=false --set optimizer.residual_decay=0.8 --set optimizer.residual_clip=0.05"},
      // Each formulation, and clip_grad (whose sharded norm is all-gathered).
      {"SCAPE 0.9 artifact sharded", "--set optimizer.formulation=artifact --set optimizer.sparsity=0.9"},
      {"SCAPE 0.9 artifact replicated",
       "--set optimizer.formulation=artifact --set optimizer.sparsity=0.9 --set optimizer.sharded=false"},
      {"SCAPE 0.99 frozen_momentum", "--set optimizer.formulation=frozen_momentum --set optimizer.mask_scope=shard"},
      {"SCAPE 0.9 clip_grad 0.05", "--set optimizer.sparsity=0.9 --set optimizer.clip_grad=0.05"},
      {"SCAPE 0.99 bitmap mask", "--set optimizer.mask_encoding=bitmap"},
      {"SCAPE 0.99, whole-gradient metrics every 2 steps", "--set log.gradient_metrics_interval=2"},
      {"SCAPE 0.99 auto-coded mask (sizes exchanged)", "--set optimizer.mask_encoding=auto"},
      {"shared-seed random-k EF 0.9", "--set optimizer.type=randk_ef --set optimizer.sparsity=0.9 --set optimizer.sharded=false"},
      {"top-k EF 0.9, residual_decay 0.9, residual_clip 1",
       "--set optimizer.type=topk_ef --set optimizer.sparsity=0.9 --set optimizer.sharded=false "
       "--set optimizer.residual_decay=0.9 --set optimizer.residual_clip=1"},
      {"1-bit Adam, freeze 3, chunk 256",
       "--set optimizer.type=onebit_adam --set optimizer.freeze_step=3 --set optimizer.sign_chunk=256 --set optimizer.sharded=false"},
      {"PowerSGD rank 2", "--set optimizer.type=powersgd --set optimizer.powersgd_rank=2 --set optimizer.sharded=false"},
      {"DeMo chunk 32, top 3",
       "--set optimizer.type=demo --set optimizer.demo_chunk=32 --set optimizer.demo_topk=3 --set optimizer.sharded=false"},
      {"DiLoCo H 3, AdamW inner", "--set optimizer.type=diloco --set optimizer.inner=adamw --set optimizer.inner_steps=3"},
      {"Streaming DiLoCo H 4, F 2, bf16 outer wire, overlap_outer",
       "--set optimizer.type=diloco --set optimizer.inner_steps=4 --set optimizer.streaming_fragments=2 "
       "--set optimizer.outer_wire=bf16 --set optimizer.overlap_outer=true"},
      {"DiLoCo H 2, fp8 outer wire", "--set optimizer.type=diloco --set optimizer.inner_steps=2 --set optimizer.outer_wire=fp8_e5m2"},
      {"SparseLoCo H 2, chunk 256, 2-bit", "--set optimizer.type=sparseloco --set optimizer.inner_steps=2 "
       "--set optimizer.chunk=256 --set optimizer.sparsity=0.95"},
      {"SparseLoCo H 4, 8-bit, bitmap indices, overlap_outer",
       "--set optimizer.type=sparseloco --set optimizer.inner_steps=4 --set optimizer.quant_bits=8 "
       "--set optimizer.mask_encoding=bitmap --set optimizer.overlap_outer=true"},
  };
  std::map<std::string, std::vector<float>> final_params;
  for (const auto& [name, set] : cases) {
    CAPTURE(std::string(name));
    const auto cfg = (dir.path / "eq.json").string();
    // One OpenMP thread per worker on both sides, whatever this machine's core count. The cases
    // reuse the two files with other configs, which scape run refuses without --force.
    const auto sim = run_command("OMP_NUM_THREADS=1 " + std::string(SCAPE_BINARY) + " run " + cfg + " --force --quiet --out " +
                        (dir.path / "sim.h5").string() + " " + set);
    REQUIRE(sim.code == 0);
    const auto mpi = run_command(mpirun(4, cfg + " --backend mpi --deterministic --force --quiet --out " + (dir.path / "mpi.h5").string() + " " + set));
    CAPTURE(mpi.output);
    REQUIRE(mpi.code == 0);
    const auto a = params(dir.path / "sim.h5"), b = params(dir.path / "mpi.h5");
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    final_params[name] = b;
    CHECK(metric(dir.path / "sim.h5", "train_loss") == metric(dir.path / "mpi.h5", "train_loss"));
    CHECK(metric(dir.path / "sim.h5", "bytes_sent") == metric(dir.path / "mpi.h5", "bytes_sent"));
    // The oracle metrics see every worker's a_i and m_prev shard on rank 0 here too (NaN rows of
    // the dense case, and of the steps log.gradient_metrics_interval skips, compare equal bit for
    // bit).
    for (const char* observed : {"grad_norm", "mask_oracle_overlap", "mask_energy_capture", "update_sign_flip"}) {
      CAPTURE(std::string(observed));
      const auto x = metric(dir.path / "sim.h5", observed), y = metric(dir.path / "mpi.h5", observed);
      REQUIRE(x.size() == y.size());
      CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
    }
    if (set.find("residual_clip") != std::string::npos) {
      const auto clipped = metric(dir.path / "mpi.h5", "residual_clipped_norm");
      CHECK(metric(dir.path / "sim.h5", "residual_clipped_norm") == clipped);
      CHECK(*std::max_element(clipped.begin(), clipped.end()) > 0);  // the clip did act
    }
    const bool replicated = set.find("sharded=false") != std::string::npos;
    // 1-bit Adam all-reduces gradients for its 3 warm-up steps, then exchanges compressed momentum.
    const bool onebit = set.find("onebit_adam") != std::string::npos;
    const bool demo = set.find("type=demo") != std::string::npos;
    const bool topk = set.find("type=topk_ef") != std::string::npos;
    const bool bucketed = set.find("overlap_grad_reduce") != std::string::npos;
    const bool diloco = set.find("type=diloco") != std::string::npos;
    const bool sparseloco = set.find("type=sparseloco") != std::string::npos;
    if (diloco || sparseloco) {
      // An outer step every inner_steps steps: measured where it ran, NaN elsewhere; the metrics
      // of the outer steps equal the simulator's bit for bit.
      const auto measured = metric(dir.path / "mpi.h5", diloco ? "comm_time_measured_outer_all_reduce"
                                                               : "comm_time_measured_sparseloco_all_gather");
      const auto sent = metric(dir.path / "mpi.h5", "bytes_sent");
      for (std::size_t i = 0; i < measured.size(); ++i) CHECK((sent[i] > 0) == (measured[i] > 0));
      for (const char* observed : {"pseudo_grad_norm", "param_drift"}) {
        const auto x = metric(dir.path / "sim.h5", observed), y = metric(dir.path / "mpi.h5", observed);
        REQUIRE(x.size() == y.size());
        CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0);
      }
      CHECK(*std::max_element(sent.begin(), sent.end()) > 0);
      CHECK(scape::run_file::read_run_summary(dir.path / "mpi.h5").status == "completed");
      continue;
    }
    const auto measured = metric(dir.path / "mpi.h5", onebit       ? "comm_time_measured_momentum_all_to_all"
                                                      : demo       ? "comm_time_measured_demo_all_gather"
                                                      : topk       ? "comm_time_measured_topk_all_gather"
                                                      : replicated ? "comm_time_measured_grad_all_reduce"
                                                      : bucketed   ? "comm_time_measured_async_reduce_scatter"
                                                                   : "comm_time_measured_grad_reduce_scatter");
    for (std::size_t i = onebit ? 3 : 0; i < measured.size(); ++i) CHECK(measured[i] > 0);
    // The model runs on the CPU here: no stream to time, the column says so with NaN.
    for (const double d : metric(dir.path / "mpi.h5", "compute_device_time")) CHECK(std::isnan(d));
    if (bucketed) {
      // The buckets ran on the communication thread; what the optimizer still waited for is
      // recorded apart from the mask wait.
      for (const double wait : metric(dir.path / "mpi.h5", "grad_wait_exposed")) CHECK(wait >= 0);
      CHECK(metric(dir.path / "sim.h5", "bytes_sent_grad_reduce_scatter").size() == 8);
    }
    CHECK(scape::run_file::read_run_summary(dir.path / "mpi.h5").status == "completed");
  }
  // Reducing the gradient in buckets changes when it is reduced, not what: the same parameters.
  const auto& dense = final_params["dense AdamS"];
  const auto& bucketed = final_params["dense AdamS, reduce-scatter in buckets during the backward pass"];
  REQUIRE(dense.size() == bucketed.size());
  CHECK(std::memcmp(dense.data(), bucketed.data(), dense.size() * sizeof(float)) == 0);
  // Mask coding is lossless: the default (Elias-Fano) and auto train exactly as the bitmap.
  const auto& bitmap = final_params["SCAPE 0.99 bitmap mask"];
  for (const char* coded : {"SCAPE 0.99 lag 1 partitioned sharded", "SCAPE 0.99 auto-coded mask (sizes exchanged)"}) {
    CAPTURE(std::string(coded));
    const auto& p = final_params[coded];
    REQUIRE(p.size() == bitmap.size());
    CHECK(std::memcmp(p.data(), bitmap.data(), p.size() * sizeof(float)) == 0);
  }
}

TEST_CASE(
    "hierarchy node: mpirun -np 4 as 2 nodes of 2 ranks is bit-identical to the simulator, link classes included") {
  // The node and rail groups are MPI_Comm_split of the world in the same rank order as the
  // simulator's groups; deterministic mode sums in rank order in every group.
  Dir dir;
  std::ofstream(dir.path / "eq.json") << kGpt;
  const std::string node = "--set topology.ranks_per_node=2 --set optimizer.hierarchy=node ";
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"SCAPE 0.99 lag 1, whole tensors a rail", node + "--set optimizer.sharded=false"},
      {"SCAPE 0.9 lag 0 sharded, row slices a rail",
       node + "--set optimizer.rail_split=rows --set optimizer.sparsity=0.9 --set optimizer.mask_lag=0"},
      {"dense AdamS", node + "--set optimizer.type=adams"},
      {"DiLoCo H 3", node + "--set optimizer.type=diloco --set optimizer.inner_steps=3"},
  };
  for (const auto& [name, set] : cases) {
    CAPTURE(std::string(name));
    const auto cfg = (dir.path / "eq.json").string();
    const auto sim = run_command("OMP_NUM_THREADS=1 " + std::string(SCAPE_BINARY) + " run " + cfg +
                                 " --force --quiet --out " + (dir.path / "sim.h5").string() + " " + set);
    CAPTURE(sim.output);
    REQUIRE(sim.code == 0);
    const auto mpi = run_command(mpirun(
        4, cfg + " --backend mpi --deterministic --force --quiet --out " + (dir.path / "mpi.h5").string() + " " + set));
    CAPTURE(mpi.output);
    REQUIRE(mpi.code == 0);
    const auto a = params(dir.path / "sim.h5"), b = params(dir.path / "mpi.h5");
    REQUIRE(a.size() == b.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    for (const char* column : {"train_loss", "bytes_sent", "bytes_sent_intra", "bytes_sent_inter"}) {
      CAPTURE(std::string(column));
      CHECK(metric(dir.path / "sim.h5", column) == metric(dir.path / "mpi.h5", column));
    }
    const auto intra = metric(dir.path / "mpi.h5", "bytes_sent_intra");
    const auto inter = metric(dir.path / "mpi.h5", "bytes_sent_inter");
    const auto sent = metric(dir.path / "mpi.h5", "bytes_sent");
    for (std::size_t i = 0; i < sent.size(); ++i) {
      CHECK(intra[i] > 0);  // the node's reduce-scatter and all-gather, every step
      CHECK(intra[i] + inter[i] == sent[i]);
    }
    CHECK(scape::run_file::read_run_summary(dir.path / "mpi.h5").status == "completed");
  }
}

TEST_CASE("default mode: MPI's own reductions agree with the simulator to rounding") {
  Dir dir;
  // The quadratic's gradient does not feed back through a softmax, so rounding differences of
  // the reductions (a few ulps per step) stay a few ulps of the parameters: 1e-5 relative.
  std::ofstream(dir.path / "q.json") << R"({"name": "q", "seed": 4, "workers": 3, "steps": 10,
    "model": {"type": "quadratic", "size": 4000}, "optimizer": {"type": "adams", "lr": 0.01},
    "log": {"save_params": true}})";
  const auto cfg = (dir.path / "q.json").string();
  REQUIRE(run_command(std::string(SCAPE_BINARY) + " run " + cfg + " --quiet --out " + (dir.path / "sim.h5").string()).code == 0);
  const auto mpi = run_command(mpirun(3, cfg + " --backend mpi --quiet --out " + (dir.path / "mpi.h5").string()));
  CAPTURE(mpi.output);
  REQUIRE(mpi.code == 0);
  const auto a = params(dir.path / "sim.h5"), b = params(dir.path / "mpi.h5");
  double worst = 0;
  for (std::size_t j = 0; j < a.size(); ++j) worst = std::max(worst, std::fabs(double(a[j]) - b[j]) / (1.0 + std::fabs(a[j])));
  CHECK(worst <= 1e-5);
}

TEST_CASE("a rank that throws ends every rank within 30 s, with its message, and the file says failed") {
  Dir dir;
  std::ofstream(dir.path / "eq.json") << kGpt;
  const auto r = run_command(mpirun(4, (dir.path / "eq.json").string() + " --backend mpi --quiet --out " + (dir.path / "f.h5").string(),
                           "SCAPE_INJECT_FAILURE=2:5"));
  CAPTURE(r.output);
  CHECK(r.code != 0);
  CHECK(r.seconds < 30);
  CHECK(r.output.find("rank 2: step 5: injected failure") != std::string::npos);
  CHECK(scape::run_file::opens_plainly(dir.path / "f.h5"));  // closed before the abort, not left to repair
  const auto s = scape::run_file::read_run_summary(dir.path / "f.h5");
  CHECK(s.status == "failed");
  CHECK(s.error.find("rank 2") != std::string::npos);
}

TEST_CASE("a hung rank is caught by the collective watchdog") {
  Dir dir;
  std::ofstream(dir.path / "eq.json") << kGpt;
  const auto r = run_command(mpirun(4, (dir.path / "eq.json").string() + " --backend mpi --quiet --collective-timeout 3 --out " +
                                  (dir.path / "h.h5").string(),
                           "SCAPE_INJECT_FAILURE=1:3:hang"));
  CAPTURE(r.output);
  CHECK(r.code != 0);
  CHECK(r.seconds < 30);
  CHECK(r.output.find("watchdog") != std::string::npos);
  CHECK(scape::run_file::read_run_summary(dir.path / "h.h5").status == "failed");
}

namespace {

// The pids of the processes whose argv[0] is the scape binary and whose command line names `out`.
std::vector<pid_t> scape_processes(const fs::path& out) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline", std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.rfind(std::string(SCAPE_BINARY) + '\0', 0) == 0 &&
        cmdline.find('\0' + out.string() + '\0') != std::string::npos)
      pids.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return pids;
}

}  // namespace

TEST_CASE("SIGTERM to one rank stops every rank at one step: checkpoint, 'interrupted' naming the rank, exit 143") {
  Dir dir;
  std::ofstream(dir.path / "long.json") << R"({"name": "quad", "seed": 3, "workers": 2, "steps": 1000000,
    "model": {"type": "quadratic", "size": 2000}, "optimizer": {"type": "scape", "sparsity": 0.99, "lr": 0.01},
    "log": {"flush_interval": 5}})";
  const fs::path out = dir.path / "term.h5";
  const std::string run = (dir.path / "long.json").string() + " --backend mpi --quiet --out " + out.string();
  const std::string command =
      mpirun(2, run + " --checkpoint-every 100000000") + " > " + (dir.path / "log").string() + " 2>&1";
  std::fflush(nullptr);
  const pid_t shell = ::fork();
  if (shell == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto steps = [&]() -> long {
    try {
      return scape::run_file::read_run_summary(out).steps_completed;
    } catch (const std::exception&) {
      return 0;
    }
  };
  while (steps() < 50 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto rank0 = scape::run_file::RunFileLock::holder(out);  // rank 0 holds the run file's lock
  const std::vector<pid_t> ranks =
      scape::run_file::RunFileLock::holder(out) ? scape_processes(out) : std::vector<pid_t>{};
  CHECK(ranks.size() == 2);
  for (const pid_t pid : ranks)
    if (rank0 && pid != rank0->pid) ::kill(pid, SIGTERM);  // rank 1 only
  int status = 0;
  ::waitpid(shell, &status, 0);
  std::ifstream log_file(dir.path / "log");
  const std::string log((std::istreambuf_iterator<char>(log_file)), std::istreambuf_iterator<char>());
  CAPTURE(log);
  REQUIRE(rank0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 143);
  const auto s = scape::run_file::read_run_summary(out);
  CHECK(s.status == "interrupted");
  const std::string n = std::to_string(s.steps_completed);
  CHECK(s.error == "SIGTERM to rank 1 after step " + n + "; checkpoint at step " + n + ": --resume continues");
  CHECK(fs::exists(out.string() + ".ckpt"));
  const auto resumed = run_command(mpirun(2, run + " --resume --set steps=" + std::to_string(s.steps_completed + 5)));
  CAPTURE(resumed.output);
  CHECK(resumed.code == 0);
  CHECK(scape::run_file::read_run_summary(out).status == "completed");
  CHECK(scape::run_file::read_run_summary(out).steps_completed == s.steps_completed + 5);
}

TEST_CASE("a simulator run's checkpoint resumed under MPI is refused with exit 2 naming both backends") {
  Dir dir;
  std::ofstream(dir.path / "long.json") << R"({"name": "quad", "seed": 3, "workers": 2, "steps": 1000000,
    "model": {"type": "quadratic", "size": 2000}, "optimizer": {"type": "scape", "sparsity": 0.99, "lr": 0.01}})";
  const fs::path out = dir.path / "sim.h5";
  const std::string cfg = (dir.path / "long.json").string();
  std::fflush(nullptr);
  const pid_t sim = ::fork();
  if (sim == 0) {
    ::execl(SCAPE_BINARY, SCAPE_BINARY, "run", cfg.c_str(), "--out", out.c_str(), "--quiet", "--checkpoint-every", "20",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(out.string() + ".ckpt") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(sim, SIGKILL);
  ::waitpid(sim, nullptr, 0);
  REQUIRE(fs::exists(out.string() + ".ckpt"));
  const auto r =
      run_command(mpirun(2, cfg + " --backend mpi --quiet --resume --set steps=2000000 --out " + out.string()));
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find(out.string() + ": --resume under --backend mpi or nccl, but the run file was written by the "
                                     "simulator (--backend sim)") != std::string::npos);
  CHECK(r.output.size() < 2000);  // not the lists of columns
}

TEST_CASE("a config past the machine's memory is refused by every rank with exit 2 before MPI starts") {
  // A batch of 2^20 sequences: each rank's activation workspace alone is terabytes (issue 55).
  Dir dir;
  auto config = nlohmann::json::parse(kGpt);
  config["data"]["batch_size"] = 1 << 20;
  std::ofstream(dir.path / "big.json") << config.dump();
  const auto out = dir.path / "big.h5";
  const auto r = run_command(mpirun(2, (dir.path / "big.json").string() + " --backend mpi --quiet --out " + out.string()));
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(r.output.find("of host memory, the largest part activations") != std::string::npos);
  CHECK(r.output.find("--force-memory") != std::string::npos);
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("a bad data path stops every rank with exit 2, and a wrong rank count is named") {
  Dir dir;
  std::ofstream(dir.path / "bad.json") << R"({"workers": 2, "steps": 2, "model": {"vocab_size": 256, "n_layer": 1, "n_embd": 16, "n_head": 2},
    "data": {"type": "text", "path": "nowhere.txt"}})";
  auto r = run_command(mpirun(2, (dir.path / "bad.json").string() + " --backend mpi --quiet --out " + (dir.path / "b.h5").string()));
  CHECK(r.code == 2);
  CHECK(r.output.find("nowhere.txt") != std::string::npos);
  r = run_command(mpirun(3, (dir.path / "bad.json").string() + " --backend mpi --quiet --out " + (dir.path / "b.h5").string()));
  CHECK(r.code == 2);
  CHECK(r.output.find("mpirun started 3 ranks") != std::string::npos);
}

TEST_CASE("bench-comm writes nccl-tests rows that calibration reads; calibration runs on real MPI runs") {
  Dir dir;
  const std::string bench = (dir.path / "bench.h5").string();
  const auto b = run_command("OMP_NUM_THREADS=1 " + std::string(MPIEXEC) + " --oversubscribe -np 2 " + SCAPE_BINARY +
                             " bench-comm --backend mpi --min-bytes 1024 --max-bytes 4194304 --factor 4 --iters 3 "
                             "--warmup 1 --out " + bench);
  CAPTURE(b.output);
  REQUIRE(b.code == 0);
  const auto f = scape::run_file::File::open(bench, scape::run_file::Access::read);
  CHECK(f.read_string_attribute("format") == "scape-bench-comm-1");
  const auto kinds = f.open_dataset("kind").read_strings();
  const auto algbw = f.open_dataset("algbw_GBps").read_all<double>();
  const auto busbw = f.open_dataset("busbw_GBps").read_all<double>();
  const auto payload = f.open_dataset("payload_bytes").read_all<double>();
  const auto steps = f.open_dataset("latency_steps").read_all<double>();
  // Five collectives at 1 KiB .. 4 MiB: sizes up to 4 MiB leave the latency-bound range even on a
  // loaded two-core host, so the combined fit sees times grow with the bytes.
  REQUIRE(kinds.size() == 35);
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    CAPTURE(i);
    // W = 2: busbw = algbw x 2 (W-1)/W = algbw for all-reduce, x (W-1)/W = algbw / 2 otherwise.
    CHECK(busbw[i] == doctest::Approx(kinds[i] == "all_reduce" ? algbw[i] : algbw[i] / 2));
    CHECK(steps[i] == (kinds[i] == "all_reduce" ? 2.0 : 1.0));
    CHECK(algbw[i] > 0);
  }
  CHECK(payload[0] == 1024.0);
  CHECK(payload[3] == 65536.0);
  CHECK(payload[6] == 4194304.0);

  std::ofstream(dir.path / "eq.json") << kGpt;
  const auto cfg = (dir.path / "eq.json").string();
  for (const auto& [np, name, set] : {std::tuple{2, "dense2", "--set optimizer.type=adams"},
                                      std::tuple{4, "scape4", ""}, std::tuple{2, "scape2", ""}}) {
    const auto r = run_command(mpirun(np, cfg + " --backend mpi --quiet --set workers=" + std::to_string(np) +
                                              " --out " + (dir.path / (std::string(name) + ".h5")).string() + " " + set));
    CAPTURE(r.output);
    REQUIRE(r.code == 0);
  }
  const auto c = run_command(std::string(SCAPE_BINARY) + " predict --calibrate " + (dir.path / "dense2.h5").string() +
                             " " + (dir.path / "scape4.h5").string() + " " + bench + " --held-out " +
                             (dir.path / "scape2.h5").string() + " --out " + (dir.path / "hw.json").string());
  CAPTURE(c.output);
  REQUIRE(c.code == 0);
  CHECK(c.output.find("| scape2.h5 | held out | 2 | scape |") != std::string::npos);
  CHECK(c.output.find("| dense2.h5 | grad_reduce_scatter |") != std::string::npos);
  std::ifstream hw(dir.path / "hw.json");
  const std::string text((std::istreambuf_iterator<char>(hw)), std::istreambuf_iterator<char>());
  CHECK(text.find("\"format\": \"scape-hardware-1\"") != std::string::npos);
}

#else

TEST_CASE("MPI runtime") { MESSAGE("skipped: scape was built without MPI"); }

#endif
