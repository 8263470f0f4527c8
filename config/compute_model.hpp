// The compute time of one worker's step as the modelled step time takes it with
// compute.type = "flops": the training FLOPs of the run's gpt or llama shape (the formula of
// `scape predict`, presets/model_presets.hpp) at an assumed MFU of a GPU preset's dense bf16 peak.
#pragma once

#include <string>

#include "config/config.hpp"
#include "presets/model_presets.hpp"

namespace scape::config {

// Seconds of forward + backward of one worker's micro-batch (data.batch_size sequences of
// model.block_size tokens), causal attention FLOPs; compute.seconds with compute.type = "sleep";
// NaN with compute.type = "measured".
double modelled_compute_seconds(const ExperimentConfig& c);

// What step_time_model adds up, for a table header: "compute: FLOPs on gh200 at MFU 0.4 +
// alpha-beta communication on ib_ndr400 (optimizer step not modelled)".
std::string describe_step_time_model(const ExperimentConfig& c);

}  // namespace scape::config
