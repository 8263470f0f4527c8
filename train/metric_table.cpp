// The metric table itself and what is read straight off it: the run's columns, their
// documentation lines and the run file's dataset attributes.
#include "train/metric_table.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "core/ledger.hpp"
#include "optimizers/make_optimizer.hpp"

namespace scape::train {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using Report = const WorkerReport&;
using Purpose = const std::string&;

double bytes_of_purpose(Report r, Purpose purpose) {
  double sum = 0;
  for (const auto& record : r.metrics.comm) {
    if (record.purpose == purpose) sum += record.bytes_sent_per_worker;
  }
  return sum;  // a purpose with no call this step sent 0 bytes
}

double measured_seconds(Report r, Purpose purpose) {
  const auto it = r.measured.find(purpose);
  return it == r.measured.end() ? kNaN : it->second;
}

void set_measured_seconds(WorkerReport& r, Purpose purpose, double seconds) {
  if (!std::isnan(seconds)) r.measured[purpose] = seconds;
}

// The order of this table is the run file's column order.
const RunMetric kRunMetrics[] = {
    {.name = "train_loss",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "1",
     .report_field = &WorkerReport::loss,
     .doc = "micro-batch loss; the mean over workers is the global-batch loss"},
    {.name = "lr",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "1",
     .metrics_field = &StepMetrics::lr,
     .doc = "learning rate of the step"},
    {.name = "grad_norm",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "1",
     .rank0_field = &RankZeroValues::grad_norm,
     .doc = "`‖mean_i g_i‖₂`, the norm of the global-batch gradient; NaN at steps `log.gradient_metrics_interval` "
            "skips"},
    {.name = "bytes_sent",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "bytes",
     .computed = [](Report r, Purpose) { return summarize(r.metrics.comm).bytes_sent_per_worker; },
     .doc = "bytes sent per worker by the optimizer's collectives of the step (what the diagnostics send to rank 0 "
            "is `bytes_sent_diagnostics`)"},
    {.name = "bytes_sent_intra",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "bytes",
     .computed = [](Report r, Purpose) { return bytes_sent_on(r.metrics.comm, LinkClass::intra); },
     .doc = "the part of `bytes_sent` sent by collectives whose ranks share one node (`optimizer.hierarchy` "
            "\"node\": the node's reduce-scatter and all-gather)"},
    {.name = "bytes_sent_inter",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "bytes",
     .computed = [](Report r, Purpose) { return bytes_sent_on(r.metrics.comm, LinkClass::inter); },
     .doc = "the part of `bytes_sent` sent by collectives whose ranks span nodes (every collective of a flat run, "
            "the rails' collectives under `optimizer.hierarchy` \"node\")"},
    {.name = "comm_time_model",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "s",
     .computed = [](Report r, Purpose) { return summarize(r.metrics.comm).modelled_time_s; },
     .doc = "alpha-beta time of the step's collectives"},
    {.name = "comm_time_exposed",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "s",
     .computed = [](Report r, Purpose) { return summarize(r.metrics.comm).exposed_time_s; },
     .doc = "alpha-beta time of the collectives that do not overlap compute (the buckets of "
            "`optimizer.overlap_grad_reduce` excluded: their exposed part is in `step_time_model`)"},
    {.name = "compute_time",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "s",
     .report_field = &WorkerReport::compute_s,
     .doc = "thread CPU seconds of forward/backward"},
    {.name = "compute_time_model",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "s",
     .rank0_field = &RankZeroValues::compute_time_model,
     .doc = "the compute the modelled step time takes: `compute_time` (`compute.type` measured), `compute.seconds` "
            "(sleep) or the "
            "training FLOPs of one worker's micro-batch at `compute.mfu` of `compute.device`'s peak (flops)"},
    {.name = "step_time_model",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "s",
     .rank0_field = &RankZeroValues::step_time_model,
     .doc = "`compute + exposed + max(0, overlapped − compute)`, compute = `compute_time_model`: the lagged "
            "mask all-gather hides behind the next forward/backward up to its length; with "
            "`optimizer.overlap_grad_reduce` the gradient buckets run behind the backward pass (2/3 of compute), "
            "only what ends after it is added, and the all-gather hides in what compute they leave "
            "(docs/algorithms.md, \"Communication volume and time\")"},
    {.name = "target_density",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "1",
     .sparse_only = true,
     .metrics_field = &StepMetrics::target_density,
     .doc = "density `ρ_t` the schedule asks for"},
    {.name = "mask_density",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "1",
     .sparse_only = true,
     .metrics_field = &StepMetrics::mask_density,
     .doc = "mask size over N (worker 0's local mask for `topk_ef`)"},
    {.name = "mask_jaccard",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "1",
     .sparse_only = true,
     .metrics_field = &StepMetrics::mask_jaccard,
     .doc = "Jaccard index of the mask and the previous step's (NaN at the first step)"},
    {.name = "mask_oracle_overlap",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "1",
     .sparse_only = true,
     .rank0_field = &RankZeroValues::mask_oracle_overlap,
     .doc = "`size(M ∩ O) / K` when the mask was chosen, `O` the top-`k_w` per shard of the mask's own "
            "statistic on the worker average (`abs(β1 m_prev + (1−β1) mean_i a_i)` for SCAPE's default; "
            "docs/algorithms.md, \"Metrics\"), with `log.oracle` and at the steps `log.gradient_metrics_interval` "
            "takes; NaN for random masks and for SCAPE's `paper` and `artifact` formulations (not defined for "
            "them yet)"},
    {.name = "mask_energy_capture",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "1",
     .sparse_only = true,
     .rank0_field = &RankZeroValues::mask_energy_capture,
     .doc = "`Σ_M ā² / Σ_O' ā²`, `ā = mean_i a_i` when the mask was chosen and `O'` the top-`k_w` of "
            "`abs(ā)` per shard, with `log.oracle`; NaN for SCAPE's `paper` and `artifact` formulations"},
    {.name = "fill_in",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "1",
     .sparse_only = true,
     .metrics_field = &StepMetrics::fill_in,
     .doc = "mask size over K (for `topk_ef` the union over workers)"},
    {.name = "residual_norm",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "1",
     .sparse_only = true,
     .metrics_field = &StepMetrics::residual_norm,
     .doc = "`‖e_i‖₂` of the error-feedback residual after the step"},
    {.name = "residual_max",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "1",
     .sparse_only = true,
     .metrics_field = &StepMetrics::residual_max,
     .doc = "largest magnitude in the residual"},
    {.name = "residual_to_param",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "1",
     .sparse_only = true,
     .metrics_field = &StepMetrics::residual_to_param,
     .doc = "`‖e_i‖₂ / ‖θ‖₂`"},
    {.name = "residual_clipped_norm",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "1",
     .sparse_only = true,
     .metrics_field = &StepMetrics::residual_clipped_norm,
     .doc = "`‖·‖₂` of the part of `e_i` that `residual_clip` removed before the step (0 when off)"},
    {.name = "staleness_mean",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "steps",
     .sparse_only = true,
     .metrics_field = &StepMetrics::staleness_mean,
     .doc = "steps since a coordinate was last delivered, mean over coordinates"},
    {.name = "staleness_p99",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "steps",
     .sparse_only = true,
     .metrics_field = &StepMetrics::staleness_p99,
     .doc = "99th percentile (nearest rank) of the staleness over coordinates"},
    {.name = "staleness_max",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "steps",
     .sparse_only = true,
     .metrics_field = &StepMetrics::staleness_max,
     .doc = "largest staleness over coordinates"},
    {.name = "update_norm",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "1",
     .metrics_field = &StepMetrics::update_norm,
     .doc = "`‖Δθ‖₂` of the parameter update (replicas are identical)"},
    {.name = "update_max",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "1",
     .metrics_field = &StepMetrics::update_max,
     .doc = "largest magnitude in the parameter update"},
    {.name = "update_sign_flip",
     .columns = Columns::one,
     .combine = Combine::worker0,
     .unit = "1",
     .metrics_field = &StepMetrics::update_sign_flip,
     .doc = "share of the coordinates the optimizer stepped in this and the previous step (the mask of a "
            "masked update, else all; weight decay alone is no step) whose update changed sign"},
    {.name = "nonfinite_grads",
     .columns = Columns::one,
     .combine = Combine::sum,
     .unit = "count",
     .computed = [](Report r, Purpose) { return static_cast<double>(r.metrics.nonfinite_grads); },
     .set_computed = [](WorkerReport& r, Purpose,
                        double v) { r.metrics.nonfinite_grads = static_cast<std::size_t>(v); },
     .doc = "non-finite gradient entries"},
    {.name = "mask_codec_time",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "s",
     .sparse_only = true,
     .metrics_field = &StepMetrics::mask_codec_s,
     .doc = "wall seconds coding this worker's mask shard and decoding every shard (`mask_encoding` other than "
            "`bitmap`; 0 otherwise)"},
    {.name = "pseudo_grad_norm",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "1",
     .outer_loop_only = true,
     .metrics_field = &StepMetrics::pseudo_grad_norm,
     .doc = "`‖Δ_i‖₂` of a worker's pseudo-gradient `θ_global − θ_i` over the fragment an outer step syncs (diloco, "
            "sparseloco); NaN at the steps without one"},
    {.name = "param_drift",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "1",
     .outer_loop_only = true,
     .metrics_field = &StepMetrics::param_drift,
     .doc = "`‖θ_i − θ̄‖₂`, a worker's distance from the workers' mean over that fragment before the outer step "
            "(diloco: `mean_j Δ_j − Δ_i` with the mean its all-reduce delivered); NaN at the steps without one and "
            "for sparseloco, which never forms the mean"},
    {.name = "optimizer_time",
     .columns = Columns::one,
     .combine = Combine::mean,
     .unit = "s",
     .report_field = &WorkerReport::optimizer_s,
     .doc = "thread CPU seconds of the optimizer step, emulated collectives included"},
    {.name = "compute_wall_time",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "s",
     .report_field = &WorkerReport::compute_wall_s,
     .doc = "wall seconds of forward/backward, the slowest worker (`scape predict --calibrate` fits compute "
            "from it)"},
    {.name = "compute_device_time",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "s",
     .measured_only = true,
     .report_field = &WorkerReport::compute_device_s,
     .doc = "seconds the model's GPU stream took for forward/backward, between a CUDA event just before its first "
            "kernel and one after its last, the slowest worker; NaN when the model runs on the CPU (there "
            "`compute_wall_time` is that time)"},
    {.name = "optimizer_wall_time",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "s",
     .report_field = &WorkerReport::optimizer_wall_s,
     .doc = "wall seconds of the optimizer step with its blocking collectives and its wait for the lagged "
            "all-gather, the slowest worker"},
    {.name = "optimizer_kernel_wall_time",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "s",
     .measured_only = true,
     .report_field = &WorkerReport::optimizer_kernel_wall_s,
     .doc = "each worker's `optimizer_wall_time` less its own blocking collectives (`comm_time_measured_<purpose>` "
            "but the `async_` ones) and its waits (`mask_wait_exposed`, `grad_wait_exposed`): its optimizer "
            "kernels, the slowest worker's. Taken per worker, since the maxima of the parts can come from "
            "different workers"},
    {.name = "aggregate_time",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "s",
     .rank0_field = &RankZeroValues::aggregate_time,
     .doc = "seconds rank 0 spent combining the previous step's reports (gradient norm and oracle metrics "
            "included)"},
    {.name = "record_time",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "s",
     .rank0_field = &RankZeroValues::record_time,
     .doc = "seconds rank 0 spent writing the previous step's row to the run file (a row's own cost is only "
            "known after it is written)"},
    {.name = "step_wall_time",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "s",
     .measured_only = true,
     .rank0_field = &RankZeroValues::step_wall_time,
     .doc = "wall seconds on rank 0 from the start of this step to the start of the next (for the last step, "
            "to the end of the run's steps): everything the step cost, `diagnostics_time`, evaluation, "
            "checkpoints and the run file included; NaN for a step whose run stopped before the next began"},
    {.name = "bytes_sent_diagnostics",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "bytes",
     .measured_only = true,
     .rank0_field = &RankZeroValues::diagnostic_bytes,
     .doc = "bytes the diagnostics gathered to rank 0 this step, every worker's part counted: 4 W N for "
            "`grad_norm` at the steps `log.gradient_metrics_interval` takes, with `log.oracle` 4 W N more for "
            "the a_i and, for SCAPE, 4 N for the shards of m_prev; 0 at the other steps. Not in `bytes_sent`, "
            "which counts the optimizer's collectives (each other rank sends 1/W of it)"},
    {.name = "diagnostics_time",
     .columns = Columns::one,
     .combine = Combine::rank0,
     .unit = "s",
     .measured_only = true,
     .rank0_field = &RankZeroValues::diagnostics_time,
     .doc = "wall seconds rank 0 spent in the gathers of `bytes_sent_diagnostics`, after every rank's report "
            "arrived; outside `compute_wall_time` and `optimizer_wall_time`, inside `step_wall_time`"},
    {.name = "bytes_sent_",
     .columns = Columns::per_collective,
     .combine = Combine::worker0,
     .unit = "bytes",
     .computed = bytes_of_purpose,
     .doc = "bytes sent per worker by the collectives of one purpose (`grad_reduce_scatter`, "
            "`param_all_gather`, `mask_all_gather`, `grad_all_reduce`, `accum_*`, `index_all_gather`, "
            "`topk_all_gather`)"},
    {.name = "comm_time_measured_",
     .columns = Columns::per_measured_collective,
     .combine = Combine::max,
     .unit = "s",
     .measured_only = true,
     .computed = measured_seconds,
     .set_computed = set_measured_seconds,
     .doc = "wall seconds of the collectives of one purpose; `async_all_gather`: the lagged mask all-gather "
            "on the communication thread (MPI) or stream (NCCL); `async_reduce_scatter` (with "
            "`optimizer.overlap_grad_reduce`): the gradient buckets there, beside the backward pass"},
    {.name = "mask_wait_exposed",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "s",
     .measured_only = true,
     .report_field = &WorkerReport::exposed_wait_s,
     .doc = "wall seconds the compute thread waited for the lagged mask all-gather"},
    {.name = "grad_wait_exposed",
     .columns = Columns::one,
     .combine = Combine::max,
     .unit = "s",
     .measured_only = true,
     .bucketed_only = true,
     .report_field = &WorkerReport::grad_wait_exposed_s,
     .doc = "wall seconds the optimizer waited, after the backward pass, for the gradient buckets of "
            "`optimizer.overlap_grad_reduce`: their exposed communication"},
};

const TensorMetric kTensorMetrics[] = {
    {.name = "residual_norm", .combine = Combine::mean, .unit = "1", .values = &StepMetrics::tensor_residual_norm,
     .doc = "`‖e_i‖₂` of the tensor's part of the residual"},
    {.name = "mask_density", .combine = Combine::worker0, .unit = "1", .values = &StepMetrics::tensor_mask_density,
     .doc = "share of the tensor's coordinates in the mask"},
    {.name = "mask_jaccard", .combine = Combine::worker0, .unit = "1", .values = &StepMetrics::tensor_mask_jaccard,
     .doc = "Jaccard index of the tensor's part of the mask and the previous step's"},
};

std::string display_name(const RunMetric& m) {
  return m.columns == Columns::one ? m.name : std::string(m.name) + "<purpose>";
}

// The doc line with the table's flags spelled out.
std::string meaning(const RunMetric& m) {
  std::string s = m.doc;
  if (m.sparse_only) s += "; NaN for dense optimizers";
  if (m.measured_only) s += "; MPI and NCCL backends only";
  if (m.outer_loop_only) s += "; a column of diloco and sparseloco runs only";
  return s;
}

}  // namespace

