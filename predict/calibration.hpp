// Calibration of the step model from measurements (`scape predict --calibrate`,
// docs/PREDICTING.md, "Calibration"): the free parameters (achieved FLOP/s, the optimizer's
// throughput over the bytes it touches, a latency and a bandwidth per collective kind) fitted
// to measured samples, the hardware description they make, and the prediction of a measured
// step with them.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ledger.hpp"
#include "optimizers/optimizer_config.hpp"
#include "predict/link_load.hpp"
#include "predict/step_model.hpp"

namespace scape::predict {

// One measured collective (or all calls of one purpose in a step): the ledger's ring steps and
// bytes one worker sends, and the measured seconds.
struct CollectiveSample {
  CollectiveKind kind = CollectiveKind::all_reduce;
  int workers = 2;
  double latency_steps = 0;
  double bytes_sent = 0;
  double time_s = 0;
  // What the link did before the call: bench-comm's back-to-back calls are busy, its calls after
  // an idle gap (--idle-gap-ms) idle.
  LinkLoad load = LinkLoad::busy;
};

// `amount` of work (FLOPs, bytes) that took `time_s`.
struct RateSample {
  double amount = 0;
  double time_s = 0;
};

struct LinkFit {
  double alpha_s = 0;
  double bandwidth_Bps = 0;
  int samples = 0;
  NetworkModel model() const { return NetworkModel{alpha_s, bandwidth_Bps}; }
};

// time = steps alpha + bytes / B, least squares in relative error (each sample weighted by
// 1 / time^2, so microsecond and second collectives count alike). alpha is 0 when the samples
// cannot separate it from the bandwidth (one distinct point) or when the fit makes it negative.
// Throws std::invalid_argument when there is no sample or the fitted bandwidth is not positive.
LinkFit fit_alpha_beta(std::span<const CollectiveSample> samples);

// time = amount / rate, least squares in relative error; returns the rate (amount per second).
// Throws std::invalid_argument when there is no sample with a positive time.
double fit_rate(std::span<const RateSample> samples, const char* what);

struct Calibration {
  double achieved_flops = 0;  // FLOP/s of forward + backward
  double optimizer_Bps = 0;   // bytes of the optimizer step per second
  // Fitted to a measured step table (predict/table_model.hpp): the per-GEMM compute model, which
  // then replaces achieved_flops for the table's rows (achieved_flops stays the fitted model's
  // average, for the report). Unfitted (max_efficiency 0) everywhere else.
  presets::GemmCurve gemm;
  LinkFit combined;           // every collective kind together: the network's inter link
  std::array<std::optional<LinkFit>, kCollectiveKindCount> by_kind{};  // indexed by CollectiveKind
  // The link among a node's ranks, fitted to the node collectives of hierarchical runs
  // (optimizer.hierarchy = "node") alone; none when no fitted run had them.
  std::optional<LinkFit> intra;
  // The inter link's idle and busy curves (predict/link_load.hpp), when the bench-comm files
  // hold calls after an idle gap (the lines above are then fitted to the busy calls alone);
  // none otherwise (one regime, the lines).
  std::optional<LoadCurves> inter_curves;
  int idle_samples = 0;
  // --link-rate-scale: the inter links' bandwidths and curves' rate times this, to predict a
  // link of another rate than the bench's (1: the bench's own).
  double link_rate_scale = 1;
  int compute_samples = 0;
  int optimizer_samples = 0;
  std::vector<std::string> sources;
  // Kinds whose own fit failed (their times do not grow with the bytes over the measured sizes,
  // as happens when every size is latency-bound on a noisy host): they use the combined link.
  std::vector<std::string> warnings;
};

// Fits every parameter. A kind gets its own link when its samples hold two distinct points and
// its fit succeeds; otherwise it keeps the combined link and a warning says why. No compute
// sample (every run's compute slept) leaves achieved_flops 0, and the hardware description
// then names no compute figure; no optimizer sample either (bench-comm files alone) leaves
// optimizer_Bps 0 too, and the description is the links alone. `intra` (the node collectives of hierarchical runs) fits
// the intra-node link, all kinds together; empty, none is fitted. When some collective samples are idle (bench-comm's
// calls after an idle gap), the lines are fitted to the busy samples and the inter link keeps both regimes' measured
// curves (predict/link_load_fit.hpp). Throws std::invalid_argument when the compute or optimizer (given samples),
// combined collective or intra-node fit fails.
Calibration calibrate(std::span<const RateSample> compute, std::span<const RateSample> optimizer,
                      std::span<const CollectiveSample> collectives, std::span<const CollectiveSample> intra = {});

// The calibration for a link `factor` times as fast as the one its inter links were fitted on
// (docs/PREDICTING.md, "A link's load"): every inter bandwidth and the curves' rate times
// factor, the latencies and the intra link as they are. Throws std::invalid_argument for a
// factor that is not positive and finite.
Calibration with_link_rate_scale(Calibration c, double factor);

// The hardware description (format kHardwareFormat): gpu and network sections that a
// prediction config reads with `"hardware": FILE`, and the fit's figures under "fit".
nlohmann::json hardware_json(const Calibration& c);

// The step model with the calibrated figures: one GPU per "node" on the calibrated link, the
// optimizer's kernels all at the fitted throughput, and the overlap of the MPI and NCCL
// runtimes (blocking collectives; only the lagged mask all-gather hides behind compute). Under
// optimizer.hierarchy = "node" a node holds its G = ranks_per_node ranks on the fitted intra
// link behind one inter-node port (a calibration cannot tell how many a node has; the netlab
// gives each node one), so its G rails share the port; a flat run stays one rank per "node",
// its ring's hops across nodes each with a port to itself. Throws std::invalid_argument for a
// hierarchical optimizer with G > 1 when no intra link was fitted.
StepInputs calibrated_inputs(const Calibration& c, const OptimizerConfig& optimizer, std::uint64_t n_params,
                             double flops_per_token, double fill_in);

}  // namespace scape::predict
