// `scape predict --from-runs`: the runs of a folder fed to a prediction config.
#include "predict/from_runs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "config/json_section.hpp"
#include "predict/report.hpp"
#include "run_file/hdf5.hpp"
#include "run_file/recorder.hpp"

namespace scape::predict {
namespace {

namespace cfg = scape::config;
using nlohmann::json;

double mean_of_finite(const std::vector<double>& v) {
  double sum = 0;
  int n = 0;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    sum += x;
    ++n;
  }
  return n ? sum / n : NAN;
}

MeasuredRun read_run(const std::filesystem::path& path, const std::string& config_json) {
  const auto f = run_file::File::open(path, run_file::Access::read);
  MeasuredRun r;
  r.file = path;
  r.config = json::parse(config_json);
  const auto val = f.has_link("/eval/val_loss") ? f.open_dataset("/eval/val_loss").read_all<double>()
                                                : std::vector<double>{};
  r.final_val_loss = val.empty() ? NAN : val.back();
  r.bytes_per_step = mean_of_finite(f.open_dataset("/metrics/bytes_sent").read_all<double>());
  return r;
}

bool is_dense(const MeasuredRun& r) {
  const std::string type = r.config.at("optimizer").at("type");
  return type == "adamw" || type == "adams";
}

// Runs of the same problem differ only in their optimizer (and labels).
json problem_of(const MeasuredRun& r) {
  json j = r.config;
  for (const char* key : {"optimizer", "name", "description"}) j.erase(key);
  return j;
}

const MeasuredRun* dense_of(const MeasuredRun& run, const std::vector<MeasuredRun>& runs) {
  for (const auto& r : runs) {
    if (is_dense(r) && problem_of(r) == problem_of(run)) return &r;
  }
  return nullptr;
}

Prediction predict_at_largest(const std::filesystem::path& config_file, std::vector<std::string> sets) {
  PredictConfig c = load_predict_config(config_file, sets);
  c.workers = {*std::max_element(c.workers.begin(), c.workers.end())};
  return run_prediction(c);
}

std::string cell(const char* format, double v) {
  if (std::isnan(v)) return "n/a";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

double bytes_sent(const StepPrediction& s) {
  double sum = 0;
  for (const auto& c : s.collectives) sum += c.record.bytes_sent_per_worker;
  return sum;
}

// With several GPUs a node, what crosses the network is the figure that matters (NVLink is
// hundreds of times faster), as `analysis report` heads inter-node bytes when G > 1.
double inter_node_bytes(const StepPrediction& s) {
  double sum = 0;
  for (const auto& c : s.collectives) sum += c.inter_bytes;
  return sum;
}

std::string run_label(const MeasuredRun& r) {
  const json& o = r.config.at("optimizer");
  return o.at("type").get<std::string>() + " " + cell("%g", o.at("sparsity").get<double>()) + " (" +
         r.file.filename().string() + ")";
}

}  // namespace

std::vector<MeasuredRun> read_completed_runs(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) throw cfg::ConfigError("--from-runs: no such folder " + dir.string());
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".h5") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<MeasuredRun> runs;
  for (const auto& path : files) {
    try {
      const auto summary = run_file::read_run_summary(path);
      if (summary.status == "completed") runs.push_back(read_run(path, summary.config_json));
    } catch (const run_file::H5Error&) {
      // Not a run file (a prediction, say): not one of the runs.
    }
  }
  return runs;
}

std::vector<AtScaleRow> predict_from_runs(const std::filesystem::path& config_file,
                                          const std::vector<std::string>& sets, const std::vector<MeasuredRun>& runs,
                                          bool config_overlap_only) {
  const std::string type = to_string(load_predict_config(config_file, sets).optimizer.type);
  std::vector<const MeasuredRun*> chosen;
  for (const auto& run : runs) {
    if (run.config.at("optimizer").at("type") == type) chosen.push_back(&run);
  }
  // In the order of a sweep over sparsity: the densest first.
  std::stable_sort(chosen.begin(), chosen.end(), [](const MeasuredRun* a, const MeasuredRun* b) {
    return a->config["optimizer"]["sparsity"].get<double>() < b->config["optimizer"]["sparsity"].get<double>();
  });
  std::vector<AtScaleRow> rows;
  for (const MeasuredRun* p : chosen) {
    const MeasuredRun& run = *p;
    const json& o = run.config.at("optimizer");
    std::vector<std::string> with_run = sets;
    char sparsity[64];
    std::snprintf(sparsity, sizeof sparsity, "optimizer.sparsity=%.17g", o.at("sparsity").get<double>());
    with_run.emplace_back(sparsity);
    AtScaleRow row{&run, dense_of(run, runs), true, predict_at_largest(config_file, with_run)};
    const OverlapModel& overlap = row.prediction.config.overlap;
    // The other side of the overlap question: off when the config overlaps, on when it does not.
    const bool other = !(overlap.grad_reduce || overlap.param_gather);
    row.overlap = !other;
    rows.push_back(std::move(row));
    if (config_overlap_only) continue;
    with_run.emplace_back(std::string("overlap.grad_reduce=") + (other ? "true" : "false"));
    with_run.emplace_back(std::string("overlap.param_gather=") + (other ? "true" : "false"));
    rows.push_back({&run, rows.back().dense, other, predict_at_largest(config_file, with_run)});
  }
  if (rows.empty()) throw cfg::ConfigError("--from-runs: no completed " + type + " run in the folder");
  return rows;
}

void print_at_scale(std::ostream& out, const std::vector<AtScaleRow>& rows) {
  const Prediction& first = rows.front().prediction;
  const int w = rows.front().at_scale().workers;
  print_header(out, first);
  const bool both =
      std::any_of(rows.begin(), rows.end(), [&](const AtScaleRow& r) { return r.overlap != rows.front().overlap; });
  out << (both ? "rows: the optimizer at each run's sparsity, with the config's overlap and with bucketed overlap "
                 "switched the other way\n\n"
               : "rows: the optimizer at each run's sparsity, with the config's overlap only\n\n");
  const bool per_node = first.config.gpus_per_node > 1;
  out << "| run here | val loss vs dense here | bytes/step vs dense here | "
      << (per_node ? "inter-node bytes/step vs dense at W = " : "bytes/step vs dense at W = ") << w
      << " | overlap (grad_reduce, param_gather) | dense step ms | " << to_string(first.config.optimizer.type)
      << " step ms | speedup |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : rows) {
    const PredictionRow& p = r.at_scale();
    const double loss = r.dense ? r.run->final_val_loss - r.dense->final_val_loss : NAN;
    const double bytes_here = r.dense ? r.run->bytes_per_step / r.dense->bytes_per_step : NAN;
    out << "| " << run_label(*r.run) << " | " << cell("%+.4f", loss) << " | " << cell("%.4f", bytes_here) << " | "
        << cell("%.4f", per_node ? inter_node_bytes(p.optimizer) / inter_node_bytes(p.baseline)
                                 : bytes_sent(p.optimizer) / bytes_sent(p.baseline))
        << " | " << (r.prediction.config.overlap.grad_reduce || r.prediction.config.overlap.param_gather ? "on" : "off")
        << " | " << cell("%.2f", p.baseline.step_s * 1e3) << " | " << cell("%.2f", p.optimizer.step_s * 1e3) << " | "
        << cell("%.3f", p.speedup) << " |\n";
  }
}

}  // namespace scape::predict
