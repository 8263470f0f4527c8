// Measurements that calibration reads (docs/PREDICTING.md, "Calibration"): the steady-state
// medians of an MPI or NCCL run file, and the rows of a `scape bench-comm` file; and
// `scape predict --calibrate`, which fits them, writes the hardware description and prints
// predicted against measured for every run.
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "core/layout.hpp"
#include "core/optimizer.hpp"
#include "optimizers/optimizer_config.hpp"
#include "predict/calibration.hpp"

namespace scape::predict {

struct MeasuredCollective {
  std::string purpose;
  CollectiveKind kind = CollectiveKind::all_reduce;
  bool overlapped = false;  // the lagged all-gather, measured on the communication thread
  double latency_steps = 0;  // of every call of the purpose in one step (the ledger)
  double bytes_sent = 0;     // per worker, every call
  double measured_s = 0;     // median over the steady-state steps
  LinkClass link = LinkClass::inter;  // intra: a hierarchical run's node collective
  int ranks = 1;  // the ranks it runs among: W, or G (a node) or W / G (a rail) under hierarchy node
};

// Medians over the steady-state steps of one run (past the density warm-up and the first
// lagged mask; without the last step, which starts no mask gather).
struct RunMeasurement {
  std::filesystem::path file;
  OptimizerConfig optimizer;
  int workers = 1;
  // optimizer.hierarchy = "node" with topology.ranks_per_node = G > 1: the node collectives run
  // among G ranks on the intra-node link, the method on each rail among W / G nodes.
  int ranks_per_node = 1;
  bool hierarchical() const { return optimizer.hierarchy == Hierarchy::node && ranks_per_node > 1; }
  std::uint64_t n_params = 0;
  ParamLayout layout;  // the run's model tensors (SCAPE's per-tensor k and owners)
  double flops_per_token = 0;
  double tokens_per_gpu = 0;
  double fill_in = 1;  // local_union: |M| / K as the run measured it
  // compute.type "sleep": the seconds a step's forward and backward stand for. Such a run's
  // compute is given, not fitted, and its model need not be a gpt (0: a measured compute).
  double slept_compute_s = 0;
  bool compute_slept() const { return slept_compute_s > 0; }
  int steps_used = 0;
  double compute_s = 0;    // compute_wall_time
  double optimizer_s = 0;  // optimizer_wall_time (its collectives and the mask wait included)
  double mask_wait_s = 0;  // mask_wait_exposed
  double blocking_comm_s = 0;  // the measured blocking collectives
  std::vector<MeasuredCollective> collectives;
  // Share of a core the run's compute got: its thread CPU seconds over its wall seconds (1 on
  // dedicated cores). Ranks that share cores with each other or with other jobs wait for a
  // core in every phase; calibration divides that wait out (docs/PREDICTING.md).
  double cpu_share = 1;
  double wall_step_s = 0;  // the step as measured, before any share correction
  double step_s() const { return compute_s + optimizer_s; }
  // The optimizer's own kernels: the median over steps of its wall time less its blocking
  // collectives and the mask wait of the same step (a difference of per-column medians can be
  // negative on a noisy host, where one step's slow collective is not the median step's).
  double optimizer_kernels_s = 0;
  // Bytes the harness's own per-step metrics move inside the measured optimizer phase on rank 0
  // (docs/PREDICTING.md, "Calibration"): no cluster optimizer pays them, the measured phase does.
  double harness_metric_bytes = 0;
};

// Bytes the harness's own per-step metrics move inside a measured run's optimizer phase on rank
// 0 (whose time the run records), which no cluster optimizer pays: ||g_i|| reads the gradient
// (4N); rank 0's update statistics copy theta before the step (8N) and then read theta, the copy
// and the previous signs and write the signs (10N); sparse optimizers' residual metrics read
// the residual (4N; under optimizer.hierarchy = "node" the rail's part, `residual_params`).
double harness_metric_bytes(const OptimizerConfig& optimizer, std::uint64_t n_params,
                            std::uint64_t residual_params = 0);

// Below this CPU share a run counts as oversubscribed and its times are scaled by the share.
inline constexpr double kOversubscribedShare = 0.9;

// Throws config::ConfigError naming the file and what is missing (a dataset, a gpt
// model or a slept compute, enough steps) when the file cannot be calibrated from.
RunMeasurement read_run_measurement(const std::filesystem::path& file);
// The rows of a bench-comm file. Throws ConfigError naming the file and the missing dataset.
std::vector<CollectiveSample> read_bench_comm(const std::filesystem::path& file);
bool is_bench_comm_file(const std::filesystem::path& file);

// Fits `fit_files` (run files and bench-comm files), writes the hardware description to
// `out`, and prints the fit and, for every run of `fit_files` and `held_out`, predicted against
// measured step and collective times with their relative errors; with `csv` not empty also
// writes one row a run there (file, role, workers, optimizer, CPU share, wall, measured and
// predicted step ms, relative error). With `links_from_bench` the links are fitted to the bench-comm files alone and
// the runs' own collectives are only compared: compute and the optimizer step can then come from
// runs over one link and the links from another (at least one bench-comm file is required);
// bench-comm rows timed after an idle gap fit the link's idle and busy regimes, and need it.
// `link_rate_scale` other than 1 predicts for a link that many times the bench's rate
// (with_link_rate_scale): a calibration on one shaped rate predicting another.
void calibrate_from_files(const std::vector<std::filesystem::path>& fit_files,
                          const std::vector<std::filesystem::path>& held_out, const std::filesystem::path& out,
                          std::ostream& table, const std::filesystem::path& csv = {}, bool links_from_bench = false,
                          double link_rate_scale = 1);

}  // namespace scape::predict
