// scape: run, sweep, validate and describe experiments from JSON, and predict cluster step times.
// Exit status: 0 completed, 2 invalid configuration or input, 3 diverged, 1 any other failure.
#include <CLI/CLI.hpp>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "experiments/config.hpp"
#include "experiments/hdf5.hpp"
#include "model/gpt.hpp"
#include "model/llama.hpp"
#include "experiments/recorder.hpp"
#include "predict/from_runs.hpp"
#include "predict/measured_runs.hpp"
#include "predict/predict_config.hpp"
#include "predict/regime.hpp"
#include "predict/report.hpp"
#include "sim/sim_run.hpp"
#include "train/compute_model.hpp"
#include "train/device_memory.hpp"
#include "train/run_log.hpp"

#ifdef SCAPE_HAVE_MPI
#include "runtime/bench_comm.hpp"
#include "runtime/mpi_run.hpp"
#endif
#ifdef SCAPE_HAVE_NCCL
#include "runtime/nccl_run.hpp"
#endif
#ifdef SCAPE_HAVE_NCCL_SINGLE
#include "runtime/nccl_single.hpp"
#endif

#ifndef SCAPE_VERSION
#define SCAPE_VERSION "0.0.0"
#endif

// The commit this binary was built from (a source generated at build time: apps/CMakeLists.txt).
const char* scape_git_sha();

