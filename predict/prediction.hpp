// A whole prediction: the configured optimizer and its dense baseline at every worker count,
// with speedup and scaling efficiency (docs/PREDICTING.md, "Outputs").
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "predict/predict_config.hpp"
#include "predict/step_model.hpp"

namespace scape::predict {

// The optimizer's device memory on the GPU that holds the most (optimizers/device_state.hpp),
// bytes: its state alone (moments, residual, outer-loop copies) and with the step's buffers.
// Under optimizer.hierarchy = "node" the rail's method over the largest rail's part among the
// M nodes, and the wrapper's buffers. NaN for a method without a buffer-by-buffer count.
struct OptimizerMemory {
  double state_bytes = std::numeric_limits<double>::quiet_NaN();
  double bytes = std::numeric_limits<double>::quiet_NaN();
};

struct PredictionRow {
  int workers = 1;
  double global_tokens = 0;  // tokens of one step over all GPUs
  StepPrediction optimizer;
  StepPrediction baseline;
  OptimizerMemory optimizer_memory, baseline_memory;
  double speedup = 0;              // baseline step time / optimizer step time
  double efficiency = 0;           // of the optimizer against itself on one GPU
  double baseline_efficiency = 0;  // of the baseline against itself on one GPU
  double tokens_per_s() const { return global_tokens / optimizer.step_s; }
  double baseline_tokens_per_s() const { return global_tokens / baseline.step_s; }
};

struct Prediction {
  PredictConfig config;
  std::uint64_t n_params = 0;
  double flops_per_token = 0;
  std::vector<PredictionRow> rows;  // in the order of config.workers
};

// E = T_1 / (W T_W), T_1 the whole W-GPU step (its global batch, one optimizer step over all N)
// on one GPU, under strong and weak scaling alike. E <= 1 because no GPU of W does less than
// 1/W of that work and communication only adds time.
double scaling_efficiency(const StepPrediction& whole_step_on_one_gpu, const StepPrediction& at_w);

StepInputs step_inputs(const PredictConfig& c, const OptimizerConfig& optimizer);
// Of `optimizer` over the model's tensors on W GPUs placed on the topology of `c` (under
// hierarchy node G = the GPUs of a node that take part, as the step model takes it).
OptimizerMemory optimizer_memory(const PredictConfig& c, const OptimizerConfig& optimizer, const ParamLayout& layout,
                                 int workers);
Prediction run_prediction(const PredictConfig& c);

}  // namespace scape::predict
