// scape run: one experiment, in the simulator or as one process per rank over MPI or NCCL.
#include <cmath>
#include <cstdio>

#include "apps/cli_common.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "sim/sim_run.hpp"
#include "train/stop_signal.hpp"

#ifdef SCAPE_HAVE_MPI
#include "runtime/mpi_run.hpp"
#endif
#ifdef SCAPE_HAVE_NCCL
#include "runtime/nccl_run.hpp"
#endif
#ifdef SCAPE_HAVE_NCCL_SINGLE
#include "runtime/nccl_single.hpp"
#endif

namespace scape::cli {
namespace {

using nlohmann::json;

struct Backend {
  std::string name = "sim";
  bool deterministic = false;
  double collective_timeout_s = 300;
};

// --out: its folder is created; an existing file is overwritten only when it is a run of this
// same config (a rerun), or with --force, so a typo cannot clobber another run's results.
void prepare_out(const std::filesystem::path& out, const cfg::ExperimentConfig& config, bool force, bool resume) {
  // A folder is refused before anything is created (--force would have had the failed creation
  // remove an empty one). A path that does not exist yet is no folder: is_directory's error
  // code then says "no such file", which must not be read as the creation's (a bare `--out
  // run.h5` was refused so before 2026-12-07).
  std::error_code absent;
  if (!out.has_filename() || std::filesystem::is_directory(out, absent))
    throw cfg::ConfigError("--out " + out.string() + ": names a folder; give the run file's path (" +
                           (out / (config.name + ".h5")).lexically_normal().string() + ", say)");
  std::error_code ec;
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path(), ec);
  if (ec) throw cfg::ConfigError("--out " + out.string() + ": cannot create its folder (" + ec.message() + ")");
  std::error_code probe;  // the throwing exists() made an unreadable path exit 1, not 2 naming --out
  const bool present = std::filesystem::exists(out, probe);
  if (probe) throw cfg::ConfigError("--out " + out.string() + ": cannot be read (" + probe.message() + ")");
  if (resume || force || !present) return;
  // An empty file is a run file whose creation never wrote a byte (a full disk): scape's own start.
  if (std::filesystem::is_regular_file(out, ec) && std::filesystem::file_size(out, ec) == 0 && !ec) return;
  std::string found;
  try {
    const json stored = json::parse(run_file::read_run_summary(out).config_json);
    if (cfg::run_id(stored) == cfg::run_id(config.to_json())) return;
    found = "the run file of another config (" + stored.value("name", std::string("unnamed")) + ", run id " +
            cfg::run_id(stored) + "; this config is " + cfg::run_id(config.to_json()) + ")";
  } catch (const std::exception&) {
    found = "not a scape run file";
  }
  throw cfg::ConfigError("--out " + out.string() + ": the file exists and is " + found +
                         "; choose another --out, or add --force to overwrite it");
}

int cmd_run(const std::string& file, std::string out, const std::vector<std::string>& sets, bool quiet, int every,
            bool resume, bool allow_unchecked, bool force, bool force_memory, const Backend& backend) {
  const auto config = load_config(file, sets, backend.name);
  // The simulator holds all W workers in this process; a rank of --backend mpi or nccl holds one,
  // beside the other ranks its launcher put on this host.
  if (backend.name == "sim") {
    check_host_memory(config, config.workers, force_memory);
  } else {
    check_rank_host_memory(config, force_memory);
  }
  if (out.empty()) out = config.name + ".h5";
  prepare_out(out, config, force, resume);
  auto options = options_for(out, quiet);
  options.checkpoint_every = every;
  options.resume = resume;
  options.allow_unchecked_checkpoint = allow_unchecked;
  // SIGTERM and SIGINT stop the run at its next step boundary (train/stop_signal.hpp); under MPI
  // a signal that reaches any rank travels to rank 0 with that rank's report.
  tr::install_stop_handlers();
  if (backend.name == "mpi") {
#ifdef SCAPE_HAVE_MPI
    scape::runtime::MpiOptions mpi;
    mpi.deterministic = backend.deterministic;
    mpi.collective_timeout_s = backend.collective_timeout_s;
    return scape::runtime::run_mpi(config, options, mpi);
#else
    throw cfg::ConfigError("--backend mpi: this scape was built without MPI (install libopenmpi-dev and rebuild)");
#endif
  }
  if (backend.name == "nccl") {
#if defined(SCAPE_HAVE_NCCL)
    scape::runtime::MpiOptions mpi;
    mpi.collective_timeout_s = backend.collective_timeout_s;
    return scape::runtime::run_nccl(config, options, mpi);
#elif defined(SCAPE_HAVE_NCCL_SINGLE)
    const auto outcome = scape::runtime::run_nccl_single_process(config, options);
    print_outcome(config, outcome, out);
    return exit_code(outcome);
#else
    throw cfg::ConfigError(
        "--backend nccl: this scape was built without the NCCL communicator (it needs nvcc and NCCL: libnccl-dev "
        "or NCCL in the CUDA toolkit, and MPI for more than one rank; rebuild)");
#endif
  }
  const auto outcome = scape::sim::run_simulated(config, options);
  print_outcome(config, outcome, out);
  return exit_code(outcome);
}

struct RunArgs {
  std::string config_file, out;
  std::vector<std::string> sets;
  bool quiet = false, resume = false, allow_unchecked = false, force = false, force_memory = false;
  int every = 0;
  Backend backend;
};

// A flag that does not apply is refused (exit 2), as scape predict refuses them: one that did
// nothing silently would be a typo or a misunderstanding the user never learns of.
void check_flags(const RunArgs& a, const CLI::App& run) {
  if (run.count("--out") > 0 && a.out.empty()) throw cfg::ConfigError("--out: empty; give the run file's path");
  if (a.backend.deterministic && a.backend.name != "mpi") {
    throw cfg::ConfigError(std::string("--deterministic applies to --backend mpi only (") +
                           (a.backend.name == "nccl" ? "NCCL reduces in its own order"
                                                     : "the simulator reduces in rank order already") + ")");
  }
  if (run.count("--collective-timeout") > 0 && a.backend.name == "sim")
    throw cfg::ConfigError("--collective-timeout applies to --backend mpi and nccl (the simulator's do not block)");
  if (!std::isfinite(a.backend.collective_timeout_s))
    throw cfg::ConfigError("--collective-timeout: a finite number of seconds, got " +
                           std::to_string(a.backend.collective_timeout_s));
  if (a.allow_unchecked && !a.resume) throw cfg::ConfigError("--allow-unchecked-checkpoint applies to --resume only");
}

}  // namespace

