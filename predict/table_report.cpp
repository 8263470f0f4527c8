// Checks of measured tables against the step model, and their fit (predict/table_report.hpp).
#include "predict/table_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "config/json_section.hpp"
#include "predict/table_model.hpp"

namespace scape::predict {
namespace {

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string percent(double e) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100 * e);
  return buf;
}

}  // namespace

TableCheck check_table(const MeasuredTable& table, const Calibration& c) {
  TableCheck out;
  for (const auto& r : table.rows) {
    RowCheck rc{r, table.memory ? predict_memory(r).total_MB() : predict_table_row(c, r).step_s * 1e3, 0};
    rc.error = rc.predicted / r.value - 1;
    out.mean_abs_error += std::abs(rc.error);
    out.worst_abs_error = std::max(out.worst_abs_error, std::abs(rc.error));
    out.rows.push_back(rc);
  }
  out.mean_abs_error /= static_cast<double>(out.rows.size());
  return out;
}

void print_table_check(std::ostream& out, const MeasuredTable& table, const TableCheck& check,
                       const std::filesystem::path& csv) {
  const char* unit = table.memory ? "MB" : "ms";
  out << "| model | method | GPUs | measured " << unit << " | predicted " << unit << " | error |\n"
      << "|---|---|---|---|---|---|\n";
  for (const auto& r : check.rows) {
    out << "| " << r.row.model << " | " << r.row.method << " | " << (table.memory ? "" : std::to_string(r.row.gpus))
        << " | " << fixed(r.row.value, 1) << " | " << fixed(r.predicted, 1) << " | " << percent(r.error) << " |\n";
  }
  out << "\nmean |error| " << fixed(100 * check.mean_abs_error, 1) << "%, worst "
      << fixed(100 * check.worst_abs_error, 1) << "% over " << check.rows.size() << " rows of "
      << table.file.filename().string() << "\n";
  if (csv.empty()) return;
  std::ofstream f(csv);
  if (!f) throw config::ConfigError("--csv: cannot write " + csv.string());
  f << "model,method,gpus,measured_" << unit << ",predicted_" << unit << ",error\n";
  for (const auto& r : check.rows) {
    f << r.row.model << ',' << r.row.method << ',' << (table.memory ? "" : std::to_string(r.row.gpus)) << ','
      << fixed(r.row.value, 3) << ',' << fixed(r.predicted, 3) << ',' << fixed(r.error, 6) << '\n';
  }
}

void calibrate_table(const MeasuredTable& table, const std::filesystem::path& hardware_out, std::ostream& out,
                     TableCompute compute, const presets::GemmCurve& shape) {
  const Calibration c = fit_step_table(table, {}, compute, shape);
  if (c.gemm.fitted() && c.gemm.max_efficiency > 1) {
    // More than the peak: the ridge asks too much of small GEMMs for these times.
    throw config::ConfigError(table.file.string() + ": the GEMM curve's fitted max_efficiency is " +
                              fixed(c.gemm.max_efficiency, 3) + " > 1 at ridge " + fixed(shape.ridge_flop_per_byte, 1) +
                              " FLOP/byte (--gemm-ridge)");
  }
  out << "fit to " << table.rows.size() << " rows of " << table.file.filename().string() << ": achieved compute "
      << fixed(c.achieved_flops / 1e12, 1) << " TFLOP/s, optimizer kernels " << fixed(c.optimizer_Bps / 1e9, 1)
      << " GB/s over the bytes they touch, link alpha " << fixed(c.combined.alpha_s * 1e6, 1) << " us, beta "
      << fixed(c.combined.bandwidth_Bps / 1e9, 3) << " GB/s\n";
  if (c.gemm.fitted()) {
    out << "GEMM curve: max efficiency " << fixed(c.gemm.max_efficiency, 4) << " of " << fixed(c.gemm.peak_TFLOPs, 0)
        << " TFLOP/s, ridge " << fixed(c.gemm.ridge_flop_per_byte, 1)
        << " FLOP/byte (given, not fitted), elementwise at " << fixed(c.gemm.memory_TBps, 2) << " TB/s\n";
  }
  out << "\n";
  print_table_check(out, table, check_table(table, c), {});
  std::set<int> counts;
  for (const auto& r : table.rows) counts.insert(r.gpus);
  out << "\nleave one GPU count out (fit without it, predict its rows):\n\n| held out | mean |error| | worst |\n"
         "|---|---|---|\n";
  for (const int held : counts) {
    const Calibration without = fit_step_table(table, {held}, compute, shape);
    double mean = 0, worst = 0;
    int n = 0;
    for (const auto& r : table.rows) {
      if (r.gpus != held) continue;
      const double e = std::abs(predict_table_row(without, r).step_s * 1e3 / r.value - 1);
      mean += e, worst = std::max(worst, e), ++n;
    }
    out << "| " << held << " GPUs | " << fixed(100 * mean / n, 1) << "% | " << fixed(100 * worst, 1) << "% |\n";
  }
  nlohmann::json hw = hardware_json(c);
  hw["description"] = "fitted by scape predict --calibrate-table to " + table.file.filename().string() +
                      ": peak_TFLOPs is the achieved compute (mfu 1), the throughputs the optimizer kernels' "
                      "fitted one, the inter link the fitted alpha-beta of blocking collectives";
  if (c.gemm.fitted()) {
    hw["gemm_curve"] = gemm_curve_json(c.gemm);
    hw["description"] = hw["description"].get<std::string>() +
                        "; gemm_curve the per-GEMM compute model (max_efficiency fitted, the rest the GH200 "
                        "datasheet's), which the table rows use instead of peak_TFLOPs";
  }
  std::ofstream f(hardware_out);
  if (!f) throw config::ConfigError("--out: cannot write " + hardware_out.string());
  f << hw.dump(2) << "\n";
}

}  // namespace scape::predict
