// FLOP-based compute time of a simulated worker (compute.type = "flops").
#include "config/compute_model.hpp"

#include <cstdio>
#include <limits>

#include "config/model_shapes.hpp"
#include "presets/gpu_presets.hpp"

namespace scape::config {

double modelled_compute_seconds(const ExperimentConfig& c) {
  if (c.compute.type == "sleep") return c.compute.seconds;
  if (c.compute.type != "flops") return std::numeric_limits<double>::quiet_NaN();
  const double per_token = presets::training_flops_per_token(predictor_model_spec(c.model), c.model.block_size,
                                                             presets::AttentionFlops::causal);
  const double tokens = static_cast<double>(c.data.batch_size) * c.model.block_size;
  const auto& device = presets::find_gpu_preset(c.compute.device, "compute.device");
  presets::GpuSpec gpu;
  gpu.peak_TFLOPs = device.peak_bf16_TFLOPs;
  gpu.mfu = c.compute.mfu;
  // Forward and backward (twice the forward) as predict_step adds them, so scape predict on
  // the same shape, batch and GPU gives the same seconds to the last bit.
  const double forward = per_token * tokens / (3.0 * gpu.achieved_flops());
  return forward + 2.0 * forward;
}

std::string describe_step_time_model(const ExperimentConfig& c) {
  char figure[32];
  std::snprintf(figure, sizeof figure, "%g", c.compute.type == "sleep" ? c.compute.seconds : c.compute.mfu);
  std::string compute = "measured CPU time of this machine";
  if (c.compute.type == "flops") compute = "FLOPs on " + c.compute.device + " at MFU " + figure;
  if (c.compute.type == "sleep") compute = std::string(figure) + " s a step slept (a GPU stand-in)";
  char link[64];
  std::snprintf(link, sizeof link, "alpha %g us, %g GB/s", c.network.alpha_us, c.network.bandwidth_GBps);
  const std::string network = c.network.preset.empty() ? std::string(link) : c.network.preset;
  return "compute: " + compute + " + alpha-beta communication on " + network + ", " + std::to_string(c.workers) +
         " workers; optimizer step not modelled";
}

}  // namespace scape::config
