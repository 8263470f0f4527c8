// The run file's metrics in one table: per metric its column name, how rank 0 combines the W
// workers' values, unit, documentation line and where the value comes from. The step row
// (StepCombiner), the report exchange between processes (ReportPacker), the run file's dataset
// attributes and docs/run-files.md (checked by tests/test_run_metrics.cpp) all follow it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/layout.hpp"
#include "core/metrics.hpp"
#include "core/optimizer.hpp"
#include "experiments/recorder.hpp"
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

// SCAPE and top-k: the optimizers with a mask, a residual and staleness (dense ones have NaN).
bool has_sparse_metrics(const OptimizerConfig& c);
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
void describe_metrics(const std::vector<MetricColumn>& columns, experiments::RunFileSpec& spec);

// Rank 0's combining of the workers' reports into one row of the run file.
class StepCombiner {
 public:
  // `log_oracle`: compute mask_oracle_overlap and mask_energy_capture (log.oracle).
  StepCombiner(const OptimizerConfig& optimizer, bool log_oracle, const ParamLayout& layout,
               std::vector<MetricColumn> columns);
  // `mask` is worker 0's mask of the step (for the oracle metrics). Under mask_lag 1 the oracle
  // of step t's mask comes from step t-1's reports: rows are combined in step order, and the
  // first row after a resume has no oracle (NaN).
  void combine(std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask);
  // Rank 0's own cost of the previous row, reported in the next one.
  void set_costs(double aggregate_s, double record_s);
  // The compute seconds the modelled step time takes instead of the measured compute_time
  // (compute.type = "flops"); NaN keeps the measured one.
  void set_modelled_compute(double seconds) { modelled_compute_s_ = seconds; }

  std::span<const double> row() const { return row_; }
  std::span<const double> tensor_row() const { return tensor_row_; }
  // The value of the column named `name` in the last row; throws std::logic_error when the run
  // has no such column.
  double value(std::string_view name) const;

 private:
  RankZeroValues rank0_values(std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask);
  void oracle_values(std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask,
                     RankZeroValues& z);
  // The oracle sets of the mask used at `use_step`, chosen from these reports.
  void build_oracle(std::span<const WorkerReport* const> reports, int use_step, metrics::MaskOracle& out);
  void combine_tensors(std::span<const WorkerReport* const> reports);

  const OptimizerConfig optimizer_;
  bool sparse_;
  bool oracle_;
  const ParamLayout& layout_;
  std::vector<MetricColumn> columns_;
  std::vector<double> row_, tensor_row_;
  std::vector<float> mean_grad_, m_prev_;
  metrics::MaskOracle oracle_now_, oracle_next_;  // this step's mask; the next one's (mask_lag 1)
  int oracle_next_step_ = 0;                     // the step oracle_next_ is for (0: none)
  double aggregate_s_ = 0, record_s_ = 0;
  double modelled_compute_s_ = std::numeric_limits<double>::quiet_NaN();
};

// The values rank 0 combines over workers as one vector of doubles: what an exchange between
// processes ships instead of a whole report (worker 0's own report stays in place).
class ReportPacker {
 public:
  ReportPacker(const OptimizerConfig& optimizer, std::size_t tensors);
  std::vector<double> pack(const WorkerReport& r) const;
  // Into a fresh report; the per-tensor values only where worker 0's report has them.
  void unpack(std::span<const double> values, const WorkerReport& worker0, WorkerReport& out) const;

 private:
  std::vector<MetricColumn> shipped_;
  std::size_t tensors_;
};

// What an exchange between processes gathered onto rank 0, as the reports StepCombiner reads:
// `scalars` holds every worker's packed values (ReportPacker, `width` each, rank order); `grads`
// and `accumulated` W whole vectors of `n` values each, or nothing where they were not gathered;
// `moment` every owner's m_prev over its shard back to back, or nothing. Worker 0's own report
// stays in place; the others are rebuilt into `others`.
struct GatheredReports {
  std::span<const double> scalars;
  std::size_t width = 0;
  std::size_t n = 0;
  std::span<const float> grads, accumulated, moment;
};
std::vector<const WorkerReport*> rebuild_reports(const WorkerReport& own, const ReportPacker& packer,
                                                 const GatheredReports& gathered, const Sharding& shards,
                                                 std::vector<WorkerReport>& others);

}  // namespace scape::train
