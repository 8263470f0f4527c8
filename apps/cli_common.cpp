// The pieces the commands share (apps/cli_common.hpp).
#include "apps/cli_common.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "train/host_memory.hpp"

namespace scape::cli {

using nlohmann::json;

int exit_code(const tr::RunOutcome& outcome) {
  switch (outcome.status) {
    case tr::RunStatus::completed: return kExitOk;
    case tr::RunStatus::diverged: return kExitDiverged;
    case tr::RunStatus::failed: return kExitFailure;
    case tr::RunStatus::interrupted: return 128 + outcome.signal;  // as the signal's default action reports it
  }
  return kExitFailure;
}

cfg::ExperimentConfig load_config(const std::string& file, const std::vector<std::string>& sets,
                                  std::string_view backend) {
  json j = cfg::read_json_file(file);
  for (const auto& s : sets) cfg::apply_override(j, s);
  cfg::apply_backend_defaults(j, backend);
  const auto base = std::filesystem::absolute(file).parent_path();
  cfg::ExperimentConfig config = cfg::parse_experiment(j, base);
  cfg::check_backend(config, backend);
  return config;
}

tr::RunOptions options_for(const std::filesystem::path& out, bool quiet) {
  tr::RunOptions o;
  o.out = out;
  o.quiet = quiet;
  o.scape_version = SCAPE_VERSION;
  o.git_sha = scape_git_sha();
  return o;
}

void check_host_memory(const cfg::ExperimentConfig& config, int workers_in_process, bool force) {
  if (force) return;
  tr::require_host_memory(tr::host_memory_estimate(config, workers_in_process), tr::available_host_memory());
}

int ranks_on_this_host() {
  // The launchers' own count of the processes on this node: OpenMPI, MPICH/Hydra, torchrun.
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"}) {
    if (const char* value = std::getenv(name)) {
      const int n = std::atoi(value);
      if (n >= 1) return n;
    }
  }
  return 1;
}

void check_rank_host_memory(const cfg::ExperimentConfig& config, bool force) {
  if (force) return;
  // Every rank on this host checks the same sum (one worker each), so they refuse together; a
  // rank that still refuses alone exits before MPI starts, and mpirun ends the others.
  tr::require_host_memory(tr::times_processes(tr::host_memory_estimate(config, 1), ranks_on_this_host()),
                          tr::available_host_memory());
}

void add_force_memory_flag(CLI::App* sub, bool& force) {
  sub->add_flag("--force-memory", force,
                "run even when the host memory estimate (scape validate prints it) exceeds the machine's available "
                "memory (refused with exit 2 otherwise)");
}

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

void print_outcome(const cfg::ExperimentConfig& c, const tr::RunOutcome& r, const std::filesystem::path& out) {
  std::fprintf(stderr, "%s: %s after %d/%d steps in %.1f s -> %s\n", c.name.c_str(), tr::to_string(r.status),
               r.steps_completed, c.steps, r.wall_s, out.string().c_str());
  if (!r.error.empty()) std::fprintf(stderr, "  %s\n", r.error.c_str());
}

}  // namespace scape::cli
