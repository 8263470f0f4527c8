// scape predict: step time, speedup and scaling on a cluster, from a prediction config, from the
// runs of a folder, or a calibration fitted to measured runs.
#include <cstdio>
#include <iostream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "apps/cli_common.hpp"
#include "predict/from_runs.hpp"
#include "predict/measured_runs.hpp"
#include "predict/predict_config.hpp"
#include "predict/regime.hpp"
#include "predict/report.hpp"
#include "predict/table_model.hpp"
#include "predict/table_report.hpp"

namespace scape::cli {
namespace {

struct Calibrate {
  std::vector<std::string> fit, held_out;
  std::vector<double> sweep_GBps;  // --sweep: the link bandwidths of the regime sweep
  std::string validate, calibrate_table, hardware;  // measured tables (docs/PREDICTING.md)
  std::string compute_model = "gemm";               // --calibrate-table: gemm or flops
  double gemm_ridge = 0;                            // --calibrate-table: 0 = the GH200 datasheet's
  bool config_overlap_only = false;                 // --from-runs: no rows with the overlap switched
  bool links_from_bench = false;                    // --calibrate: links from bench-comm files alone
  double link_rate_scale = 1;                       // --calibrate: the inter links at this times the bench's rate
};

// The shipped calibration of the artifact's cluster, fitted to its Llama-500M table.
std::string default_table_hardware() {
  return std::string(SCAPE_SOURCE_DIR) + "/experiments/hardware/tacc-vista-measured.json";
}

int cmd_tables(const std::string& file, const std::string& out, const std::string& csv, const Calibrate& calibrate) {
  if (!file.empty()) throw cfg::ConfigError("--validate and --calibrate-table take no prediction config");
  if (!calibrate.validate.empty() && !calibrate.calibrate_table.empty()) {
    throw cfg::ConfigError("--validate and --calibrate-table: give one");
  }
  if (!calibrate.calibrate_table.empty()) {
    if (!csv.empty() || !calibrate.hardware.empty())
      throw cfg::ConfigError("--calibrate-table takes no --csv or --hardware");
    const auto table = scape::predict::read_measured_table(calibrate.calibrate_table);
    const std::string hw = out.empty() ? "calibrated-hardware.json" : out;
    const auto compute =
        calibrate.compute_model == "flops" ? scape::predict::TableCompute::flops : scape::predict::TableCompute::gemm;
    presets::GemmCurve shape = scape::predict::gh200_curve_shape();
    if (calibrate.gemm_ridge > 0) shape.ridge_flop_per_byte = calibrate.gemm_ridge;
    scape::predict::calibrate_table(table, hw, std::cout, compute, shape);
    std::fprintf(stderr, "calibrated from %s -> %s\n", calibrate.calibrate_table.c_str(), hw.c_str());
    return kExitOk;
  }
  if (!out.empty()) throw cfg::ConfigError("--validate prints a table (and --csv): no --out");
  const std::string hw = calibrate.hardware.empty() ? default_table_hardware() : calibrate.hardware;
  const nlohmann::json j = cfg::read_json_file(hw);
  scape::predict::Calibration c;
  try {
    c = scape::predict::calibration_from_hardware(j, hw);
  } catch (const std::invalid_argument& e) {
    throw cfg::ConfigError(std::string("--hardware: ") + e.what());
  }
  const auto table = scape::predict::read_measured_table(calibrate.validate);
  std::cout << "hardware: " << hw << "\n\n";
  scape::predict::print_table_check(std::cout, table, scape::predict::check_table(table, c), csv);
  return kExitOk;
}

int cmd_predict(const std::string& file, std::string out, const std::string& csv, const std::vector<std::string>& sets,
                const std::string& from_runs, const Calibrate& calibrate) {
  if (calibrate.calibrate_table.empty() && (calibrate.compute_model != "gemm" || calibrate.gemm_ridge > 0)) {
    throw cfg::ConfigError("--compute-model and --gemm-ridge go with --calibrate-table");
  }
  if (!calibrate.validate.empty() || !calibrate.calibrate_table.empty()) return cmd_tables(file, out, csv, calibrate);
  if (!calibrate.hardware.empty()) throw cfg::ConfigError("--hardware goes with --validate");
  if (!calibrate.fit.empty()) {
    if (!file.empty() || !from_runs.empty()) throw cfg::ConfigError("--calibrate takes no config or --from-runs");
    if (out.empty()) out = "calibrated-hardware.json";
    scape::predict::calibrate_from_files({calibrate.fit.begin(), calibrate.fit.end()},
                                         {calibrate.held_out.begin(), calibrate.held_out.end()}, out, std::cout, csv,
                                         calibrate.links_from_bench, calibrate.link_rate_scale);
    std::fprintf(stderr, "calibrated from %zu file(s) -> %s\n", calibrate.fit.size(), out.c_str());
    return kExitOk;
  }
  if (!calibrate.held_out.empty()) throw cfg::ConfigError("--held-out goes with --calibrate");
  if (calibrate.links_from_bench) throw cfg::ConfigError("--links-from-bench goes with --calibrate");
  if (calibrate.link_rate_scale != 1) throw cfg::ConfigError("--link-rate-scale goes with --calibrate");
  if (file.empty()) throw cfg::ConfigError("predict: a prediction config (or --calibrate RUN.h5 ...) is required");
  if (calibrate.config_overlap_only && from_runs.empty()) {
    throw cfg::ConfigError("--config-overlap-only goes with --from-runs");
  }
  if (!from_runs.empty()) {
    if (!out.empty() || !csv.empty()) throw cfg::ConfigError("--from-runs prints a table only: no --out or --csv");
    const auto runs = scape::predict::read_completed_runs(from_runs);
    scape::predict::print_at_scale(
        std::cout, scape::predict::predict_from_runs(file, sets, runs, calibrate.config_overlap_only));
    return kExitOk;
  }
  const auto config = scape::predict::load_predict_config(file, sets);
  const auto prediction = scape::predict::run_prediction(config);
  scape::predict::print_prediction(std::cout, prediction);
  scape::predict::print_break_even(std::cout, config, scape::predict::break_even(config));
  if (!calibrate.sweep_GBps.empty()) scape::predict::print_regime_sweep(std::cout, config, calibrate.sweep_GBps);
  if (out.empty()) out = config.name + "-predict.h5";
  scape::predict::write_prediction_hdf5(out, prediction);
  if (!csv.empty()) scape::predict::write_prediction_csv(csv, prediction);
  std::fprintf(stderr, "%s: predicted %zu worker counts -> %s%s\n", config.name.c_str(), prediction.rows.size(),
               out.c_str(), csv.empty() ? "" : (" and " + csv).c_str());
  return kExitOk;
}

struct PredictArgs {
  std::string config_file, out, csv, from_runs;
  std::vector<std::string> sets;
  Calibrate calibrate;
};

}  // namespace

Command add_predict_command(CLI::App& app) {
  const auto a = std::make_shared<PredictArgs>();
  auto* predict = app.add_subcommand(
      "predict", "predict step time, speedup and scaling efficiency on a cluster (docs/PREDICTING.md)");
  predict->add_option("config", a->config_file, "prediction JSON file (not with --calibrate)")
      ->check(CLI::ExistingPath);
  predict->add_option("--set", a->sets, "override a config value: key.path=value (JSON, else a string); repeatable");
  predict->add_option("--out", a->out, "HDF5 prediction file (default: <name>-predict.h5 in the current directory); "
                                       "with --calibrate the hardware description (default calibrated-hardware.json)");
  predict->add_option("--csv", a->csv,
                      "also write the table as CSV (with --calibrate: one row a run, measured and predicted step)");
  predict->add_option("--from-runs", a->from_runs,
                      "instead: for each completed run in this folder of the config's optimizer type, predict at the "
                      "largest worker count with the run's sparsity (with and without bucketed overlap) and print "
                      "the run's val loss and bytes against its dense run beside it");
  predict->add_flag("--config-overlap-only", a->calibrate.config_overlap_only,
                    "with --from-runs: only the rows with the config's own overlap, not the rows with bucketed "
                    "overlap switched the other way (a measured cluster's config holds the regime it was measured in)");
  predict->add_option("--calibrate", a->calibrate.fit,
                      "instead: fit compute, the optimizer step and alpha-beta per collective to these MPI/NCCL run "
                      "files and bench-comm files, write the hardware description (--out) and print predicted "
                      "against measured for each run (docs/PREDICTING.md, Calibration)")
      ->expected(1, -1);
  predict->add_option("--sweep", a->calibrate.sweep_GBps,
                      "also print the regime sweep at the largest worker count: strong scaling at 1 to 16 sequences "
                      "per GPU, overlap on and off, at these link bandwidths in GB/s (e.g. --sweep 12.5 25 50 100 200)")
      ->expected(1, -1)
      ->check(CLI::PositiveNumber);
  // The measured-table options (docs/PREDICTING.md, "Measured tables"), each an existing file.
  const std::tuple<const char*, std::string*, const char*> table_options[] = {
      {"--validate", &a->calibrate.validate,
       "instead: predict every row of this measured table (CSV model,method,gpus,step_ms or model,method,peak_MB; "
       "experiments/measured/) with the artifact's setup of its model and print measured, predicted and error, then "
       "the mean and worst |error| (--csv writes them)"},
      {"--hardware", &a->calibrate.hardware,
       "with --validate: the hardware description to predict with (default: the shipped "
       "experiments/hardware/tacc-vista-measured.json)"},
      {"--calibrate-table", &a->calibrate.calibrate_table,
       "instead: fit achieved FLOP/s, the optimizer kernels' throughput and the link's alpha and beta to this "
       "step-time table, write the hardware description (--out, default calibrated-hardware.json) and print every "
       "row's error and the leave-one-GPU-count-out errors"}};
  for (const auto& [name, target, help] : table_options) {
    predict->add_option(name, *target, help)->check(CLI::ExistingFile);
  }
  predict
      ->add_option("--compute-model", a->calibrate.compute_model,
                   "with --calibrate-table: gemm (default; every GEMM on the GPU's efficiency curve, its maximum "
                   "efficiency fitted) or flops (the training FLOPs at one fitted FLOP/s, the model before issue 58)")
      ->check(CLI::IsMember({"gemm", "flops"}));
  predict
      ->add_option("--gemm-ridge", a->calibrate.gemm_ridge,
                   "with --calibrate-table: the GEMM curve's ridge in FLOP/byte (default the GH200's peak over its "
                   "memory bandwidth, 989 / 4.9; one model's table cannot fit it)")
      ->check(CLI::PositiveNumber);
  predict->add_flag("--links-from-bench", a->calibrate.links_from_bench,
                    "with --calibrate: fit the links to the bench-comm files alone, the runs' collectives only "
                    "compared (compute and the optimizer from runs over one link, the links from another)");
  predict
      ->add_option("--link-rate-scale", a->calibrate.link_rate_scale,
                   "with --calibrate --links-from-bench: predict for a link this many times the bench's rate (60 "
                   "Mbit/s from a 100 Mbit/s bench: 0.6); bandwidths and full-rate bytes scale, latencies do not")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  predict->add_option("--held-out", a->calibrate.held_out,
                      "with --calibrate: runs predicted with the fit but not fitted on (their error is printed)");
  Command c;
  c.sub = predict;
  c.run = [a] { return cmd_predict(a->config_file, a->out, a->csv, a->sets, a->from_runs, a->calibrate); };
  return c;
}

}  // namespace scape::cli
