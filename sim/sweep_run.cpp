// The simulator's runs of a planned sweep (see sweep_run.hpp).
#include "sim/sweep_run.hpp"

#include <cmath>
#include <cstdio>
#include <mutex>

#include <nlohmann/json.hpp>

#include "config/compute_model.hpp"
#include "model/gpt.hpp"
#include "model/llama.hpp"
#include "run_file/hdf5.hpp"
#include "sim/sim_run.hpp"
#include "train/host_memory.hpp"
#include "train/stop_signal.hpp"

namespace scape::sim {
namespace {

using nlohmann::json;
namespace cfg = scape::config;
namespace tr = scape::train;

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

// A finished run (completed, or diverged: the same config and seed diverge again, bit for bit)
// is the point's result, read back from its file.
void take_finished(SweepPointRow& row, const std::filesystem::path& path, const std::string& status,
                   const std::string& by) {
  row.outcome = outcome_from_file(path);
  if (status == "diverged") row.outcome.status = tr::RunStatus::diverged;
  row.status = "skipped (" + status + by + ")";
  row.note = path.string();
}

// Each point's progress line names it. With parallel points a line every two seconds from each
// would bury the sweep's own lines, so each point reports once a minute (and when it ends).
tr::RunOptions point_options(const tr::RunOptions& base, const std::filesystem::path& path, int jobs, std::size_t k,
                             std::size_t n, const std::string& label) {
  auto options = base;
  options.out = path;
  options.writer_lock_held = true;  // run_planned holds each point's lock while it runs
  options.progress_label = "[" + std::to_string(k + 1) + "/" + std::to_string(n) + "] " + label;
  if (jobs > 1) options.progress_every_seconds = 60;
  return options;
}

}  // namespace

tr::RunOutcome outcome_from_file(const std::filesystem::path& path) {
  const auto f = run_file::File::open(path, run_file::Access::read);
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
    o.n_params = scape::model::transformer_layout(scape::model::transformer_shape(g)).size();
  } else if (m.at("type") == "llama") {
    auto get = [&m](const char* key) { return m.at(key).get<int>(); };
    const scape::model::LlamaConfig l{.n_layer = get("n_layer"),
                                      .n_head = get("n_head"),
                                      .n_kv_head = get("n_kv_head"),
                                      .n_embd = get("n_embd"),
                                      .block_size = get("block_size"),
                                      .vocab_size = get("vocab_size"),
                                      .ffn_hidden = get("ffn_hidden")};
    o.n_params = scape::model::transformer_layout(scape::model::transformer_shape(l)).size();
  } else if (f.has_link("/final/params")) {
    o.n_params = f.open_dataset("/final/params").dims().at(0);
  }
  return o;
}

bool is_skipped(const std::string& status, const char* what) {
  return status.starts_with(std::string("skipped (") + what);
}

