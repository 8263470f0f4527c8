// Least-squares fits of the step model's free parameters and the hardware description they
// make (docs/PREDICTING.md, "Calibration").
#include "predict/calibration.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "predict/link_load_fit.hpp"
#include "predict/predict_config.hpp"

namespace scape::predict {
namespace {

constexpr CollectiveKind kKinds[] = {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                                     CollectiveKind::all_gather};

// Bandwidth only (alpha = 0): 1/B = sum(w b t) / sum(w b^2).
LinkFit bandwidth_only(std::span<const CollectiveSample> samples) {
  double bb = 0, bt = 0;
  for (const auto& s : samples) {
    const double w = 1.0 / (s.time_s * s.time_s);
    bb += w * s.bytes_sent * s.bytes_sent;
    bt += w * s.bytes_sent * s.time_s;
  }
  if (!(bt > 0)) throw std::invalid_argument("collective fit: no bytes were sent, so no bandwidth can be fitted");
  return LinkFit{0.0, bb / bt, static_cast<int>(samples.size())};
}

// Each kind's own link where its samples hold two distinct points and its fit succeeds.
void fit_each_kind(Calibration& c, std::span<const CollectiveSample> collectives) {
  for (const auto kind : kKinds) {
    std::vector<CollectiveSample> mine;
    for (const auto& s : collectives) {
      if (s.kind == kind) mine.push_back(s);
    }
    if (mine.empty()) continue;
    bool distinct = false;
    for (const auto& s : mine) {
      distinct = distinct || s.latency_steps != mine.front().latency_steps || s.bytes_sent != mine.front().bytes_sent;
    }
    if (!distinct) continue;
    try {
      c.by_kind[static_cast<std::size_t>(kind)] = fit_alpha_beta(mine);
    } catch (const std::invalid_argument& e) {
      c.warnings.push_back(std::string(to_string(kind)) + ": " + e.what() + " (" + std::to_string(mine.size()) +
                           " samples); it uses the combined link");
    }
  }
}

}  // namespace

LinkFit fit_alpha_beta(std::span<const CollectiveSample> samples) {
  if (samples.empty()) throw std::invalid_argument("collective fit: no samples");
  // Normal equations of min sum w (s alpha + b beta - t)^2 with w = 1 / t^2, beta = 1 / B.
  double ss = 0, sb = 0, bb = 0, st = 0, bt = 0;
  for (const auto& s : samples) {
    if (!(s.time_s > 0) || !std::isfinite(s.time_s)) {
      throw std::invalid_argument("collective fit: a measured time is not positive and finite");
    }
    const double w = 1.0 / (s.time_s * s.time_s);
    ss += w * s.latency_steps * s.latency_steps;
    sb += w * s.latency_steps * s.bytes_sent;
    bb += w * s.bytes_sent * s.bytes_sent;
    st += w * s.latency_steps * s.time_s;
    bt += w * s.bytes_sent * s.time_s;
  }
  const double det = ss * bb - sb * sb;
  // Collinear steps and bytes (one distinct point, or bytes proportional to steps) leave alpha
  // undetermined: the relative tolerance is that of the determinant's cancellation.
  if (!(std::abs(det) > 1e-9 * ss * bb)) return bandwidth_only(samples);
  const double alpha = (st * bb - sb * bt) / det;
  const double beta = (ss * bt - sb * st) / det;
  if (alpha < 0) return bandwidth_only(samples);
  if (!(beta > 0)) throw std::invalid_argument("collective fit: the measured times do not grow with the bytes");
  return LinkFit{alpha, 1.0 / beta, static_cast<int>(samples.size())};
}

double fit_rate(std::span<const RateSample> samples, const char* what) {
  // min sum w (a x - t)^2, w = 1 / t^2, x = seconds per unit: x = sum(w a t) / sum(w a^2).
  double aa = 0, at = 0;
  for (const auto& s : samples) {
    if (!(s.time_s > 0) || !std::isfinite(s.time_s) || !(s.amount > 0)) continue;
    const double w = 1.0 / (s.time_s * s.time_s);
    aa += w * s.amount * s.amount;
    at += w * s.amount * s.time_s;
  }
  if (!(at > 0)) throw std::invalid_argument(std::string(what) + " fit: no sample with a positive time");
  return aa / at;
}

Calibration calibrate(std::span<const RateSample> compute, std::span<const RateSample> optimizer,
                      std::span<const CollectiveSample> collectives, std::span<const CollectiveSample> intra) {
  Calibration c;
  if (!compute.empty()) {  // runs whose compute sleeps give none: their compute is given
    c.achieved_flops = fit_rate(compute, "compute");
    c.compute_samples = static_cast<int>(compute.size());
  }
  if (!optimizer.empty()) {  // bench-comm files alone give none: the links alone are fitted
    c.optimizer_Bps = fit_rate(optimizer, "optimizer step");
    c.optimizer_samples = static_cast<int>(optimizer.size());
  }
  if (!intra.empty()) {
    try {
      c.intra = fit_alpha_beta(intra);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("intra-node link: ") + e.what());
    }
  }
  std::vector<CollectiveSample> lines(collectives.begin(), collectives.end());
  if (has_idle_calls(collectives)) {
    c.inter_curves = measured_curves(collectives);
    std::erase_if(lines, [](const CollectiveSample& s) { return s.load == LinkLoad::idle; });
    c.idle_samples = static_cast<int>(collectives.size() - lines.size());
  }
  c.combined = fit_alpha_beta(lines);
  fit_each_kind(c, lines);
  return c;
}

