// The sweep planner and its locked schedule (sweep_plan.hpp).
#include "config/sweep_plan.hpp"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "run_file/recorder.hpp"
#include "run_file/run_lock.hpp"

namespace scape::config {

std::string point_label(const SweepPoint& p) {
  std::string s;
  for (const auto& [k, v] : p.assignment) {
    s += (s.empty() ? "" : " ") + k + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  }
  return s.empty() ? "base" : s;
}

std::string finished_status(const std::filesystem::path& file, std::string& why) {
  why.clear();
  if (!std::filesystem::exists(file)) return "";
  try {
    const auto summary = run_file::read_run_summary(file);
    if (summary.status == "completed" || summary.status == "diverged") return summary.status;
    why = "left " + summary.status + " after step " + std::to_string(summary.steps_completed);
  } catch (const std::exception& e) {
    why = e.what();
  }
  return "";
}

SweepPlan plan_sweep(const std::filesystem::path& sweep_file, const std::filesystem::path& out_dir,
                     const std::vector<std::string>& sets) {
  const nlohmann::json sweep = read_json_file(sweep_file);
  const auto base_dir = std::filesystem::absolute(sweep_file).parent_path();
  auto expanded = expand_sweep(sweep, base_dir);
  SweepPlan plan;
  plan.points.resize(expanded.size());
  std::map<std::filesystem::path, std::size_t> planned;  // run file -> the point that runs it
  for (std::size_t i = 0; i < expanded.size(); ++i) {
    PlannedPoint& p = plan.points[i];
    p.label = point_label(expanded[i]);
    try {
      for (const auto& s : sets) apply_override(expanded[i].config, s);
      p.config = parse_experiment(expanded[i].config, base_dir);
      p.file = out_dir / (p.config->name + "-" + run_id(p.config->to_json()) + ".h5");
    } catch (const ConfigError& e) {
      p.config.reset();
      p.invalid = e.what();
      continue;
    }
    p.finished = finished_status(p.file, p.rerun_reason);
    if (!p.finished.empty()) continue;
    if (const auto it = planned.find(p.file); it != planned.end()) {
      p.same_as = it->second;
      continue;
    }
    planned.emplace(p.file, i);
    plan.to_run.push_back(i);
  }
  return plan;
}

void run_planned(const std::vector<std::filesystem::path>& files, int jobs, const ScheduleHooks& hooks) {
  std::mutex mu;
  std::vector<std::size_t> held;
  std::once_flag unlocked_once;
  std::exception_ptr failure;
  auto run_point = [&](std::size_t k, bool wait) {
    try {
      if (wait) hooks.waiting(k);
      auto lock =
          wait ? std::optional(run_file::RunFileLock::acquire(files[k])) : run_file::RunFileLock::try_acquire(files[k]);
      if (!lock) {
        {
          std::lock_guard guard(mu);
          held.push_back(k);
        }
        hooks.held_elsewhere(k);
        return;
      }
      if (!lock->holds()) std::call_once(unlocked_once, [&] { hooks.unlocked(files[k]); });
      hooks.run(k, wait);
    } catch (...) {
      std::lock_guard guard(mu);
      if (!failure) failure = std::current_exception();
    }
  };
  auto run_all = [&](const std::vector<std::size_t>& ks, bool wait) {
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
      for (std::size_t i = next++; i < ks.size(); i = next++) run_point(ks[i], wait);
    };
    std::vector<std::thread> pool;
    for (int j = 0; j < std::max(1, jobs); ++j) pool.emplace_back(worker);
    for (auto& t : pool) t.join();
  };
  std::vector<std::size_t> all(files.size());
  for (std::size_t k = 0; k < all.size(); ++k) all[k] = k;
  run_all(all, false);
  run_all(std::exchange(held, {}), true);
  if (failure) std::rethrow_exception(failure);
}

}  // namespace scape::config
