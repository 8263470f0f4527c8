// `scape sweep`'s runs on the in-process simulator: every planned point of a sweep
// (config/sweep_plan.hpp) run, read back from the run file that already answers it, or settled
// as the same run as another point, with a progress line per point on stderr. The table and the
// exit status are the command's (apps/command_sweep.cpp).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "config/sweep_plan.hpp"
#include "train/run_log.hpp"

namespace scape::sim {

// One point's outcome: "completed", "diverged", "failed", "interrupted", "invalid", or
// "skipped (completed...)" / "skipped (diverged...)" when its run file already answered it.
struct SweepPointRow {
  std::string label;
  std::string status;
  train::RunOutcome outcome;
  int workers = 1;
  std::string note;        // the run file, or the error of a failed or invalid point
  std::string time_model;  // what its modelled step time adds up
};

struct SweepRunOptions {
  int jobs = 1;               // points run in parallel
  bool force_memory = false;  // skip each point's host memory check
  // The options every point's run starts from (quiet, scape_version, git_sha); each point sets
  // its own out, progress label and writer lock.
  train::RunOptions run;
};

// Runs `plan` (planned from `sweep_file` into `out_dir`): one row per point, in sweep order.
std::vector<SweepPointRow> run_sweep(const config::SweepPlan& plan, const std::string& sweep_file,
                                     const std::filesystem::path& out_dir, const SweepRunOptions& options);

// The summary figures of a finished run, read back from its file (a skipped sweep point).
train::RunOutcome outcome_from_file(const std::filesystem::path& path);

// Whether a row's status is "skipped (<what>...)".
bool is_skipped(const std::string& status, const char* what);

}  // namespace scape::sim
