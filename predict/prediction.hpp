// A whole prediction: the configured optimizer and its dense baseline at every worker count,
// with speedup and scaling efficiency (docs/PREDICTING.md, "Outputs").
#pragma once

#include <cstdint>
#include <vector>

#include "predict/predict_config.hpp"
#include "predict/step_model.hpp"

namespace scape::predict {

struct PredictionRow {
  int workers = 1;
  double global_tokens = 0;  // tokens of one step over all GPUs
  StepPrediction optimizer;
  StepPrediction baseline;
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
Prediction run_prediction(const PredictConfig& c);

}  // namespace scape::predict
