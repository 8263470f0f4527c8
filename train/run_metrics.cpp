// Rank 0's combining of the workers' reports by the metric table's rules (the mask oracles
// included), and the packing of reports between processes.
#include "train/run_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/ledger.hpp"
#include "core/metrics.hpp"
#include "core/schedule.hpp"

namespace scape::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using Report = const WorkerReport&;
using Purpose = const std::string&;

double worker_value(const RunMetric& m, Report r, Purpose purpose) {
  if (m.report_field != nullptr) return r.*m.report_field;
  if (m.metrics_field != nullptr) return r.metrics.*m.metrics_field;
  return m.computed(r, purpose);
}

void set_worker_value(const RunMetric& m, WorkerReport& r, Purpose purpose, double value) {
  if (m.report_field != nullptr) {
    r.*m.report_field = value;
  } else if (m.metrics_field != nullptr) {
    r.metrics.*m.metrics_field = value;
  } else {
    m.set_computed(r, purpose, value);
  }
}

// The values of one column combined over the workers (every rule but rank0).
double combine_workers(const RunMetric& m, const std::string& purpose, std::span<const WorkerReport* const> reports) {
  if (m.combine == Combine::worker0) return worker_value(m, *reports[0], purpose);
  if (m.combine == Combine::max) {
    // The slowest of the workers that have the value; NaN when none has (a collective that did
    // not run this step, a GPU time on the CPU), never a 0 that was not measured.
    double x = kNaN;
    for (const WorkerReport* r : reports) {
      const double v = worker_value(m, *r, purpose);
      if (!std::isnan(v)) x = std::isnan(x) ? v : std::max(x, v);
    }
    return x;
  }
  double x = 0;
  for (const WorkerReport* r : reports) x += worker_value(m, *r, purpose);
  return m.combine == Combine::mean ? x / static_cast<double>(reports.size()) : x;
}

const RunMetric& metric_named(std::string_view name) {
  for (const RunMetric& m : run_metrics()) {
    if (name == m.name) return m;
  }
  throw std::logic_error("no metric '" + std::string(name) + "' in the table");
}

// Element-wise mean over workers in rank order (float, as the optimizer's buffers).
template <typename Get>
void mean_of(std::span<const WorkerReport* const> reports, Get get, std::vector<float>& out) {
  const auto first = get(*reports[0]);
  out.assign(first.begin(), first.end());
  for (std::size_t r = 1; r < reports.size(); ++r) {
    const auto x = get(*reports[r]);
    for (std::size_t j = 0; j < out.size(); ++j) out[j] += x[j];
  }
  const float w = static_cast<float>(reports.size());
  for (float& x : out) x /= w;
}

}  // namespace

StepCombiner::StepCombiner(const OptimizerConfig& optimizer, bool log_oracle, const ParamLayout& layout,
                           std::vector<MetricColumn> columns)
    : optimizer_(optimizer),
      sparse_(has_sparse_metrics(optimizer)),
      oracle_(log_oracle && sparse_),
      layout_(layout),
      columns_(std::move(columns)) {}

void StepCombiner::set_costs(double aggregate_s, double record_s) {
  aggregate_s_ = aggregate_s;
  record_s_ = record_s;
}

void StepCombiner::combine(std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask) {
  const RankZeroValues z = rank0_values(reports, mask);
  row_.assign(columns_.size(), 0.0);
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    const RunMetric& m = *columns_[i].metric;
    if (m.sparse_only && !sparse_) {
      row_[i] = kNaN;
    } else {
      row_[i] = m.combine == Combine::rank0 ? z.*m.rank0_field : combine_workers(m, columns_[i].purpose, reports);
    }
  }
  combine_tensors(reports);
}

