// scape sweep: every point of a sweep, completed and diverged points skipped on a re-run, and
// the table of their outcomes.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "apps/cli_common.hpp"
#include "experiments/hdf5.hpp"
#include "experiments/recorder.hpp"
#include "experiments/run_lock.hpp"
#include "model/gpt.hpp"
#include "model/llama.hpp"
#include "sim/sim_run.hpp"
#include "train/compute_model.hpp"

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
// is the point's result, read back from its file. Anything else there (status running, killed or
// failed, or a file that cannot be read back) is no result: the point runs again and its file is
// overwritten.
bool skip_if_finished(SweepRow& row, const std::filesystem::path& path, const std::string& by, bool say_why_it_runs) {
  if (!std::filesystem::exists(path)) return false;
  try {
    const auto summary = ex::read_run_summary(path);
    if (summary.status == "completed" || summary.status == "diverged") {
      row.outcome = outcome_from_file(path);
      if (summary.status == "diverged") row.outcome.status = tr::RunStatus::diverged;
      row.status = "skipped (" + summary.status + by + ")";
      row.note = path.string();
      return true;
    }
    if (say_why_it_runs) {
      std::fprintf(stderr, "%s: left %s after step %ld; running the point again unless another sweep is running it\n",
                   path.string().c_str(), summary.status.c_str(), summary.steps_completed);
    }
  } catch (const std::exception& e) {
    if (say_why_it_runs) std::fprintf(stderr, "%s: %s; running the point again\n", path.string().c_str(), e.what());
  }
  return false;
}

// Each point's progress line names it. With parallel points a line every two seconds from each
// would bury the sweep's own lines, so each point reports once a minute (and when it ends).
tr::RunOptions point_options(const std::filesystem::path& path, bool quiet, int jobs, std::size_t k, std::size_t n,
                             const std::string& label) {
  auto options = options_for(path, quiet);
  options.progress_label = "[" + std::to_string(k + 1) + "/" + std::to_string(n) + "] " + label;
  if (jobs > 1) options.progress_every_seconds = 60;
  return options;
}

bool is_skipped(const std::string& status, const char* what) {
  return status.starts_with(std::string("skipped (") + what);
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
      if (skip_if_finished(rows[i], path, "", true)) continue;
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
  // Each point is checked again under its run file's lock just before it starts: another sweep
  // into the same folder may have finished it meanwhile, or may be running it now. A point held
  // elsewhere waits until this sweep's other points are done, then for that lock.
  std::mutex mu;
  std::vector<std::size_t> held;
  std::once_flag unlocked_warning;
  auto warn_unlocked_once = [&](const std::filesystem::path& path) {
    std::call_once(unlocked_warning, [&] {
      std::fprintf(stderr, "warning: %s: this filesystem does not support flock; points run unlocked, so a second "
                   "sweep into %s at the same time may run them again\n", path.string().c_str(), out_dir.c_str());
    });
  };
  auto run_point = [&](std::size_t k, bool wait) {
    const auto& [config, path] = to_run[k];
    SweepRow& row = rows[run_rows[k]];
    try {
      if (wait) {
        std::lock_guard guard(mu);
        std::fprintf(stderr, "[%zu/%zu] %s: waiting for another sweep's run of it\n", k + 1, to_run.size(),
                     row.label.c_str());
      }
      auto lock = wait ? std::optional(ex::RunFileLock::acquire(path)) : ex::RunFileLock::try_acquire(path);
      if (!lock) {
        std::lock_guard guard(mu);
        held.push_back(k);
        std::fprintf(stderr, "[%zu/%zu] %s: another sweep is running it; waiting for it at the end\n", k + 1,
                     to_run.size(), row.label.c_str());
        return;
      }
      if (!lock->holds()) warn_unlocked_once(path);
      if (!skip_if_finished(row, path, " by another sweep", false)) {
        row.outcome = scape::sim::run_simulated(config, point_options(path, quiet, jobs, k, to_run.size(), row.label));
        row.status = tr::to_string(row.outcome.status);
        row.note = row.outcome.error.empty() ? path.string() : row.outcome.error;
      }
    } catch (const std::exception& e) {
      row.status = "invalid";
      row.note = e.what();
    }
    std::lock_guard guard(mu);
    std::fprintf(stderr, "[%zu/%zu] %s: %s\n", k + 1, to_run.size(), row.label.c_str(), row.status.c_str());
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
  std::vector<std::size_t> all(to_run.size());
  for (std::size_t k = 0; k < all.size(); ++k) all[k] = k;
  run_all(all, false);
  const auto waiting = std::exchange(held, {});
  run_all(waiting, true);
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
    if (r.status == "invalid" || r.status == "failed") std::fprintf(stderr, "%s: %s: %s\n", r.label.c_str(), r.status.c_str(), r.note.c_str());
  }
  return code;
}

struct SweepArgs {
  std::string config_file, out_dir;
  std::vector<std::string> sets;
  int jobs = 1;
  bool quiet = false;
};

}  // namespace

Command add_sweep_command(CLI::App& app) {
  const auto a = std::make_shared<SweepArgs>();
  auto* sweep = app.add_subcommand("sweep", "run every point of a sweep (grid, points, lr_search, repeat: docs/configuration.md); completed and diverged points are skipped on a re-run, killed or failed ones run again; each point is checked again just before it starts, and a point another sweep into the same folder is running is waited for, never run twice");
  sweep->add_option("sweep", a->config_file, "sweep JSON file")->required()->check(CLI::ExistingPath);
  sweep->add_option("--out", a->out_dir, "output folder for the run files")->required();
  sweep->add_option("--jobs", a->jobs, "points run in parallel (default 1)")->check(CLI::Range(1, 64));
  sweep->add_option("--set", a->sets, "override a value in every point: key.path=value");
  sweep->add_flag("--quiet", a->quiet, "no progress output");
  Command c;
  c.sub = sweep;
  c.run = [a] { return cmd_sweep(a->config_file, a->out_dir, a->sets, a->jobs, a->quiet); };
  return c;
}

}  // namespace scape::cli
