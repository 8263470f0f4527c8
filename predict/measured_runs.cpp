// Reading run and bench-comm files for calibration, and the calibration report.
#include "predict/measured_runs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "config/config.hpp"
#include "config/json_section.hpp"
#include "config/model_shapes.hpp"
#include "core/schedule.hpp"
#include "optimizers/volume.hpp"
#include "predict/link_load_fit.hpp"
#include "run_file/bench_comm_file.hpp"
#include "run_file/hdf5.hpp"

namespace scape::predict {
namespace {

namespace cfg = config;
using nlohmann::json;

[[noreturn]] void bad_file(const std::filesystem::path& file, const std::string& what) {
  throw cfg::ConfigError(file.string() + ": " + what);
}

run_file::File open_measurements(const std::filesystem::path& file) {
  try {
    return run_file::File::open(file, run_file::Access::read);
  } catch (const run_file::H5Error& e) {
    bad_file(file, std::string("cannot be read: ") + e.what());
  }
}

std::vector<double> column(const run_file::File& f, const std::filesystem::path& file, const std::string& name,
                           const std::string& why) {
  if (!f.has_link(name)) bad_file(file, "missing dataset " + name + " (" + why + ")");
  return f.open_dataset(name).read_all<double>();
}

double median(std::vector<double> v) {
  std::erase_if(v, [](double x) { return !std::isfinite(x); });
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The values of `values` at the rows whose step lies in [first, last].
std::vector<double> rows_in(const std::vector<double>& steps, const std::vector<double>& values, int first, int last) {
  std::vector<double> out;
  for (std::size_t i = 0; i < steps.size() && i < values.size(); ++i) {
    if (steps[i] >= first && steps[i] <= last) out.push_back(values[i]);
  }
  return out;
}

cfg::ExperimentConfig run_config(const run_file::File& f, const std::filesystem::path& file) {
  if (!f.has_attribute("config")) bad_file(file, "missing attribute config (not a scape run file)");
  try {
    return cfg::parse_experiment(json::parse(f.read_string_attribute("config")),
                                 std::filesystem::absolute(file).parent_path());
  } catch (const std::exception& e) {
    bad_file(file, std::string("its config does not parse: ") + e.what());
  }
}

// Collects the ledger's records of one steady-state step by purpose: under hierarchy node the
// records of the rail `part` names, the node's two collectives included.
std::vector<MeasuredCollective> ledger_collectives(const OptimizerConfig& c, const ParamLayout& layout, int workers,
                                                   const MethodShare& part, int step,
                                                   std::optional<std::size_t> union_size) {
  const bool node = c.hierarchy == Hierarchy::node;
  const auto records =
      node ? rail_step_collectives(c, layout, workers, part.rail, step, step + 1, NetworkModel{}, union_size)
           : step_collectives(c, layout, workers, step, step + 1, NetworkModel{}, union_size);
  std::vector<MeasuredCollective> out;
  for (const auto& r : records) {
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& m) { return m.purpose == r.purpose; });
    if (it == out.end()) {
      const int ranks = !node ? workers : r.link == LinkClass::intra ? c.ranks_per_node : part.workers;
      out.push_back(MeasuredCollective{r.purpose, r.kind, r.overlapped, 0, 0, 0, r.link, ranks});
      it = out.end() - 1;
    }
    it->latency_steps += r.latency_steps;
    it->bytes_sent += r.bytes_sent_per_worker;
  }
  return out;
}

CollectiveKind kind_named(const std::string& name, const std::filesystem::path& file, std::size_t row) {
  for (const auto kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather,
                          CollectiveKind::all_to_all}) {
    if (name == to_string(kind)) return kind;
  }
  bad_file(file, "/kind[" + std::to_string(row) + "]: unknown collective kind " + name);
}

