// `scape predict --validate` and `--calibrate-table` (docs/PREDICTING.md, "Measured tables"):
// every row of a measured table predicted and compared, and the fit with its leave-one-out
// check over the GPU counts.
#pragma once

#include <filesystem>
#include <ostream>
#include <vector>

#include "predict/calibration.hpp"
#include "predict/measured_table.hpp"
#include "predict/table_model.hpp"

namespace scape::predict {

struct RowCheck {
  MeasuredRow row;
  double predicted = 0;  // ms, or MB for a memory row
  double error = 0;      // predicted / measured - 1
};

struct TableCheck {
  std::vector<RowCheck> rows;
  double mean_abs_error = 0;
  double worst_abs_error = 0;
};

TableCheck check_table(const MeasuredTable& table, const Calibration& c);

// Prints every row (measured, predicted, error) and the mean and worst absolute error; writes
// them as CSV to `csv` unless it is empty (columns model,method,gpus,measured_ms,predicted_ms,
// error; gpus empty and the values in MB for memory rows).
void print_table_check(std::ostream& out, const MeasuredTable& table, const TableCheck& check,
                       const std::filesystem::path& csv);

// Fits the step-time table with `compute` (the GEMM curve's shape: gh200_curve_shape), writes
// the hardware description to `hardware_out` and prints the fit, every row's error, and the
// held-out errors of the fit repeated without each GPU count.
void calibrate_table(const MeasuredTable& table, const std::filesystem::path& hardware_out, std::ostream& out,
                     TableCompute compute = TableCompute::gemm, const presets::GemmCurve& shape = gh200_curve_shape());

}  // namespace scape::predict