namespace {

namespace ex = scape::experiments;
namespace tr = scape::train;
using nlohmann::json;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitInvalid = 2;
constexpr int kExitDiverged = 3;

int exit_code(tr::RunStatus s) {
  switch (s) {
    case tr::RunStatus::completed: return kExitOk;
    case tr::RunStatus::diverged: return kExitDiverged;
    case tr::RunStatus::failed: return kExitFailure;
  }
  return kExitFailure;
}

ex::ExperimentConfig load_config(const std::string& file, const std::vector<std::string>& sets) {
  json j = ex::read_json_file(file);
  for (const auto& s : sets) ex::apply_override(j, s);
  const auto base = std::filesystem::absolute(file).parent_path();
  return ex::parse_experiment(j, base);
}

tr::RunOptions options_for(const std::filesystem::path& out, bool quiet) {
  tr::RunOptions o;
  o.out = out;
  o.quiet = quiet;
  o.scape_version = SCAPE_VERSION;
  o.git_sha = scape_git_sha();
  return o;
}

// A table cell: the number, or n/a for a metric that does not apply (NaN).
std::string cell(double x, const char* format) {
  if (std::isnan(x)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

double dense_bytes(const tr::RunOutcome& r, int workers) {
  // A dense step sends 2 (W-1)/W N fp32 values per worker, replicated or sharded alike.
  return 2.0 * (workers - 1) / workers * static_cast<double>(r.n_params) * 4.0;
}

void print_outcome(const ex::ExperimentConfig& c, const tr::RunOutcome& r, const std::filesystem::path& out) {
  std::fprintf(stderr, "%s: %s after %d/%d steps in %.1f s -> %s\n", c.name.c_str(), tr::to_string(r.status),
               r.steps_completed, c.steps, r.wall_s, out.string().c_str());
  if (!r.error.empty()) std::fprintf(stderr, "  %s\n", r.error.c_str());
}

struct Backend {
  std::string name = "sim";
  bool deterministic = false;
  double collective_timeout_s = 300;
};

// --out: its folder is created; an existing file is overwritten only when it is a run of this
// same config (a rerun), or with --force, so a typo cannot clobber another run's results.
void prepare_out(const std::filesystem::path& out, const ex::ExperimentConfig& config, bool force, bool resume) {
  std::error_code ec;
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path(), ec);
  if (ec) throw std::runtime_error("--out " + out.string() + ": cannot create its folder (" + ec.message() + ")");
  if (resume || force || !std::filesystem::exists(out)) return;
  std::string found;
  try {
    const json stored = json::parse(ex::read_run_summary(out).config_json);
    if (ex::run_id(stored) == ex::run_id(config.to_json())) return;
    found = "the run file of another config (" + stored.value("name", std::string("unnamed")) + ", run id " +
            ex::run_id(stored) + "; this config is " + ex::run_id(config.to_json()) + ")";
  } catch (const std::exception&) {
    found = "not a scape run file";
  }
  throw ex::ConfigError("--out " + out.string() + ": the file exists and is " + found +
                        "; choose another --out, or add --force to overwrite it");
}

int cmd_run(const std::string& file, std::string out, const std::vector<std::string>& sets, bool quiet, int every,
            bool resume, bool force, const Backend& backend) {
  const auto config = load_config(file, sets);
  if (out.empty()) out = config.name + ".h5";
  prepare_out(out, config, force, resume);
  auto options = options_for(out, quiet);
  options.checkpoint_every = every;
  options.resume = resume;
  if (backend.name == "mpi") {
#ifdef SCAPE_HAVE_MPI
    scape::runtime::MpiOptions mpi;
    mpi.deterministic = backend.deterministic;
    mpi.collective_timeout_s = backend.collective_timeout_s;
    return scape::runtime::run_mpi(config, options, mpi);
#else
    throw ex::ConfigError("--backend mpi: this scape was built without MPI (install libopenmpi-dev and rebuild)");
#endif
  }
  if (backend.name == "nccl") {
    if (backend.deterministic) {
      throw ex::ConfigError("--deterministic applies to --backend mpi only (NCCL reduces in its own order)");
    }
#if defined(SCAPE_HAVE_NCCL)
    scape::runtime::MpiOptions mpi;
    mpi.collective_timeout_s = backend.collective_timeout_s;
    return scape::runtime::run_nccl(config, options, mpi);
#elif defined(SCAPE_HAVE_NCCL_SINGLE)
    const auto outcome = scape::runtime::run_nccl_single_process(config, options);
    print_outcome(config, outcome, out);
    return exit_code(outcome.status);
#else
    throw ex::ConfigError(
        "--backend nccl: this scape was built without the NCCL communicator (it needs nvcc and NCCL: libnccl-dev "
        "or NCCL in the CUDA toolkit, and MPI for more than one rank; rebuild)");
#endif
  }
  const auto outcome = scape::sim::run_simulated(config, options);
  print_outcome(config, outcome, out);
  return exit_code(outcome.status);
}

std::string label_of(const ex::SweepPoint& p) {
  std::string s;
  for (const auto& [k, v] : p.assignment) s += (s.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  return s.empty() ? "base" : s;
}

int cmd_validate(const std::string& file, const std::vector<std::string>& sets) {
  json j = ex::read_json_file(file);
  if (j.is_object() && (j.contains("grid") || j.contains("points") || j.contains("repeat") || j.contains("lr_search"))) {
    // A sweep: every point must be a valid experiment.
    const auto base_dir = std::filesystem::absolute(file).parent_path();
    auto points = ex::expand_sweep(j, base_dir);
    int invalid = 0;
    for (auto& p : points) {
      try {
        for (const auto& s : sets) ex::apply_override(p.config, s);
        const auto config = ex::parse_experiment(p.config, base_dir);
        std::printf("valid    %s  (run id %s)\n", label_of(p).c_str(), ex::run_id(config.to_json()).c_str());
      } catch (const ex::ConfigError& e) {
        ++invalid;
        std::printf("invalid  %s: %s\n", label_of(p).c_str(), e.what());
      }
    }
    std::fprintf(stderr, "%s: sweep of %zu points, %d invalid\n", file.c_str(), points.size(), invalid);
    return invalid ? kExitInvalid : kExitOk;
  }
  const auto config = load_config(file, sets);
  std::cout << config.to_json().dump(2) << "\n";
  std::fprintf(stderr, "%s: valid (run id %s)\n", file.c_str(), ex::run_id(config.to_json()).c_str());
  if (config.device == scape::kernels::DeviceKind::cuda) {
    std::fprintf(stderr, "device memory estimate (simulator, one GPU): %s\n",
                 scape::train::describe(scape::train::device_memory_estimate(config, config.workers, true)).c_str());
  }
  return kExitOk;
}

double mean_finite(const std::vector<double>& v) {
  double sum = 0;
  int n = 0;
  for (double x : v) {
    if (std::isfinite(x)) {
      sum += x;
      ++n;
    }
  }
  return n ? sum / n : NAN;
}

// The summary figures of a finished run, read back from its file (a skipped sweep point).
tr::RunOutcome outcome_from_file(const std::filesystem::path& path) {
  const auto f = ex::File::open(path, ex::Access::read);
  tr::RunOutcome o;
  o.status = tr::RunStatus::completed;
  const auto loss = f.open_dataset("/metrics/train_loss").read_all<double>();
  o.final_train_loss = loss.empty() ? NAN : loss.back();
  const auto val = f.open_dataset("/eval/val_loss").read_all<double>();
  o.final_val_loss = val.empty() ? NAN : val.back();
  o.bytes_per_step = mean_finite(f.open_dataset("/metrics/bytes_sent").read_all<double>());
  o.mean_mask_jaccard = mean_finite(f.open_dataset("/metrics/mask_jaccard").read_all<double>());
  o.step_time_model = mean_finite(f.open_dataset("/metrics/step_time_model").read_all<double>());
  const auto config = json::parse(f.read_string_attribute("config"));
  const auto& m = config.at("model");
  if (m.at("type") == "quadratic") {
    o.n_params = m.at("size").get<std::size_t>();
  } else if (m.at("type") == "gpt") {
    scape::model::GptConfig g;
    g.n_layer = m.at("n_layer");
    g.n_head = m.at("n_head");
    g.n_embd = m.at("n_embd");
    g.block_size = m.at("block_size");
    g.vocab_size = m.at("vocab_size");
    o.n_params = scape::model::gpt_layout(g).size();
  } else if (m.at("type") == "llama") {
    auto get = [&m](const char* key) { return m.at(key).get<int>(); };
    const scape::model::LlamaConfig l{.n_layer = get("n_layer"), .n_head = get("n_head"), .n_kv_head = get("n_kv_head"),
                                      .n_embd = get("n_embd"), .block_size = get("block_size"),
                                      .vocab_size = get("vocab_size"), .ffn_hidden = get("ffn_hidden")};
    o.n_params = scape::model::llama_layout(l).size();
  } else if (f.has_link("/final/params")) {
    o.n_params = f.open_dataset("/final/params").dims().at(0);
  }
  return o;
}

struct SweepRow {
  std::string label;
  std::string status;
  tr::RunOutcome outcome;
  int workers = 1;
  std::string note;
  std::string time_model;  // what its modelled step time adds up
};

// The modelled-step column's header: what it models, when every point models the same.
std::string step_time_header(const std::vector<SweepRow>& rows) {
  std::string shared;
  for (const auto& r : rows) {
    if (r.time_model.empty()) continue;
    if (!shared.empty() && shared != r.time_model) return "modelled step ms (differs between points)";
    shared = r.time_model;
  }
  return "modelled step ms (" + shared + ")";
}


int cmd_sweep(const std::string& file, const std::string& out_dir, const std::vector<std::string>& sets, int jobs,
              bool quiet) {
  json sweep = ex::read_json_file(file);
  const auto base_dir = std::filesystem::absolute(file).parent_path();
  auto points = ex::expand_sweep(sweep, base_dir);
  std::filesystem::create_directories(out_dir);
  std::vector<SweepRow> rows(points.size());
  std::vector<std::pair<ex::ExperimentConfig, std::filesystem::path>> to_run;
  std::vector<std::size_t> run_rows;
  // Points whose resolved configs are equal (e.g. a dense optimizer at two sparsities) share a
  // run file: the first runs, the others report its outcome.
  std::map<std::filesystem::path, std::size_t> planned;  // path -> row that runs it
  std::vector<std::pair<std::size_t, std::size_t>> same_as;  // (row, row that runs it)
  for (std::size_t i = 0; i < points.size(); ++i) {
    rows[i].label = label_of(points[i]);
    try {
      for (const auto& s : sets) ex::apply_override(points[i].config, s);
      const auto config = ex::parse_experiment(points[i].config, base_dir);
      rows[i].workers = config.workers;
      rows[i].time_model = tr::describe_step_time_model(config);
      const auto path = std::filesystem::path(out_dir) / (config.name + "-" + ex::run_id(config.to_json()) + ".h5");
      if (std::filesystem::exists(path)) {
        try {
          const auto summary = ex::read_run_summary(path);
          // A diverged run is a result too: the same config and seed diverge again, bit for bit.
          if (summary.status == "completed" || summary.status == "diverged") {
            rows[i].status = "skipped (" + summary.status + ")";
            rows[i].note = path.string();
            rows[i].outcome = outcome_from_file(path);
            if (summary.status == "diverged") rows[i].outcome.status = tr::RunStatus::diverged;
            continue;
          }
          // A killed or failed point (status running, killed or failed) starts again; its file is
          // overwritten.
          std::fprintf(stderr, "%s: left %s after step %ld; running the point again\n", path.string().c_str(),
                       summary.status.c_str(), summary.steps_completed);
        } catch (const std::exception&) {
          // Unreadable leftovers are rerun and overwritten.
        }
      }
      if (const auto it = planned.find(path); it != planned.end()) {
        same_as.emplace_back(i, it->second);
        continue;
      }
      planned.emplace(path, i);
      to_run.emplace_back(config, path);
      run_rows.push_back(i);
    } catch (const ex::ConfigError& e) {
      rows[i].status = "invalid";
      rows[i].note = e.what();
    }
  }
  std::fprintf(stderr, "sweep %s: %zu points, %zu to run, %zu the same run as another point, %zu skipped or invalid, "
               "%d job(s)\n", file.c_str(), points.size(), to_run.size(), same_as.size(),
               points.size() - to_run.size() - same_as.size(), jobs);
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  auto worker = [&] {
    for (std::size_t k = next++; k < to_run.size(); k = next++) {
      const auto& [config, path] = to_run[k];
      SweepRow& row = rows[run_rows[k]];
      try {
        row.outcome = scape::sim::run_simulated(config, options_for(path, quiet || jobs > 1));
        row.status = tr::to_string(row.outcome.status);
        row.note = row.outcome.error.empty() ? path.string() : row.outcome.error;
      } catch (const std::exception& e) {
        row.status = "invalid";
        row.note = e.what();
      }
      std::lock_guard lock(mu);
      std::fprintf(stderr, "[%zu/%zu] %s: %s\n", k + 1, to_run.size(), row.label.c_str(), row.status.c_str());
    }
  };
  std::vector<std::thread> pool;
  for (int j = 0; j < std::max(1, jobs); ++j) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  for (const auto& [row, runner] : same_as) {
    rows[row].status = rows[runner].status;
    rows[row].outcome = rows[runner].outcome;
    rows[row].workers = rows[runner].workers;
    rows[row].time_model = rows[runner].time_model;
    rows[row].note = "same run as " + rows[runner].label + ": " + rows[runner].note;
    std::fprintf(stderr, "%s: the same run as %s (settings that do not apply to the optimizer are ignored)\n",
                 rows[row].label.c_str(), rows[runner].label.c_str());
  }

  std::printf("\n| point | status | final val loss | final train loss | bytes/step vs dense | mean mask Jaccard | %s |\n",
              step_time_header(rows).c_str());
  std::printf("|---|---|---|---|---|---|---|\n");
  int code = kExitOk;
  for (const auto& r : rows) {
    const auto& o = r.outcome;
    const bool ran = r.status == "completed" || r.status == "diverged" || r.status == "skipped (completed)" ||
                     r.status == "skipped (diverged)";
    if (ran) {
      const double dense = dense_bytes(o, r.workers);
      std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", r.label.c_str(), r.status.c_str(),
                  cell(o.final_val_loss, "%.4f").c_str(), cell(o.final_train_loss, "%.4f").c_str(),
                  cell(dense > 0 ? o.bytes_per_step / dense : NAN, "%.4f").c_str(),
                  cell(o.mean_mask_jaccard, "%.3f").c_str(), cell(o.step_time_model * 1e3, "%.4g").c_str());
    } else {
      std::printf("| %s | %s | | | | | |\n", r.label.c_str(), r.status.c_str());
    }
    if (r.status == "failed" || r.status == "invalid") code = kExitFailure;
    if ((r.status == "diverged" || r.status == "skipped (diverged)") && code == kExitOk) code = kExitDiverged;
  }
  for (const auto& r : rows) {
    if (r.status == "invalid" || r.status == "failed") std::fprintf(stderr, "%s: %s: %s\n", r.label.c_str(), r.status.c_str(), r.note.c_str());
  }
  return code;
}

struct Calibrate {
  std::vector<std::string> fit, held_out;
  std::vector<double> sweep_GBps;  // --sweep: the link bandwidths of the regime sweep
};

int cmd_repair(const std::vector<std::string>& files) {
  int code = kExitOk;
  for (const auto& file : files) {
    try {
      const auto r = ex::repair_run_file(file);
      std::printf("%s: %s; status %s%s; %ld steps kept", file.c_str(),
                  r.was_open_for_writing ? "cleared the flags of a writer that never closed" : "was closed cleanly",
                  r.status_after.c_str(), r.status_after != r.status_before ? (" (was " + r.status_before + ")").c_str() : "",
                  r.steps_completed);
      if (r.steps_completed < r.steps_completed_before)
        std::printf("; steps_completed lowered from %ld: a table held fewer rows (a kill in mid-flush)",
                    r.steps_completed_before);
      if (!r.trimmed.empty()) std::printf("; dropped the rows of an interrupted flush from %zu tables", r.trimmed.size());
      std::printf("\n");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      code = kExitFailure;
    }
  }
  return code;
}

int cmd_predict(const std::string& file, std::string out, const std::string& csv, const std::vector<std::string>& sets,
                const std::string& from_runs, const Calibrate& calibrate) {
  if (!calibrate.fit.empty()) {
    if (!file.empty() || !csv.empty() || !from_runs.empty()) throw ex::ConfigError("--calibrate takes no config, --csv or --from-runs");
    if (out.empty()) out = "calibrated-hardware.json";
    scape::predict::calibrate_from_files({calibrate.fit.begin(), calibrate.fit.end()},
                                         {calibrate.held_out.begin(), calibrate.held_out.end()}, out, std::cout);
    std::fprintf(stderr, "calibrated from %zu file(s) -> %s\n", calibrate.fit.size(), out.c_str());
    return kExitOk;
  }
  if (!calibrate.held_out.empty()) throw ex::ConfigError("--held-out goes with --calibrate");
  if (file.empty()) throw ex::ConfigError("predict: a prediction config (or --calibrate RUN.h5 ...) is required");
  if (!from_runs.empty()) {
    if (!out.empty() || !csv.empty()) throw ex::ConfigError("--from-runs prints a table only: no --out or --csv");
    const auto runs = scape::predict::read_completed_runs(from_runs);
    scape::predict::print_at_scale(std::cout, scape::predict::predict_from_runs(file, sets, runs));
    return kExitOk;
  }
  const auto config = scape::predict::load_predict_config(file, sets);
  const auto prediction = scape::predict::run_prediction(config);
  scape::predict::print_prediction(std::cout, prediction);
  scape::predict::print_break_even(std::cout, config, scape::predict::break_even(config));
  if (!calibrate.sweep_GBps.empty()) scape::predict::print_regime_sweep(std::cout, config, calibrate.sweep_GBps);
  if (out.empty()) out = config.name + "-predict.h5";
  scape::predict::write_prediction_hdf5(out, prediction);
  if (!csv.empty()) scape::predict::write_prediction_csv(csv, prediction);
  std::fprintf(stderr, "%s: predicted %zu worker counts -> %s%s\n", config.name.c_str(), prediction.rows.size(),
               out.c_str(), csv.empty() ? "" : (" and " + csv).c_str());
  return kExitOk;
}

int cmd_bench_comm(const std::string& backend, const std::string& out, std::size_t min_bytes, std::size_t max_bytes,
                   double factor, int iters, int warmup) {
#ifdef SCAPE_HAVE_MPI
  scape::runtime::BenchCommOptions o;
  o.min_bytes = min_bytes;
  o.max_bytes = max_bytes;
  o.factor = factor;
  o.iters = iters;
  o.warmup = warmup;
  o.out = out;
  if (backend == "nccl") {
#ifdef SCAPE_HAVE_NCCL
    return scape::runtime::bench_comm(MPI_COMM_WORLD, scape::runtime::nccl_bench_backend(), o);
#else
    throw ex::ConfigError("bench-comm --backend nccl: this scape was built without the NCCL communicator");
#endif
  }
  return scape::runtime::bench_comm(MPI_COMM_WORLD, scape::runtime::mpi_bench_backend(), o);
#else
  (void)backend, (void)out, (void)min_bytes, (void)max_bytes, (void)factor, (void)iters, (void)warmup;
  throw ex::ConfigError("bench-comm: this scape was built without MPI (install libopenmpi-dev and rebuild)");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) then fails the write with EFBIG, which the run reports and
  // survives, instead of killing the process half-way through a flush.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"scape: research simulator for communication-sparse distributed training.\n"
               "Exit status: 0 completed, 2 invalid configuration or input, 3 diverged, 1 other failure."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(SCAPE_VERSION) + " (" + scape_git_sha() + ")");