LinkLoad load_named(const std::string& name, const std::filesystem::path& file, std::size_t row) {
  for (const auto load : {LinkLoad::idle, LinkLoad::busy}) {
    if (name == to_string(load)) return load;
  }
  bad_file(file, "/regime[" + std::to_string(row) + "]: unknown regime " + name + " (idle or busy)");
}

std::string percent(double predicted, double measured) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * (predicted - measured) / measured);
  return buf;
}

std::string ms(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s * 1e3);
  return buf;
}

std::string share(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < kOversubscribedShare ? "%.3f (scaled)" : "%.3f", s);
  return buf;
}

// A run's collectives as link samples: those across nodes, and a hierarchical run's node
// collectives, kept apart for the intra-node link.
struct RunSamples {
  std::vector<CollectiveSample> inter, intra;
};

RunSamples samples_of(const RunMeasurement& r) {
  RunSamples out;
  for (const auto& c : r.collectives) {
    // The lagged all-gather shares the cores with the compute thread here: not a link figure.
    if (c.overlapped || !(c.measured_s > 0) || !(c.bytes_sent > 0)) continue;
    CollectiveSample s{c.kind, c.ranks, c.latency_steps, c.bytes_sent, c.measured_s};
    if (c.link == LinkClass::intra) {
      out.intra.push_back(s);
      continue;
    }
    // A hierarchical run's G rails cross the node's one port at once, each ring on 1/G of it:
    // in the measured time the port carried G times the rail's bytes.
    if (r.hierarchical()) s.bytes_sent *= r.ranks_per_node;
    out.inter.push_back(s);
  }
  return out;
}

void print_fit(std::ostream& out, const Calibration& c) {
  char buf[256];
  if (c.compute_samples > 0) {
    std::snprintf(buf, sizeof buf, "compute: %.4g GFLOP/s achieved (%d runs); ", c.achieved_flops / 1e9,
                  c.compute_samples);
  } else if (c.optimizer_samples > 0) {
    std::snprintf(buf, sizeof buf, "compute: not fitted (every fitted run's compute slept); ");
  } else {
    std::snprintf(buf, sizeof buf, "compute and optimizer step: not fitted (no run: the links alone)\n");
  }
  out << buf;
  if (c.optimizer_samples > 0) {
    std::snprintf(buf, sizeof buf, "optimizer step: %.4g GB/s over the bytes it touches (%d runs)\n",
                  c.optimizer_Bps / 1e9, c.optimizer_samples);
    out << buf;
  }
  std::snprintf(buf, sizeof buf, "collectives, all kinds: alpha %.3g us, %.4g GB/s (%d samples)\n",
                c.combined.alpha_s * 1e6, c.combined.bandwidth_Bps / 1e9, c.combined.samples);
  out << buf;
  for (const auto kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter, CollectiveKind::all_gather}) {
    if (const auto& l = c.by_kind[static_cast<std::size_t>(kind)]) {
      std::snprintf(buf, sizeof buf, "  %s: alpha %.3g us, %.4g GB/s (%d samples)\n", to_string(kind),
                    l->alpha_s * 1e6, l->bandwidth_Bps / 1e9, l->samples);
      out << buf;
    }
  }
  if (c.intra) {
    std::snprintf(buf, sizeof buf, "intra-node link (the node collectives): alpha %.3g us, %.4g GB/s (%d samples)\n",
                  c.intra->alpha_s * 1e6, c.intra->bandwidth_Bps / 1e9, c.intra->samples);
    out << buf;
  }
  if (c.inter_curves) {
    std::snprintf(
        buf, sizeof buf,
        "  the lines above fit the busy calls alone; the inter link keeps the measured curves of %d idle and %d "
        "busy calls (%d ranks), interpolated\n",
        c.idle_samples, c.combined.samples, c.inter_curves->workers);
    out << buf;
  }
  if (c.link_rate_scale != 1) {
    std::snprintf(buf, sizeof buf, "inter links scaled to %.4g times the bench's rate (--link-rate-scale)\n",
                  c.link_rate_scale);
    out << buf;
  }
  for (const auto& w : c.warnings) out << "  warning: " << w << "\n";
}