RankZeroValues StepCombiner::rank0_values(std::span<const WorkerReport* const> reports,
                                          std::span<const std::uint64_t> mask) {
  RankZeroValues z{};
  const StepMetrics& m0 = reports[0]->metrics;
  static const RunMetric& compute_time = metric_named("compute_time");
  const double measured = combine_workers(compute_time, "", reports);
  const double compute = std::isnan(modelled_compute_s_) ? measured : modelled_compute_s_;
  z.compute_time_model = compute;
  z.step_time_model = modelled_step_time(m0.comm, compute);
  // The gradient of the global batch: the mean over workers in rank order.
  z.grad_norm = kNaN;  // a step that does not take the gradient metrics sends no gradients
  if (!reports[0]->grads.empty()) {
    mean_of(reports, [](const WorkerReport& r) { return r.grads; }, mean_grad_);
    z.grad_norm = metrics::l2_norm(mean_grad_);
  }
  oracle_values(reports, mask, z);
  z.aggregate_time = aggregate_s_;
  z.record_time = record_s_;
  z.diagnostic_bytes = reports[0]->diagnostic_bytes;
  z.diagnostics_time = reports[0]->diagnostic_s;
  z.step_wall_time = kNaN;
  return z;
}

void StepCombiner::oracle_values(std::span<const WorkerReport* const> reports, std::span<const std::uint64_t> mask,
                                 RankZeroValues& z) {
  // docs/algorithms.md, "Metrics": both oracles are taken when the mask is chosen. Under lag 1
  // SCAPE chooses M_t at the end of step t-1 (M_1 at step 1 itself); top-k EF and lag 0 choose
  // it from step t's own reports.
  // Without this step's a_i (log.gradient_metrics_interval) no oracle is built now; under lag 1
  // the one built at step t-1 still scores this step's mask.
  z.mask_oracle_overlap = z.mask_energy_capture = kNaN;
  if (!oracle_) return;
  // The oracles rank the earlier formulation's statistic per shard; under paper and artifact
  // (momentum-unit residuals, per-tensor k) they are not defined yet, and stay NaN.
  if (optimizer_.type == OptimizerType::scape && optimizer_.scape.formulation != Formulation::frozen_momentum) return;
  const bool have = !reports[0]->accumulated.empty();
  const int t = reports[0]->metrics.step;
  const bool lagged = optimizer_.type == OptimizerType::scape && optimizer_.scape.mask_lag == 1;
  const metrics::MaskOracle* chosen = nullptr;
  if ((!lagged || t == 1) && have) {
    build_oracle(reports, t, oracle_now_);
    chosen = &oracle_now_;
  } else if (lagged && oracle_next_step_ == t) {
    chosen = &oracle_next_;
  }
  if (chosen != nullptr) {
    z.mask_oracle_overlap = metrics::oracle_overlap(*chosen, mask);
    z.mask_energy_capture = metrics::energy_capture(*chosen, mask);
  }
  if (lagged && have) {
    build_oracle(reports, t + 1, oracle_next_);
    oracle_next_step_ = t + 1;
  }
}

void StepCombiner::build_oracle(std::span<const WorkerReport* const> reports, int use_step,
                                metrics::MaskOracle& out) {
  const std::size_t n = layout_.size();
  const int workers = static_cast<int>(reports.size());
  const double rho = density_at(optimizer_.density_schedule(), use_step);
  std::vector<metrics::RankRange> ranges;
  const bool partitioned =
      optimizer_.type == OptimizerType::scape && optimizer_.scape.mask_partition == MaskPartition::partitioned;
  if (partitioned) {
    const Sharding shards(n, workers);
    for (int w = 0; w < workers; ++w) ranges.push_back({shards.begin(w), shards.end(w), k_for(rho, shards.size(w))});
  } else {
    ranges.push_back({0, n, k_for(rho, n)});
  }
  metrics::OracleStatistic statistic = metrics::OracleStatistic::mean_gradient;  // top-k EF ranks |a_i|
  if (optimizer_.type == OptimizerType::scape) {
    switch (optimizer_.scape.mask_statistic) {
      case MaskStatistic::first_moment: statistic = metrics::OracleStatistic::first_moment; break;
      case MaskStatistic::gradient: statistic = metrics::OracleStatistic::mean_gradient; break;
      case MaskStatistic::momentum_only: statistic = metrics::OracleStatistic::momentum; break;
      case MaskStatistic::random: statistic = metrics::OracleStatistic::none; break;
    }
  }
  if (statistic == metrics::OracleStatistic::first_moment || statistic == metrics::OracleStatistic::momentum) {
    // m_prev: each owner's shard, in rank order (replicas agree where the state is replicated).
    const Sharding shards(n, workers);
    m_prev_.assign(n, 0.0f);
    for (int w = 0; w < workers; ++w) {
      const auto m = reports[static_cast<std::size_t>(w)]->first_moment;
      if (m.size() != shards.size(w)) {
        statistic = metrics::OracleStatistic::none;  // a report without it (none is sent): no O
        break;
      }
      std::copy(m.begin(), m.end(), m_prev_.begin() + static_cast<std::ptrdiff_t>(shards.begin(w)));
    }
  }
  mean_of(reports, [](const WorkerReport& r) { return r.accumulated; }, out.mean_acc);
  metrics::build_mask_oracle(statistic, m_prev_, optimizer_.beta1, ranges, out);
}