  std::string config_file, out, out_dir;
  std::vector<std::string> sets;
  bool quiet = false, resume = false, force = false;
  int every = 0, jobs = 1;

  auto* run = app.add_subcommand("run", "run one experiment with W simulated workers and write an HDF5 run file");
  run->add_option("config", config_file, "experiment JSON file")->required()->check(CLI::ExistingPath);
  run->add_option("--out", out, "run file (default: <name>.h5 in the current directory)");
  run->add_option("--set", sets, "override a config value: key.path=value (JSON, else a string); repeatable");
  run->add_flag("--quiet", quiet, "no progress output");
  run->add_option("--checkpoint-every", every, "write OUT.ckpt every N steps (0: never)")->check(CLI::NonNegativeNumber);
  run->add_flag("--resume", resume,
                "continue from OUT.ckpt; ends bit-identical to an uninterrupted run. Only steps and log.* may differ "
                "from the checkpoint's config (exit 2 listing the keys otherwise)");
  run->add_flag("--force", force,
                "overwrite an existing --out that is not a run file of this config (refused with exit 2 otherwise)");
  Backend backend;
  run->add_option("--backend", backend.name,
                  "sim: W threads in this process; mpi: one process per rank under mpirun; nccl: as mpi, one GPU "
                  "per rank, collectives over NCCL, optimizer on the GPU (a build without MPI runs workers = 1 "
                  "in this process)")
      ->check(CLI::IsMember({"sim", "mpi", "nccl"}))
      ->capture_default_str();
  run->add_flag("--deterministic", backend.deterministic,
                "mpi: reduce in rank order, bit-identical to the simulator with the same W (not with nccl)");
  run->add_option("--collective-timeout", backend.collective_timeout_s,
                  "mpi, nccl: seconds a collective may block before the watchdog fails the run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();

  auto* sweep = app.add_subcommand("sweep", "run every point of a sweep (grid, points, lr_search, repeat: docs/configuration.md); completed and diverged points are skipped on a re-run, killed or failed ones run again");
  sweep->add_option("sweep", config_file, "sweep JSON file")->required()->check(CLI::ExistingPath);
  sweep->add_option("--out", out_dir, "output folder for the run files")->required();
  sweep->add_option("--jobs", jobs, "points run in parallel (default 1)")->check(CLI::Range(1, 64));
  sweep->add_option("--set", sets, "override a value in every point: key.path=value");
  sweep->add_flag("--quiet", quiet, "no progress output");

  auto* validate = app.add_subcommand(
      "validate",
      "check a config (print it with every default filled in; with device = cuda, its GPU memory estimate) or every "
      "point of a sweep");
  validate->add_option("config", config_file, "experiment or sweep JSON file")->required()->check(CLI::ExistingPath);
  validate->add_option("--set", sets, "override a config value: key.path=value");

  std::vector<std::string> repair_files;
  auto* repair = app.add_subcommand(
      "repair", "make killed runs' files open plainly (h5py.File(p, 'r'), h5dump): clear the 'open for writing' "
                "flags their writer left, drop rows of an interrupted flush, read every table back, mark status "
                "killed. Never on a run that is still running");
  repair->add_option("run_files", repair_files, "run files (RUN.h5)")->required()->check(CLI::ExistingFile);

  bool predict_schema = false;
  auto* schema = app.add_subcommand(
      "schema", "print the JSON Schema of experiment configs (or of prediction configs with --predict); keys say "
                "in x-applies-to which model, data or optimizer types read them");
  schema->add_flag("--predict", predict_schema, "the schema of `scape predict` configs instead");

  std::string csv;
  auto* predict = app.add_subcommand(
      "predict", "predict step time, speedup and scaling efficiency on a cluster (docs/PREDICTING.md)");
  predict->add_option("config", config_file, "prediction JSON file (not with --calibrate)")->check(CLI::ExistingPath);
  predict->add_option("--set", sets, "override a config value: key.path=value (JSON, else a string); repeatable");
  predict->add_option("--out", out, "HDF5 prediction file (default: <name>-predict.h5 in the current directory); "
                                    "with --calibrate the hardware description (default calibrated-hardware.json)");
  predict->add_option("--csv", csv, "also write the table as CSV");
  std::string from_runs;
  predict->add_option("--from-runs", from_runs,
                      "instead: for each completed run in this folder of the config's optimizer type, predict at the "
                      "largest worker count with the run's sparsity (with and without bucketed overlap) and print "
                      "the run's val loss and bytes against its dense run beside it");
  Calibrate calibrate;
  predict->add_option("--calibrate", calibrate.fit,
                      "instead: fit compute, the optimizer step and alpha-beta per collective to these MPI/NCCL run "
                      "files and bench-comm files, write the hardware description (--out) and print predicted "
                      "against measured for each run (docs/PREDICTING.md, Calibration)")
      ->expected(1, -1);
  predict->add_option("--sweep", calibrate.sweep_GBps,
                      "also print the regime sweep at the largest worker count: strong scaling at 1 to 16 sequences "
                      "per GPU, overlap on and off, at these link bandwidths in GB/s (e.g. --sweep 12.5 25 50 100 200)")
      ->expected(1, -1)
      ->check(CLI::PositiveNumber);
  predict->add_option("--held-out", calibrate.held_out,
                      "with --calibrate: runs predicted with the fit but not fitted on (their error is printed)");

  std::string bench_backend = "mpi";
  std::string bench_out = "bench-comm.h5";
  std::size_t bench_min = 1024, bench_max = std::size_t{64} << 20;
  double bench_factor = 2;
  int bench_iters = 20, bench_warmup = 5;
  auto* bench = app.add_subcommand(
      "bench-comm", "under mpirun: time every collective the optimizers use over a range of sizes (algbw, busbw as "
                    "nccl-tests) and write them for `scape predict --calibrate`");
  bench->add_option("--backend", bench_backend, "mpi or nccl (one GPU per rank)")
      ->check(CLI::IsMember({"mpi", "nccl"}))
      ->capture_default_str();
  bench->add_option("--out", bench_out, "HDF5 file of the rows")->capture_default_str();
  bench->add_option("--min-bytes", bench_min, "payload of the smallest size")->capture_default_str();
  bench->add_option("--max-bytes", bench_max, "payload of the largest size")->capture_default_str();
  bench->add_option("--factor", bench_factor, "ratio between sizes")->capture_default_str();
  bench->add_option("--iters", bench_iters, "timed calls per size")->capture_default_str();
  bench->add_option("--warmup", bench_warmup, "untimed calls per size")->capture_default_str();

  CLI11_PARSE(app, argc, argv);
#ifdef SCAPE_HAVE_MPI
  // MPI lives for the whole process: initialised before any run, finalised after.
  struct MpiSession {
    bool active = false;
    ~MpiSession() {
      if (active) MPI_Finalize();
    }
  } mpi_session;
#ifdef SCAPE_HAVE_NCCL
  const bool under_mpi = backend.name == "mpi" || backend.name == "nccl";
#else
  const bool under_mpi = backend.name == "mpi";
#endif
  if ((run->parsed() && under_mpi) || bench->parsed()) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    mpi_session.active = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      std::fprintf(stderr, "error: --backend %s needs MPI_THREAD_MULTIPLE (the lagged all-gather and the watchdog "
                   "run on their own threads)\n", bench->parsed() ? bench_backend.c_str() : backend.name.c_str());
      return kExitFailure;
    }
  }
#endif
  try {
    if (run->parsed()) return cmd_run(config_file, out, sets, quiet, every, resume, force, backend);
    if (repair->parsed()) return cmd_repair(repair_files);
    if (sweep->parsed()) return cmd_sweep(config_file, out_dir, sets, jobs, quiet);
    if (validate->parsed()) return cmd_validate(config_file, sets);
    if (bench->parsed()) return cmd_bench_comm(bench_backend, bench_out, bench_min, bench_max, bench_factor,
                                               bench_iters, bench_warmup);
    if (predict->parsed()) return cmd_predict(config_file, out, csv, sets, from_runs, calibrate);
    if (schema->parsed()) {
      std::cout << (predict_schema ? scape::predict::predict_schema() : ex::experiment_schema()).dump(2) << "\n";
    }
    return kExitOk;
  } catch (const ex::ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitInvalid;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitFailure;
  }
}