void print_runs(std::ostream& out, const Calibration& c, const std::vector<RunMeasurement>& runs,
                const std::vector<bool>& fitted, std::ostream* csv) {
  if (csv) *csv << "file,role,workers,optimizer,cpu_share,wall_step_ms,measured_step_ms,predicted_step_ms,error\n";
  if (runs.empty()) return;  // --links-from-bench on bench-comm files alone: nothing to compare
  out << "\n| run | role | W | optimizer | steps | CPU share | wall step ms | measured step ms | predicted step ms | "
         "error | compute ms meas / pred | optimizer ms meas / pred "
         "|\n|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  std::string collectives;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunMeasurement& r = runs[i];
    StepInputs in = calibrated_inputs(c, r.optimizer, r.n_params, r.flops_per_token, r.fill_in);
    in.layout = r.layout;
    in.fixed_compute_s = r.slept_compute_s;
    const StepPrediction p = predict_step(in, r.workers, r.tokens_per_gpu);
    const double harness_s = r.harness_metric_bytes / c.optimizer_Bps;
    const double pred_opt = p.optimizer_s + p.exposed_comm_s + harness_s;  // what optimizer_wall_time holds
    const double pred_step = p.step_s + harness_s;
    out << "| " << r.file.filename().string() << " | " << (fitted[i] ? "fitted" : "held out") << " | " << r.workers
        << " | " << to_string(r.optimizer.type) << (r.hierarchical() ? " (node)" : "") << " | " << r.steps_used << " | "
        << share(r.cpu_share) << " | " << ms(r.wall_step_s) << " | " << ms(r.step_s()) << " | " << ms(pred_step)
        << " | " << percent(pred_step, r.step_s()) << " | " << ms(r.compute_s) << " / " << ms(p.compute_s()) << " | "
        << ms(r.optimizer_s) << " / " << ms(pred_opt) << " |\n";
    if (csv) {
      *csv << r.file.string() << "," << (fitted[i] ? "fitted" : "held_out") << "," << r.workers << ","
           << to_string(r.optimizer.type) << "," << r.cpu_share << "," << ms(r.wall_step_s) << "," << ms(r.step_s())
           << "," << ms(pred_step) << ","
           << pred_step / r.step_s() - 1 << "\n";
    }
    for (const auto& m : r.collectives) {
      double predicted = 0;
      for (const auto& col : p.collectives) {
        if (col.record.purpose == m.purpose) predicted += col.time_s;
      }
      collectives += "| " + r.file.filename().string() + " | " + m.purpose + (m.overlapped ? " (lagged)" : "") +
                     " | " + ms(m.measured_s) + " | " + ms(predicted) + " | " +
                     (m.measured_s > 0 ? percent(predicted, m.measured_s) : "n/a") + " |\n";
    }
  }
  out << "\n| run | collective | measured ms | predicted ms | error |\n|---|---|---|---|---|\n" << collectives;
}

}  // namespace

double harness_metric_bytes(const OptimizerConfig& optimizer, std::uint64_t n_params, std::uint64_t residual_params) {
  const double n = static_cast<double>(n_params);
  const double residual = static_cast<double>(residual_params > 0 ? residual_params : n_params);
  return (4 + 8 + 10) * n + (has_sparse_metrics(optimizer) ? 4 * residual : 0);
}

bool is_bench_comm_file(const std::filesystem::path& file) {
  const run_file::File f = open_measurements(file);
  return f.has_attribute("format") && f.read_string_attribute("format") == run_file::kBenchCommFormat;
}