Calibration with_link_rate_scale(Calibration c, double factor) {
  if (!(factor > 0) || !std::isfinite(factor)) {
    throw std::invalid_argument("link rate scale: must be positive and finite");
  }
  c.link_rate_scale = factor;
  c.combined.bandwidth_Bps *= factor;
  for (auto& l : c.by_kind) {
    if (l) l->bandwidth_Bps *= factor;
  }
  if (c.inter_curves) c.inter_curves->rate_scale *= factor;
  return c;
}

namespace {

const char* hardware_description(const Calibration& c) {
  if (c.compute_samples > 0) {
    return "calibrated by scape predict --calibrate: peak_TFLOPs is the achieved compute (mfu 1), the three "
           "throughputs the optimizer step's fitted one, the links the fitted alpha-beta";
  }
  if (c.optimizer_samples > 0) {
    return "calibrated by scape predict --calibrate from runs whose compute slept: no compute figure (a config "
           "using it names its GPU's peak_TFLOPs), the three throughputs the optimizer step's fitted one, the links "
           "the fitted alpha-beta";
  }
  return "calibrated by scape predict --calibrate --links-from-bench from bench-comm files alone: the links only "
         "(a config using it names its GPU)";
}

}  // namespace

nlohmann::json hardware_json(const Calibration& c) {
  using nlohmann::json;
  const auto link = [](const LinkFit& l) {
    return json{{"alpha_us", l.alpha_s * 1e6}, {"bandwidth_GBps", l.bandwidth_Bps / 1e9}};
  };
  json collectives = json::object();
  json fit = {{"achieved_TFLOPs", c.achieved_flops / 1e12},
              {"optimizer_GBps", c.optimizer_Bps / 1e9},
              {"compute_samples", c.compute_samples},
              {"optimizer_samples", c.optimizer_samples},
              {"collective_samples", c.combined.samples}};
  for (const auto kind : kKinds) {
    if (const auto& l = c.by_kind[static_cast<std::size_t>(kind)]) {
      collectives[to_string(kind)] = link(*l);
      fit[std::string(to_string(kind)) + "_samples"] = l->samples;
    }
  }
  json network = {{"gpus_per_node", 1}, {"inter", link(c.combined)}, {"collectives", collectives}};
  if (c.intra) {
    network["intra"] = link(*c.intra);
    fit["intra_samples"] = c.intra->samples;
  }
  if (c.inter_curves) {
    network["inter_curves"] = inter_curves_json(*c.inter_curves);
    fit["idle_samples"] = c.idle_samples;
  }
  if (c.link_rate_scale != 1) fit["link_rate_scale"] = c.link_rate_scale;
  const double tbps = c.optimizer_Bps / 1e12;
  json gpu = json::object();
  if (c.optimizer_samples > 0) gpu = {{"memory_bandwidth_TBps", tbps}, {"select_TBps", tbps}, {"pack_TBps", tbps}};
  if (c.compute_samples > 0) {
    gpu["peak_TFLOPs"] = c.achieved_flops / 1e12;
    gpu["mfu"] = 1.0;
  }
  return json{{"format", kHardwareFormat}, {"description", hardware_description(c)},
              {"sources", c.sources},      {"gpu", gpu},
              {"network", network},        {"fit", fit}};
}

StepInputs calibrated_inputs(const Calibration& c, const OptimizerConfig& optimizer, std::uint64_t n_params,
                             double flops_per_token, double fill_in) {
  StepInputs in;
  in.optimizer = optimizer;
  in.n_params = n_params;
  in.flops_per_token = flops_per_token;
  in.fill_in = fill_in;
  in.gpu.peak_TFLOPs = c.achieved_flops / 1e12;
  in.gpu.mfu = 1.0;
  in.gpu.memory_TBps = c.optimizer_Bps / 1e12;
  // The fitted throughput covers the whole measured optimizer step, mask coding included (it
  // runs inside it), so coding adds no separate term here.
  in.gpu.mask_codec_Gcoords_per_s = std::numeric_limits<double>::max();
  in.topology.gpus_per_node = 1;
  in.topology.nics_per_node = 1;
  if (optimizer.hierarchy == Hierarchy::node && optimizer.ranks_per_node > 1) {
    if (!c.intra) {
      throw std::invalid_argument(
          "optimizer.hierarchy \"node\": no intra-node link was fitted (no fitted run "
          "measured the node collectives)");
    }
    in.topology.gpus_per_node = optimizer.ranks_per_node;
    in.topology.intra = c.intra->model();
  }
  in.topology.inter = c.combined.model();
  in.topology.inter_curves = c.inter_curves;
  for (std::size_t k = 0; k < c.by_kind.size(); ++k) {
    if (c.by_kind[k]) in.topology.inter_by_kind[k] = c.by_kind[k]->model();
  }
  in.overlap.grad_reduce = false;
  in.overlap.param_gather = false;
  in.overlap.sparse_reduce = false;
  in.overlap.mask_gather = true;
  return in;
}

}  // namespace scape::predict
