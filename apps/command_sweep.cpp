// scape sweep: every point of a sweep, completed and diverged points skipped on a re-run, and
// the table of their outcomes.
#include <cmath>
#include <cstdio>
#include <mutex>

#include "apps/cli_common.hpp"
#include "config/compute_model.hpp"
#include "config/sweep_plan.hpp"
#include "model/gpt.hpp"
#include "model/llama.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"
#include "sim/sim_run.hpp"

namespace scape::cli {
namespace {

using nlohmann::json;

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
    const scape::model::LlamaConfig l{.n_layer = get("n_layer"), .n_head = get("n_head"), .n_kv_head = get("n_kv_head"),
                                      .n_embd = get("n_embd"), .block_size = get("block_size"),
                                      .vocab_size = get("vocab_size"), .ffn_hidden = get("ffn_hidden")};
    o.n_params = scape::model::transformer_layout(scape::model::transformer_shape(l)).size();
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

// A finished run (completed, or diverged: the same config and seed diverge again, bit for bit)
// is the point's result, read back from its file.
void take_finished(SweepRow& row, const std::filesystem::path& path, const std::string& status, const std::string& by) {
  row.outcome = outcome_from_file(path);
  if (status == "diverged") row.outcome.status = tr::RunStatus::diverged;
  row.status = "skipped (" + status + by + ")";
  row.note = path.string();
}

// Each point's progress line names it. With parallel points a line every two seconds from each
// would bury the sweep's own lines, so each point reports once a minute (and when it ends).
tr::RunOptions point_options(const std::filesystem::path& path, bool quiet, int jobs, std::size_t k, std::size_t n,
                             const std::string& label) {
  auto options = options_for(path, quiet);
  options.writer_lock_held = true;  // run_planned holds each point's lock while it runs
  options.progress_label = "[" + std::to_string(k + 1) + "/" + std::to_string(n) + "] " + label;
  if (jobs > 1) options.progress_every_seconds = 60;
  return options;
}

bool is_skipped(const std::string& status, const char* what) {
  return status.starts_with(std::string("skipped (") + what);
}

int cmd_sweep(const std::string& file, const std::string& out_dir, const std::vector<std::string>& sets, int jobs,
              bool quiet, bool force_memory) {
  const cfg::SweepPlan plan = cfg::plan_sweep(file, out_dir, sets);
  std::filesystem::create_directories(out_dir);
  std::vector<SweepRow> rows(plan.points.size());
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
    rows[i].time_model = config::describe_step_time_model(*p.config);
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
  std::fprintf(stderr, "sweep %s: %zu points, %zu to run, %zu the same run as another point, %zu skipped or invalid, "
               "%d job(s)\n", file.c_str(), plan.points.size(), n, same, plan.points.size() - n - same, jobs);
  std::vector<std::filesystem::path> files;
  for (const std::size_t i : plan.to_run) files.push_back(plan.points[i].file);
  // Each point is checked again under its run file's lock just before it starts: another sweep
  // into the same folder may have finished it meanwhile, or may be running it now.
  std::mutex mu;
  cfg::ScheduleHooks hooks;
  hooks.run = [&](std::size_t k, bool) {
    const cfg::PlannedPoint& p = plan.points[plan.to_run[k]];
    SweepRow& row = rows[plan.to_run[k]];
    try {
      std::string why;
      const std::string finished = cfg::finished_status(p.file, why);
      if (!finished.empty()) {
        take_finished(row, p.file, finished, " by another sweep");
      } else {
        check_host_memory(*p.config, p.config->workers, force_memory);  // at its start: points may run in parallel
        row.outcome = scape::sim::run_simulated(*p.config, point_options(p.file, quiet, jobs, k, n, row.label));
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
    std::fprintf(stderr, "warning: %s: this filesystem does not support flock; points run unlocked, so a second "
                 "sweep into %s at the same time may run them again\n", path.string().c_str(), out_dir.c_str());
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

  std::printf(
      "\n| point | status | final val loss | final train loss | bytes/step vs dense | mean mask Jaccard | %s |\n",
      step_time_header(rows).c_str());
  std::printf("|---|---|---|---|---|---|---|\n");
  int code = kExitOk;
  for (const auto& r : rows) {
    const auto& o = r.outcome;
    const bool ran = r.status == "completed" || r.status == "diverged" || is_skipped(r.status, "completed") ||
                     is_skipped(r.status, "diverged");
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
    if ((r.status == "diverged" || is_skipped(r.status, "diverged")) && code == kExitOk) code = kExitDiverged;
  }
  for (const auto& r : rows) {
    if (r.status == "invalid" || r.status == "failed")
      std::fprintf(stderr, "%s: %s: %s\n", r.label.c_str(), r.status.c_str(), r.note.c_str());
  }
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
      "starts, and a point another sweep into the same folder is running is waited for, never run twice");
  sweep->add_option("sweep", a->config_file, "sweep JSON file")->required()->check(CLI::ExistingPath);
  sweep->add_option("--out", a->out_dir, "output folder for the run files")->required();
  sweep->add_option("--jobs", a->jobs, "points run in parallel (default 1)")->check(CLI::Range(1, 64));
  sweep->add_option("--set", a->sets, "override a value in every point: key.path=value");
  sweep->add_flag("--quiet", a->quiet, "no progress output");
  add_force_memory_flag(sweep, a->force_memory);
  Command c;
  c.sub = sweep;
  c.run = [a] { return cmd_sweep(a->config_file, a->out_dir, a->sets, a->jobs, a->quiet, a->force_memory); };
  return c;
}

}  // namespace scape::cli