std::vector<CollectiveSample> read_bench_comm(const std::filesystem::path& file) {
  const run_file::File f = open_measurements(file);
  const std::string why = "written by scape bench-comm";
  if (!f.has_link("/kind")) bad_file(file, "missing dataset /kind (" + why + ")");
  const auto kinds = f.open_dataset("/kind").read_strings();
  const auto workers = column(f, file, "/workers", why);
  const auto steps = column(f, file, "/latency_steps", why);
  const auto sent = column(f, file, "/bytes_sent_per_worker", why);
  const auto time = column(f, file, "/time_s", why);
  // Files before --idle-gap-ms have no /regime: every call of theirs followed another.
  const auto regimes = f.has_link("/regime") ? f.open_dataset("/regime").read_strings() : std::vector<std::string>{};
  if (!regimes.empty() && regimes.size() != kinds.size()) {
    bad_file(file, "/regime has " + std::to_string(regimes.size()) + " rows, /kind " + std::to_string(kinds.size()));
  }
  std::vector<CollectiveSample> out;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    CollectiveSample s;
    s.kind = kind_named(kinds[i], file, i);
    s.workers = static_cast<int>(workers.at(i));
    s.latency_steps = steps.at(i);
    s.bytes_sent = sent.at(i);
    s.time_s = time.at(i);
    if (!regimes.empty()) s.load = load_named(regimes[i], file, i);
    out.push_back(s);
  }
  return out;
}

