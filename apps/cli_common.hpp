// What the commands of `scape` share (apps/command_*.cpp): the exit statuses, the command
// record scape_main.cpp dispatches on, loading a config with its --set overrides, the run
// options every run gets, and the lines a finished run prints.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"
#include "train/run_log.hpp"

#ifndef SCAPE_VERSION
#define SCAPE_VERSION "0.0.0"
#endif

// The commit this binary was built from (a source generated at build time: apps/CMakeLists.txt).
const char* scape_git_sha();

namespace scape::cli {

namespace cfg = scape::config;
namespace tr = scape::train;

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitInvalid = 2;
constexpr int kExitDiverged = 3;

// One verb of `scape`: its subcommand (options registered by its add_* function, which owns
// their storage), what runs when it is the one parsed, and whether it runs under MPI as parsed
// (scape_main.cpp initialises MPI first) with the backend name an MPI error names.
struct Command {
  CLI::App* sub = nullptr;
  std::function<int()> run;
  std::function<bool()> under_mpi = [] { return false; };
  std::function<std::string()> mpi_backend = [] { return std::string(); };
};

// 0 completed, 3 diverged, 1 failed, 128 + the signal for a run a stop signal interrupted.
int exit_code(const tr::RunOutcome& outcome);
// `backend` (scape run --backend) fills in the defaults that depend on it
// (config::apply_backend_defaults) where the file and the --set overrides leave them out.
cfg::ExperimentConfig load_config(const std::string& file, const std::vector<std::string>& sets,
                                  std::string_view backend = "sim");
tr::RunOptions options_for(const std::filesystem::path& out, bool quiet);
// Refuses (ConfigError, exit 2) a config whose host memory estimate for `workers_in_process`
// workers (train/host_memory.hpp) exceeds the machine's MemAvailable, unless `force` (--force-memory).
void check_host_memory(const cfg::ExperimentConfig& config, int workers_in_process, bool force);
// The same for a rank of --backend mpi or nccl: one worker a rank, times the ranks the launcher
// put on this host (OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS or LOCAL_WORLD_SIZE; else 1).
void check_rank_host_memory(const cfg::ExperimentConfig& config, bool force);
// --force-memory, as run, sweep and validate register it.
void add_force_memory_flag(CLI::App* sub, bool& force);
// A table cell: the number, or n/a for a metric that does not apply (NaN).
std::string cell(double x, const char* format);
double dense_bytes(const tr::RunOutcome& r, int workers);
void print_outcome(const cfg::ExperimentConfig& c, const tr::RunOutcome& r, const std::filesystem::path& out);

// The verbs, in the order `scape --help` lists them (apps/command_<verb>.cpp).
Command add_run_command(CLI::App& app);
Command add_sweep_command(CLI::App& app);
Command add_validate_command(CLI::App& app);
Command add_repair_command(CLI::App& app);
Command add_schema_command(CLI::App& app);
Command add_predict_command(CLI::App& app);
Command add_bench_comm_command(CLI::App& app);

}  // namespace scape::cli
