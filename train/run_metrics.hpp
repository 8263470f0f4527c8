// Rank 0's side of the metric table (train/metric_table.hpp, included here for every user of
// either): combining the workers' reports into the step's row, and packing reports for the
// exchange between processes, both by the table's rules.
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
#include "train/metric_table.hpp"
#include "train/worker_report.hpp"

namespace scape::train {

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
