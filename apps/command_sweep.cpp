// scape sweep: every point of a sweep, completed and diverged points skipped on a re-run, and
// the table of their outcomes.
#include <cmath>
#include <cstdio>

#include "apps/cli_common.hpp"
#include "config/sweep_plan.hpp"
#include "sim/sweep_run.hpp"
#include "train/stop_signal.hpp"

namespace scape::cli {
namespace {

// The modelled-step column's header: what it models, when every point models the same.
std::string step_time_header(const std::vector<sim::SweepPointRow>& rows) {
  std::string shared;
  for (const auto& r : rows) {
    if (r.time_model.empty()) continue;
    if (!shared.empty() && shared != r.time_model) return "modelled step ms (differs between points)";
    shared = r.time_model;
  }
  return shared.empty() ? "modelled step ms" : "modelled step ms (" + shared + ")";
}

// --out and --set checked before anything runs or is created: a malformed flag is the command's
// input (exit 2), not each point's (which made every point invalid, exit 1).
void check_sweep_flags(const std::string& out_dir, const std::vector<std::string>& sets) {
  if (out_dir.empty()) throw cfg::ConfigError("--out: empty; give the folder of the run files");
  std::error_code ec;
  if (std::filesystem::exists(out_dir, ec) && !std::filesystem::is_directory(out_dir, ec))
    throw cfg::ConfigError("--out " + out_dir + ": is a file; scape sweep writes its run files into a folder");
  for (const std::string& assignment : sets) {
    nlohmann::json probe = nlohmann::json::object();
    cfg::apply_override(probe, assignment);
  }
}

int cmd_sweep(const std::string& file, const std::string& out_dir, const std::vector<std::string>& sets, int jobs,
              bool quiet, bool force_memory) {
  check_sweep_flags(out_dir, sets);
  const cfg::SweepPlan plan = cfg::plan_sweep(file, out_dir, sets);
  tr::install_stop_handlers();
  sim::SweepRunOptions options;
  options.jobs = jobs;
  options.force_memory = force_memory;
  options.run = options_for({}, quiet);
  const std::vector<sim::SweepPointRow> rows = sim::run_sweep(plan, file, out_dir, options);

  std::printf(
      "\n| point | status | final val loss | final train loss | bytes/step vs dense | mean mask Jaccard | %s |\n",
      step_time_header(rows).c_str());
  std::printf("|---|---|---|---|---|---|---|\n");
  int code = kExitOk;
  std::size_t invalid = 0;
  for (const auto& r : rows) {
    invalid += r.status == "invalid";
    const auto& o = r.outcome;
    const bool ran = r.status == "completed" || r.status == "diverged" || sim::is_skipped(r.status, "completed") ||
                     sim::is_skipped(r.status, "diverged");
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
    if ((r.status == "diverged" || sim::is_skipped(r.status, "diverged")) && code == kExitOk) code = kExitDiverged;
  }
  for (const auto& r : rows) {
    if (r.status == "invalid" || r.status == "failed" || r.status == "interrupted")
      std::fprintf(stderr, "%s: %s: %s\n", r.label.c_str(), r.status.c_str(), r.note.c_str());
  }
  // As `scape run` reports a stop signal; a re-run runs the interrupted and unstarted points.
  if (const int signal = tr::stop_signal(); signal != 0) return 128 + signal;
  if (!rows.empty() && invalid == rows.size()) return kExitInvalid;  // nothing ran: the input is wrong
  return code;
}

struct SweepArgs {
  std::string config_file, out_dir;
  std::vector<std::string> sets;
  int jobs = 1;
  bool quiet = false, force_memory = false;
};

}  // namespace

Command add_sweep_command(CLI::App& app) {
  const auto a = std::make_shared<SweepArgs>();
  auto* sweep = app.add_subcommand(
      "sweep",
      "run every point of a sweep (grid, points, lr_search, repeat: docs/configuration.md); completed and diverged "
      "points are skipped on a re-run, killed or failed ones run again; each point is checked again just before it "
      "starts, and a point another sweep into the same folder is running is waited for, never run twice; SIGTERM or "
      "SIGINT stops the points running at a step boundary (interrupted) and starts no other, exit 128 + the signal");
  sweep->add_option("sweep", a->config_file, "sweep JSON file")->required()->check(CLI::ExistingPath);
  sweep->add_option("--out", a->out_dir, "output folder for the run files")->required();
  sweep->add_option("--jobs", a->jobs, "points run in parallel (default 1)")->check(CLI::Range(1, 64));
  sweep->add_option("--set", a->sets,
                    "override a value in every point: key.path=value (JSON, else a string); repeatable");
  sweep->add_flag("--quiet", a->quiet, "no progress output");
  add_force_memory_flag(sweep, a->force_memory);
  Command c;
  c.sub = sweep;
  c.run = [a] { return cmd_sweep(a->config_file, a->out_dir, a->sets, a->jobs, a->quiet, a->force_memory); };
  return c;
}

}  // namespace scape::cli
