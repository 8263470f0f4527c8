// The run file's metrics in one table: per metric its column name, how rank 0 combines the W
// workers' values, unit, documentation line and where the value comes from. The step row
// (StepCombiner), the report exchange between processes (ReportPacker), the run file's dataset
// attributes and docs/run-files.md (checked by tests/test_run_metrics.cpp) all follow it.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"
#include "run_file/recorder.hpp"
#include "train/worker_report.hpp"

namespace scape::train {

enum class Combine {
  mean,     // summed in rank order, then divided by W
  sum,      // summed in rank order
  max,      // the largest, starting from 0 (NaN values are passed over)
  worker0,  // worker 0's value (the replicas agree, or it is worker 0's local mask)
  rank0,    // computed by rank 0 from every report (RankZeroValues)
};
// As docs/run-files.md and the run file's "combine" attribute name it ("mean", "worker 0", ...).
const char* to_string(Combine c);

enum class Columns {
  one,                      // one column, named as the metric
  per_collective,           // name + purpose, for each of collective_purposes()
  per_measured_collective,  // the same plus name + "async_all_gather" (the lagged all-gather)
};

// What rank 0 computes itself from all reports, for the Combine::rank0 metrics.
struct RankZeroValues {
  double grad_norm, mask_oracle_overlap, mask_energy_capture;  // from this step's reports
  double compute_time_model, step_time_model;
  double aggregate_time, record_time;                      // rank 0's own cost of the previous row
  double diagnostic_bytes, diagnostics_time;               // rank 0's report (multi-process exchange)
  double step_wall_time;  // NaN in the row; RunLog writes it once the next step starts
};

struct RunMetric {
  const char* name;  // a per-collective family's name ends in '_', the purpose follows
  Columns columns;
  Combine combine;
  const char* unit;  // "s", "bytes", "steps", "count", or "1" for a pure number
  bool sparse_only = false;    // NaN for dense optimizers
  bool measured_only = false;  // a column only with measured communication (MPI and NCCL backends)
  bool bucketed_only = false;  // a column only with optimizer.overlap_grad_reduce
  bool outer_loop_only = false;  // a column only for diloco and sparseloco
  // Where a worker's value is, for every rule but rank0: a field of the report or of its
  // StepMetrics, or else computed from the report (`purpose` is "" for Columns::one).
  double WorkerReport::*report_field = nullptr;
  double StepMetrics::*metrics_field = nullptr;
  double (*computed)(const WorkerReport& r, const std::string& purpose) = nullptr;
  // The mean, sum and max rules' values travel between processes (ReportPacker); a computed
  // one needs this to be written back into a report.
  void (*set_computed)(WorkerReport& r, const std::string& purpose, double value) = nullptr;
  double RankZeroValues::*rank0_field = nullptr;  // the rank0 rule
  const char* doc;  // one line: docs/run-files.md and the dataset's "doc" attribute
};

// /tensors/<name>: [steps x tensors], tensors in layout order.
struct TensorMetric {
  const char* name;
  Combine combine;  // mean (shipped between processes) or worker0
  const char* unit;
  std::vector<double> StepMetrics::*values;  // per tensor; empty when it does not apply (NaN)
  const char* doc;
};

// Whether rank 0 needs every worker's value (mean, sum, max): then exchanges between
// processes ship it.
bool shipped(Combine c);

std::span<const RunMetric> run_metrics();
std::span<const TensorMetric> tensor_metrics();

// The optimizers whose mask the oracle metrics score (docs/algorithms.md, "Metrics"): the sparse
// ones but SCAPE's paper and artifact formulations, for which they are not defined yet. Only
// these need a_i (and SCAPE's m_prev) on rank 0 with log.oracle.
bool has_oracle_metrics(const OptimizerConfig& c);

// The line of docs/run-files.md that documents a metric (a row of a markdown table).
std::string doc_row(const RunMetric& m);
std::string doc_row(const TensorMetric& m);

// One dataset of /metrics, in the run file's column order.
struct MetricColumn {
  std::string name;
  const RunMetric* metric;
  std::string purpose;  // "" for Columns::one
};
std::vector<MetricColumn> metric_columns(const OptimizerConfig& c, bool measured);

// The run file's metric and tensor-metric names and dataset attributes.
void describe_metrics(const std::vector<MetricColumn>& columns, run_file::RunFileSpec& spec);

}  // namespace scape::train