const char* to_string(Combine c) {
  constexpr const char* kNames[] = {"mean", "sum", "max", "worker 0", "rank 0"};
  return kNames[static_cast<int>(c)];
}

bool shipped(Combine c) { return c == Combine::mean || c == Combine::sum || c == Combine::max; }

bool has_oracle_metrics(const OptimizerConfig& c) {
  // Under hierarchy node a rank's residual and mask cover its rail's part only.
  return has_sparse_metrics(c) && c.hierarchy == Hierarchy::flat &&
         (c.type != OptimizerType::scape || c.scape.formulation == Formulation::frozen_momentum);
}

std::span<const RunMetric> run_metrics() { return kRunMetrics; }
std::span<const TensorMetric> tensor_metrics() { return kTensorMetrics; }

std::string doc_row(const RunMetric& m) {
  return "| `" + display_name(m) + "` | " + m.unit + " | " + to_string(m.combine) + " | " + meaning(m) + " |";
}

std::string doc_row(const TensorMetric& m) {
  return "| `" + std::string(m.name) + "` | " + m.unit + " | " + to_string(m.combine) + " | " + m.doc + " |";
}

std::vector<MetricColumn> metric_columns(const OptimizerConfig& c, bool measured) {
  std::vector<std::string> collectives = collective_purposes(c);
  std::vector<std::string> measured_collectives = collectives;
  measured_collectives.push_back("async_all_gather");
  if (c.overlap_grad_reduce) measured_collectives.push_back("async_reduce_scatter");
  std::vector<MetricColumn> columns;
  for (const RunMetric& m : kRunMetrics) {
    if (m.measured_only && !measured) continue;
    if (m.bucketed_only && !c.overlap_grad_reduce) continue;
    if (m.outer_loop_only && !has_outer_loop(c.type)) continue;
    if (m.columns == Columns::one) {
      columns.push_back({m.name, &m, ""});
      continue;
    }
    for (const std::string& p : m.columns == Columns::per_collective ? collectives : measured_collectives) {
      columns.push_back({m.name + p, &m, p});
    }
  }
  return columns;
}

void describe_metrics(const std::vector<MetricColumn>& columns, run_file::RunFileSpec& spec) {
  for (const MetricColumn& c : columns) {
    spec.metric_names.push_back(c.name);
    spec.metric_descriptions.push_back({c.metric->unit, to_string(c.metric->combine), meaning(*c.metric)});
  }
  for (const TensorMetric& m : kTensorMetrics) {
    spec.tensor_metric_names.push_back(m.name);
    spec.tensor_metric_descriptions.push_back({m.unit, to_string(m.combine), m.doc});
  }
}

}  // namespace scape::train
