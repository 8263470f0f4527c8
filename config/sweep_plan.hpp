// The plan of `scape sweep` (docs/configuration.md, "Sweeps"): which points run, which share
// another point's run, which a finished run file already answers; and the schedule that runs the
// planned points on threads, each under its run file's lock, so two sweeps into one folder never
// run a point twice. What a point runs is the caller's (sim/sweep_run.cpp runs the
// simulator).
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace scape::config {

// "k=v k=v" of a point's assignment, or "base".
std::string point_label(const SweepPoint& p);

// What a run file already holds: "completed" or "diverged" (the point's result: the same config
// and seed diverge again, bit for bit), or "" when there is no result there; then `why` says what
// is there instead (left running or killed after step N, or unreadable; empty when no file).
std::string finished_status(const std::filesystem::path& file, std::string& why);

struct PlannedPoint {
  std::string label;
  std::optional<ExperimentConfig> config;  // absent when the point is invalid
  std::string invalid;                     // the ConfigError of an invalid point
  std::filesystem::path file;              // <name>-<run id>.h5 in the output folder
  std::string finished;                    // finished_status() of the file at planning time
  std::string rerun_reason;                // why an unfinished file there runs again
  std::optional<std::size_t> same_as;      // the point whose run it shares (equal resolved configs)
};

struct SweepPlan {
  std::vector<PlannedPoint> points;
  std::vector<std::size_t> to_run;  // the points that run, in sweep order
};

// Expands the sweep file, applies `sets` (key.path=value) to every point and resolves it. Points
// whose resolved configs are equal (a dense optimizer at two sparsities) share one run file: the
// first runs, the others report its outcome. Throws ConfigError for an unreadable sweep file.
SweepPlan plan_sweep(const std::filesystem::path& sweep_file, const std::filesystem::path& out_dir,
                     const std::vector<std::string>& sets);

// How run_planned reports on the points it schedules; each is called from the running thread.
struct ScheduleHooks {
  // The point k of `files` runs now, its lock held (`waited`: after waiting for another sweep).
  std::function<void(std::size_t k, bool waited)> run;
  // Another sweep holds point k: it is retried, waiting for that lock, once the others are done.
  std::function<void(std::size_t k)> held_elsewhere;
  // Point k is about to wait for another sweep's lock.
  std::function<void(std::size_t k)> waiting;
  // The filesystem of `file` does not support flock: points run unlocked (said once).
  std::function<void(const std::filesystem::path& file)> unlocked;
};

// Runs every run file of `files` on `jobs` threads, each under its lock: first every point whose
// lock is free, then the points other sweeps held, each waiting for its lock. A hook that throws
// ends the sweep with that exception after the running points finish.
void run_planned(const std::vector<std::filesystem::path>& files, int jobs, const ScheduleHooks& hooks);

}  // namespace scape::config
