// Prediction over worker counts, baseline and efficiencies (docs/PREDICTING.md, "Outputs").
#include "predict/prediction.hpp"

namespace scape::predict {

double scaling_efficiency(const StepPrediction& one_gpu, const StepPrediction& at_w, Scaling scaling) {
  const double ratio = one_gpu.step_s / at_w.step_s;
  return scaling == Scaling::strong ? ratio / at_w.workers : ratio;
}

StepInputs step_inputs(const PredictConfig& c, const OptimizerConfig& optimizer) {
  StepInputs in;
  in.optimizer = optimizer;
  in.n_params = parameter_count(c.model);
  in.flops_per_token = training_flops_per_token(c.model, c.batch.seq_len, c.attention);
  in.fill_in = c.fill_in;
  in.gpu = c.gpu;
  in.topology = c.topology();
  in.overlap = c.overlap;
  return in;
}

Prediction run_prediction(const PredictConfig& c) {
  Prediction p;
  p.config = c;
  p.n_params = parameter_count(c.model);
  p.flops_per_token = training_flops_per_token(c.model, c.batch.seq_len, c.attention);
  const StepInputs opt = step_inputs(c, c.optimizer);
  const StepInputs base = step_inputs(c, c.baseline);
  // The one-GPU references of the efficiencies, with that GPU's batch under the scaling rule.
  const StepPrediction opt_one = predict_step(opt, 1, c.batch.tokens_per_gpu(1));
  const StepPrediction base_one = predict_step(base, 1, c.batch.tokens_per_gpu(1));
  for (const int w : c.workers) {
    PredictionRow r;
    r.workers = w;
    r.global_tokens = c.batch.global_tokens(w);
    r.optimizer = predict_step(opt, w, c.batch.tokens_per_gpu(w));
    r.baseline = predict_step(base, w, c.batch.tokens_per_gpu(w));
    r.speedup = r.baseline.step_s / r.optimizer.step_s;
    r.efficiency = scaling_efficiency(opt_one, r.optimizer, c.batch.scaling);
    r.baseline_efficiency = scaling_efficiency(base_one, r.baseline, c.batch.scaling);
    p.rows.push_back(std::move(r));
  }
  return p;
}

}  // namespace scape::predict