RunMeasurement read_run_measurement(const std::filesystem::path& file) {
  const run_file::File f = open_measurements(file);
  const cfg::ExperimentConfig config = run_config(f, file);
  const bool slept = config.compute.type == "sleep";
  if (config.model.type != "gpt" && !slept) {
    bad_file(file, "model.type " + config.model.type +
                       ": calibration fits compute per FLOP and needs a gpt run, or a run whose compute sleeps "
                       "(compute.type sleep)");
  }
  if (has_outer_loop(config.optimizer.type)) {
    // The fit reads one steady-state step's collectives; these come once every inner_steps steps.
    bad_file(file, std::string("optimizer.type ") + to_string(config.optimizer.type) +
                       ": its outer step comes once every inner_steps steps; calibrate on runs of the other "
                       "optimizers");
  }
  if (config.optimizer.overlap_grad_reduce) {
    // Its buckets run beside the backward pass: their measured time mixes link time with waits
    // for the gradient, so it cannot fit the link.
    bad_file(file, "optimizer.overlap_grad_reduce: its reduce-scatter runs in buckets beside the backward pass; "
                   "calibrate on runs without it");
  }
  RunMeasurement r;
  r.file = file;
  r.optimizer = config.optimizer;
  r.workers = config.workers;
  r.ranks_per_node = config.topology.ranks_per_node;
  if (config.model.type == "gpt") {
    const presets::ModelSpec spec = scape::config::predictor_model_spec(config.model);
    r.layout = scape::config::language_model_spec(config.model).layout();
    r.flops_per_token = presets::training_flops_per_token(spec, config.model.block_size, presets::AttentionFlops::causal);
    r.tokens_per_gpu = static_cast<double>(config.data.batch_size) * config.model.block_size;
  } else {
    r.layout.add("theta", {static_cast<std::size_t>(config.model.size)}, true);  // the quadratic's one tensor
  }
  r.n_params = r.layout.size();
  if (slept) r.slept_compute_s = config.compute.seconds;

  const std::string measured_why = "a run of the mpi or nccl backend, written by this version";
  const auto steps = column(f, file, "/metrics/step", "a scape run file");
  const int t = steady_state_step(config.optimizer);
  const int first = std::max(3, t + 1);
  const int last = steps.empty() ? 0 : static_cast<int>(steps.back()) - 1;
  r.steps_used = static_cast<int>(rows_in(steps, steps, first, last).size());
  if (r.steps_used < 3) {
    bad_file(file, "only " + std::to_string(r.steps_used) + " steady-state steps (steps " + std::to_string(first) +
                       " to the last but one); calibration needs at least 3");
  }
  const std::string node_why = "optimizer.hierarchy node: its node collectives' times fit the intra-node link";
  const auto rows = [&](const std::string& name, const std::string& why) {
    return rows_in(steps, column(f, file, "/metrics/" + name, why), first, last);
  };
  const auto med = [&](const std::string& name) { return median(rows(name, measured_why)); };
  r.compute_s = med("compute_wall_time");
  r.optimizer_s = med("optimizer_wall_time");
  // A slept compute holds no core: the share measures nothing there.
  r.cpu_share = slept ? 1.0 : std::min(1.0, med("compute_time") / r.compute_s);
  const MethodShare part = method_share(config.optimizer, r.layout, r.n_params, r.workers, r.ranks_per_node);
  std::optional<std::size_t> union_size;
  if (config.optimizer.type == OptimizerType::scape &&
      config.optimizer.scape.mask_partition == MaskPartition::local_union) {
    r.fill_in = med("fill_in");
    const double k =
        static_cast<double>(mask_k(part.flat, part.layout, part.workers, density_at(config.optimizer.density(), 0, 1)));
    union_size = static_cast<std::size_t>(std::round(r.fill_in * k));
  }
  r.collectives = ledger_collectives(config.optimizer, r.layout, r.workers, part, t, union_size);
  std::vector<double> own = rows("optimizer_wall_time", measured_why);
  const auto subtract = [&own](const std::vector<double>& x) {
    for (std::size_t i = 0; i < own.size() && i < x.size(); ++i) {
      if (std::isfinite(x[i])) own[i] -= x[i];
    }
  };
  for (auto& c : r.collectives) {
    const auto times = rows("comm_time_measured_" + (c.overlapped ? std::string("async_all_gather") : c.purpose),
                            c.link == LinkClass::intra ? node_why : measured_why);
    c.measured_s = median(times);
    if (c.link == LinkClass::intra && !std::isfinite(c.measured_s)) {
      // Runs before the node's and rails' times reached the world communicator wrote NaN here.
      bad_file(file, "/metrics/comm_time_measured_" + c.purpose + " holds no time in steps " + std::to_string(first) +
                         " to " + std::to_string(last) + " (" + node_why + "; rerun with this version)");
    }
    if (!c.overlapped && std::isfinite(c.measured_s)) {
      r.blocking_comm_s += c.measured_s;
      subtract(times);
    }
  }
  if (has_sparse_metrics(config.optimizer)) {
    const auto waits = rows("mask_wait_exposed", measured_why);
    const double wait = median(waits);
    r.mask_wait_s = std::isfinite(wait) ? wait : 0.0;
    subtract(waits);
  }
  // Each rank's own remainder where the run recorded it: the remainder of the per-column maxima
  // above mixes ranks when they are out of balance (docs/run-files.md, optimizer_kernel_wall_time).
  r.optimizer_kernels_s = f.has_link("/metrics/optimizer_kernel_wall_time") ? med("optimizer_kernel_wall_time")
                                                                            : median(own);
  r.harness_metric_bytes = harness_metric_bytes(config.optimizer, r.n_params, part.layout.size());
  r.wall_step_s = r.step_s();
  if (r.cpu_share < kOversubscribedShare) {
    // Every phase waited for a core in the same proportion: what remains is the time of a
    // rank that has its core.
    for (double* x : {&r.compute_s, &r.optimizer_s, &r.mask_wait_s, &r.blocking_comm_s, &r.optimizer_kernels_s}) {
      *x *= r.cpu_share;
    }
    for (auto& c : r.collectives) c.measured_s *= r.cpu_share;
  }
  return r;
}