Command add_run_command(CLI::App& app) {
  const auto a = std::make_shared<RunArgs>();
  auto* run = app.add_subcommand("run", "run one experiment with W simulated workers and write an HDF5 run file");
  run->add_option("config", a->config_file, "experiment JSON file")->required()->check(CLI::ExistingPath);
  run->add_option("--out", a->out, "run file (default: <name>.h5 in the current directory)");
  run->add_option("--set", a->sets, "override a config value: key.path=value (JSON, else a string); repeatable");
  run->add_flag("--quiet", a->quiet, "no progress output");
  run->add_option("--checkpoint-every", a->every, "write OUT.ckpt every N steps (0: never)")
      ->check(CLI::Range(0, 1000000000))
      ->capture_default_str();
  run->add_flag("--resume", a->resume,
                "continue from OUT.ckpt; ends bit-identical to an uninterrupted run. Only steps and log.* may differ "
                "from the checkpoint's config (exit 2 listing the keys otherwise)");
  run->add_flag(
      "--allow-unchecked-checkpoint", a->allow_unchecked,
      "--resume: accept a checkpoint of the older SCAPECK1 format, which has no checksum (refused with exit 2 "
      "otherwise)");
  run->add_flag("--force", a->force,
                "overwrite an existing --out that is not a run file of this config (refused with exit 2 otherwise)");
  add_force_memory_flag(run, a->force_memory);
  run->add_option("--backend", a->backend.name,
                  "sim: W threads in this process; mpi: one process per rank under mpirun; nccl: as mpi, one GPU "
                  "per rank, collectives over NCCL, optimizer on the GPU (a build without MPI runs workers = 1 "
                  "in this process)")
      ->check(CLI::IsMember({"sim", "mpi", "nccl"}))
      ->capture_default_str();
  run->add_flag("--deterministic", a->backend.deterministic,
                "mpi: reduce in rank order, bit-identical to the simulator with the same W (not with nccl)");
  run->add_option("--collective-timeout", a->backend.collective_timeout_s,
                  "mpi, nccl: seconds a collective may block before the watchdog fails the run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  Command c;
  c.sub = run;
  c.run = [a, run] {
    check_flags(*a, *run);
    return cmd_run(a->config_file, a->out, a->sets, a->quiet, a->every, a->resume, a->allow_unchecked, a->force,
                   a->force_memory, a->backend);
  };
#ifdef SCAPE_HAVE_NCCL
  c.under_mpi = [a] { return a->backend.name == "mpi" || a->backend.name == "nccl"; };
#else
  c.under_mpi = [a] { return a->backend.name == "mpi"; };
#endif
  c.mpi_backend = [a] { return a->backend.name; };
  return c;
}

}  // namespace scape::cli
