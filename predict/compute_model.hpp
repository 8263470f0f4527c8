// The compute time of one worker's step as the modelled step time takes it with
// compute.type = "flops": the training FLOPs of the run's gpt shape (the formula of
// `scape predict`, predict/models.hpp) at an assumed MFU of a GPU preset's dense bf16 peak.
#pragma once

#include <string>

#include "experiments/config.hpp"
#include "predict/models.hpp"

namespace scape::train {

// The run's gpt shape as the predictor describes models: GPT-2 blocks, tied embeddings, a
// position table of block_size rows (the same parameters as the GPT layout, model/gpt.hpp).
predict::ModelSpec model_spec(const experiments::ModelSection& m);

// Seconds of forward + backward of one worker's micro-batch (data.batch_size sequences of
// model.block_size tokens), causal attention FLOPs; NaN with compute.type = "measured".
double modelled_compute_seconds(const experiments::ExperimentConfig& c);

// What step_time_model adds up, for a table header: "compute: FLOPs on gh200 at MFU 0.4 +
// alpha-beta communication on ib_ndr400 (optimizer step not modelled)".
std::string describe_step_time_model(const experiments::ExperimentConfig& c);

}  // namespace scape::train