void calibrate_from_files(const std::vector<std::filesystem::path>& fit_files,
                          const std::vector<std::filesystem::path>& held_out, const std::filesystem::path& out,
                          std::ostream& table, const std::filesystem::path& csv, bool links_from_bench,
                          double link_rate_scale) {
  std::vector<RunMeasurement> runs;
  std::vector<bool> fitted;
  std::vector<RateSample> compute, optimizer;
  std::vector<CollectiveSample> collectives, intra;
  for (const auto& file : fit_files) {
    if (is_bench_comm_file(file)) {
      const auto rows = read_bench_comm(file);
      collectives.insert(collectives.end(), rows.begin(), rows.end());
      continue;
    }
    runs.push_back(read_run_measurement(file));
    fitted.push_back(true);
    const RunMeasurement& r = runs.back();
    if (!r.compute_slept()) compute.push_back(RateSample{r.flops_per_token * r.tokens_per_gpu, r.compute_s});
    Calibration unit;  // any positive figures: only the bytes of the step are read
    unit.achieved_flops = unit.optimizer_Bps = unit.combined.bandwidth_Bps = 1;
    unit.intra = LinkFit{0, 1, 0};
    StepInputs in = calibrated_inputs(unit, r.optimizer, r.n_params, r.flops_per_token, r.fill_in);
    in.layout = r.layout;
    in.fixed_compute_s = r.slept_compute_s;
    optimizer.push_back(RateSample{predict_step(in, r.workers, r.tokens_per_gpu).optimizer_bytes +
                                       r.harness_metric_bytes,
                                   r.optimizer_kernels_s});
    // The bench-comm files' flat rings never run inside a node alone: the intra-node link comes
    // from the runs' node collectives even under --links-from-bench.
    const auto s = samples_of(r);
    intra.insert(intra.end(), s.intra.begin(), s.intra.end());
    if (links_from_bench) continue;
    collectives.insert(collectives.end(), s.inter.begin(), s.inter.end());
  }
  if (has_idle_calls(collectives) && !links_from_bench) {
    // A run's collectives are not marked idle or busy: they would enter the regimes' fit as busy.
    throw cfg::ConfigError(
        "--calibrate: a bench-comm file among the inputs holds calls after an idle gap "
        "(bench-comm --idle-gap-ms); fit the link regimes with --links-from-bench");
  }
  if (links_from_bench && collectives.empty()) {
    throw cfg::ConfigError("--calibrate --links-from-bench: no bench-comm file among the inputs to fit the links to");
  }
  for (const auto& file : held_out) {
    runs.push_back(read_run_measurement(file));
    fitted.push_back(false);
    if (compute.empty() && !runs.back().compute_slept()) {
      throw cfg::ConfigError("--calibrate: " + file.string() +
                             " measures its compute, but every fitted run's compute slept: fit on a run whose "
                             "compute is measured too");
    }
  }
  if (fitted.empty() && !links_from_bench)
    throw cfg::ConfigError(
        "--calibrate: no run file among the inputs (bench-comm files alone fit only the links: "
        "--links-from-bench; compute and the optimizer step need a run)");
  Calibration c;
  try {
    c = calibrate(compute, optimizer, collectives, intra);
  } catch (const std::invalid_argument& e) {
    throw cfg::ConfigError(std::string("--calibrate: ") + e.what());
  }
  for (const auto& r : runs) {
    if (r.hierarchical() && !c.intra) {
      throw cfg::ConfigError("--calibrate: " + r.file.string() +
                             " runs optimizer.hierarchy node, but no fitted run measured the node collectives "
                             "that fit the intra-node link: fit on a hierarchical run too");
    }
  }
  if (link_rate_scale != 1) c = with_link_rate_scale(c, link_rate_scale);
  for (const auto& file : fit_files) c.sources.push_back(file.string());
  std::ofstream o(out);
  o << hardware_json(c).dump(2) << "\n";
  if (!o) throw std::runtime_error(out.string() + ": cannot be written");
  print_fit(table, c);
  if (csv.empty()) {
    print_runs(table, c, runs, fitted, nullptr);
    return;
  }
  std::ofstream csv_out(csv);
  print_runs(table, c, runs, fitted, &csv_out);
  if (!csv_out) throw std::runtime_error(csv.string() + ": cannot be written");
}

}  // namespace scape::predict