void StepCombiner::combine_tensors(std::span<const WorkerReport* const> reports) {
  const std::size_t nt = layout_.slots().size();
  tensor_row_.assign(tensor_metrics().size() * nt, kNaN);
  for (std::size_t k = 0; k < tensor_metrics().size(); ++k) {
    const TensorMetric& m = tensor_metrics()[k];
    const std::vector<double>& first = reports[0]->metrics.*m.values;
    if (first.empty()) continue;
    for (std::size_t s = 0; s < nt; ++s) {
      double x = first[s];
      if (m.combine == Combine::mean) {
        x = 0;
        for (const WorkerReport* r : reports) x += (r->metrics.*m.values)[s];
        x /= static_cast<double>(reports.size());
      }
      tensor_row_[k * nt + s] = x;
    }
  }
}

double StepCombiner::value(std::string_view name) const {
  for (std::size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].name == name) return row_[i];
  }
  throw std::logic_error("the run has no metric column '" + std::string(name) + "'");
}

ReportPacker::ReportPacker(const OptimizerConfig& optimizer, std::size_t tensors) : tensors_(tensors) {
  for (MetricColumn& c : metric_columns(optimizer, true)) {
    if (shipped(c.metric->combine)) shipped_.push_back(std::move(c));
  }
}

std::vector<double> ReportPacker::pack(const WorkerReport& r) const {
  std::vector<double> v;
  for (const MetricColumn& c : shipped_) v.push_back(worker_value(*c.metric, r, c.purpose));
  for (const TensorMetric& m : tensor_metrics()) {
    if (!shipped(m.combine)) continue;
    const std::vector<double>& values = r.metrics.*m.values;
    for (std::size_t s = 0; s < tensors_; ++s) v.push_back(s < values.size() ? values[s] : kNaN);
  }
  return v;
}

void ReportPacker::unpack(std::span<const double> values, const WorkerReport& worker0, WorkerReport& out) const {
  std::size_t i = 0;
  for (const MetricColumn& c : shipped_) set_worker_value(*c.metric, out, c.purpose, values[i++]);
  for (const TensorMetric& m : tensor_metrics()) {
    if (!shipped(m.combine)) continue;
    const auto mine = values.subspan(i, tensors_);
    if (!(worker0.metrics.*m.values).empty()) (out.metrics.*m.values).assign(mine.begin(), mine.end());
    i += tensors_;
  }
}

std::vector<const WorkerReport*> rebuild_reports(const WorkerReport& own, const ReportPacker& packer,
                                                 const GatheredReports& g, const Sharding& shards,
                                                 std::vector<WorkerReport>& others) {
  const auto w = static_cast<std::size_t>(shards.workers());
  others.assign(w, WorkerReport{});
  std::vector<const WorkerReport*> all(w);
  all[0] = &own;
  for (std::size_t q = 1; q < w; ++q) {
    packer.unpack(g.scalars.subspan(q * g.width, g.width), own, others[q]);
    if (!g.grads.empty()) others[q].grads = g.grads.subspan(q * g.n, g.n);
    if (!g.accumulated.empty()) others[q].accumulated = g.accumulated.subspan(q * g.n, g.n);
    if (!g.moment.empty()) {
      others[q].first_moment = g.moment.subspan(shards.begin(static_cast<int>(q)), shards.size(static_cast<int>(q)));
    }
    all[q] = &others[q];
  }
  return all;
}

}  // namespace scape::train