std::vector<SweepPointRow> run_sweep(const cfg::SweepPlan& plan, const std::string& sweep_file,
                                     const std::filesystem::path& out_dir, const SweepRunOptions& options) {
  const int jobs = options.jobs;
  std::filesystem::create_directories(out_dir);
  std::vector<SweepPointRow> rows(plan.points.size());
  std::size_t same = 0;
  for (std::size_t i = 0; i < plan.points.size(); ++i) {
    const cfg::PlannedPoint& p = plan.points[i];
    rows[i].label = p.label;
    if (!p.config) {
      rows[i].status = "invalid";
      rows[i].note = p.invalid;
      continue;
    }
    rows[i].workers = p.config->workers;
    rows[i].time_model = cfg::describe_step_time_model(*p.config);
    if (!p.finished.empty()) {
      take_finished(rows[i], p.file, p.finished, "");
    } else if (!p.rerun_reason.empty()) {
      const bool left = p.rerun_reason.starts_with("left ");
      std::fprintf(stderr, "%s: %s; running the point again%s\n", p.file.string().c_str(), p.rerun_reason.c_str(),
                   left ? " unless another sweep is running it" : "");
    }
    if (p.same_as) ++same;
  }
  const std::size_t n = plan.to_run.size();
  std::fprintf(stderr,
               "sweep %s: %zu points, %zu to run, %zu the same run as another point, %zu skipped or invalid, "
               "%d job(s)\n",
               sweep_file.c_str(), plan.points.size(), n, same, plan.points.size() - n - same, jobs);
  std::vector<std::filesystem::path> files;
  for (const std::size_t i : plan.to_run) files.push_back(plan.points[i].file);
  // Each point is checked again under its run file's lock just before it starts: another sweep
  // into the same folder may have finished it meanwhile, or may be running it now.
  std::mutex mu;
  cfg::ScheduleHooks hooks;
  hooks.run = [&](std::size_t k, bool) {
    const cfg::PlannedPoint& p = plan.points[plan.to_run[k]];
    SweepPointRow& row = rows[plan.to_run[k]];
    // After SIGTERM or SIGINT the points running stop at a step boundary (interrupted, as
    // `scape run` stops); no other point starts.
    if (const int signal = tr::stop_signal(); signal != 0) {
      row.status = std::string("not run (") + tr::signal_name(signal) + ")";
      std::lock_guard guard(mu);
      std::fprintf(stderr, "[%zu/%zu] %s: %s\n", k + 1, n, row.label.c_str(), row.status.c_str());
      return;
    }
    try {
      std::string why;
      const std::string finished = cfg::finished_status(p.file, why);
      if (!finished.empty()) {
        take_finished(row, p.file, finished, " by another sweep");
      } else {
        if (!options.force_memory) {  // at its start: points may run in parallel
          tr::require_host_memory(tr::host_memory_estimate(*p.config, p.config->workers), tr::available_host_memory());
        }
        row.outcome = run_simulated(*p.config, point_options(options.run, p.file, jobs, k, n, row.label));
        row.status = tr::to_string(row.outcome.status);
        row.note = row.outcome.error.empty() ? p.file.string() : row.outcome.error;
      }
    } catch (const std::exception& e) {
      row.status = "invalid";
      row.note = e.what();
    }
    std::lock_guard guard(mu);
    std::fprintf(stderr, "[%zu/%zu] %s: %s\n", k + 1, n, row.label.c_str(), row.status.c_str());
  };
  hooks.held_elsewhere = [&](std::size_t k) {
    std::lock_guard guard(mu);
    std::fprintf(stderr, "[%zu/%zu] %s: another sweep is running it; waiting for it at the end\n", k + 1, n,
                 rows[plan.to_run[k]].label.c_str());
  };
  hooks.waiting = [&](std::size_t k) {
    std::lock_guard guard(mu);
    std::fprintf(stderr, "[%zu/%zu] %s: waiting for another sweep's run of it\n", k + 1, n,
                 rows[plan.to_run[k]].label.c_str());
  };
  hooks.unlocked = [&](const std::filesystem::path& path) {
    std::fprintf(stderr,
                 "warning: %s: this filesystem does not support flock; points run unlocked, so a second "
                 "sweep into %s at the same time may run them again\n",
                 path.string().c_str(), out_dir.string().c_str());
  };
  cfg::run_planned(files, jobs, hooks);
  for (std::size_t i = 0; i < plan.points.size(); ++i) {
    if (!plan.points[i].same_as) continue;
    const std::size_t runner = *plan.points[i].same_as;
    rows[i].status = rows[runner].status;
    rows[i].outcome = rows[runner].outcome;
    rows[i].workers = rows[runner].workers;
    rows[i].time_model = rows[runner].time_model;
    rows[i].note = "same run as " + rows[runner].label + ": " + rows[runner].note;
    std::fprintf(stderr, "%s: the same run as %s (settings that do not apply to the optimizer are ignored)\n",
                 rows[i].label.c_str(), rows[runner].label.c_str());
  }
  return rows;
}

}  // namespace scape::sim
